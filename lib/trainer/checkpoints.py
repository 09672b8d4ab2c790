"""Checkpoints of a run: saving (one file from rank 0, or torch.distributed.checkpoint shards from every rank of
a sharded run), restoring, the best-k checkpoints and early stopping (best.py), and the stops that save first.

What a checkpoint holds, and how its tensors and RNG states go back, is resume.py's (checkpoint_state,
load_state); the files themselves are lib/checkpoint.py's. Periodic checkpoints are kept CONFIG_CHECKPOINT_KEEP
deep; a finished run's final checkpoint supersedes them. A stop signal (SIGTERM/SIGINT) or a device that
failed for good (exit 3) saves the last completed step's state where it can and says how to resume.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from ..redact import shown
from .. import checkpoint, distributed, fileio
from ..config import Config
from ..distributed import Rank
from ..errors import KfitError
from ..hardware import HardwareProfile
from . import best
from .engine import Engine
from .recovery import Recovery
from .resume import (DEVICE_LOST_EXIT, StoppedToResume, TrainingInterrupted, checkpoint_problem, checkpoint_state,
                     load_state, model_problem, resume_command, sharded_tensors)
from .rundir import RunDirectory
from .verify import state_problem


class Checkpoints:
    """Saves and restores the engine's tensors with the recovery's Progress and plan. `elapsed()`: the run's
    training seconds so far; `event(kind, message, **data)` reports."""

    def __init__(self, config: Config, hardware: HardwareProfile, rank: Rank, directory: RunDirectory,
                 engine: Engine, recovery: Recovery, *, elapsed: Callable[[], float], event: Callable[..., None],
                 log: Callable[[str], None], lower_is_better: bool = True) -> None:
        self.config, self.hardware, self.rank, self.directory = config, hardware, rank, directory
        self.lower_is_better = lower_is_better  # of CONFIG_CHECKPOINT_BEST_METRIC (best.check_metric)
        self.engine, self.recovery, self.elapsed, self.event, self.log = engine, recovery, elapsed, event, log
        self.last_checkpoint = time.perf_counter()
        self.saved_step: int | None = None  # the step of the last periodic checkpoint

    @property
    def sharded(self) -> bool:
        return self.engine.sharded

    @property
    def saves(self) -> bool:
        """Whether this rank takes part in saving: rank 0, or every rank of a sharded run."""
        return self.rank.is_main or self.sharded

    def epochs_begun(self) -> int:
        p = self.recovery.progress
        return min(p.epoch + (p.window > 0), self.config.epochs)

    # -- saving --------------------------------------------------------------------

    def save(self, path: Path, final_eval: dict | None = None, keep: int = 0, final: bool = False) -> Path:
        """Rank 0 writes the checkpoint file; under FSDP every rank calls this and writes its shards.
        `keep`: a periodic checkpoint, after which the newest `keep` are kept (save_periodic prunes). Out of
        room, the oldest periodic checkpoints go first while the newest stays (checkpoint.room_maker);
        `final`: the finished run's, which may replace the newest periodic one."""
        engine, run_dir = self.engine, self.directory.path
        state = checkpoint_state(
            model=None if self.sharded else engine.model, optimizer=None if self.sharded else engine.optimizer,
            scaler=engine.scaler, device=engine.device,
            progress={**asdict(self.recovery.progress), "elapsed_s": self.elapsed()},
            epoch=self.epochs_begun(), final_eval=final_eval, config=self.config, plan=self.recovery.plan,
            hardware=self.hardware)
        if self.sharded:
            checkpoint.save_sharded(path, sharded_tensors(engine.model, engine.optimizer), state,
                                    is_main=self.rank.is_main, barrier=torch.distributed.barrier)
        else:
            # short of room: the oldest rotated checkpoints go first, whatever CHECKPOINT_KEEP, never the newest
            # (a best-<step> one is never touched); the final checkpoint may replace the newest periodic one
            checkpoint.save_run_checkpoint(path, state, room_maker(run_dir, path, final, self.log))
        return path

    def save_periodic(self) -> Path:
        step = self.recovery.progress.step
        path = self.save(checkpoint.periodic_path(self.directory.path, step, self.sharded),
                         keep=self.config.checkpoint_keep)
        self.directory.prune_periodic(self.config.checkpoint_keep)
        self.last_checkpoint, self.saved_step = time.perf_counter(), step
        return path

    def save_final(self, final_eval: dict) -> Path:
        path = self.save(checkpoint.final_path(self.directory.path, self.sharded), final_eval, final=True)
        self.directory.drop_periodic()  # the finished run's checkpoint supersedes them
        return path

    def judge(self, entry: dict, final: bool = False) -> bool:
        """After an evaluation: save it as a best-<step> checkpoint when it is among the best k, and say whether
        early stopping ends the run (best.py). Rank 0 judges and every rank follows: a sharded save needs all
        of them. The final evaluation only ranks (under DDP only rank 0 reaches it)."""
        config, p = self.config, self.recovery.progress
        if not (config.checkpoint_best_keep or config.early_stop_patience):
            return False
        verdict = best.judge(config, p, entry["step"], entry, self.lower_is_better) if self.rank.is_main else None
        if not final or self.sharded:
            verdict = distributed.broadcast(verdict)
        entered, stop = verdict
        if entered and self.saves:
            metrics = {k: v for k, v in entry.items() if k not in ("step", "epoch", "final")}
            path = self.save(checkpoint.best_path(self.directory.path, p.step, self.sharded), metrics)
            if self.rank.is_main:
                self.directory.prune_best([step for step, _ in p.best])
                metric = config.checkpoint_best_metric
                self.event("best_checkpoint", f"Best checkpoint: {path.name} ({metric} {entry[metric]:.4g}; "
                           f"keeping the best {config.checkpoint_best_keep})", path=str(path),
                           metric=metric, value=entry[metric])
        if stop is None or final:
            return False
        if self.rank.is_main:
            self.event("early_stop", stop, metric=config.checkpoint_best_metric,
                       best_step=p.early_best[0], best_value=p.early_best[1])
        return True

    # -- restoring -------------------------------------------------------------------

    def restore(self, chosen: Path | None = None, marker: dict | None = None) -> Path | None:
        """Continue the run in the run directory from `chosen` (RESUME_FROM's, checked), else its newest
        checkpoint that is intact and fits (`fits`: a damaged one is named in one warning, renamed to
        <name>.damaged and the previous one taken); then a relaunch's out-of-memory `marker`
        (checkpoint.read_oom_marker's, checked). Returns the checkpoint resumed, or None."""
        run_dir, engine = self.directory.path, self.engine
        if chosen is not None:
            found = (chosen, self.chosen_state(chosen))
        else:
            found = checkpoint.latest_valid(run_dir, self.log, self.fits, aside=self.rank.is_main)
        if found is None and marker is None:
            self.log(f"warning: no readable checkpoint in {run_dir}: starting a fresh run in a new directory")
            return None
        path = None
        if found is not None:
            path, state = found
            progress = load_state(state, engine.model, engine.optimizer, engine.scaler, engine.device, path=path,
                                  sharded=self.sharded)
            # a scaler the fp16 rung enabled on the same kind of device: its scale back
            if self.recovery.resumed(progress, state.get("plan")) and state["scaler"] and engine.scaler.is_enabled():
                engine.scaler.load_state_dict(state["scaler"])
            self.directory.drop_later(progress.step, [step for step, _ in progress.best], path)
        # without a checkpoint: out of memory before the first, restarted here
        self.recovery.apply_marker(marker)
        return path

    def fits(self, state: dict, path: Path) -> str | None:
        """What keeps a loaded checkpoint from going into this run (a wrong file, a checkpoint of another model,
        a tensor, RNG or scaler state that does not fit: verify.py), None when every part fits."""
        engine = self.engine
        return (checkpoint_problem(state) or model_problem(state, engine.model)
                or state_problem(state, path, engine.model, engine.optimizer, engine.scaler, engine.device))

    def chosen_state(self, chosen: Path) -> dict:
        """RESUME_FROM's checkpoint, read and checked as `fits` checks one; what is wrong is one KfitError
        naming it (the user named it: nothing is renamed)."""
        run_dir = self.directory.path
        try:
            state = checkpoint.load_checkpoint(chosen, verify=True)
        except checkpoint.DamagedCheckpoint as err:
            raise KfitError(f"RESUME_FROM={chosen} is damaged ({err}): name another checkpoint, or the run "
                            f"directory ({run_dir}) for its newest intact one") from None
        except Exception as err:  # noqa: BLE001 - any unreadable file is the user's to replace
            raise KfitError(f"RESUME_FROM={chosen} cannot be read ({type(err).__name__}: "
                            f"{shown(' '.join(str(err).split()), 120)}): name another checkpoint, or the run directory "
                            f"({run_dir}) for its newest readable one") from None
        wrong = checkpoint_problem(state)
        if wrong is not None:
            raise KfitError(f"RESUME_FROM={chosen} is not a kfit checkpoint ({wrong}): name a checkpoint-<step>.pt "
                            "of a run, or its directory")
        wrong = model_problem(state, self.engine.model)
        if wrong is not None:
            raise KfitError(f"RESUME_FROM={chosen} does not fit this config's model ({wrong}): name a "
                            "checkpoint of this model (the same preset, vocabulary, CONFIG_PAD_VOCAB and block "
                            "size), or start a new run from it with INIT_FROM")
        wrong = self.fits(state, chosen)
        if wrong is not None:
            raise KfitError(f"RESUME_FROM={chosen} is damaged ({wrong}): name another checkpoint, or the run "
                            f"directory ({run_dir}) for its newest intact one")
        return state

    # -- stops that save first ----------------------------------------------------------

    def resume_hint(self) -> str:
        """The command that continues this run: 'make train' with the config file, the one-off settings the run
        trains with, and RESUME_FROM for a run started from INIT_FROM's weights (the search passes it by)."""
        return resume_command(self.config, self.directory.path)

    def interrupt(self, signum: int) -> None:
        """Stop at this step boundary after saving a checkpoint (all ranks agreed on it)."""
        step = self.recovery.progress.step
        path = self.save_periodic() if self.saves else None
        self.event("interrupted", f"{signal.Signals(signum).name} received: checkpoint saved at step "
                   f"{step} ({path.name if path else ''}); '{self.resume_hint()}' resumes from it",
                   signal=signal.Signals(signum).name, path=str(path))
        raise TrainingInterrupted(signum, step, path)

    def device_lost(self, err: BaseException) -> None:
        """The device failed for good: save the last completed step's state where the tensors are still
        consistent and readable (else the newest checkpoint stands), say how to resume, stop (exit 3)."""
        p, reason = self.recovery.progress, shown(" ".join(str(err).split()), 200)
        saved = None
        if self.saves and not self.engine.updating:  # mid-update the tensors are neither the last step's nor this one's
            try:
                saved = (p.step, self.save_periodic())
            except Exception:  # noqa: BLE001 - a lost GPU's tensors cannot be read back
                saved = None
        if saved is None and self.rank.is_main:
            saved = self.directory.newest_periodic()
        kept = (f"checkpoint {saved[1].name} holds step {saved[0]}" if saved else
                "no checkpoint could be saved, so the run starts again")
        where = (" (CONFIG_DEVICE_AUTO plans again for what the machine has then, e.g. the CPU, with the same "
                 "effective batch)" if self.config.device == "auto" else
                 " after fixing or replacing the GPU (or select CONFIG_DEVICE_AUTO to continue on what is left)")
        message = (f"the training device failed at step {p.step + 1} ({reason}): {kept}; resume with "
                   f"'{resume_command(self.config, self.directory.path)}'{where}")
        self.event("device_lost", message, show=False, error=reason,
                   path=str(saved[1]) if saved else None, resume_step=saved[0] if saved else 0)
        if self.rank.is_main:
            print(f"error: {message}", file=sys.stderr, flush=True)
        raise StoppedToResume(message, saved[0] if saved else 0, saved[1] if saved else None, DEVICE_LOST_EXIT)


def room_maker(run_dir: Path, writing: Path, final: bool = False, log=print) -> Callable[[int], bool]:
    """make_room for save_run_checkpoint: each call deletes the oldest periodic checkpoint but the newest
    (whatever CONFIG_CHECKPOINT_KEEP is: the rotation deletes them soon anyway), never `writing`. For the
    `final` checkpoint, which supersedes them all, the newest periodic one goes last, and only once the space
    it frees makes room for the final one (a run never loses its only checkpoint to a write that cannot fit)."""
    def make_room(needed: int) -> bool:
        periodic = [p for _, p in checkpoint.periodic_checkpoints(run_dir) if p != writing]
        if len(periodic) > 1:
            victim = periodic[-1]
        elif final and periodic and fileio.free_bytes(run_dir) + size_of(periodic[0]) >= needed:
            victim = periodic[0]
        else:
            return False
        checkpoint.remove(victim)
        log(f"note: little room in {run_dir}: removed {victim.name} to write {Path(writing).name}")
        return True
    return make_room


def size_of(path: Path) -> int:
    """The bytes a checkpoint file or sharded directory holds."""
    path = Path(path)
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    except OSError:
        return 0
