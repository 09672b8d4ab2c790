"""One-off GPU diagnostic (not part of kfit): where an eager step's time goes on a small model.

For gpt2-tiny bf16 micro-batch 64 and resnet18 bf16 512 (the step-time check's
cases): kfit's counted ops (lib.steptime.count_step) against the kernels and
aten ops torch.profiler sees, and the wall time of a bare step (training_steps,
synchronised) against the host's time per op. Writes $1/op_overhead.jsonl.
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
from lib.memory import step_optimizer, training_steps
from lib.step import autocast_for
from lib.steptime import count_step
from lib.task import load_task

R = Path(sys.argv[1])
OUT = open(R / "op_overhead.jsonl", "a")
for name, batch in [("gpt2-tiny", 64), ("resnet18", 512), ("gpt2-tiny", 8), ("lenet5", 256)]:
    config = kconfig.make_defconfig(name, out=R / f"{name}.config")
    task = load_task(config)
    phases, _ = count_step(task, config, batch=batch, precision="bf16", device_type="cuda",
                           gradient_checkpointing=False)
    counted = {k: v.ops for k, v in phases.items()}
    model = task.build(False).train().cuda()
    optimizer = step_optimizer(config, model, "cuda")
    x, y = (t.cuda() for t in task.example_batch(batch))
    autocast = autocast_for(SimpleNamespace(precision="bf16", device_type="cuda"))

    def step():
        training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip, foreach=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    aten = [e for e in events if e.name.startswith("aten::") and e.device_type == torch.autograd.DeviceType.CPU]
    gpu_busy = sum(e.device_time for e in kernels) / 1e3  # ms (overlaps ignored: one stream)
    line = {"case": f"{name} bf16 {batch}", "counted_ops": counted, "counted_total": sum(counted.values()),
            "kernels": len(kernels), "aten_events": len(aten),
            "step_ms_median": round(sorted(times)[len(times) // 2] * 1e3, 3), "step_ms_min": round(min(times) * 1e3, 3),
            "gpu_busy_ms": round(gpu_busy, 3),
            "host_us_per_counted_op": round(sorted(times)[len(times) // 2] * 1e6 / sum(counted.values()), 2),
            "host_us_per_kernel": round(sorted(times)[len(times) // 2] * 1e6 / max(1, len(kernels)), 2)}
    print(json.dumps(line), flush=True)
    OUT.write(json.dumps(line) + "\n")
    del model, optimizer, x, y
