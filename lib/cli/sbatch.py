"""The sbatch command: a SLURM batch script made from the plan.

NODES= machines with GPUS= training processes each (on a GPU node, its GPUs), PARTITION=, TIME=, ACCOUNT=,
CPUS= (per node; default what the partition's nodes have, from sinfo) and OUT= (the script's path) -> a script with one task per node running `kfit train` under
srun. Every node's kfit reads SLURM's variables (lib/cli/slurm.py: node count, node rank, the first host as
the rendezvous), the run directory is the config's OUTPUT_DIR (shared between the nodes), and the job
survives its time limit: SLURM sends the batch shell SIGUSR1 (--signal=B:USR1@<lead>) before the limit, the
script passes SIGTERM to the training step (every rank checkpoints at its next step boundary and exits 143)
and requeues the job, and the requeued job's `kfit train` resumes the run (the default resume). ARRAY=N
writes an Optuna job array instead: N tasks, each one `kfit hpo` worker against HPO_STORAGE.

The plan is resolved for NODES x GPUS processes on the machine GPU=/HW= describe (the cluster's nodes, as
`kfit plan` takes them), else this one; its summary line is printed and kept in the script.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from .. import config as kconfig
from ..env import env_number, env_text
from ..errors import KfitError
from ..redact import escaped, shown
from ..fileio import read_bytes, write_atomic, write_target
from .common import ensure_config, hardware_from_env
from .flags import command

TEMPLATE = "sbatch.sh.j2"
TIME_FORMS = ("MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES or "
              "DAYS-HOURS:MINUTES:SECONDS (as sbatch --time takes it)")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_limit_seconds(text: str) -> int:
    """SLURM's --time as seconds: '30' (minutes), '30:00', '2:00:00', '1-12', '1-12:30', '1-12:30:00'."""
    match = _TIME.match(text.strip())
    if match is None:
        raise KfitError(f"TIME='{shown(text, 40)}' is not a SLURM time limit: write it as {TIME_FORMS}")
    if any(len(part or "") > 9 for part in match.groups()):  # a year is 6 digits of minutes; 4,300 digits fail int()
        raise KfitError(f"TIME='{shown(text, 40)}' is out of range: a part of it has more than 9 digits; give a "
                        f"limit SLURM takes, as {TIME_FORMS}")
    days, a, b, c = match.groups()
    a, b, c = int(a), int(b or 0), int(c or 0)
    if days is not None:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        seconds = int(days) * 86400 + a * 3600 + b * 60 + c
    elif match.group(4) is not None:  # HOURS:MINUTES:SECONDS
        seconds = a * 3600 + b * 60 + c
    else:  # MINUTES[:SECONDS]
        seconds = a * 60 + b
    if seconds < 60:
        raise KfitError(f"TIME='{shown(text, 40)}' is under a minute: SLURM counts limits in minutes; give at least 1")
    return seconds


def warning_lead(step_seconds: float | None, limit: int | None) -> int:
    """Seconds before the time limit that SLURM sends the warning signal: a minute to save the checkpoint and
    requeue, plus two of the plan's predicted steps (the stop waits for the step boundary); at most half of
    a known limit and SLURM's largest (65535 s)."""
    lead = 60 + int(2 * (step_seconds or 0.0))
    if limit is not None:
        lead = min(lead, limit // 2)
    return max(1, min(lead, 65535))


def _name(value: str | None, variable: str) -> str | None:
    if value is not None and not re.fullmatch(r"[\w.@+-]+", value):
        raise KfitError(f"{variable}='{shown(value, 40)}': SLURM names are letters, digits and . _ - + @ only")
    return value


def kfit_command() -> list[str]:
    """How a node runs kfit: this Python on scripts/kfit.py in a checkout (as make does), else the package."""
    from ..resources import CHECKOUT

    script = CHECKOUT / "scripts" / "kfit.py" if CHECKOUT else None
    return [sys.executable, str(script)] if script and script.is_file() else [sys.executable, "-m", "kfit"]


def render(**values) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent.parent / "templates"),
                             autoescape=False, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env.get_template(TEMPLATE).render(**values)


def _hpo_storage(array: int) -> str:
    from ..hpo import checked_storage

    storage = checked_storage(env_text("HPO_STORAGE"))
    if not storage or storage.startswith("sqlite"):
        raise KfitError(f"ARRAY={array} writes {array} HPO workers on several machines: they need one database "
                        "server they all reach, e.g. HPO_STORAGE=postgresql+psycopg2://user:password@db-host/optuna "
                        "(an SQLite file on a network filesystem is not safe; docs/tuning.md)")
    return storage


def node_request(cpus: int | None, partition: str | None, hardware, ask=None) -> tuple[int, int | None, str]:
    """(CPUs per task, memory per task in MiB or None, where they came from): CPUS= as given, else what the
    scheduler's sinfo reports for the partition's smallest node (a login node is not a compute node), else this
    machine when there is no scheduler to ask and the plan is for it, else the machine GPU=/HW= describe."""
    from .slurm import partition_nodes

    asked = (ask or partition_nodes)(partition)
    where = f"sinfo{' --partition ' + partition if partition else ''}"
    if cpus is not None:
        return cpus, asked[1] if asked else None, "CPUS=" + (f"; memory: {where}" if asked else "")
    if asked is not None:
        return asked[0], asked[1], f"{where}, its smallest node"
    if hardware.source == "detected":
        return hardware.cpu.logical_cores, None, "this machine (no SLURM scheduler answered sinfo)"
    return hardware.cpu.logical_cores, None, f"the machine GPU=/HW= describe, {hardware.source} (no SLURM scheduler answered sinfo)"


def cmd_sbatch(args) -> int:
    from ..planning import make_plan
    from ..planning.render import summary_line

    nodes = env_number("NODES", int, 1, minimum=1)
    gpus = env_number("GPUS", int, None, minimum=1)
    array = env_number("ARRAY", int, None, minimum=1)
    if array is not None and nodes != 1:
        raise KfitError(f"ARRAY={array} with NODES={nodes}: each HPO worker trains on one machine; use NODES=1")
    time_text = env_text("TIME")
    limit = time_limit_seconds(time_text) if time_text else None
    partition, account = _name(env_text("PARTITION"), "PARTITION"), _name(env_text("ACCOUNT"), "ACCOUNT")
    hardware = hardware_from_env(allow_simulated=True)  # GPU= / HW= describe the cluster's nodes
    config = ensure_config()
    model, plan = make_plan(config, hardware, gpus=gpus, nodes=nodes)
    per_node = plan.world_size // nodes if plan.world_size % nodes == 0 else plan.world_size
    if array is None and per_node * nodes != plan.world_size:
        raise KfitError(f"the plan has {plan.world_size} processes, not {nodes} machine(s) x {per_node}: set GPUS=")
    cpus, memory, source = node_request(env_number("CPUS", int, None, minimum=1), partition, hardware)
    source = escaped(source)  # a comment line of the script: a HW= profile's name with a line break stays one
    summary = summary_line(plan, hardware, model)
    output_dir = Path(config.output_dir).expanduser().resolve()
    for name, path in (("the current directory", Path.cwd()), ("CONFIG_OUTPUT_DIR", output_dir)):
        # an #SBATCH line ends at a line break, which would start a command of the script: refused, not written
        if escaped(str(path)) != str(path):
            raise KfitError(f"{name} ({shown(path)}) holds a line break or another control character, which an "
                            "#SBATCH line cannot hold: use a directory whose name has none")
    output_dir.mkdir(parents=True, exist_ok=True)  # sbatch's --output needs the directory to exist
    job = f"kfit-{model.name}" + (f"-{model.preset}" if model.preset else "") + ("-hpo" if array else "")
    out = Path(env_text("OUT") or output_dir / f"{job}.sbatch").expanduser().absolute()  # a link there: refused
    # the config the job runs, as it is now: a requeued job must resume the same run, whatever .config becomes
    snapshot = out.with_name(out.name + ".config")
    for target in (out, snapshot):  # both checked before either is written: a refusal leaves nothing behind
        write_target(target)
    write_atomic(snapshot, read_bytes(kconfig.config_path()))
    # the training processes of each node: GPUS= as given, else the plan's (one per GPU of a GPU node)
    env = {"KCONFIG_CONFIG": str(snapshot), "GPUS": str(per_node)}
    if array:
        env["HPO_STORAGE"] = _hpo_storage(array)
        for name in ("HPO_STUDY", "TRIALS"):
            if env_text(name):
                env[name] = env_text(name)
        env.pop("GPUS")
    text = render(
        job=job, nodes=nodes, per_node=per_node, cpus=cpus, memory=memory, source=source,
        gpu=plan.device_type == "cuda",
        time=time_text, partition=partition, account=account, array=array,
        lead=warning_lead(plan.predicted_step_seconds, limit), workdir=Path.cwd(), output_dir=output_dir,
        log=output_dir / (f"slurm-{job}-%A_%a.out" if array else f"slurm-{job}-%j.out"),
        kfit=" ".join(shlex.quote(part) for part in kfit_command()), subcommand="hpo" if array else "train",
        env=env, summary=escaped(summary), world_size=plan.world_size, effective_batch=plan.effective_batch)
    # the owner's only: the script may hold HPO_STORAGE's database password (the job runs as its owner)
    write_atomic(out, text.encode(), mode=0o700)
    print(summary)
    what = (f"{array} HPO worker(s) (a job array) against {_redact(env['HPO_STORAGE'])}" if array else
            f"{nodes} node(s) x {per_node} process(es), effective batch {plan.effective_batch}")
    print(f"# SLURM batch script for {what} written to {shown(out)}; submit it with: sbatch {shown(out)}")
    return 0


def _redact(url: str) -> str:
    from ..hpo import redact

    return redact(url)


def register(sub) -> None:
    command(sub, "sbatch", "write a SLURM batch script that trains (or searches) as planned, with requeue",
            "NODES", "GPUS", "CPUS", "PARTITION", "TIME", "ACCOUNT", "ARRAY", "HPO_STORAGE", "HPO_STUDY", "TRIALS",
            "HW", "GPU", "FREE_GB", "OUT", func=cmd_sbatch,
            help={"GPUS": "training processes per node (with --gpu: also each node's GPU count)",
                  "OUT": "the script to write (default <OUTPUT_DIR>/kfit-<model>.sbatch)"})

