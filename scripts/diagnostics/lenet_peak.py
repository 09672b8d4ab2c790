"""One-off GPU diagnostic (not part of kfit): why LeNet-5's reserved peak on CUDA exceeds the prediction.

For LeNet-5 fp32/bf16 steps, with cudnn.benchmark off (the memory check) and on
(what AUTO plans train with): max allocated and max reserved, the prediction's
terms, and the live blocks at the allocated peak grouped by the first lib/torch
frame. Writes JSON lines to $1/lenet_peak.jsonl.
"""
import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lib.hardware  # noqa: F401  (expandable segments, as kfit runs)
import torch

from lib import config as kconfig
from lib.memory import MemoryPredictor, step_optimizer, training_steps
from lib.step import autocast_for
from lib.task import load_task

R = Path(sys.argv[1])
OUT = open(R / "lenet_peak.jsonl", "a")
MiB = 2**20
KEYS = ("torch/nn/", "torch/optim/", "/lib/", "torch/autograd", "torch/_tensor")


def where(frames) -> str:
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in KEYS) and "memory/_" not in name:
            return f"{name.split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    return "?"


config = kconfig.make_defconfig("lenet5", out=R / "lenet5.config")
task = load_task(config)
predictor = MemoryPredictor()
for precision, batch in [("fp32", 4096), ("bf16", 1024), ("bf16", 4096), ("fp32", 1024)]:
    pred = predictor.predict(config, batch=batch, device_type="cuda", precision=precision)
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
        model = task.build(False).train().cuda()
        optimizer = step_optimizer(config, model, "cuda")
        x, y = (t.cuda() for t in task.example_batch(batch))
        autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cuda"))
        for _ in range(2):
            training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip,
                           foreach=True)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = snap["device_traces"][0]
        live, total, best, best_live = {}, 0, 0, {}
        for e in events:
            if e["action"] == "alloc":
                live[e["addr"]] = (e["size"], e.get("frames", []))
                total += e["size"]
                if total > best:
                    best, best_live = total, dict(live)
            elif e["action"] == "free_completed" and e["addr"] in live:
                total -= live.pop(e["addr"])[0]
        groups = defaultdict(int)
        for size, frames in best_live.values():
            groups[where(frames)] += size
        segs = [{"size_mib": round(s["total_size"] / MiB, 1), "pool": "small" if s["total_size"] <= 2 * MiB else "large",
                 "allocated_mib": round(s["allocated_size"] / MiB, 1)} for s in snap["segments"]]
        sizes = sorted({e["size"] for e in events if e["action"] == "alloc"}, reverse=True)[:12]
        line = {"case": f"lenet5 {precision} {batch} benchmark={bench}",
                "max_allocated_mib": round(torch.cuda.max_memory_allocated() / MiB, 1),
                "max_reserved_mib": round(torch.cuda.max_memory_reserved() / MiB, 1),
                "predicted_mib": round(pred.peak_bytes / MiB, 1), "traced_mib": round(pred.trace.peak_bytes / MiB, 1),
                "breakdown_mib": {k: round(v / MiB, 1) for k, v in pred.breakdown.items()},
                "history_peak_mib": round(best / MiB, 1),
                "largest_allocs_mib": [round(s / MiB, 2) for s in sizes],
                "segments_end": segs[:20], "n_segments": len(segs),
                "at_peak": {k: round(v / MiB, 1) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])[:15]}}
        print(json.dumps({k: line[k] for k in ("case", "max_allocated_mib", "max_reserved_mib", "predicted_mib",
                                                  "history_peak_mib", "n_segments")}), flush=True)
        OUT.write(json.dumps(line) + "\n")
        OUT.flush()
        del model, optimizer, x, y
torch.backends.cudnn.benchmark = False
