#!/bin/sh
# A one-machine SLURM cluster for tests/test_slurm_scheduler.py: Debian's slurm-wlm and munge, a minimal
# slurm.conf (this machine is the controller and the one compute node: its CPUs, no GPUs, no cgroups, so it
# works in a container), then munged, slurmctld and slurmd started.
#
# Safe to run again: a cluster that already answers is reused (nothing is installed, written or restarted), and
# an /etc/slurm/slurm.conf not written by this script is never replaced. Never hangs: apt, the daemons and
# every wait are bounded. Exits 0 once `sinfo` shows the node idle; otherwise exits 1 with one line on stderr
# saying why (the tests skip with it). KFIT_SKIP_SLURM=1 skips it on purpose.
set -u
exec 1>&2

MARK="# written by kfit scripts/ensure-slurm.sh"
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s 2>/dev/null || hostname)

fail() {
    echo "ensure-slurm: no local SLURM cluster: $1"
    exit 1
}
say() { echo "ensure-slurm: $1"; }
. "$(dirname "$0")/debian-install.sh"

node_idle() {
    timeout 10 sinfo -h -n "$HOST" -o %T 2>/dev/null | grep -Eq '^(idle|mixed|allocated|completing)'
}

[ -z "${KFIT_SKIP_SLURM:-}" ] || fail "KFIT_SKIP_SLURM is set"
# The machine's CPUs as the scheduler must see them. GNU nproc obeys OMP_NUM_THREADS (the test suite sets it to 1):
# a node declared with 1 CPU leaves every job asking for this machine's 2 pending forever (Reason=PartitionConfig).
CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
conf_text() {
    cat <<EOF
$MARK: one node, this machine ($HOST), $CPUS CPUs, no GPUs.
ClusterName=kfit
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits out its credential's lifetime before it starts again (120 s by default): 15 s here, so the
# preemption test sees SLURM's own restart; forcing an earlier start races the revocation ("credential revoked")
AuthInfo=cred_expire=15
CryptoType=crypto/munge
MpiDefault=none
# no cgroups: they are not available (or not delegated) in a container
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# requeued jobs (the preemption test) and quick turnaround
JobRequeue=1
ReturnToService=2
KillWait=30
MinJobAge=600
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}
ours() { [ -e "$CONF" ] && grep -q "^$MARK" "$CONF"; }
if command -v sinfo >/dev/null 2>&1 && node_idle; then
    # already up: a real cluster, or ours as this script writes it now (an older start may have declared fewer CPUs)
    if ! ours || conf_text | cmp -s - "$CONF"; then
        exit 0
    fi
fi
[ "$(id -u)" = 0 ] || fail "not root: slurmctld, slurmd and munged need it here (or run this script as root)"

# ---- the packages
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
        || ! command -v munged >/dev/null 2>&1; then
    debian_install slurm-wlm munge
    command -v slurmctld >/dev/null 2>&1 || fail "slurm-wlm installed, but slurmctld is not on PATH"
fi

# ---- munge: a key, then the daemon (as the munge user, as its service runs it)
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile=/etc/munge/munge.key >/dev/null 2>&1 || fail "mungekey could not create a key"
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null || fail "cannot write a munge key"
    fi
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null
if ! timeout 10 munge -n >/dev/null 2>&1; then
    if command -v runuser >/dev/null 2>&1; then
        timeout 20 runuser -u munge -- munged >/dev/null 2>&1 || timeout 20 munged --force >/dev/null 2>&1
    else
        timeout 20 munged --force >/dev/null 2>&1
    fi
    timeout 10 munge -n >/dev/null 2>&1 || fail "munged does not answer (see /var/log/munge/munged.log)"
fi

# ---- slurm.conf: ours, or one we must not touch
if [ -e "$CONF" ] && ! grep -q "^$MARK" "$CONF"; then
    fail "$CONF exists and was not written by this script: not replacing it (a real cluster's?)"
fi
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
conf_text > "$CONF.new"
if ! cmp -s "$CONF.new" "$CONF" 2>/dev/null; then
    mv "$CONF.new" "$CONF"
    changed=1
else
    rm -f "$CONF.new"
    changed=0
fi
# slurmd in 22.05 reads cgroup.conf even with the cgroup plugins off; an empty one is enough
[ -e /etc/slurm/cgroup.conf ] || echo "$MARK" > /etc/slurm/cgroup.conf

# ---- the daemons: reuse running ones (reconfigure if the file changed), else start them
running() { [ -s "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }
stop() {  # a node's CPU count changes only with a restart of both daemons (scontrol reconfigure keeps the old one)
    running "$1" || return 0
    kill "$(cat "$1")" 2>/dev/null
    i=0
    while running "$1" && [ $i -lt 20 ]; do sleep 0.5; i=$((i + 1)); done
    running "$1" && kill -9 "$(cat "$1" 2>/dev/null)" 2>/dev/null
    return 0
}
if [ "$changed" = 1 ]; then
    stop /run/slurmd.pid
    stop /run/slurmctld.pid
fi
if ! running /run/slurmctld.pid; then
    # -c: a fresh start forgets the jobs of an earlier one (a test cluster's old jobs would hold the node)
    timeout 30 slurmctld -c >/dev/null 2>&1 || fail "slurmctld did not start (see /var/log/slurm/slurmctld.log)"
fi
if ! running /run/slurmd.pid; then
    timeout 30 slurmd >/dev/null 2>&1 || fail "slurmd did not start (see /var/log/slurm/slurmd.log)"
fi

# ---- wait (bounded) for the node to be schedulable; a node left down by an earlier start is resumed
i=0
while [ $i -lt 30 ]; do
    node_idle && { echo "ensure-slurm: SLURM is up: node $HOST, $CPUS CPUs, partition debug"; exit 0; }
    state=$(timeout 10 sinfo -h -n "$HOST" -o %T 2>/dev/null)
    case "$state" in
        down* | drain* | fail*) timeout 10 scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 ;;
    esac
    sleep 1
    i=$((i + 1))
done
fail "node $HOST is not idle after 30 s (state: ${state:-none}; see /var/log/slurm/slurmd.log and slurmctld.log)"
