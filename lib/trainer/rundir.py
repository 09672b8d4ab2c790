"""The run directory of one run: claimed and locked by rank 0, and what the run writes there besides tensors.

Rank 0 claims the directory (a new one, named by the time, or the one to resume: `claim_run_directory`),
locked against a second `make train` there; every rank writes into that one and resumes what rank 0 decided.
Here too: the run files (config, plan.json, hardware.json, and a tokenized corpus's tokenizer.json with its
sha256 in tokenizer.sha256: lib/data/run_tokenizer.py), plan.json again whenever the plan changes,
pruning the periodic and best-k checkpoints, dropping the checkpoints later than the one resumed, and the
out-of-memory marker of an FSDP run (`oom.json`, for `make train` to relaunch it: recovery.py decides what
it holds).
"""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path
from typing import IO, Callable

from .. import checkpoint, distributed, fileio
from ..config import Config
from ..data import run_tokenizer
from ..distributed import Rank
from ..errors import KfitError
from ..hardware import HardwareProfile
from ..plan import Plan
from ..models.registry import label as model_label


def output_directory(config: Config) -> Path:
    """CONFIG_OUTPUT_DIR with ~ expanded (as CONFIG_DATA_DIR is), refused unless runs can be written there."""
    path = Path(config.output_dir).expanduser()
    reason = fileio.unwritable_reason(path)
    if reason is not None:
        raise KfitError(f'CONFIG_OUTPUT_DIR="{config.output_dir}" cannot hold runs ({reason}): set CONFIG_OUTPUT_DIR '
                        "to a directory you can write (or create), e.g. \"runs\"")
    return path


def run_directory(config: Config) -> Path:
    """RUN_NAME's directory, or a new one named after the model and the time, created here so that two runs
    started in the same second get one each."""
    base = output_directory(config)
    if config.run_name:
        return base / config.run_name
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = model_label(config)
    base.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = base / (f"{label}-{stamp}" if n == 1 else f"{label}-{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def run_history(path: Path) -> str | None:
    """What of a run's history `path` holds (its checkpoints, its metrics), None when nothing: a directory a new
    run may start in."""
    try:
        names = {p.name for p in Path(path).iterdir()}
    except (FileNotFoundError, NotADirectoryError):
        return None
    finished = [n for n in (checkpoint.FINAL, checkpoint.FINAL_SHARDED) if n in names]
    saved = sorted(n for n in names if n.startswith(("checkpoint-", "final-", "best-")))
    metrics = Path(path) / "metrics.jsonl"
    if finished:
        return f"finished: {finished[0]}"
    if saved:
        return f"checkpoints: {', '.join(saved[:2])}{' ...' if len(saved) > 2 else ''}"
    if "metrics.jsonl" in names and not metrics.is_symlink() and metrics.is_file() and metrics.stat().st_size:
        return "its metrics.jsonl"
    return None


def claim_run_directory(config: Config, run_dir: Path | None, resume: Path | None,
                        log=print) -> tuple[Path, Path | None, IO]:
    """(the run directory, the run to resume or None, its lock): the directory locked by this process
    against a second `make train` (fileio.try_lock). A named directory (RUN_NAME, or `run_dir`) another
    live process holds is refused; a resume search's pick that one took meanwhile becomes a new run."""
    lock = fileio.try_lock(resume) if resume is not None else None
    if resume is not None and lock is None:
        pid = fileio.lock_holder(resume) or 0
        if run_dir is not None or config.run_name:
            raise checkpoint.in_use_error(resume, pid)
        log(f"note: not resuming {resume}: {checkpoint.holder_name(pid)} has just taken it; this run is a "
            "separate one")
        resume = None
    path = Path(resume or run_dir or run_directory(config))
    fileio.refuse_linked_directory(path)  # RUN_NAME or a resumed run that is a link: never written through
    if resume is None:  # a new run starts only where no run's history is: it never replaces one
        fileio.refuse_link(path / fileio.LOCK_NAME)  # a lock planted as a link: named first, as taking it would
        holder = fileio.lock_holder(path) if path.is_dir() else None
        if holder is not None:  # a live run there: said as such, before what it holds
            raise checkpoint.in_use_error(path, holder)
        history = run_history(path)
        if history is not None:
            raise KfitError(f"{path} holds another run ({history}), which a new run would replace: choose another "
                            "CONFIG_RUN_NAME (or none, for a new directory), continue that run with its own config "
                            f"(make train KCONFIG_CONFIG={path / 'config'}; EXTEND_EPOCHS=N RUN={path} once it has "
                            "finished), or move it away")
    if lock is None:
        path.mkdir(parents=True, exist_ok=True)
        lock = fileio.try_lock(path)
        if lock is None:
            raise checkpoint.in_use_error(path, fileio.lock_holder(path) or 0)
    fileio.remove_stale_temporaries(path)  # locked: only writes a kill interrupted leave them
    return path, resume, lock


def write_run_files(run_dir: Path, config: Config, plan: Plan, hardware: HardwareProfile,
                    log: Callable[[str], None] = print) -> None:
    """The .config, plan and hardware a run was started with, beside its checkpoints, and its corpus's
    tokenizer."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with checkpoint.full_disk_is_an_error(run_dir / "config"):
        checkpoint.write_text_atomic(run_dir / "config", config.text)
        checkpoint.write_json_atomic(run_dir / "plan.json", plan.to_dict())
        checkpoint.write_json_atomic(run_dir / "hardware.json", hardware.to_dict())
        keep_tokenizer(run_dir, config, log)


def keep_tokenizer(run_dir: Path, config: Config, log: Callable[[str], None] = print) -> str | None:
    """Copy the tokenized corpus's tokenizer.json into the run directory (never through a link planted there)
    and record its sha256 in tokenizer.sha256; returns the sha256, or None for data without a tokenizer.
    A resumed run whose corpus was tokenized again since says so, and keeps the tokenizer it trains on now."""
    if config.dataset != "dir" or not config.data_dir:
        return None
    source = run_tokenizer.corpus_tokenizer(Path(config.data_dir).expanduser())
    if source is None:
        return None
    try:
        data = source.read_bytes()
    except OSError as err:  # training reads the corpus itself; only sampling needs this file
        log(f"warning: {source} cannot be read ({err.strerror or err}): the run keeps no tokenizer, and make "
            "sample will look for it in the corpus directory")
        return None
    digest = run_tokenizer.sha256_hex(data)
    kept = run_tokenizer.recorded_hash(run_dir)
    copy = run_dir / run_tokenizer.TOKENIZER_FILE
    if kept == digest and copy.is_file() and not copy.is_symlink() and \
            run_tokenizer.sha256_hex(copy.read_bytes()) == digest:
        return digest  # resumed: the same tokenizer
    if kept is not None and kept != digest:
        log(f"warning: {source} is not the tokenizer this run started with (sha256 {digest[:12]}, the run's "
            f"{kept[:12]}): the corpus was tokenized again, so its token ids mean other text from here on; the "
            "run now keeps this tokenizer")
    fileio.write_atomic(copy, data, follow_symlinks=False)
    fileio.write_atomic(run_dir / run_tokenizer.HASH_FILE, run_tokenizer.hash_record(digest), follow_symlinks=False)
    return digest


class RunDirectory:
    """`path`, held by this process's `lock` (rank 0's; None on the other ranks and once released)."""

    def __init__(self, path: Path, lock: IO | None, *, main: bool, log: Callable[[str], None] = print) -> None:
        self.path, self.lock, self.main, self.log = Path(path), lock, main, log

    @classmethod
    def claim(cls, config: Config, rank: Rank, run_dir: Path | None, resume: Path | None,
              log: Callable[[str], None] = print) -> tuple[RunDirectory, Path | None, Path | None]:
        """(the run directory, the run to resume or None, the checkpoint RESUME_FROM chose or None), rank 0
        deciding for all. `resume`: a run directory (the resume search's pick) or a checkpoint in one."""
        resume_dir = checkpoint.run_of(resume) if resume is not None else None
        chosen = Path(resume) if resume is not None and Path(resume) != resume_dir else None
        lock, claim = None, None
        if rank.is_main:
            try:
                # a chosen checkpoint's run in use by another process is refused, never swapped for a new run
                named = run_dir if chosen is None else (run_dir or resume_dir)
                claimed, resume_dir, lock = claim_run_directory(config, named, resume_dir, log)
                claim = (claimed, resume_dir, None)
            except KfitError as err:  # refused on every rank, not only here
                claim = (None, None, str(err))
        path, resume_dir, refused = distributed.broadcast(claim)
        if refused is not None:
            raise KfitError(refused)
        return cls(path, lock, main=rank.is_main, log=log), resume_dir, chosen

    def release(self) -> None:
        """Let another `make train` take the run directory (the process ending does it too)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def discard_unstarted(self) -> None:
        """A new run refused before its first step (a tracker that would not start, a file planted in the
        directory): its start files and lock removed, and the directory if nothing else is in it, so that no
        empty run is left to be taken for the last one. Never a directory with a run's history (run_history)."""
        if not self.main or run_history(self.path) is not None:
            return
        for name in ("config", "plan.json", "hardware.json", "metrics.jsonl", run_tokenizer.TOKENIZER_FILE,
                     run_tokenizer.HASH_FILE):
            kept = self.path / name
            if kept.is_file() and not kept.is_symlink():
                kept.unlink()
        self.release()
        (self.path / fileio.LOCK_NAME).unlink(missing_ok=True)
        try:
            self.path.rmdir()
        except OSError:  # something else is there (the user's own files): left as it is
            pass

    # -- run files ---------------------------------------------------------------

    def write_files(self, config: Config, plan: Plan, hardware: HardwareProfile) -> None:
        if self.main:
            write_run_files(self.path, config, plan, hardware, self.log)

    def write_plan(self, plan: Plan) -> None:
        """plan.json again after the plan changed (halving, a ladder rung)."""
        if self.main:
            checkpoint.write_json_atomic(self.path / "plan.json", plan.to_dict())

    def write_init_record(self, record: dict) -> None:
        if self.main:
            checkpoint.write_json_atomic(self.path / checkpoint.INIT_RECORD, record)

    def started_from_weights(self) -> bool:
        """Whether the run started from INIT_FROM's weights (the resume search passes it by)."""
        return (self.path / checkpoint.INIT_RECORD).is_file()

    # -- checkpoints on disk -------------------------------------------------------

    def prune_periodic(self, keep: int) -> None:
        if self.main:
            checkpoint.prune(self.path, keep)

    def prune_best(self, steps: list[int]) -> list[Path]:
        return checkpoint.prune_best(self.path, steps) if self.main else []

    def drop_periodic(self) -> None:
        """A finished run's checkpoint supersedes its periodic ones."""
        if self.main:
            for _, old in checkpoint.periodic_checkpoints(self.path):
                checkpoint.remove(old)

    def newest_periodic(self) -> tuple[int, Path] | None:
        return next(iter(checkpoint.periodic_checkpoints(self.path)), None)

    def drop_later(self, step: int, best_steps: list[int], resumed: Path) -> None:
        """Checkpoints later than the one resumed (an older one RESUME_FROM chose, or unreadable newer ones)
        belong to steps this run takes again: the rotation would keep them over its new ones and the resume
        search would take them. Best-<step> files outside the resumed ranking go too (best.py)."""
        if not self.main:
            return
        later = [path for saved, path in checkpoint.periodic_checkpoints(self.path) if saved > step]
        for path in later:
            checkpoint.remove(path)
        later += checkpoint.prune_best(self.path, best_steps)
        if later:
            self.log(f"note: resuming from {resumed.name}: removed {', '.join(sorted(q.name for q in later))}, "
                     "saved after it")

    # -- the out-of-memory marker of a sharded run ---------------------------------

    def write_marker(self, marker: dict) -> None:
        checkpoint.write_json_atomic(self.path / checkpoint.OOM_MARKER, marker)
