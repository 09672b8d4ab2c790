"""Tracing sharded steps in a child process: `ShardedTracer` (the planning process's side) and `serve`
(the child's loop, which runs sharded.py's `trace_sharded_step`).

Why a child process: tracing needs the fake process group as torch's default
group, and the planning process may be a torchrun rank whose real group that
would clobber. `ShardedTracer` starts `python -c "...sharded_process.serve()"` once per
predictor (same interpreter, working directory and sys.path, so a custom
model's factory imports as it does here), sends one JSON line per trace and
reads the Trace back as JSON; the child's stderr (fake-tensor logs) goes to a
temporary file that is shown only when it fails, as a PlanError naming the
child's last error line. `python -m lib.memory.sharded_process` runs the same loop.

Time (2-core CPU, torch 2.13, AdamW foreach, bf16): 5-9 s a trace for GPT-2
774M and 1558M at 2, 8 or 64 processes and micro-batch 1 or 8; the first trace
at a new world size takes 8-14 s (DTensor propagates every optimizer op anew
for the new shard shapes; at 64 processes each gathered unit is also copied
out of 64 pieces), plus 2-4 s to start the child. One process's trace of the
same model takes 4.4-6 s: both are dominated by fake-tensor dispatch, about
66k ops for 1558M. `ShardedTracers` keeps two such children where two cores are
free, so the pair of shallow depths a deep model is scaled from (and a DDP
replica's pair) is traced at once: a cold `kfit plan` of llama3-8b on 8 H100s
went from 79 s to 44 s here, with the same traces.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import torch

from ..config import Config
from ..errors import PlanError
from .sharded import trace_sharded_step
from .trace import Trace
from ..env import environ

ROOT = Path(__file__).resolve().parents[2]  # what holds this package (a checkout, or site-packages): the child's path


# --------------------------------------------------------------------------
# The child process: one JSON request per line in, one JSON reply per line out


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Child:
    """What the serving process keeps between requests: configs by text (the task: lib.task.task_once)."""

    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], Config] = {}

    def config(self, text: str, source: str) -> Config:
        from ..config import read_config

        if (text, source) not in self.configs:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / ".config"
                path.write_text(text)
                config = read_config(path)
            self.configs[(text, source)] = dataclasses.replace(config, source=source)  # its errors name the file
        return self.configs[(text, source)]

    def task(self, config: Config):
        from ..task import task_once
        from .cache import model_fingerprint

        key = json.dumps(model_fingerprint(config), sort_keys=True)
        return task_once(config, key)

    def handle(self, request: dict) -> dict:
        if request.get("cwd"):
            os.chdir(request["cwd"])
        for path in reversed(request.get("sys_path", [])):
            if path not in sys.path:
                sys.path.insert(0, path)
        if request.get("threads"):  # the CPU convolution paths (and their scratch) depend on it
            torch.set_num_threads(request["threads"])
        config = self.config(request["config_text"], request.get("config_source", ""))
        step = request["step"]
        if step.get("strategy") is None:  # one process's step (a DDP rank's), traced here beside another
            from .trace import trace_step

            trace = trace_step(self.task(config), config, **step)
        else:
            trace = trace_sharded_step(self.task(config), config, **step)
        return {"trace": trace.to_json()}


def serve(requests=None, replies=None) -> None:
    """Answer trace requests until end of input. stdout is kept for the replies: anything else written to
    it (a custom model's prints, C libraries) goes to stderr."""
    if replies is None:
        replies = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    import faulthandler

    faulthandler.enable()  # a crash names itself in the log the parent reads
    requests = requests if requests is not None else sys.stdin
    child = _Child()
    for line in requests:
        if not line.strip():
            continue
        try:
            reply = child.handle(json.loads(line))
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises PlanError
            import traceback

            traceback.print_exc()  # into the log the parent shows on failure
            message = str(err) if err.__class__.__module__.startswith(__name__.split(".")[0] + ".") else f"{type(err).__name__}: {err}"
            reply = {"error": _one_line(message)}
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                replies.write(json.dumps(reply) + "\n")
                replies.flush()
                raise
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


# --------------------------------------------------------------------------
# The parent's side


# torchrun's variables: the child must not mistake itself for a rank
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                   "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE")


def _close(process: subprocess.Popen, log, abort: list[bool]) -> None:
    try:
        if abort[0]:
            process.kill()
        elif process.stdin:
            process.stdin.close()  # the child's loop ends at end of input
        process.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
    finally:
        log.close()


class ShardedTracer:
    """Traces sharded steps in a child process, started at the first trace and kept until close()
    (or until this object is collected, or the process exits)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._log = None
        self._finalizer = None
        self._abort = [False]  # kill rather than wait: a reply may still be on its way
        self._pending: tuple[str, int] | None = None  # (what, log offset) of the request the child works on

    def _start(self) -> subprocess.Popen:
        env = {k: v for k, v in environ().items() if k not in _RANK_VARIABLES and not k.startswith("TORCHELASTIC_")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self._log = tempfile.TemporaryFile(prefix="kfit-sharded-trace-")  # binary: shared with the child
        self._process = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import serve; serve()"], cwd=os.getcwd(), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._abort = [False]
        self._finalizer = weakref.finalize(self, _close, self._process, self._log, self._abort)
        return self._process

    def close(self, abort: bool = False) -> None:
        if self._finalizer is not None:
            self._abort[0] = abort
            self._finalizer()
        self._process = self._log = self._finalizer = None

    def _last_error_line(self, since: int) -> str:
        """The child's last error line written to its log after `since`: an exception's last line, or
        faulthandler's "Fatal Python error: ..." on a crash; else its last line."""
        try:
            self._log.seek(since)
            lines = [line for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        except (OSError, ValueError, AttributeError):
            lines = []
        errors = [line for line in lines if not line[:1].isspace() and "error" in line.lower()]
        return _one_line((errors or lines)[-1]) if lines else "no output"

    def send(self, config: Config, **step) -> None:
        """Hand the child the trace of trace_sharded_step(**step) for `config`; receive() reads it back, so
        several tracers' children work at once."""
        if not config.text:  # the child reads the config from its text: an empty one would be the defaults
            raise ValueError("the config has no .config text to hand the tracing process (read it with "
                             "lib.config.read_config, make_defconfig or derive)")
        what = f"{step.get('strategy')} at {step.get('world_size')} processes, micro-batch {step.get('batch')}"
        process = self._process if self._process is not None and self._process.poll() is None else self._start()
        request = {"config_text": config.text, "config_source": config.source, "cwd": os.getcwd(),
                   "sys_path": [p for p in sys.path if p], "threads": torch.get_num_threads(), "step": step}
        since = self._log.seek(0, os.SEEK_END)
        self._pending = (what, since)
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child is gone: receive() says why
        except BaseException:  # interrupted while writing: the child's reply would answer the next request
            self.close(abort=True)
            raise

    def receive(self) -> Trace:
        """The Trace of the request send() handed the child; a failure is a PlanError."""
        (what, since), self._pending = self._pending, None
        process = self._process
        try:
            line = process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        except BaseException:  # interrupted while the child works: its reply would answer the next request
            self.close(abort=True)
            raise
        if not line:
            code = process.wait()
            reason = f"{f'signal {-code}' if code < 0 else f'exit status {code}'}: {self._last_error_line(since)}"
            self.close(abort=True)
            raise PlanError(f"tracing the sharded step ({what}) failed: the tracing process died ({reason})")
        reply = json.loads(line)
        if "error" in reply:
            raise PlanError(f"tracing the sharded step ({what}) failed: {reply['error'].split('. ')[0]}; a model the "
                            "tracer cannot run trains under DDP (CONFIG_PARALLEL_DDP), which kfit plans from real "
                            "steps of one process")
        return Trace.from_json(reply["trace"])

    def trace(self, config: Config, **step) -> Trace:
        """The Trace of trace_sharded_step(**step) for `config`, from the child; a failure is a PlanError."""
        self.send(config, **step)
        return self.receive()


class ShardedTracers:
    """Up to `size` ShardedTracers, so that the traces of one prediction (the two shallow depths a deep model
    is scaled from) run in as many child processes at once: each child's fake-tensor dispatch runs on one core,
    and a 2-core machine traces a pair in about the time of one."""

    def __init__(self, size: int) -> None:
        self._tracers = [ShardedTracer() for _ in range(max(1, size))]

    def trace(self, config: Config, **step) -> Trace:
        return self._tracers[0].trace(config, **step)

    def trace_all(self, requests: list[tuple[Config, dict]]) -> list[Trace]:
        """The traces of `requests` ((config, trace_sharded_step's keywords) each), in order."""
        results: list[Trace] = []
        for start in range(0, len(requests), len(self._tracers)):
            batch = list(zip(self._tracers, requests[start:start + len(self._tracers)]))
            try:
                for tracer, (config, step) in batch:
                    tracer.send(config, **step)
                results += [tracer.receive() for tracer, _ in batch]
            except BaseException:
                for tracer, _ in batch:  # a reply still on its way would answer the next request
                    if tracer._pending is not None:
                        tracer.close(abort=True)
                raise
        return results

    def close(self, abort: bool = False) -> None:
        for tracer in self._tracers:
            tracer.close(abort)


if __name__ == "__main__":
    serve()
