"""kfit's training loop against a minimal one on the same device: what the trainer costs per sample.

The comparison is loop_compare.py's, the one `make bench-loop` runs on the CPU: the same model, data, loss,
optimizer (the AdamW implementation kfit's runs), clipping, autocast (the plan's precision), micro-batch,
threads and loader workers train in kfit's Trainer.fit() and in a minimal torch loop, the reference's steps
interleaved in chunks inside kfit's run (the device synchronised at each chunk's boundaries), neither
evaluating while timed, each side's rate the samples its timed steps trained on over their seconds.

Here: GPT-2-tiny at 64 on a GPU, LeNet-5 at 32 with DEVICE=cpu, ROUNDS rounds (fewer where the check's
budget runs out after one). overhead = kfit's seconds per sample over the reference's, less 1, of the median
round; the check passes within TOLERANCE. kfit_ms and reference_ms are each side's milliseconds per full
micro-batch at its median round's rate.
"""

from __future__ import annotations

from .loop_compare import Case, compare
from .report import Context, Result, failed, passed

# device -> case. GPT-2-tiny at 64 is a host-bound step on an H100 (about 9 ms): the loop's own work shows there
# if anywhere; chunks of 10 steps, about 0.1 s. LeNet-5 at 32 on a CPU: short, as the test suite runs it.
CASES = {"cuda": Case("gpt2-tiny", 64, steps=100, warmup=10, chunk=10),
         "cpu": Case("lenet5", 32, steps=20, warmup=3, chunk=5)}
# Three on a GPU: a host-bound step's rounds there moved 2-7% each, and the median of two is their mean.
ROUNDS = {"cuda": 3, "cpu": 2}
TOLERANCE = {"cuda": 0.10, "cpu": 0.5}  # a shared 2-core CPU moves 30% between runs


def judge(device: str, figures: dict) -> Result:
    overhead = figures["overhead"]
    text = (f"{figures['model']} micro-batch {figures['micro_batch']} {figures['precision']}: kfit "
            f"{figures['kfit_ms']:.2f} ms/step, reference {figures['reference_ms']:.2f} ms/step, "
            f"overhead {overhead:+.1%}")
    figures = {**figures, "tolerance": TOLERANCE[device]}
    if overhead <= TOLERANCE[device]:
        return passed(text, **figures)
    return failed(f"{text}: above {TOLERANCE[device]:.0%}", **figures)


def check_loop(ctx: Context) -> Result:
    case = CASES[ctx.device]
    synchronize = ctx.cuda.synchronize if ctx.cuda is not None else (lambda: None)
    result = compare(case, ROUNDS[ctx.device], ctx.workdir, device=ctx.device, synchronize=synchronize,
                     out_of_time=ctx.out_of_time)
    figures = {"model": case.name, "micro_batch": case.micro_batch, "precision": result.precision,
               "steps": case.steps, "warmup": case.warmup, "rounds": len(result.kfit_rounds),
               "kfit_ms": round(case.micro_batch / result.kfit * 1e3, 3),
               "reference_ms": round(case.micro_batch / result.reference * 1e3, 3),
               "overhead": round(result.overhead, 4),
               "kfit_rounds_s": [round(s, 4) for s, _ in result.kfit_rounds],
               "reference_rounds_s": [round(s, 4) for s, _ in result.reference_rounds]}
    return judge(ctx.device, figures)
