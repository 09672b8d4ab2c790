"""make train EXTEND_EPOCHS=N / EXTEND_STEPS=N: a finished run continued from its last checkpoint.

The run keeps what it has and adds to it. Its finished checkpoint stays, as `final-<step>.pt` (a hard link: no
copy, no extra disk), and also becomes `checkpoint-<step>.pt`, the periodic checkpoint the usual resume takes;
`checkpoint.pt` goes, so the run is an unfinished run of its extended config, which its `config` file now
holds, and `make train` with that config resumes it if the extension is interrupted. metrics.jsonl gets an
`extended` event and then the new steps' lines. The schedule spans the new total: the learning rate at the
step the run continues from is the extended schedule's (for cosine, higher than where the run ended).

EXTEND_EPOCHS=N: CONFIG_EPOCHS grows by N and CONFIG_MAX_STEPS, where the run had one, is lifted (the run
trains to the end of its new last epoch). EXTEND_STEPS=N: CONFIG_MAX_STEPS becomes the steps done plus N,
with CONFIG_EPOCHS raised where that many would end the run sooner.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from .redact import shown
from . import checkpoint, fileio
from .config import Config, config_from_text, derive
from .errors import KfitError

EPOCHS_MAX = 100000  # CONFIG_EPOCHS's range


def kept_path(run_dir: Path, step: int, sharded: bool) -> Path:
    """Where a finished checkpoint is kept when its run is extended: no name the rotation or the resume
    search takes."""
    return Path(run_dir) / f"final-{step}{checkpoint.SHARDED_SUFFIX if sharded else '.pt'}"


def _link_tree(source: Path, target: Path) -> None:
    """target as a hard-linked copy of source: a file, or a sharded checkpoint's directory of files."""
    if source.is_dir():
        target.mkdir()
        for child in sorted(source.iterdir()):
            _link_tree(child, target / child.name)
    else:
        os.link(source, target, follow_symlinks=False)


def extend(run_dir: Path, *, epochs: int | None, steps: int | None, log=print) -> Config:
    """Make the finished run in `run_dir` an unfinished run of its config extended by `epochs` or `steps`;
    returns that config (its OUTPUT_DIR and RUN_NAME naming the run, RESUME on). Refusals are KfitErrors
    naming the fix; nothing is changed by one."""
    from .trainer.windows import epoch_micro_batches

    run_dir = Path(run_dir).expanduser()
    what = f"RUN={run_dir}"
    if (epochs is None) == (steps is None):
        raise KfitError("give one of EXTEND_EPOCHS= and EXTEND_STEPS=, not both")
    if not run_dir.is_dir() or not (run_dir / "config").is_file():
        raise KfitError(f"{what} is not a run directory (no config there): name a finished run under "
                        "CONFIG_OUTPUT_DIR to extend")
    final = checkpoint.finished_checkpoint(run_dir)
    if final is None:
        raise KfitError(f"{what} has not finished (no {checkpoint.FINAL}): 'make train' resumes an unfinished run; "
                        "EXTEND_EPOCHS= continues a finished one")
    holder = fileio.lock_holder(run_dir)
    if holder is not None:
        raise checkpoint.in_use_error(run_dir, holder)
    try:
        fileio.refuse_link(final)
        state = checkpoint.load_checkpoint(final)
        progress, saved_text = state["progress"], state["config"]
        step, epoch, window = int(progress["step"]), int(progress["epoch"]), int(progress["window_size"])
        fileio.refuse_link(run_dir / "config")
        run_text = fileio.read_text(run_dir / "config")
    except (OSError, KeyError, TypeError, ValueError, RuntimeError, UnicodeDecodeError) as err:
        raise KfitError(f"{what}: its final checkpoint {final.name} or config cannot be read "
                        f"({type(err).__name__}: {shown(' '.join(str(err).split()), 120)}): extend another run, or "
                        f"start a new one from its weights with INIT_FROM={final}") from None
    if run_text != saved_text:
        log(f"note: {run_dir / 'config'} differs from the config {final.name} was trained with: extending the "
            "checkpoint's")
    config = config_from_text(saved_text, str(run_dir / "config"))
    sharded = final.is_dir()
    if epochs is not None:
        changes: dict[str, object] = {"EPOCHS": min(EPOCHS_MAX, config.epochs + epochs), "MAX_STEPS": 0}
        said = f"{epochs} more epoch(s): CONFIG_EPOCHS {config.epochs} -> {changes['EPOCHS']}"
    else:
        target = step + steps
        changes = {"MAX_STEPS": target}
        samples = _train_samples(config)
        if samples is not None:  # a stream's passes have no length: CONFIG_EPOCHS stays its cap
            per_epoch = max(1, len(epoch_micro_batches(samples, window, 0, 0)))
            changes["EPOCHS"] = min(EPOCHS_MAX, max(config.epochs, math.ceil(target / per_epoch)))
        said = f"{steps} more step(s): CONFIG_MAX_STEPS {config.max_steps or 'none'} -> {target}"
    extended = derive(config, {**changes, "OUTPUT_DIR": str(run_dir.parent), "RUN_NAME": run_dir.name,
                               "RESUME": True})
    # the run's files, in an order a kill at any point leaves resumable: the kept copy, the periodic one,
    # the extended config, the record; the finished checkpoint last
    kept, periodic = kept_path(run_dir, step, sharded), checkpoint.periodic_path(run_dir, step, sharded)
    # the record opened first, as the trainer opens it: a link, a special file or a file with other hard links
    # planted at metrics.jsonl (a shared OUTPUT_DIR) is refused before the run is changed at all
    with fileio.open_append(run_dir / "metrics.jsonl", owned=True) as metrics:
        for link in (kept, periodic):
            if not os.path.lexists(link):
                _link_tree(final, link)
        fileio.write_atomic(run_dir / "config", extended.text.encode(), follow_symlinks=False)
        metrics.write(json.dumps({"event": "extended", "message": f"Extended at step {step} (epoch {epoch}) by "
                                  f"{said}; {final.name} kept as {kept.name}", "step": step,
                                  "epochs": [config.epochs, extended.epochs],
                                  "max_steps": [config.max_steps, extended.max_steps], "kept": kept.name,
                                  "time": round(time.time(), 3)}) + "\n")
    checkpoint.remove(final)
    log(f"Extending {run_dir} from step {step} by {said} ({final.name} kept as {kept.name})")
    return extended


def _train_samples(config: Config) -> int | None:
    """The training split's samples (None for a stream, which has no length)."""
    from .data.stream import StreamSplit
    from .task import load_task

    split = load_task(config).train
    return None if isinstance(split, StreamSplit) else len(split)
