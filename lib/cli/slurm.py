"""Inside a SLURM allocation, `make train` on every node (`srun --ntasks-per-node=1 make train`) takes the node
count, this node's rank and the rendezvous host from SLURM's environment, as it would from NNODES=, NODE_RANK=
and MASTER_ADDR=. Anything the user sets explicitly wins."""

from __future__ import annotations

import re
from typing import Iterator, Mapping

from ..errors import KfitError
from ..redact import shown

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> Iterator[str]:
    """SLURM's compressed host list as host names: 'gpu[01-03,07],login' -> gpu01, gpu02, gpu03, gpu07, login
    (zero padding kept, as `scontrol show hostnames` prints them). The whole list is checked first, in one pass
    over its text; the names come one at a time, so a range of billions costs nothing until it is walked."""
    parts = [_parsed(part, text) for part in _parts(text)]
    for prefix, ranges, suffix in parts:
        for first, last, width in ranges:
            yield from (f"{prefix}{n:0{width}d}{suffix}" for n in range(first, last + 1)) if width else (prefix,)


def first_host(text: str) -> str:
    """The first host of SLURM's host list (the rendezvous host), the list checked whole."""
    host = next(expand_hostlist(text), None)
    if host is None:
        raise KfitError(f"SLURM_JOB_NODELIST={shown(text)} names no host")
    return host


def _parts(text: str) -> list[str]:
    """The comma-separated entries outside brackets."""
    parts, depth, part = [], 0, ""
    for char in text.strip() + ",":
        if char == "," and depth == 0:
            if part:
                parts.append(part)
            part = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise KfitError(f"SLURM_JOB_NODELIST={shown(text)}: unbalanced brackets")
        part += char
    if depth:
        raise KfitError(f"SLURM_JOB_NODELIST={shown(text)}: unbalanced brackets")
    return parts


def _parsed(part: str, text: str) -> tuple[str, list[tuple[int, int, int]], str]:
    """(prefix, [(first, last, digits)], suffix) of one entry; a plain name is (name, [(0, 0, 0)], "")."""
    if "[" not in part:
        return part, [(0, 0, 0)], ""
    prefix, _, rest = part.partition("[")
    inside, _, suffix = rest.partition("]")
    ranges = []
    for item in inside.split(","):
        match = _RANGE.match(item)
        if match is None:
            raise KfitError(f"SLURM host list item {shown(item)} in SLURM_JOB_NODELIST={shown(text)} is not a "
                            "number or a range")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise KfitError(f"SLURM host list range {shown(item)} in SLURM_JOB_NODELIST={shown(text)} runs "
                            "backwards")
        ranges.append((int(first), int(last), len(first)))
    return prefix, ranges, suffix


def gpus_per_node(env: Mapping[str, str]) -> str | None:
    """The GPUs SLURM gave this node: SLURM_GPUS_ON_NODE, else the count of SLURM_GPUS_PER_NODE ('4' or
    'a100:4'); None where the job asked for none (a CPU job) or the value is not a count."""
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        count = (env.get(name) or "").rpartition(":")[2]
        if count.isdigit() and int(count) > 0:
            return str(int(count))
    return None


def slurm_variables(env: Mapping[str, str]) -> dict[str, str]:
    """NNODES, NODE_RANK, MASTER_ADDR, RDZV_ID and GPUS (training processes per node: one per GPU SLURM gave
    the node) as SLURM's environment gives them, or {} outside a job. Inside an srun step the step's nodes
    count (`srun -N1` in a 2-node job is one machine), else the job's; a user's own NNODES= keeps SLURM's rank
    and host out too."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return {}
    in_step = bool(env.get("SLURM_STEP_ID") and env.get("SLURM_STEP_NUM_NODES"))
    nodes = env.get("SLURM_STEP_NUM_NODES") if in_step else (env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"))
    listed = (env.get("SLURM_STEP_NODELIST") if in_step else None) or env.get("SLURM_JOB_NODELIST") \
        or env.get("SLURM_NODELIST")
    found = {"RDZV_ID": f"slurm-{job}"}
    gpus = gpus_per_node(env)
    if gpus and not env.get("GPUS"):
        found["GPUS"] = gpus
    if env.get("NNODES"):
        return found
    if nodes:
        found["NNODES"] = nodes
    if nodes and nodes != "1":
        if env.get("SLURM_NODEID") is not None:
            found["NODE_RANK"] = env["SLURM_NODEID"]
        if listed:
            found["MASTER_ADDR"] = first_host(listed)
    return found


def with_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with SLURM's answers filled in where the user set nothing."""
    return {**slurm_variables(env), **env}


def partition_nodes(partition: str | None, run=None) -> tuple[int, int] | None:
    """(CPUs, memory in MiB) of the smallest node of `partition` (the default partition when None), as the
    scheduler's sinfo reports them: what one task on a node of it can ask for. None when there is no sinfo or
    no scheduler answers it (a machine outside a cluster, a controller down)."""
    import shutil
    import subprocess

    if shutil.which("sinfo") is None:
        return None
    argv = ["sinfo", "--noheader", "--format=%c %m", *(["--partition", partition] if partition else [])]
    try:
        done = (run or subprocess.run)(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].rstrip("+").isdigit():
            rows.append((int(fields[0]), int(fields[1].rstrip("+"))))
    if not rows:
        if done.returncode == 0 and partition:
            raise KfitError(f"PARTITION={partition}: sinfo lists no nodes in it; name a partition 'sinfo' shows")
        return None
    return min(c for c, _ in rows), min(m for _, m in rows)
