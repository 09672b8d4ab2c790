"""torchrun's stderr, read as kfit's launcher shows it: the ranks' own lines pass through; torchrun's log lines,
its tracebacks and C++ stack dumps go to a log file; what they say (a killed rank, a stop signal) becomes one
error line (`explain`)."""

from __future__ import annotations

import re
import signal
import sys
import tempfile
from pathlib import Path

from . import fileio

_SIGNAL_EXIT = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_RANK_EXCEPTION = re.compile(r"^\[rank\d+\]:")  # torch prefixes a rank's uncaught exception with its rank
# The c10d store's C++ warning when the machine hosting the rendezvous store leaves first: on a run that
# finished, another machine's torchrun agent is still in its exit barrier's wait (a race in torchrun, harmless),
# and prints this line with a C++ stack dump. It goes to torchrun's log, with the frames under it.
_STORE_WARNING = re.compile(r"^\[[WE]\d{4} [\d:.]+ TCPStore\.cpp:\d+\] \[c10d\]")
# a surviving rank's own line when a peer is gone (lib/cli/train.py): the consequence, like its tracebacks
_PEER_LOST_LINE = re.compile(r"^error: rank \d+ lost another training process")
_CPP_DUMP = re.compile(r"^(Exception raised from |frame #\d+: |<omitting python frames>)")


class TorchrunOutput:
    """torchrun's stderr, which its ranks share: the ranks' lines pass through; torchrun's own (its log
    lines, and the traceback with its failure report, 40-50 lines for one killed rank) are kept in `kept`
    instead, and what they say is read: the signal that stopped torchrun, the root cause's rank and exit code."""

    def __init__(self, pid: int, out) -> None:
        self.own_line = re.compile(rf"^[IWEF]\d{{4}} [\d:.]+ +{pid} ")  # torchrun's logging, by its pid
        self.out = out
        self.kept: list[str] = []
        self.block: list[str] | None = None  # a traceback whose owner is not known yet
        self.suppressing = False
        self.report = False  # inside ChildFailedError's failure report
        self.in_root = False
        self.signal: int | None = None
        self.root: dict[str, int] = {}
        self.failure: str | None = None  # torchrun's own exception otherwise
        # ranks' uncaught exceptions, shown at the end unless a killed rank explains them: when a rank dies,
        # the others fail in their next collective ("Connection reset by peer") with tracebacks of their own
        self.rank_exceptions: list[str] = []
        self.in_dump = False  # inside a c10d store warning's C++ stack dump

    def feed(self, line: str) -> None:
        if _STORE_WARNING.match(line) or (self.in_dump and _CPP_DUMP.match(line)):
            self.in_dump = True
            self.kept.append(line)
            return
        self.in_dump = False
        if self.block is not None:  # a traceback's first frame tells whose it is
            self.block.append(line)
            if not line.startswith("  File"):
                return
            block, self.block = self.block, None
            if '"<frozen runpy>"' in line or "torch/distributed/run.py" in line:
                self.suppressing = True
                self.kept += block
            else:
                self.out.writelines(block)
            return
        if self.suppressing:
            self.kept.append(line)
            self._read_report(line)
            return
        if _RANK_EXCEPTION.match(line) or _PEER_LOST_LINE.match(line):
            self.rank_exceptions.append(line)
            return
        if line.startswith("Traceback (most recent call last):"):
            self.block = [line]
        elif self.own_line.match(line):
            self.kept.append(line)
        else:
            self.out.write(line)
        self.out.flush()

    def _read_report(self, line: str) -> None:
        if self.report:
            self.in_root = self.in_root or line.startswith("Root Cause")
            if self.in_root and (match := _ROOT_RANK.match(line)):
                self.root.update(rank=int(match[1]), local_rank=int(match[2]))
            elif self.in_root and (match := _ROOT_EXIT.match(line)):
                self.root["exitcode"] = int(match[1])
            elif self.in_root and line.startswith("====="):
                self.suppressing = self.report = self.in_root = False
            return
        if line.startswith((" ", "\t")) or not line.strip() or line.startswith("During handling"):
            return  # a frame of the traceback
        if line.startswith("Traceback"):
            return
        if "ChildFailedError" in line:
            self.report = True
            return
        self.suppressing = False  # the exception's line ends the traceback
        if match := _SIGNAL_EXIT.search(line):
            self.signal = int(match[1])
        else:
            self.failure = line.strip()

    def close(self, log_path: Path | None) -> Path | None:
        """Flush; torchrun's own lines are appended to log_path (when there are any), and so are the ranks'
        exceptions when a rank was killed (the error line names it; theirs are its consequence). The log
        is never appended through a link or to another user's file (the temporary directory is shared:
        fileio.open_append(owned=True)); then it goes to a new private directory. Returns the log written."""
        if self.block:
            self.out.writelines(self.block)
        if self.root.get("exitcode", 0) < 0:
            self.kept += self.rank_exceptions
        else:
            self.out.writelines(self.rank_exceptions)
        self.rank_exceptions = []
        self.out.flush()
        if self.kept and log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                log = fileio.open_append(log_path, owned=True)
            except OSError:  # a link, a directory or another user's file planted there
                log_path = Path(tempfile.mkdtemp(prefix="kfit-torchrun-")) / log_path.name
                log = fileio.open_append(log_path, owned=True)
            with log:
                log.writelines(self.kept)
        return log_path


def explain(output: TorchrunOutput, code: int, log_path: Path | None) -> int:
    """The exit status of a failed torchrun, with one error line where no rank said why."""
    where = f"; torchrun's report: {log_path}" if log_path is not None and output.kept else ""
    exitcode = output.root.get("exitcode")
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        hint = (" (the kernel's out-of-memory killer sends it when RAM runs out: see 'dmesg')"
                if number == signal.SIGKILL else "")
        print(f"error: training process rank {output.root.get('rank', '?')} (local rank "
              f"{output.root.get('local_rank', '?')}) was killed by signal {number} ({name}){hint}; torchrun "
              f"stopped the others{where}; 'make train' resumes from the last checkpoint, if one was saved",
              file=sys.stderr)
        return 128 + number
    if exitcode == 128 + signal.SIGTERM:  # torchrun stopped its ranks, and nothing here asked it to
        print(f"error: torchrun stopped the training processes (SIGTERM) without being asked: another machine of "
              f"the run left or failed{where}; they saved a checkpoint first; 'make train' on every machine resumes "
              "from it", file=sys.stderr)
        return exitcode
    if exitcode is not None and exitcode > 0:
        return exitcode  # the rank printed its own error
    if output.failure:
        print(f"error: torchrun failed: {output.failure}{where}", file=sys.stderr)
    return code
