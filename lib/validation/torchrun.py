"""A one-process torchrun run: NCCL on a GPU, gloo on a CPU.

The check starts `python -m torch.distributed.run --nproc-per-node 1 --standalone
-m lib.validation.torchrun` (this module is also the worker). The worker joins
the process group, all-reduces a tensor (timed; on NCCL 256 MiB for a
bandwidth figure), trains a small model under DistributedDataParallel for
DDP_STEPS steps next to the same model without DDP (the weights must be
equal), then leaves through a barrier, and writes what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .report import Context, Result, failed, passed
from ..env import environ
from ..fileio import write_text

ROOT = Path(__file__).resolve().parents[2]
DDP_STEPS = 5


def command(out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone",
            "-m", __name__, str(out)]


def judge(report: dict, returncode: int, output: str, seconds: float) -> Result:
    figures = {**report, "returncode": returncode, "wall_s": round(seconds, 1)}
    if returncode != 0 or not report:
        return failed(f"torchrun exited {returncode}: {' '.join(output.split())[-300:]}", **figures)
    problems = []
    if report.get("all_reduce_value") != report.get("world_size"):
        problems.append(f"all_reduce gave {report.get('all_reduce_value')}, expected {report.get('world_size')}")
    if not report.get("ddp_equal"):
        problems.append(f"DDP weights differ from a plain run's by {report.get('ddp_max_diff')}")
    text = (f"{report['backend']} world {report['world_size']} on {report['device']}: init "
            f"{report['init_s']:.2f}s, all_reduce ok" +
            (f" ({report['all_reduce_gbps']:.1f} GB/s on {report['all_reduce_mib']} MiB)"
             if report.get("all_reduce_gbps") else "") + f", DDP {DDP_STEPS} steps equal; {seconds:.1f}s in all")
    return failed(f"{text}; " + "; ".join(problems), **figures) if problems else passed(text, **figures)


def check_torchrun(ctx: Context) -> Result:
    out = ctx.workdir / "torchrun.json"
    env = {**environ(), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), environ().get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "KFIT_VALIDATE_DEVICE": ctx.device}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    start = time.monotonic()
    try:
        proc = subprocess.run(command(out), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=min(600.0, max(10.0, ctx.seconds_left())))
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        returncode, output = 124, f"timed out after {err.timeout:.0f}s"
    report = json.loads(out.read_text()) if out.exists() else {}
    return judge(report, returncode, output, time.monotonic() - start)


# --------------------------------------------------------------------------
# The worker (runs under torchrun)


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = environ().get("KFIT_VALIDATE_DEVICE") == "cuda"
    local_rank = int(environ()["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    start = time.perf_counter()
    dist.init_process_group("nccl" if cuda else "gloo")
    report = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "device": str(device),
              "init_s": round(time.perf_counter() - start, 3)}
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    report["all_reduce_value"] = int(value.item())
    if cuda:  # a bandwidth figure: with one rank NCCL still runs the collective's kernels
        mib = 256
        big = torch.ones(mib * 2**18, device=device)
        dist.all_reduce(big)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(big)
        torch.cuda.synchronize(device)
        report.update(all_reduce_mib=mib, all_reduce_gbps=round(5 * mib / 1024 / (time.perf_counter() - start), 1))
        del big
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
    wrapped = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device),
        device_ids=[local_rank] if cuda else None)
    wrapped.module.load_state_dict(plain.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, wrapped)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(DDP_STEPS):
        x = torch.randn(16, 32, generator=generator).to(device)
        for model, optimizer in zip((plain, wrapped), optimizers):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    diff = max(float((p - q).abs().max()) for p, q in zip(plain.parameters(), wrapped.module.parameters()))
    report.update(ddp_max_diff=diff, ddp_equal=diff <= 1e-6)
    del wrapped, plain, optimizers  # released before leaving the group (gloo aborts at exit otherwise)
    dist.barrier()
    dist.destroy_process_group()
    write_text(out, json.dumps(report))


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
