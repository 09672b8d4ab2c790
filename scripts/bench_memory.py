#!/usr/bin/env python3
"""Predicted vs measured peak memory of a training step (make bench-memory).

For each model x three micro-batches x fp32/bf16, run the step the predictor
traces (lib.memory.training_steps: two steps, the second accumulating, then
zero_grad) for real and measure its peak:
  cpu   torch.profiler with profile_memory=True, then export_memory_timeline:
        the largest sum over categories of live bytes;
  cuda  torch.cuda.max_memory_reserved after reset_peak_memory_stats (what
        other processes cannot use; allocated is printed next to it).
The prediction is lib.memory's for the same device, overhead terms included.
Last line: memory-accuracy: device=<cpu|cuda> cases=N max_rel_err=X mean_rel_err=Y
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lib import config as kconfig  # noqa: E402
from lib.memory import MemoryPredictor, step_optimizer, training_steps  # noqa: E402
from lib.task import load_task  # noqa: E402
from lib.step import autocast_for, seed_everything  # noqa: E402

# defconfig (or "outside" for the out-of-tree factory below) -> micro-batches
CASES = {"lenet5": (32, 128, 512), "resnet18": (8, 16, 32), "gpt2-tiny": (8, 16, 32),
         "custom-transformer": (16, 64, 256), "outside": (8, 32, 128)}

# A custom model that lives outside the project: a torch.nn.Transformer encoder classifier.
OUTSIDE_FACTORY = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 96)
            layer = nn.TransformerEncoderLayer(96, 4, 384, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
            self.head = nn.Linear(96, 5)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def make_batch(n, generator):
        x = torch.randint(0, 64, (n, 48), generator=generator)
        return x, x[:, 0] % 5

    def build():
        return Classifier(), make_batch, lambda out, y: F.cross_entropy(out.float(), y)
''')


@contextlib.contextmanager
def quiet_stderr():
    """Kineto writes profiler start/stop lines straight to fd 2; they would drown the table."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def measure_cpu(task, config, batch: int, precision: str) -> tuple[int, None]:
    model = task.build(config.gradient_checkpointing).train()
    optimizer = step_optimizer(config, model, "cpu")
    x, y = task.example_batch(batch)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True,
                                                with_stack=True) as prof:
        training_steps(model, optimizer, task.loss, x, y, grad_clip=config.grad_clip, foreach=False,
                       autocast=autocast_for(SimpleNamespace(precision=precision, device_type="cpu")))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of a CUDA-only API
        path = os.path.join(tmp, "timeline.json")
        prof.export_memory_timeline(path, device="cpu")
        _, sizes = json.loads(Path(path).read_text())
    return max(sum(s) for s in sizes), None


def measure_cuda(task, config, batch: int, precision: str) -> tuple[int, int]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = task.build(config.gradient_checkpointing).train().to("cuda")
    optimizer = step_optimizer(config, model, "cuda")
    x, y = (t.to("cuda") for t in task.example_batch(batch))
    training_steps(model, optimizer, task.loss, x, y, grad_clip=config.grad_clip, foreach=True,
                   autocast=autocast_for(SimpleNamespace(precision=precision, device_type="cuda")))
    torch.cuda.synchronize()
    result = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    del model, optimizer, x, y
    return result


def configs(workdir: Path, names: list[str]):
    """(label, config) per case, the out-of-tree factory written under workdir."""
    (workdir / "outside_model.py").write_text(OUTSIDE_FACTORY)
    sys.path.insert(0, str(workdir))
    for name in names:
        base = "custom-transformer" if name == "outside" else name
        config = kconfig.make_defconfig(base, out=workdir / f"{name}.config")
        if name == "outside":
            config = kconfig.derive(config, {"CUSTOM_MODEL_FACTORY": "outside_model:build"})
        yield name, config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=os.environ.get("DEVICE", "auto"))
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    args = parser.parse_args()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    measure = measure_cuda if device == "cuda" else measure_cpu
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        predictor = MemoryPredictor(cache_dir=tmp)  # a fresh cache: every prediction is traced here
        print(f"{'model':<20} {'batch':>5} {'prec':<5} {'predicted MiB':>13} {'measured MiB':>12} "
              f"{'rel err':>8} {'trace s':>7} {'run s':>6}" + ("  allocated MiB" if device == "cuda" else ""))
        for name, config in configs(Path(tmp), args.models.split(",")):
            task = load_task(config)
            for precision in ("fp32", "bf16"):
                for batch in CASES[name]:
                    seed_everything(0)
                    predicted = predictor.predict(config, batch=batch, device_type=device, precision=precision)
                    start = time.perf_counter()
                    measured, allocated = measure(task, config, batch, precision)
                    seconds = time.perf_counter() - start
                    err = (predicted.peak_bytes - measured) / measured
                    errors.append(abs(err))
                    print(f"{name:<20} {batch:>5} {precision:<5} {predicted.peak_bytes / 2**20:>13.1f} "
                          f"{measured / 2**20:>12.1f} {err:>+8.2%} {predicted.trace.seconds:>7.2f} {seconds:>6.1f}"
                          + (f"  {allocated / 2**20:.1f}" if allocated is not None else ""), flush=True)
    print(f"memory-accuracy: device={device} cases={len(errors)} max_rel_err={max(errors):.4f} "
          f"mean_rel_err={sum(errors) / len(errors):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
