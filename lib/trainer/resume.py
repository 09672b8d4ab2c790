"""What a run leaves behind to be continued, and how it picks up again.

Resume: checkpoints hold the model, optimizer, scaler, RNG states and the
position (epoch, window, current micro-batch: `Progress`), so a run interrupted
by SIGTERM or SIGINT and resumed computes exactly the losses of an
uninterrupted one. `StopSignals` turns the first such signal into a request to
stop at the next step boundary, after a checkpoint (`TrainingInterrupted`).
The atomic writing and the finding of a run's newest readable checkpoint are
lib/checkpoint.py's. A run directory is locked by the process writing it
(rundir.py's `claim_run_directory`): a second `make train` never writes into a live run; RESUME_FROM
(`resume_point`) refuses one a live process holds.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import random
import shlex
import signal
import threading
import time
from pathlib import Path

import torch

from ..redact import shown
from .. import checkpoint, fileio, resumable
from ..config import Config
from ..config.typed import LADDER_RUNGS
from ..errors import KfitError
from ..hardware import HardwareProfile
from ..plan import Plan
from .windows import Progress


def resume_point(source: Path, config: Config, log=print) -> tuple[Path, int]:
    """RESUME_FROM: (the checkpoint to continue, its effective batch), checked as the resume search checks a
    run: a run directory gives its newest readable checkpoint, a checkpoint file (or sharded directory) itself;
    a finished run, an unreadable or foreign checkpoint, a config that differs in training math, or a run a
    live process holds is a KfitError naming the path and the fix. Reads only."""
    source = Path(source).expanduser()
    what = f"RESUME_FROM={source}"
    if not source.exists():
        raise KfitError(f"{what}: no such run directory or checkpoint: name a run directory (under "
                        "CONFIG_OUTPUT_DIR) or one of its checkpoint-<step>.pt files")
    run_dir = checkpoint.run_of(source)
    if checkpoint.finished_checkpoint(run_dir) or source.name in (checkpoint.FINAL, checkpoint.FINAL_SHARDED):
        raise KfitError(f"{what}: that run has finished ({checkpoint.finished_checkpoint(run_dir).name}): "
                        f"INIT_FROM={source} starts a new run from its weights")
    if run_dir == source:
        # what it skips is said (and renamed aside) once, by the restore that checks it against the model too;
        # a checkpoint whose own config is not its run's (run_config_problem) is passed by as the restore passes
        # it by, while one that is its run's but not this config's is the error below
        skipped: list[str] = []
        found = checkpoint.latest_valid(run_dir, skipped.append,
                                        lambda state, path: checkpoint_problem(state) or run_config_problem(state, path))
        if found is None:  # every checkpoint differs from the run's config file: that file is not the judge
            found = checkpoint.latest_valid(run_dir, lambda line: None, lambda state, _: checkpoint_problem(state))
        if found is None:
            for line in skipped:
                log(line)
            raise KfitError(f"{what} holds no readable checkpoint-<step>.pt: name a run directory that saved "
                            "one, or start afresh without RESUME_FROM")
        path, state = found
    else:
        path = source
        try:
            state = checkpoint.load_checkpoint(path, verify=True)
        except checkpoint.DamagedCheckpoint as err:
            raise KfitError(f"{what} is damaged ({err}): name another checkpoint, or the run directory ({run_dir}) "
                            "for its newest intact one") from None
        except Exception as err:  # noqa: BLE001 - any unreadable file is the user's to replace
            raise KfitError(f"{what} cannot be read ({type(err).__name__}: {shown(' '.join(str(err).split()), 120)}): name "
                            f"another checkpoint, or the run directory ({run_dir}) for its newest readable one"
                            ) from None
        problem = checkpoint_problem(state)
        if problem is not None or not isinstance(state.get("config"), str):
            raise KfitError(f"{what} is not a kfit checkpoint ({problem or 'it holds no config'}): name a "
                            "checkpoint-<step>.pt of a run, or its directory")
    differences = resumable.identity_differences(state.get("config", ""), config.text)
    if differences:
        raise KfitError(f"{what}: its config differs in training math ({'; '.join(differences[:3])}"
                        f"{f'; {len(differences) - 3} more' if len(differences) > 3 else ''}): train with the "
                        f"run's own config (KCONFIG_CONFIG={run_dir / 'config'}), or start a new run from its "
                        f"weights with INIT_FROM={path}")
    holder = fileio.lock_holder(run_dir)
    if holder is not None:
        raise checkpoint.in_use_error(run_dir, holder)
    return path, int(state["progress"]["window_size"])


def versions() -> dict:
    return {"torch": str(torch.__version__), "python": platform.python_version(),
            "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}


# --------------------------------------------------------------------------
# Into and out of a checkpoint


def checkpoint_state(*, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                     scaler: torch.amp.GradScaler, progress: dict, device: torch.device, epoch: int,
                     final_eval: dict | None, config: Config, plan: Plan, hardware: HardwareProfile) -> dict:
    """Everything a checkpoint holds: the tensors and RNG states to continue exactly, and what made the run.
    model and optimizer None: a sharded checkpoint's extra part (`sharded_tensors` holds them)."""
    tensors = {} if model is None else {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    return {**tensors, "scaler": scaler.state_dict(),
            "progress": progress, "rng": rng_state(device), "step": progress["step"], "epoch": epoch,
            "eval": final_eval, "config": config.text, "plan": plan.to_dict(), "hardware": hardware.to_dict(),
            "versions": versions()}


def sharded_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer, flat: bool = True) -> dict:
    """The model's and optimizer's state keyed by parameter name, as torch.distributed.checkpoint saves
    and loads it (sharded DTensors under FSDP, whole tensors otherwise). `flat`: the optimizer's entries keyed
    by parameter name alone ("state.<name>.exp_avg", "param_groups.<name>.lr"), so any layout's processes find
    theirs: a pipeline stage holds some parameters, and its groups list others than another stage's. Checkpoints
    saved before kfit saved them so hold numbered groups (`flat_optimizer`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=flat))
    return {"model": model_state, "optimizer": optimizer_state}


def flat_optimizer(path) -> bool:
    """Whether the sharded checkpoint at `path` keys its optimizer by parameter name alone (sharded_tensors'
    `flat`), as its metadata's key paths say: ("optimizer", "state.<name>.<key>") rather than
    ("optimizer", "state", <name>, <key>)."""
    paths = getattr(checkpoint.sharded_metadata(path), "planner_data", None) or {}
    return any(isinstance(where, tuple) and len(where) == 2 and where[0] == "optimizer" for where in paths.values())


def checkpoint_problem(state) -> str | None:
    """What keeps a loaded checkpoint from being resumed (a wrong file saved under its name, say), None
    when it holds what load_state reads (model and optimizer only when it is not sharded)."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dict"
    keys = (() if state.get("sharded") else ("model", "optimizer")) + ("scaler", "progress", "rng")
    missing = [k for k in keys if not isinstance(state.get(k), dict)]
    if missing:
        return f"it lacks {', '.join(missing)} (each a dict)"
    fields = {f.name for f in dataclasses.fields(Progress)}
    if not {"window_size", "micro_batch"} <= set(state["progress"]) <= fields:
        return f"its progress has the keys {sorted(state['progress'])}, not those of kfit's Progress"
    if not {"torch", "python"} <= set(state["rng"]):
        return "its RNG state lacks torch or python"
    wrong = progress_type_problem(state["progress"]) or progress_range_problem(state)
    if wrong is not None:
        return wrong
    if state.get("plan") is not None and not isinstance(state.get("plan"), dict):
        return f"its plan is a {type(state['plan']).__name__}, not a dict"
    return None


# What each Progress field holds (a crafted or foreign checkpoint may hold anything there).
PROGRESS_TYPES = {"int": (int,), "float": (int, float), "list[str]": (list,), "list[list]": (list,),
                  "list | None": (list, type(None)), "dict | None": (dict, type(None))}


def progress_type_problem(progress: dict) -> str | None:
    """A checkpoint's progress field of the wrong type (a string for the step, say), or a window or micro-batch
    below 1; None when every field has the type Progress declares."""
    for f in dataclasses.fields(Progress):
        if f.name not in progress:
            continue
        value, kinds = progress[f.name], PROGRESS_TYPES.get(str(f.type), (object,))
        if isinstance(value, bool) or not isinstance(value, kinds):
            return f"its progress field {f.name} is {type(value).__name__} {str(value)[:40]!r}, not {f.type}"
    if progress["window_size"] < 1 or progress["micro_batch"] < 1:
        return "its progress holds a window or micro-batch below 1"
    below = [k for k in ("halvings", "step", "epoch", "window", "samples", "interval_samples", "stale_evals",
                         "elapsed_s") if progress.get(k, 0) < 0]
    if below:
        return f"its progress holds {', '.join(below)} below 0"
    unknown = [r for r in progress.get("rungs", []) if r not in LADDER_RUNGS]
    if unknown:
        return f"its progress names the ladder rung {str(unknown[0])[:40]!r}, not one of {', '.join(LADDER_RUNGS)}"
    marks = [*progress.get("best", []), *([progress["early_best"]] if progress.get("early_best") is not None else [])]
    if any(not (isinstance(m, list) and len(m) == 2 and type(m[0]) is int and isinstance(m[1], (int, float))
                and not isinstance(m[1], bool)) for m in marks):
        return "its progress holds a best or early_best evaluation that is not [step, value]"
    return None


# No count a run keeps reaches this: 2**53 optimizer steps (or samples, or seconds) are beyond any machine, and
# below it every count is exact in a float64 (the schedule's arithmetic, metrics.jsonl's JSON numbers).
COUNT_LIMIT = 2 ** 53
COUNTS = ("window_size", "micro_batch", "halvings", "step", "epoch", "window", "samples", "interval_samples",
          "stale_evals")


def progress_range_problem(state: dict) -> str | None:
    """A checkpoint's progress (types checked by progress_type_problem) whose values no run writes: a count at or
    beyond COUNT_LIMIT, seconds or a loss that are not finite, or counts that contradict each other (each step
    is at least one window of this epoch or an earlier one, and at most window_size samples; a halving halves a
    micro-batch that is at most the effective batch). None when the values are those a run can have reached."""
    p = state["progress"]
    beyond = [k for k in COUNTS if p.get(k, 0) >= COUNT_LIMIT]
    if beyond:
        return f"its progress field {beyond[0]} is {str(p[beyond[0]])[:40]}, beyond any run (2**53)"
    elapsed, loss = p.get("elapsed_s", 0.0), p.get("interval_loss", 0.0)
    if not (math.isfinite(elapsed) and elapsed < COUNT_LIMIT):
        return f"its progress field elapsed_s is {str(elapsed)[:40]}, not a finite number of seconds"
    if not math.isfinite(loss):  # a custom loss_fn may be below zero: finite is all that holds for every task
        return f"its progress field interval_loss is {str(loss)[:40]}, not a finite loss"
    step, window_size = p.get("step", 0), p["window_size"]
    contradictions = [
        ("window", p.get("window", 0) <= step, "more windows of this epoch than steps"),
        ("epoch", p.get("epoch", 0) <= step, "more epochs done than steps"),
        ("samples", p.get("samples", 0) <= step * window_size, f"more than {window_size} samples a step"),
        ("interval_samples", p.get("interval_samples", 0) <= p.get("samples", 0), "more than all the samples"),
        ("stale_evals", p.get("stale_evals", 0) <= step, "more evaluations than steps"),
        ("halvings", p.get("halvings", 0) <= window_size.bit_length(),
         f"more halvings than a micro-batch of at most {window_size} allows"),
        ("micro_batch", p["micro_batch"] <= window_size, f"above the effective batch {window_size}"),
    ]
    for name, holds, why in contradictions:
        if not holds:
            return f"its progress field {name} is {p.get(name, 0)} at step {step}: {why}"
    marks = [*p.get("best", []), *([p["early_best"]] if p.get("early_best") is not None else [])]
    later = [m[0] for m in marks if not 0 <= m[0] <= step]
    if later:
        return f"its progress holds a best or early_best evaluation at step {str(later[0])[:40]}, not in 0-{step}"
    top, begun = state.get("step", step), state.get("epoch", 0)  # checkpoint_state's copies, beside the progress
    if isinstance(top, bool) or not isinstance(top, int) or top != step:
        return f"its step is {str(top)[:40]}, its progress's {step}"
    if isinstance(begun, bool) or not isinstance(begun, int) or not 0 <= begun <= p.get("epoch", 0) + 1:
        return f"its epoch is {str(begun)[:40]}, its progress's {p.get('epoch', 0)} (done) and one begun at most"
    return None


# What a checkpoint's own config may differ in from its run's config file: an extension (lib/extension.py) raises
# the run's EPOCHS or MAX_STEPS, and its finished checkpoint, kept as a periodic one, holds the config before.
EXTENDED = ("CONFIG_EPOCHS", "CONFIG_MAX_STEPS")


def run_config(run_dir: Path) -> str | None:
    """The training math of a run directory's config file as text, None where it cannot judge a checkpoint:
    missing, a link, unreadable, or holding no setting."""
    path = Path(run_dir) / "config"
    try:
        if path.is_symlink() or not path.is_file():
            return None
        text = fileio.read_text(path, follow_symlinks=False)
    except (OSError, UnicodeDecodeError):
        return None
    return text if resumable.training_identity(text) else None


def run_config_problem(state: dict, path: Path | None) -> str | None:
    """A checkpoint (at `path`) whose own config differs in training math from its run's config file (another
    model named there, say: the tensors would be trained by this run's math all the same), beyond what an
    extension changes; symbols that file lacks (cut short) are not compared. None when it agrees, or when there
    is nothing to compare (no path, no config in the checkpoint, a run config that cannot judge: run_config)."""
    if path is None or "config" not in state:
        return None
    if not isinstance(state["config"], str):
        return f"its config is a {type(state['config']).__name__}, not the text of a .config"
    reference = run_config(checkpoint.run_of(path))
    if reference is None:
        return None
    present = {line.split("=", 1)[0] if "=" in line else line[2:-len(" is not set")]
               for line in resumable.training_identity(reference)}
    differences = [d for d in resumable.identity_differences(state["config"], reference)
                   if d.split(":", 1)[0] in present and d.split(":", 1)[0] not in EXTENDED]
    if not differences:
        return None
    more = f"; {len(differences) - 2} more" if len(differences) > 2 else ""
    return (f"its config differs from its run's in training math ({'; '.join(differences[:2])}{more}; "
            "'there' is the checkpoint's, 'here' the run's config file)")


def model_problem(state: dict, model: torch.nn.Module) -> str | None:
    """Whether a checkpoint's model state is this model's, by the names and shapes of its tensors, before
    anything is loaded: a checkpoint of another model (another preset, vocabulary or architecture) is named
    with its first difference, as a corrupt one is. A sharded checkpoint is checked as it loads."""
    if state.get("sharded"):
        return None
    saved = state["model"]
    not_tensors = [name for name, value in saved.items() if not isinstance(value, torch.Tensor)]
    if not_tensors:
        value = saved[not_tensors[0]]
        return f"its model tensor {not_tensors[0]} is a {type(value).__name__}, not a tensor"
    ours = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    elsewhere = getattr(model, "pipeline_elsewhere", frozenset())  # the other pipeline stages' tensors
    differences = [f"{name}: {list(saved[name].shape)} there, {list(shape)} here"
                   for name, shape in ours.items() if name in saved and tuple(saved[name].shape) != shape]
    differences += [f"{name}: in this model, not there" for name in ours if name not in saved]
    differences += [f"{name}: there, not in this model" for name in saved if name not in ours
                    and name not in elsewhere]
    if not differences:
        return None
    more = f"; {len(differences) - 1} more" if len(differences) > 1 else ""
    return f"it is a checkpoint of another model ({differences[0]}{more})"


def _named_optimizer_state(raw: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() of an unsharded run (parameters numbered in group order) keyed by parameter
    name instead, the form set_state_dict takes: the live optimizer's groups list the same parameters
    in the same order (lib.step.make_optimizer), so number i is the name of its i-th parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    # a pipeline stage's optimizer holds its parameters only: the file numbers the whole model's, in the order
    # the whole model's optimizer listed them (lib/pipeline.py keep_stages kept it)
    order = getattr(model, "pipeline_optimizer_order", None) or [
        names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    ours = set(names.values())
    state = {order[int(i)]: v for i, v in raw["state"].items() if order[int(i)] in ours}
    groups = [{**g, "params": [order[int(i)] for i in g["params"] if order[int(i)] in ours]}
              for g in raw["param_groups"]]
    return {"state": state, "param_groups": groups}


def load_state(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, device: torch.device, path=None, sharded: bool = False) -> Progress:
    """Put a checkpoint's tensors and RNG states back in place; returns where the run stood. The checkpoint
    was checked against the model, optimizer, scaler and device first (verify.state_problem): torch trusts it.

    A checkpoint of either kind fits a model of either kind: a sharded checkpoint (state["sharded"],
    at `path`) is resharded to this run's processes by torch.distributed.checkpoint (into a whole
    model in a single process); a single file is loaded whole and, for a sharded model (`sharded`),
    cut into this process's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if state.get("sharded"):
        flat = flat_optimizer(path)
        tensors = sharded_tensors(model, optimizer, flat)
        checkpoint.load_sharded_tensors(path, tensors)
        set_state_dict(model, optimizer, model_state_dict=tensors["model"], optim_state_dict=tensors["optimizer"],
                       options=StateDictOptions(flatten_optimizer_state_dict=flat))
    elif sharded:
        ours = model.state_dict()  # a pipeline stage's part of the whole model the file holds
        set_state_dict(model, optimizer, model_state_dict={k: v for k, v in state["model"].items() if k in ours},
                       optim_state_dict=_named_optimizer_state(state["optimizer"], model, optimizer),
                       options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:  # empty: saved by a scaler that was off (an enabled one refuses it with a traceback)
        scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"], device)
    return Progress(**state["progress"])


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


MIN_AUTO_INTERVAL_S = 60.0  # more often, a save can cost more than the work it keeps


def auto_interval_s(config: Config, predicted_run_seconds: float | None) -> float:
    """CHECKPOINT_INTERVAL_AUTO's seconds between checkpoints: CHECKPOINT_MINUTES, or less where the plan
    predicts the run's time, so that a crash loses at most CHECKPOINT_LOST_WORK_PERCENT of it."""
    interval = 60.0 * (config.checkpoint_minutes or 10)
    if predicted_run_seconds and config.checkpoint_lost_work_percent:
        share = predicted_run_seconds * config.checkpoint_lost_work_percent / 100
        interval = min(interval, max(MIN_AUTO_INTERVAL_S, share))
    return interval


def checkpoint_due(config: Config, step: int, last_checkpoint: float, seconds: float | None) -> bool:
    """Whether a periodic checkpoint is due after `step`: every CHECKPOINT_EVERY_STEPS steps, or `seconds`
    (AUTO's interval, or the low-battery one) after `last_checkpoint`, a perf_counter() time."""
    if seconds is not None and time.perf_counter() - last_checkpoint >= seconds:
        return True
    return config.checkpoint_interval == "steps" and step % config.checkpoint_every_steps == 0


# --------------------------------------------------------------------------
# Stopping on a signal


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT stopped training after a checkpoint was saved; exit_code is 128 + the signal."""

    def __init__(self, signum: int, step: int, path: Path | None) -> None:
        self.signum, self.step, self.path, self.exit_code = signum, step, path, 128 + signum
        super().__init__(f"{signal.Signals(signum).name} at step {step}")


# Exit codes of a run that stopped itself after a checkpoint, for 'make train' to return (README's table).
DEVICE_LOST_EXIT = 3  # the training device failed for good (ECC, lost, launch failure)
BATTERY_EXIT = 4  # on battery below CONFIG_BATTERY_LOW_PERCENT with CONFIG_BATTERY_STOP


class StoppedToResume(TrainingInterrupted):
    """Training stopped itself, after a checkpoint where it could: the message says why and how to resume.
    A TrainingInterrupted, so the command line returns `exit_code` as it does after SIGTERM."""

    def __init__(self, message: str, step: int, path: Path | None, exit_code: int) -> None:
        KeyboardInterrupt.__init__(self, message)
        self.signum, self.step, self.path, self.exit_code = None, step, path, exit_code


def resume_command(config: Config, run_dir: Path | None = None) -> str:
    """The command that continues this run: the config file it was read from, unless it is ./.config,
    and RESUME=1 when CONFIG_RESUME is off; RESUME_FROM=<run_dir> for a run started from INIT_FROM's
    weights, which the resume search passes by."""
    command = "make train"
    if config.source and Path(config.source).resolve() != Path(".config").resolve():
        command += f" KCONFIG_CONFIG={shlex.quote(str(config.source))}"
    command += "".join(f" {shlex.quote(s)}" for s in _one_off(config))
    if run_dir is not None and (Path(run_dir) / checkpoint.INIT_RECORD).is_file():
        return command + f" RESUME_FROM={shlex.quote(str(run_dir))}"
    return command + ("" if config.resume else " RESUME=1")


def _one_off(config: Config) -> list[str]:
    """The command line's one-off settings this run trains with (EPOCHS=60 where the config file says 40): the
    resume command repeats them, since the file alone describes another run."""
    from ..resumable import one_off_settings

    try:
        text = Path(config.source).read_text() if config.source else None
    except (OSError, UnicodeDecodeError):
        return []
    return (one_off_settings(config.text, text) or []) if text is not None else []


class StopSignals:
    """Catches SIGTERM and SIGINT while installed: `received` is the signal, for the loop to stop at the
    next step boundary; a second Ctrl-C raises KeyboardInterrupt at once, without a checkpoint."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict = {}

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.received = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.previous = {}  # signal handlers can only be installed from the main thread (HPO may use others)
            return
        self.previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
