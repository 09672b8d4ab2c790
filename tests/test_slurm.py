"""Inside a SLURM allocation kfit takes the node count, node rank and rendezvous host from SLURM's variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from lib import distributed
from lib.cli.invocation import Invocation
from lib.cli.slurm import expand_hostlist, first_host, slurm_variables, with_slurm
from lib.errors import KfitError

JOB = {"SLURM_JOB_ID": "4711", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
       "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_host_lists_expand_as_scontrol_prints_them():
    assert list(expand_hostlist("gpu[01-03,07],login")) == ["gpu01", "gpu02", "gpu03", "gpu07", "login"]
    assert list(expand_hostlist("node9")) == ["node9"]
    assert list(expand_hostlist("a[8-10]-ib")) == ["a8-ib", "a9-ib", "a10-ib"]
    for bad in ("gpu[01-03", "gpu[x]", "gpu]01[", "gpu[9-1]", "a,b[1-2],c[x]", ","):
        with pytest.raises(KfitError, match="SLURM") as err:
            list(expand_hostlist(bad)) if bad != "," else first_host(bad)
        assert "\n" not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(prefix=st.text("abgpu-", min_size=1, max_size=4), first=st.integers(0, 10**30),
       span=st.integers(0, 10**30), width=st.integers(1, 40), tail=st.text(max_size=30))
def test_the_rendezvous_host_comes_at_once_from_any_range_and_bad_text_is_one_line(prefix, first, span, width, tail):
    """The first host of a range of up to 10^30 names, without walking it (a list of billions had been built
    whole); any text after it is checked, and a mistake is one line with the value escaped and cut."""
    listed = f"{prefix}[{first:0{width}d}-{first + span}]"
    assert first_host(listed) == f"{prefix}{first:0{width}d}"
    try:
        first_host(listed + "," + tail)
    except KfitError as err:
        assert "\n" not in str(err) and len(str(err)) < 1200


def test_a_slurm_job_sets_nodes_rank_and_host_unless_the_user_did():
    assert slurm_variables({}) == {}
    assert slurm_variables(JOB) == {"RDZV_ID": "slurm-4711", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "gpu07"}
    assert slurm_variables({**JOB, "SLURM_JOB_NUM_NODES": "1"}) == {"RDZV_ID": "slurm-4711", "NNODES": "1"}
    assert with_slurm({**JOB, "MASTER_ADDR": "10.0.0.9"})["MASTER_ADDR"] == "10.0.0.9"
    run = Invocation.from_environment(JOB)
    assert run.nodes == (2, 2) and run.planned_nodes == 2


def test_the_torchrun_command_in_a_slurm_job_names_its_first_node():
    command = distributed.torchrun_command(4, Path("kfit.py"), with_slurm(JOB))
    at = command.index("--nnodes")
    assert command[at:at + 8] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "gpu07",
                                  "--master-port", "29500"]


def test_an_srun_step_counts_its_own_nodes_and_a_users_nnodes_wins():
    step = {**JOB, "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "gpu03", "SLURM_NODEID": "0"}
    assert slurm_variables(step) == {"RDZV_ID": "slurm-4711", "NNODES": "1"}  # srun -N1: one machine
    assert slurm_variables({**step, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu[03-04]"})[
        "MASTER_ADDR"] == "gpu03"
    assert slurm_variables({**JOB, "NNODES": "2"}) == {"RDZV_ID": "slurm-4711"}


def test_the_gpus_slurm_gave_a_node_are_its_training_processes_unless_the_user_said():
    assert slurm_variables({**JOB, "SLURM_GPUS_ON_NODE": "4"})["GPUS"] == "4"
    assert slurm_variables({**JOB, "SLURM_GPUS_PER_NODE": "a100:8"})["GPUS"] == "8"
    assert "GPUS" not in slurm_variables({**JOB, "SLURM_GPUS_ON_NODE": "0"})  # a CPU job
    assert "GPUS" not in slurm_variables({**JOB, "SLURM_GPUS_PER_NODE": "gpu:a100"})  # not a count
    assert with_slurm({**JOB, "SLURM_GPUS_ON_NODE": "4", "GPUS": "2"})["GPUS"] == "2"
    assert "GPUS" not in slurm_variables({"SLURM_GPUS_ON_NODE": "4"})  # outside a job: nothing


def test_sbatch_asks_for_what_the_partitions_smallest_node_has_and_says_where_that_came_from():
    from types import SimpleNamespace

    from lib.cli.sbatch import node_request
    from lib.cli.slurm import partition_nodes

    def sinfo(stdout: str, code: int = 0):
        return lambda argv, **kw: SimpleNamespace(returncode=code, stdout=stdout, argv=argv)

    seen = []
    assert partition_nodes("gpu", run=lambda argv, **kw: seen.append(argv) or
                           SimpleNamespace(returncode=0, stdout="96 1031000\n64 515000+\n")) == (64, 515000)
    assert seen[0][-2:] == ["--partition", "gpu"]
    assert partition_nodes(None, run=sinfo("", 1)) is None  # no controller answers: not a cluster to ask
    with pytest.raises(KfitError, match="PARTITION=nope: sinfo lists no nodes in it"):
        partition_nodes("nope", run=sinfo(""))
    catalog = SimpleNamespace(source="catalog:h100", cpu=SimpleNamespace(logical_cores=192))
    here = SimpleNamespace(source="detected", cpu=SimpleNamespace(logical_cores=2))
    assert node_request(None, "gpu", catalog, ask=lambda p: (64, 515000)) == (
        64, 515000, "sinfo --partition gpu, its smallest node")
    assert node_request(8, None, catalog, ask=lambda p: (64, 515000)) == (8, 515000, "CPUS=; memory: sinfo")
    assert node_request(None, None, here, ask=lambda p: None)[:2] == (2, None)
    cpus, memory, source = node_request(None, None, catalog, ask=lambda p: None)
    assert (cpus, memory) == (192, None) and "catalog:h100" in source and "no SLURM scheduler" in source
