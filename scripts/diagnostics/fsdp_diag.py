"""One-off GPU diagnostic for the fsdp check's under-predictions (not part of kfit).

Under torchrun --nproc-per-node 1 on a GPU: for each case, the real step measured
by torch's FSDPMemTracker on real CUDA tensors (its category snapshot at the peak)
and by the caching allocator, next to kfit's fake trace of the same step (per
category). Writes JSON lines to $1/fsdp_diag.jsonl.
"""
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
import torch.distributed as dist

from lib import config as kconfig
from lib.memory import MemoryPredictor, step_optimizer, training_steps
from lib.memory.sharded import FSDP_CATEGORIES
from lib.parallel import make_mesh, shard_model
from lib.step import autocast_for, seed_everything
from lib.task import load_task

R = Path(sys.argv[1])
OUT = open(R / "fsdp_diag.jsonl", "a")
MiB = 2**20
CASES = [("gpt2", "bf16", "fsdp", 8), ("gpt2", "bf16", "fsdp_grad_op", 8), ("gpt2", "bf16", "fsdp", 16),
         ("gpt2", "fp32", "fsdp", 4)]


def emit(**kw):
    line = json.dumps(kw, default=str)
    print(line[:1500], flush=True)
    OUT.write(line + "\n")
    OUT.flush()


def categories(snap) -> dict:
    out = {}
    for k, v in snap.items():
        name = getattr(k, "value", k)
        out[FSDP_CATEGORIES.get(name, name)] = out.get(FSDP_CATEGORIES.get(name, name), 0) + int(v)
    return {k: round(v / MiB, 1) for k, v in out.items()}


device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl")
meshes = {}
predictor = MemoryPredictor()
for model_name, precision, strategy, batch in CASES:
    path = R / f"{model_name}.config"
    config = kconfig.make_defconfig(model_name, out=path)
    task = load_task(config)
    trace = predictor.trace(config, batch=batch, device_type="cuda", precision=precision, strategy=strategy,
                            world_size=1, local_world_size=1)
    plain = predictor.trace(config, batch=batch, device_type="cuda", precision=precision)
    mesh = meshes.setdefault(strategy, make_mesh("cuda", strategy, 1, 1))
    for tracked in (False, True):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        seed_everything(0)
        model = task.build(False).to(device)
        shard_model(model, strategy, mesh, precision=precision)
        optimizer = step_optimizer(config, model, "cuda")
        x, y = (t.to(device) for t in task.example_batch(batch))
        autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cuda"))
        real = None
        if tracked:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((x, y))
            with tracker:
                training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip,
                               foreach=True, before_each=tracker.reset_mod_stats)
            snap = next(iter(tracker.get_tracker_snapshot("peak").values()), {})
            real = categories(snap)
        else:
            training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip,
                           foreach=True)
        torch.cuda.synchronize()
        emit(case=f"{model_name} {precision} {strategy} {batch}", tracked=tracked,
             allocated_mib=round(torch.cuda.max_memory_allocated() / MiB, 1),
             reserved_mib=round(torch.cuda.max_memory_reserved() / MiB, 1),
             real_tracker=real, fake_trace={k: round(v / MiB, 1) for k, v in trace.breakdown.items()},
             fake_peak_mib=round(trace.peak_bytes / MiB, 1), plain_fake_peak_mib=round(plain.peak_bytes / MiB, 1),
             plain_fake=({k: round(v / MiB, 1) for k, v in plain.breakdown.items()} if not tracked else None))
        del model, optimizer, x, y
predictor.close() if hasattr(predictor, "close") else None
dist.barrier()
dist.destroy_process_group()
