"""One-off GPU diagnostic (not part of kfit): a small model's step by phase, eager and compiled.

gpt2-tiny and resnet18 bf16: median wall ms of forward+backward alone and of the
optimizer step alone (clip + AdamW foreach + zero_grad, never compiled by kfit),
with the model eager and torch.compile'd (default mode), against kfit's counted
ops per phase. Writes $1/phase_times.jsonl.
"""
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lib.hardware  # noqa: F401
import torch

from lib import config as kconfig
from lib.memory import step_optimizer
from lib.step import autocast_for
from lib.steptime import count_step
from lib.task import load_task

R = Path(sys.argv[1])
OUT = open(R / "phase_times.jsonl", "a")


def median_ms(fn, n=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return round(sorted(ts)[n // 2] * 1e3, 3)


for name, batch in [("gpt2-tiny", 64), ("gpt2-tiny", 8), ("resnet18", 512), ("lenet5", 256)]:
    config = kconfig.make_defconfig(name, out=R / f"{name}.config")
    task = load_task(config)
    phases, _ = count_step(task, config, batch=batch, precision="bf16", device_type="cuda",
                           gradient_checkpointing=False)
    model = task.build(False).train().cuda()
    optimizer = step_optimizer(config, model, "cuda")
    x, y = (t.cuda() for t in task.example_batch(batch))
    autocast = autocast_for(SimpleNamespace(precision="bf16", device_type="cuda"))
    line = {"case": f"{name} bf16 {batch}", "counted_ops": {k: v.ops for k, v in phases.items()}}
    for compiled in (False, True):
        fwd = torch.compile(model) if compiled else model

        def fb():
            with autocast:
                loss = task.loss(fwd(x), y)
            loss.backward()

        def opt():
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

        def both():
            fb()
            opt()

        line["compiled" if compiled else "eager"] = {"fwd_bwd_ms": median_ms(fb), "optimizer_ms": median_ms(opt),
                                                      "step_ms": median_ms(both)}
    print(json.dumps(line), flush=True)
    OUT.write(json.dumps(line) + "\n")
    del model, optimizer, x, y
