"""One-off GPU diagnostics for the validate-gpu failures (not part of kfit). Writes JSON lines to $R/diag.jsonl."""
import json
import os
import pickle
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

from lib import config as kconfig
from lib.memory import MemoryPredictor
from lib.step import seed_everything
from lib.task import load_task
from lib.validation.budget import make_config, run_training
from lib.validation.measure import CudaDevice, build_step, measure_cuda
from lib.validation.report import Context

R = Path(sys.argv[1])
PARTS = sys.argv[2].split(",")
OUTF = open(R / "diag.jsonl", "a")
MiB = 2**20


def emit(**kw):
    line = json.dumps(kw, default=str)
    print(line[:600], flush=True)
    OUTF.write(line + "\n")
    OUTF.flush()


work = Path(tempfile.mkdtemp())
ctx = Context(device="cuda", quick=False, workdir=work, cuda=CudaDevice())
pred = MemoryPredictor()


def mem_case(model, precision, batch, ckpt=False, snapshot=None):
    config = kconfig.make_defconfig(model, out=work / f"{model}.config")
    if ckpt:
        config = kconfig.derive(config, {"GRADIENT_CHECKPOINTING": True})
    task = load_task(config)
    p = pred.predict(config, batch=batch, device_type="cuda", precision=precision)
    seed_everything(0)
    snapshot = None if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") else snapshot
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200000, context=None, stacks="python")
    reserved, allocated = measure_cuda(task, config, ctx.cuda, batch=batch, precision=precision)
    if snapshot:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(R / snapshot, "wb") as f:
            pickle.dump(snap, f)
    emit(part="mem", model=model, precision=precision, batch=batch, ckpt=ckpt, predicted=p.peak_bytes,
         traced=p.trace.peak_bytes, breakdown=p.breakdown, reserved=reserved, allocated=allocated,
         alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))


if "mem" in PARTS:
    for args in [("gpt2", "bf16", 16, True, None), ("gpt2", "bf16", 8, True, None), ("gpt2", "fp32", 8, True, None),
                 ("gpt2-tiny", "bf16", 128, True, None), ("resnet18", "bf16", 256, True, None),
                 ("lenet5", "bf16", 1024, False, "snap_lenet5_bf16_1024.pickle"),
                 ("resnet18", "fp32", 256, False, "snap_resnet18_fp32_256.pickle"),
                 ("gpt2", "bf16", 16, True, "snap_gpt2_bf16_16_ckpt.pickle")]:
        try:
            mem_case(*args)
        except Exception:
            emit(part="mem", args=args, error=traceback.format_exc()[-1500:])
        ctx.cuda.release()

if "oom" in PARTS:
    from lib.checkpoint import FINAL, load_checkpoint
    from lib.hardware import resolve_hardware
    from lib.planning import make_plan

    hw = resolve_hardware()
    weights = {}
    for name, opt, micro, accum in [("adamA", "OPTIMIZER_ADAMW", 8, 2), ("adamB", "OPTIMIZER_ADAMW", 8, 2),
                                    ("adam44", "OPTIMIZER_ADAMW", 4, 4), ("sgdA", "OPTIMIZER_SGD", 8, 2),
                                    ("sgdB", "OPTIMIZER_SGD", 8, 2), ("sgd44", "OPTIMIZER_SGD", 4, 4)]:
        try:
            t = time.time()
            config = make_config(ctx, "gpt2", name, {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": micro,
                                                     "GRADIENT_ACCUMULATION": accum, opt: True,
                                                     "LEARNING_RATE": 1e-3, "EVAL_BATCH_SIZE": 4,
                                                     "PRECISION_FP32": True, "TF32_OFF": True,
                                                     "COMPILE_MANUAL": True, "COMPILE_MODEL": False})
            plan = make_plan(config, hw).plan
            res = run_training(config, plan, hw)
            weights[name] = load_checkpoint(res.run_dir / FINAL)["model"]
            losses = [json.loads(l).get("loss") for l in (res.run_dir / "metrics.jsonl").read_text().splitlines()
                      if '"loss"' in l]
            emit(part="oom", name=name, steps=res.steps, seconds=time.time() - t, losses=losses[:30])
        except Exception:
            emit(part="oom", name=name, error=traceback.format_exc()[-1500:])
        ctx.cuda.release()

    def diff(a, b):
        return max(float((weights[a][k].float() - weights[b][k].float()).abs().max()) for k in weights[a])

    for a, b in [("adamA", "adamB"), ("adamA", "adam44"), ("sgdA", "sgdB"), ("sgdA", "sgd44")]:
        if a in weights and b in weights:
            emit(part="oom-diff", a=a, b=b, max_abs=diff(a, b))

if "steptime" in PARTS:
    for model, precision, batch in [("gpt2-tiny", "bf16", 64), ("resnet18", "bf16", 512), ("gpt2", "bf16", 8),
                                    ("lenet5", "bf16", 1024), ("resnet50", "bf16", 128)]:
        try:
            config = kconfig.make_defconfig(model, out=work / f"{model}.config")
            task = load_task(config)
            run, kept = build_step(task, config, batch=batch, precision=precision, device="cuda",
                                   device_type="cuda")
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            times = []
            for _ in range(20):
                t = time.perf_counter()
                run()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            try:
                ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                kernels = len(ev)
                durs = sorted(getattr(e, "device_time", 0) or 0 for e in ev)
                kernel_us = sum(durs)
                short = sum(1 for d in durs if d < 10)
            except Exception as err:
                kernels, kernel_us, short = str(err), 0, None
            emit(part="steptime", model=model, precision=precision, batch=batch,
                 step_ms=sorted(times)[len(times) // 2] * 1e3, min_ms=min(times) * 1e3, max_ms=max(times) * 1e3,
                 note="run() = two micro-batches + optimizer step (training_steps)",
                 kernels=kernels, kernel_ms=kernel_us / 1e3, kernels_under_10us=short)
            del run, kept
        except Exception:
            emit(part="steptime", model=model, error=traceback.format_exc()[-1500:])
        ctx.cuda.release()
emit(part="done")
