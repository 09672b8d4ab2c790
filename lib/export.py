"""One file of weights from any run: `make export RUN=<run dir or checkpoint>`.

A run's checkpoints are for continuing it (optimizer state, RNG, position)
and, for a sharded run, spread over one file per process. Export writes what
using the model needs: model.pt, the whole model's state_dict (loadable with
`torch.load(..., weights_only=True)` into the model the run's config builds),
with the run's config and plan beside it. Sharded checkpoints are consolidated
in this one process by torch.distributed.checkpoint, without a process group.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from . import checkpoint
from .errors import KfitError

MODEL_FILE = "model.pt"


def checkpoint_of(run: Path) -> Path:
    """The checkpoint a path names: itself, or a run directory's finished one, else its newest periodic one."""
    run = Path(run)
    if run.is_file() or checkpoint.is_sharded_checkpoint(run):
        if not run.exists():
            raise KfitError(f"{run} does not exist")
        return run
    if not run.is_dir():
        raise KfitError(f"RUN={run}: no such run directory or checkpoint (runs are under CONFIG_OUTPUT_DIR)")
    found = checkpoint.finished_checkpoint(run) or next((p for _, p in checkpoint.periodic_checkpoints(run)), None)
    if found is None:
        raise KfitError(f"{run} holds no checkpoint: it is not a run directory, or the run saved none yet")
    return found


def model_state(path: Path) -> dict[str, torch.Tensor]:
    """The whole model's state_dict from a checkpoint of either kind."""
    try:
        state = checkpoint.load_checkpoint(path)
    except Exception as err:  # noqa: BLE001 - any unreadable checkpoint is the user's file to fix
        raise KfitError(f"{path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:160]})") from None
    if not state.get("sharded"):
        return state["model"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:  # DCP's own consolidation, then only the model's part
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(str(path), str(whole))
        return torch.load(whole, map_location="cpu", weights_only=True)["model"]


def export(run: Path, out: Path | None = None) -> Path:
    """Write model.pt, config and plan.json of a run's checkpoint into `out` (default: the run directory's
    export/); returns the model file's path."""
    path = checkpoint_of(run)
    weights = model_state(path)
    meta = checkpoint.load_checkpoint(path)
    out = Path(out) if out else (path.parent / "export")
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.save_checkpoint(out / MODEL_FILE, weights)
    checkpoint.write_text_atomic(out / "config", meta["config"])
    checkpoint.write_text_atomic(out / "plan.json", json.dumps(meta["plan"], indent=2, sort_keys=True) + "\n")
    return out / MODEL_FILE
