"""One-off GPU diagnostic (not part of kfit): what is live at the caching allocator's peak of one sharded step.

Under torchrun --nproc-per-node 1: records the allocator's history
(torch.cuda.memory._record_memory_history) over lib.memory.training_steps on
the model as lib.parallel.shard_model shards it, replays the events to the
moment of the most allocated bytes and groups the live blocks by the first
Python frame in torch.distributed, torch.optim, torch.nn or lib. Writes JSON
lines to $1/fsdp_peak.jsonl.
"""
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
import torch.distributed as dist

from lib import config as kconfig
from lib.memory import step_optimizer, training_steps
from lib.parallel import make_mesh, shard_model
from lib.step import autocast_for, seed_everything
from lib.task import load_task

R = Path(sys.argv[1])
OUT = open(R / "fsdp_peak.jsonl", "a")
MiB = 2**20
CASES = [("gpt2", "fp32", "fsdp", 4, True), ("gpt2", "fp32", "fsdp", 4, False), ("gpt2", "bf16", "fsdp", 8, True)]
KEYS = ("torch/distributed/", "torch/optim/", "torch/nn/", "/lib/", "torch/_tensor", "torch/autograd")


def where(frames) -> str:
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in KEYS) and "memory/_" not in name:
            return f"{name.split('site-packages/')[-1].split('/work/main/')[-1]}:{f.get('line')} {f.get('name')}"
    return (frames[0].get("filename", "?") + ":" + str(frames[0].get("line"))) if frames else "?"


device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl")
for model_name, precision, strategy, batch, sharded in CASES:
    config = kconfig.make_defconfig(model_name, out=R / f"{model_name}.config")
    task = load_task(config)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
    seed_everything(0)
    model = task.build(False).to(device)
    if sharded:
        shard_model(model, strategy, make_mesh("cuda", strategy, 1, 1), precision=precision)
    optimizer = step_optimizer(config, model, "cuda")
    x, y = (t.to(device) for t in task.example_batch(batch))
    autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cuda"))
    training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip, foreach=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][device.index]
    live, total, best, best_live, best_i, streams = {}, 0, 0, {}, 0, set()
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []), e.get("stream"))
            total += e["size"]
            streams.add(e.get("stream"))
            if total > best:
                best, best_live, best_i = total, dict(live), i
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    groups = defaultdict(int)
    for size, frames, stream in best_live.values():
        groups[f"stream {stream} | {where(frames)}"] += size
    top = sorted(groups.items(), key=lambda kv: -kv[1])[:25]
    at = events[best_i]
    line = {"case": f"{model_name} {precision} {strategy if sharded else 'plain'} {batch}",
            "max_allocated_mib": round(torch.cuda.max_memory_allocated() / MiB, 1),
            "replayed_peak_mib": round(best / MiB, 1), "events": len(events), "streams": sorted(map(str, streams)),
            "peak_event": where(at.get("frames", [])), "peak_event_index": best_i,
            "live_at_peak": [(k, round(v / MiB, 1)) for k, v in top]}
    print(json.dumps(line, indent=0)[:4000], flush=True)
    OUT.write(json.dumps(line) + "\n")
    OUT.flush()
    del model, optimizer, x, y
dist.barrier()
dist.destroy_process_group()
