#!/bin/sh
# A local PostgreSQL for tests/test_hpo_postgres.py: Debian's postgresql, a cluster of its own ("kfit", port
# KFIT_PG_PORT or 54329) listening on 127.0.0.1 only, and a user and database for Optuna studies.
#
# Prints the storage URL on stdout (postgresql+psycopg2://kfit:<password>@127.0.0.1:<port>/kfit_hpo); messages go to
# stderr. Safe to run again: an existing cluster, user and database are reused (a stopped cluster is started),
# and no other cluster is touched. Never hangs: apt and the server are bounded. Exits 1 with one line saying
# why where that is impossible (the tests skip with it). KFIT_SKIP_POSTGRES=1 skips it on purpose.
set -u

PORT=${KFIT_PG_PORT:-54329}
CLUSTER=kfit
# a password unlike the user and database names, so that hiding it in printed URLs hides only it
PASSWORD=hpo-test-secret
URL="postgresql+psycopg2://kfit:$PASSWORD@127.0.0.1:$PORT/kfit_hpo"

fail() {
    echo "ensure-postgres: no local PostgreSQL: $1" >&2
    exit 1
}
say() { echo "ensure-postgres: $1" >&2; }
. "$(dirname "$0")/debian-install.sh"

[ -z "${KFIT_SKIP_POSTGRES:-}" ] || fail "KFIT_SKIP_POSTGRES is set"
[ "$(id -u)" = 0 ] || fail "not root: installing and starting PostgreSQL needs it here"

# ---- the package
if ! command -v pg_createcluster >/dev/null 2>&1; then
    debian_install postgresql
    command -v pg_createcluster >/dev/null 2>&1 || fail "postgresql installed, but pg_createcluster is not on PATH"
fi
VERSION=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)
[ -n "$VERSION" ] || fail "no server under /usr/lib/postgresql"

# ---- our cluster: created once, on 127.0.0.1 only, then started
if ! pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | grep -qx "$VERSION $CLUSTER"; then
    say "creating cluster $VERSION/$CLUSTER on 127.0.0.1:$PORT"
    timeout 120 pg_createcluster --port "$PORT" "$VERSION" "$CLUSTER" -- --auth-local=peer --auth-host=scram-sha-256 \
        >/dev/null 2>&1 || fail "pg_createcluster $VERSION $CLUSTER failed"
fi
CONF_DIR=/etc/postgresql/$VERSION/$CLUSTER
grep -q "^listen_addresses = '127.0.0.1'" "$CONF_DIR/postgresql.conf" \
    || echo "listen_addresses = '127.0.0.1'  # ensure-postgres.sh: this machine only" >> "$CONF_DIR/postgresql.conf"
status=$(pg_lsclusters -h 2>/dev/null | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $4}')
if [ "$status" != online ]; then
    timeout 60 pg_ctlcluster "$VERSION" "$CLUSTER" start >/dev/null 2>&1 \
        || fail "the cluster did not start (see /var/log/postgresql/postgresql-$VERSION-$CLUSTER.log)"
fi

# ---- the user and the database (idempotent)
psql_() { timeout 30 runuser -u postgres -- psql -p "$PORT" -h /var/run/postgresql -v ON_ERROR_STOP=1 -qAt "$@"; }
i=0
until psql_ -c "select 1" >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 30 ] || fail "the server does not answer on port $PORT after 30 s"
    sleep 1
done
if [ "$(psql_ -c "select 1 from pg_roles where rolname = 'kfit'")" = 1 ]; then
    psql_ -c "alter role kfit password '$PASSWORD'" >/dev/null || fail "cannot set the role kfit's password"
else
    psql_ -c "create role kfit login password '$PASSWORD'" >/dev/null || fail "cannot create the role kfit"
fi
[ "$(psql_ -c "select 1 from pg_database where datname = 'kfit_hpo'")" = 1 ] \
    || psql_ -c "create database kfit_hpo owner kfit" >/dev/null || fail "cannot create the database kfit_hpo"
say "PostgreSQL $VERSION is up on 127.0.0.1:$PORT (database kfit_hpo, user kfit)"
echo "$URL"
