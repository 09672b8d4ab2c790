"""Model FLOPs utilisation of GPT-2 124M compiled, on GPT-2's 50,257-token vocabulary, measured.

MFU = the step's counted FLOPs per sample (lib.steptime's count: matmuls and attention, forward and
backward) x the measured samples/s, over the datasheet peak of the precision (the GPU catalog's), as the
plan's predicted MFU is (lib.planning.throughput.model_flops_utilisation, called here with the measured
throughput in place of the predicted one). The throughput is the compile check's compiled bf16 GPT-2 at
micro-batch BATCH (warm, after the first compile), reused rather than compiled again; where that check
did not measure it, this one does, the same way. The plan for that micro-batch, compiled, gives the
predicted MFU beside it, and so checks the compiled step-time prediction the step-time check (eager) leaves.

The check passes at FLOOR or more (see its comment) and reports the figure either way.
"""

from __future__ import annotations

from types import SimpleNamespace

from . import vocab
from .compile_check import shared_key, throughput
from .report import Context, Result, failed, passed, skipped

BATCH = 16  # sequences of 1,024 tokens per micro-batch: 16k tokens, a size GPT-2 124M trains at on one GPU
# A quarter of the datasheet peak. The step-time model expects matmuls at 60% of the datasheet
# (lib.steptime.device.GPU_COMPUTE_EFFICIENCY) and the vocabulary's logits and fp32 cross-entropy to be
# bandwidth-bound, which puts this step near a third of the peak on an H100 (the plan's predicted MFU,
# in the figures); under a quarter, something the plan assumes is not happening: attention without its
# fused kernel, matmuls outside bf16, or a host-bound step.
FLOOR = 0.25


def plan_for(ctx: Context):
    """(config, hardware, plan) of GPT-2 124M on the 50,257-token vocabulary at BATCH x 1, compiled, bf16."""
    from ..hardware import resolve_hardware
    from ..hyperparams import ModelDescription, resolve

    config = vocab.make_config(ctx.workdir, "mfu", {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": BATCH,
                                                    "GRADIENT_ACCUMULATION": 1, "COMPILE_MANUAL": True,
                                                    "COMPILE_MODEL": True, "PRECISION_BF16": True})
    hardware = resolve_hardware()
    return config, hardware, resolve(config, hardware, ModelDescription.from_config(config))


def measured_mfu(plan, speed_model, samples_per_s: float) -> tuple[float | None, str]:
    """The plan's MFU formula with the measured samples/s in place of the predicted."""
    from ..planning.throughput import model_flops_utilisation

    measured = SimpleNamespace(micro_batch=plan.micro_batch, precision=plan.precision, tf32=plan.tf32,
                               world_size=plan.world_size, cpu_threads=plan.cpu_threads,
                               predicted_samples_per_second=samples_per_s)
    return model_flops_utilisation(measured, speed_model)


def judge(mfu: float | None, why: str, figures: dict) -> Result:
    figures = {**figures, "mfu": None if mfu is None else round(mfu, 4), "mfu_how": why, "floor": FLOOR}
    if mfu is None:
        return failed(f"no MFU: {why}", **figures)
    predicted = figures.get("predicted_mfu")
    text = (f"{vocab.LABEL} bf16 compiled, micro-batch {figures['micro_batch']}: "
            f"{figures['samples_per_s']:,.1f} samples/s, MFU {mfu:.1%}"
            + (f" (predicted {predicted:.1%})" if predicted is not None else ""))
    if mfu >= FLOOR:
        return passed(text, **figures)
    return failed(f"{text}: under the {FLOOR:.0%} floor", **figures)


def speed_model(config, hardware, plan):
    from ..steptime import model_for_plan

    return model_for_plan(config, hardware, plan)


def check_mfu(ctx: Context, plan_for=plan_for, speed_model_for=speed_model) -> Result:
    """(plan_for and speed_model_for: the tests' stand-ins for planning GPT-2 124M and counting its FLOPs)"""
    if ctx.device != "cuda":
        return skipped("DEVICE=cpu: MFU is against a GPU's datasheet peak (make plan shows a CPU's predicted one)")
    from ..task import load_task

    config, hardware, plan = plan_for(ctx)
    measured = ctx.shared.get(shared_key(vocab.MODEL, BATCH))
    source = "the compile check's measurement"
    if measured is None:
        task = load_task(config)
        measured = throughput(task, config, ctx.cuda, batch=BATCH, compile=True)
        source = "measured here"
        ctx.cuda.release()
    model = speed_model_for(config, hardware, plan)
    if model is None:
        return skipped(f"no datasheet peak for {plan.device_name} in the GPU catalog (lib/hardware/gpus.json)",
                       samples_per_s=measured["samples_per_s"])
    mfu, why = measured_mfu(plan, model, measured["samples_per_s"])
    predicted_sps = plan.predicted_samples_per_second
    figures = {"micro_batch": plan.micro_batch, "precision": plan.precision, "compiled": plan.compile,
               "samples_per_s": measured["samples_per_s"], "first_compile_s": measured.get("warm_up_s"),
               "throughput_source": source, "predicted_mfu": plan.predicted_mfu and round(plan.predicted_mfu, 4),
               "predicted_samples_per_s": predicted_sps and round(predicted_sps, 1),
               "predicted_error": predicted_sps and round((predicted_sps - measured["samples_per_s"])
                                                          / measured["samples_per_s"], 4)}
    return judge(mfu, why, figures)
