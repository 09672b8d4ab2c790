"""torch.compile on against off: warm training throughput, against what compile AUTO decides.

For each model in MODELS (bf16, compile mode default) the step lib.memory
traces runs eagerly, then compiled as the trainer compiles it (the model and its
loss in one graph, lib/step.py forward_loss: `loss_compiled` in the figures); each
is timed over TIMED_CALLS calls after
warm-up (the compiled one after its first compile, whose time is reported).
speedup = compiled / eager samples per second. Compile AUTO (what
lib.planning.make_plan decides for this GPU) is confirmed when it compiles and
every speedup is at least 1, or when it does not and every speedup is below 1;
otherwise the check fails and the suggestion says which way AUTO should go.
"""

from __future__ import annotations

import time

from .. import config as kconfig
from ..step import seed_everything

from . import vocab
from .measure import build_step
from .report import Context, Result, failed, passed, skipped

# defconfig (or vocab.MODEL: GPT-2 124M on GPT-2's 50,257 tokens), micro-batch; the mfu check reuses the
# compiled GPT-2's throughput (SHARED_KEY) rather than compiling it again
MODELS = (("resnet18", 256), (vocab.MODEL, 16))
QUICK_MODELS = MODELS[:1]
WARM_CALLS, TIMED_CALLS = 2, 8  # each call is two optimizer steps (lib.memory.training_steps)


def shared_key(name: str, batch: int) -> str:
    """Where a compiled bf16 throughput of `name` at `batch` is left in Context.shared for a later check."""
    return f"compiled-bf16:{name}:{batch}"


def config_for(ctx: Context, name: str, tag: str = "compile"):
    if name == vocab.MODEL:
        return vocab.make_config(ctx.workdir, f"{tag}-{name}")
    return kconfig.make_defconfig(name, out=ctx.workdir / f"{tag}-{name}.config")


def throughput(task, config, cuda, *, batch: int, compile: bool) -> dict:
    import torch

    seed_everything(0)
    torch.backends.cudnn.benchmark = True  # as AUTO plans on a GPU
    run, kept = build_step(task, config, batch=batch, precision="bf16", device=cuda.device, device_type="cuda",
                           compile=compile)
    start = time.perf_counter()
    for _ in range(WARM_CALLS):
        run()
        cuda.synchronize()
    warm_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(TIMED_CALLS):
        run()
    cuda.synchronize()
    seconds = time.perf_counter() - start
    del run, kept
    return {"samples_per_s": round(TIMED_CALLS * 2 * batch / seconds, 1), "warm_up_s": round(warm_s, 2)}


def compile_auto(ctx: Context) -> tuple[bool, str]:
    """What compile AUTO decides on this machine (a MANUAL batch: the planner is not needed)."""
    from ..hardware import resolve_hardware
    from ..planning import make_plan

    config = kconfig.make_defconfig("resnet18", out=ctx.workdir / "compile-auto.config")
    config = kconfig.derive(config, {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 8, "GRADIENT_ACCUMULATION": 1})
    plan = make_plan(config, resolve_hardware()).plan
    return plan.compile, plan.reasons["compile"]


def verdict(gpu: str, auto_on: bool, auto_reason: str, measured: dict[str, dict]) -> Result:
    speedups = {name: m["speedup"] for name, m in measured.items()}
    faster = all(s >= 1.0 for s in speedups.values())
    slower = all(s < 1.0 for s in speedups.values())
    agrees = (auto_on and faster) or (not auto_on and slower)
    advice = ("keep" if agrees else
              f"deny-list '{gpu}' in lib.hyperparams.COMPILE_DENY" if auto_on else
              f"enable compile AUTO for '{gpu}' (it is off: {auto_reason})")
    figures = {"models": measured, "auto_compiles": auto_on, "auto_reason": auto_reason,
               "suggested": {"COMPILE_AUTO": {"gpu": gpu, "auto_compiles": auto_on, "speedups": speedups,
                                              "advice": advice}}}
    text = (", ".join(f"{name} x{s:.2f} (first compile {measured[name]['compiled']['warm_up_s']:.0f}s)"
                      for name, s in speedups.items())
            + f"; compile AUTO {'on' if auto_on else 'off'} here")
    if agrees:
        return passed(f"{text}: confirmed", **figures)
    return failed(f"{text}: {advice}" if faster or slower else f"{text}: mixed, {advice}", **figures)


def check_compile(ctx: Context) -> Result:
    if ctx.device != "cuda":
        return skipped("DEVICE=cpu: compile AUTO is off on CPUs (measured slower than eager after a 20+ s "
                       "first compile; see README)")
    from ..task import load_task

    measured, not_run = {}, []
    for name, batch in QUICK_MODELS if ctx.quick else MODELS:
        if ctx.out_of_time():
            not_run.append(f"{name}: time budget")
            continue
        config = config_for(ctx, name)
        task = load_task(config)
        eager = throughput(task, config, ctx.cuda, batch=batch, compile=False)
        compiled = throughput(task, config, ctx.cuda, batch=batch, compile=True)
        ctx.shared[shared_key(name, batch)] = compiled
        measured[name] = {"batch": batch, "eager": eager, "compiled": compiled, "loss_compiled": True,
                          "speedup": round(compiled["samples_per_s"] / eager["samples_per_s"], 3)}
        ctx.log(f"  compile {name:<10} eager {eager['samples_per_s']:9.1f}/s  compiled "
                f"{compiled['samples_per_s']:9.1f}/s  x{measured[name]['speedup']:.2f}")
        ctx.cuda.release()
    if not measured:
        return skipped("no model measured: " + "; ".join(not_run))
    on, why = compile_auto(ctx)
    result = verdict(ctx.cuda.name(), on, why, measured)
    result.figures["not_run"] = not_run
    return result
