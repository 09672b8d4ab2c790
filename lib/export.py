"""One file of weights from any run: `make export RUN=<run dir or checkpoint>`.

A run's checkpoints are for continuing it (optimizer state, RNG, position)
and, for a sharded run, spread over one file per process. Export writes what
using the model needs: model.safetensors, the whole model's state_dict
(`safetensors.torch.load_file`, then `load_state_dict` into the model the run's
config builds: `load_exported`), with the run's config and plan beside it.
Sharded checkpoints are consolidated in this one process by
torch.distributed.checkpoint, without a process group.

safetensors refuses tensors that share memory; GPT-2's output layer shares its
token embedding, so each such alias is written as its own copy (GPT-2 124M: its
154 MB embedding twice) and every key loads with strict=True into any model,
tied or not, without a loader of kfit's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import os
import sys
import tempfile
from pathlib import Path

import torch

from . import checkpoint, fileio
from .data.run_tokenizer import HASH_FILE, TOKENIZER_FILE, choose_tokenizer, hash_record, sha256_hex
from .errors import KfitError
from .redact import shown
from .fileio import UnsafeFileError, refuse_linked_components, write_atomic, write_target

MODEL_FILE = "model.safetensors"


def checkpoint_of(run: Path) -> Path:
    """The checkpoint a path names: itself, or a run directory's finished one, else its newest periodic one."""
    run = Path(run)
    if run.is_file() or checkpoint.is_sharded_checkpoint(run):
        if not run.exists():
            raise KfitError(f"{shown(run)} does not exist")
        return run
    if not run.is_dir():
        kind = fileio.what_is(run)
        if kind not in (None, fileio.MISSING):  # a FIFO, a dangling or looping link: said as it is
            raise KfitError(f"RUN={shown(run)} is {kind}: name a run directory or a checkpoint file")
        raise KfitError(f"RUN={shown(run)}: no such run directory or checkpoint (runs are under CONFIG_OUTPUT_DIR)")
    found = checkpoint.finished_checkpoint(run) or next((p for _, p in checkpoint.periodic_checkpoints(run)), None)
    if found is None:
        raise KfitError(f"{shown(run)} holds no checkpoint: it is not a run directory, or the run saved none yet")
    return found


def read_checkpoint(path: Path) -> dict:
    try:
        state = checkpoint.load_checkpoint(path, verify=True)  # a damaged file is never exported or started from
    except checkpoint.DamagedCheckpoint as err:
        raise KfitError(f"{shown(path)} is damaged ({err}): name another checkpoint of the run") from None
    except Exception as err:  # noqa: BLE001 - any unreadable checkpoint is the user's file to fix
        raise KfitError(f"{shown(path)} cannot be read ({type(err).__name__}: {shown(' '.join(str(err).split()), 160)})") from None
    if not isinstance(state, dict) or not (state.get("sharded") or isinstance(state.get("model"), dict)):
        raise KfitError(f"{shown(path)} is not a kfit checkpoint (it holds no model state)")
    return state


def model_state(path: Path, state: dict | None = None) -> dict[str, torch.Tensor]:
    """The whole model's state_dict from a checkpoint of either kind (`state`: its contents, already read)."""
    state = state if state is not None else read_checkpoint(path)
    if not state.get("sharded"):
        return _finite(state["model"], path)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:  # DCP's own consolidation, then only the model's part
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(str(path), str(whole))
        return _finite(torch.load(whole, map_location="cpu", weights_only=True)["model"], path)


def _finite(weights, path: Path):
    """`weights` unless one holds a NaN or an infinity, which no trained model does: a run that diverged, or a
    file changed after it was written (its CRCs rewritten too). Exported or sampled, it would give garbage
    without a word."""
    for name, tensor in weights.items() if isinstance(weights, dict) else ():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise KfitError(f"{shown(path)}: its weight {shown(name, 80)} holds NaN or infinite values (the run "
                            "diverged, or the file was changed after it was written): name an earlier checkpoint "
                            "(RUN=<run>/checkpoint-<step>.pt)")
    return weights


def export(run: Path, out: Path | None = None, log=lambda line: print(line, file=sys.stderr)) -> Path:
    """Write model.safetensors, config and plan.json of a run's checkpoint into `out` (default: the run
    directory's export/), and the run's tokenizer.json with its sha256 where it has one; returns the model
    file's path. Every failure is a KfitError in one line: a checkpoint a live run rotated away while it was
    read is looked up once more, then the run is said to be live; an output the OS refuses names the path and
    the reason. `log` takes a warning line (a tokenizer found only in the corpus directory)."""
    path, state = _settled(Path(run))
    weights = _model_of(path, state)  # weights that are not a model's are refused before OUT is touched
    tokenizer, warning = _tokenizer_of(path, state["config"])
    out = Path(out) if out else (path.parent / "export")
    try:
        if out.exists() and not out.is_dir():
            raise KfitError(f"OUT={out} is a file, not a directory: name a directory (created when missing)")
        refuse_linked_components(out, path.parent)  # never into a link planted in (or as) the export directory
        out.mkdir(parents=True, exist_ok=True)
    except UnsafeFileError:
        raise  # names the link as it is
    except OSError as err:
        raise _refused(out, err) from None
    with _export_lock(out):
        try:
            names = (MODEL_FILE, "config", "plan.json") + ((TOKENIZER_FILE, HASH_FILE) if tokenizer is not None else ())
            for name in names:  # every file checked before the first is written: a refusal leaves OUT as it was
                write_target(out / name)
            for name in (MODEL_FILE, "config", "plan.json", TOKENIZER_FILE, HASH_FILE):  # a killed export's
                for stale in out.glob(f".{name}.*.tmp"):
                    stale.unlink(missing_ok=True)
            save_weights(out / MODEL_FILE, weights,
                         {"kfit.checkpoint": str(path), "kfit.step": str(state.get("step", ""))})
            checkpoint.write_text_atomic(out / "config", state["config"])
            checkpoint.write_text_atomic(out / "plan.json", json.dumps(state["plan"], indent=2, sort_keys=True) + "\n")
            if tokenizer is not None:  # a model of a tokenized corpus: make sample decodes with it
                write_atomic(out / TOKENIZER_FILE, tokenizer, follow_symlinks=False)
                write_atomic(out / HASH_FILE, hash_record(sha256_hex(tokenizer)), follow_symlinks=False)
        except UnsafeFileError:  # a link or special file planted in OUT: named as it is, nothing written through
            raise
        except OSError as err:
            raise _refused(out, err) from None
    if warning:
        log(warning)
    return out / MODEL_FILE


def _tokenizer_of(path: Path, config_text: str) -> tuple[bytes | None, str | None]:
    """(the tokenizer.json a run trained with, or None for a model without one; a warning or None): the run
    directory's copy, else its tokenized corpus's (CONFIG_DATA_DIR of its config), refused when its sha256
    is not the one the run recorded (lib/data/run_tokenizer.py)."""
    found = re.search(r'^CONFIG_DATA_DIR="(.*)"$', config_text, re.MULTILINE)
    data_dir = None
    if found and re.search(r"^CONFIG_DATASET_DIR=y$", config_text, re.MULTILINE):
        data_dir = Path(re.sub(r"\\(.)", r"\1", found.group(1))).expanduser()  # Kconfig's escapes undone
    chosen = choose_tokenizer([checkpoint.run_of(path)], data_dir)
    return (chosen.data, chosen.warning) if chosen is not None else (None, None)


def _settled(run: Path) -> tuple[Path, dict]:
    """(the checkpoint, its contents) of a run; a run directory whose chosen checkpoint vanished while it was
    read (a live run rotating its checkpoints) is looked up again once."""
    for attempt in (1, 2):
        try:
            path = checkpoint_of(run)
        except OSError as err:  # a name the OS refuses (too long, a loop of links, no permission)
            raise KfitError(f"RUN={run} cannot be read ({err.strerror or err})") from None
        try:
            state = read_checkpoint(path)
            if not isinstance(state.get("config"), str) or not isinstance(state.get("plan"), dict):
                raise KfitError(f"{shown(path)} is not a kfit checkpoint (it holds no config and plan): export a checkpoint "
                                "kfit wrote")
            return path, state
        except KfitError:
            if not run.is_dir() or path.exists() or checkpoint.is_sharded_checkpoint(path):
                raise
            if attempt == 2:
                raise KfitError(f"RUN={run} is training now: its checkpoints were replaced twice while being read; "
                                "export it when it stops, or name one checkpoint (RUN=<run>/checkpoint.pt)") from None
    raise AssertionError("unreachable")


def _model_of(path: Path, state: dict) -> dict[str, torch.Tensor]:
    return model_state(path, state)


def _refused(out: Path, err: OSError) -> KfitError:
    where = err.filename or out
    return KfitError(f"OUT={out}: cannot write the export ({err.strerror or err} at {where}): name a writable "
                     "directory with room for the model")


@contextlib.contextmanager
def _export_lock(out: Path):
    """The export directory held by this export (a lock on the directory itself, no file of its own): two exports
    into one directory never sweep each other's temporaries."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise KfitError(f"OUT={out}: another export is writing there now: wait for it, or name another "
                            "directory") from None
        yield
    finally:
        os.close(fd)


def save_weights(path: Path, weights: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A state_dict as one safetensors file, written atomically; aliased tensors as copies (the docstring)."""
    from safetensors.torch import save

    seen: set[tuple[int, int]] = set()
    plain = {}
    for name, tensor in weights.items():
        tensor = tensor.detach().cpu()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        plain[name] = tensor.clone() if key in seen or not tensor.is_contiguous() else tensor
        seen.add(key)
    write_atomic(path, save(plain, metadata=metadata), follow_symlinks=False)


def weights_of(source: Path) -> tuple[dict[str, torch.Tensor], Path, int | None]:
    """(the model's state_dict, the file it came from, its step or None) from a run directory (its finished
    checkpoint, else its newest periodic one), a checkpoint of either kind, an exported model.safetensors or
    the export directory holding one."""
    source = Path(source)
    if source.is_dir() and not checkpoint.is_sharded_checkpoint(source) and (source / MODEL_FILE).is_file():
        source = source / MODEL_FILE
    if source.suffix == ".safetensors":
        from safetensors import safe_open

        weights = load_exported(source)
        with safe_open(str(source), "pt") as f:
            step = (f.metadata() or {}).get("kfit.step", "")
        return weights, source, int(step) if step.isdigit() else None
    path = checkpoint_of(source)
    state = read_checkpoint(path)  # a sharded one: only its extra part, the step
    step = state.get("step")
    return model_state(path, state), path, step if isinstance(step, int) else None


def load_exported(path: Path) -> dict[str, torch.Tensor]:
    """The state_dict an export wrote (model.safetensors), on the CPU."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file is the user's to fix
        raise KfitError(f"{path} is not a safetensors file kfit can read ({type(err).__name__}: "
                        f"{shown(' '.join(str(err).split()), 160)}): export the run again with make export") from None
