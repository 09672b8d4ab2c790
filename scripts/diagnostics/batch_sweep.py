"""One-off GPU diagnostic (not part of kfit): one model's step at several micro-batches, for the step-time
model's transfer from one micro-batch to another, and GPT-2 124M's head at 50,257 rows against 50,304.

Per case (model, head rows, micro-batch, eager or compiled, bf16): the median wall ms of forward+backward
alone and of a whole step (forward, backward, clipping, kfit's AdamW, zero_grad), each synchronised, as
phase_times.py times them. Appends to $1/batch_sweep.jsonl; stops starting cases after $2 seconds (default
240), so a device call's time limit never cuts one off half written. DEVICE=cpu runs a short version of
every case on the CPU (to try the script, not to measure). SWEEP=loss runs the second set instead: the loss
compiled in one graph with the model against the model alone (as the trainer compiles), and GPT-2-tiny's
host-bound steps again, each timed in three rounds, to see how far they move between rounds.

SWEEP=paired times each model's micro-batches in turn within a round (PAIRED_ROUNDS rounds, the order
reversed every other round; each a median of PAIRED_STEPS whole steps), into batch_sweep_paired.jsonl,
one line per series with every round's step at every size: a host-bound step's rounds moved 30-50% a
few seconds apart, so steps timed one size after another compared the moments more than the sizes, and a
round's sizes share their moment (the median of the rounds' ratios, as make bench-steptime on a CPU).
Compiled, the loss is compiled with the model as kfit compiles it, one graph per micro-batch.
"""
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lib.hardware  # noqa: F401 - the allocator as kfit's runs have it, before CUDA starts
import torch

from lib import config as kconfig
from lib.memory import step_optimizer
from lib.step import autocast_for
from lib.task import load_task
from lib.validation import vocab

R = Path(sys.argv[1])
DEADLINE = time.monotonic() + float(sys.argv[2] if len(sys.argv) > 2 else 240)
DEVICE = os.environ.get("DEVICE", "cuda")
CPU = DEVICE == "cpu"

# (model, head rows or None, micro-batches, compiled: False, True (the model) or "loss" (model and loss)):
# most wanted first
CASES = [
    ("gpt2-50k", vocab.GPT2_VOCAB, (4, 8, 16), False),
    ("gpt2-50k", vocab.PADDED_VOCAB, (4, 8, 16), False),
    ("gpt2-50k", vocab.GPT2_VOCAB, (16,), True),
    ("gpt2-50k", vocab.PADDED_VOCAB, (16,), True),
    ("gpt2-tiny", None, (8, 16, 32, 64, 128, 256), False),
    ("resnet18", None, (64, 128, 256, 512), False),
    ("gpt2-tiny", None, (16, 64, 256), True),
    ("resnet18", None, (128, 512), True),
]
LOSS = os.environ.get("SWEEP") == "loss"
if LOSS:
    CASES = [
        ("gpt2-50k", vocab.PADDED_VOCAB, (8, 16, 32), "loss"),
        ("gpt2-50k", vocab.PADDED_VOCAB, (8, 16, 32), True),
        ("gpt2-50k", vocab.GPT2_VOCAB, (16,), "loss"),
        ("gpt2-tiny", None, (8, 16, 32, 64, 128), False),
        ("gpt2-tiny", None, (16, 64), "loss"),
        ("gpt2-tiny", None, (16, 64), True),
    ]
PAIRED = os.environ.get("SWEEP") == "paired"
if PAIRED:  # the series whose calibrated transfers the first sweeps could not settle, with the loss compiled
    CASES = [
        ("gpt2-tiny", None, (8, 32, 128, 256), False),
        ("resnet18", None, (64, 128, 256, 512), False),
        ("gpt2-tiny", None, (16, 64, 256), "loss"),
        ("resnet18", None, (128, 256, 512), "loss"),
        ("gpt2-50k", vocab.PADDED_VOCAB, (8, 16, 32), "loss"),
        ("gpt2-50k", vocab.GPT2_VOCAB, (4, 8, 16), False),
    ]
PAIRED_ROUNDS, PAIRED_STEPS = (2, 2) if CPU else (7, 10)
OUT = open(R / ("batch_sweep_paired.jsonl" if PAIRED else "batch_sweep.jsonl"), "a")
ROUNDS = 3 if LOSS else 1
if CPU:
    CASES = [(m, rows if m != "gpt2-50k" else vocab.PADDED_VOCAB, (2 if m != "gpt2-50k" else 1,), c)
             for m, rows, _, c in CASES][:4 if LOSS else None]
    if PAIRED:
        CASES = [(m, rows if m != "gpt2-50k" else vocab.PADDED_VOCAB, (1, 2), c) for m, rows, _, c in CASES[:4]]


def sync():
    if not CPU:
        torch.cuda.synchronize()


def median_ms(fn, n=3 if CPU else 30):
    for _ in range(2 if CPU else min(5, n)):
        fn()
    sync()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return round(sorted(ts)[n // 2] * 1e3, 3)


def config_for(name, rows):
    if name == "gpt2-50k":
        return vocab.make_config(R, f"sweep-{rows}", vocab_size=rows)
    return kconfig.make_defconfig(name, out=R / f"sweep-{name}.config")


def setup(name, rows):
    """(config, task, model, optimizer, autocast) of one case, bf16, as a run on the GPU has them."""
    config = config_for(name, rows)
    task = load_task(config)
    model = task.build(False).train().to(DEVICE)
    torch.backends.cudnn.benchmark = True  # as AUTO plans on a GPU
    return (config, task, model, step_optimizer(config, model, DEVICE),
            autocast_for(SimpleNamespace(precision="bf16", device_type=DEVICE)))


def run_case(name, rows, batches, compiled):
    config, task, model, optimizer, autocast = setup(name, rows)
    for batch in batches:
        if time.monotonic() > DEADLINE:
            return
        torch._dynamo.reset()  # one graph per micro-batch, compiled for that shape as a run compiles it
        if compiled == "loss":
            fwd_loss = torch.compile(lambda x, y: task.loss(model(x), y), dynamic=False)
        else:
            fwd = torch.compile(model, dynamic=False) if compiled else model
            fwd_loss = lambda x, y: task.loss(fwd(x), y)  # noqa: E731
        x, y = (t.to(DEVICE) for t in task.example_batch(batch))

        def fb():
            with autocast:
                loss = fwd_loss(x, y)
            loss.backward()

        def step():
            fb()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=not CPU)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

        t0 = time.perf_counter()
        fb()
        sync()
        first = round(time.perf_counter() - t0, 2)
        rounds = [(median_ms(fb), median_ms(step)) for _ in range(ROUNDS)]
        line = {"model": name, "rows": rows, "micro_batch": batch, "compiled": bool(compiled), "precision": "bf16",
                "first_call_s": first, "fwd_bwd_ms": sorted(r[0] for r in rounds)[ROUNDS // 2],
                "step_ms": sorted(r[1] for r in rounds)[ROUNDS // 2],
                "device": torch.cuda.get_device_name() if not CPU else "cpu"}
        if LOSS:
            line.update(loss_compiled=compiled == "loss", rounds_fwd_bwd_ms=[r[0] for r in rounds],
                        rounds_step_ms=[r[1] for r in rounds])
        print(json.dumps(line), flush=True)
        OUT.write(json.dumps(line) + "\n")
        OUT.flush()
        del x, y, fwd_loss
    del model, optimizer
    if not CPU:
        torch.cuda.empty_cache()


def run_paired(name, rows, batches, compiled):
    """Every micro-batch's step in turn, PAIRED_ROUNDS times: one line with each size's steps by round,
    written at the end. Past the deadline it stops after three rounds, so a case started just before it
    runs on for its compiles and three rounds (GPT-2 124M compiled at 8-32: about 100 s on an H100)."""
    assert compiled in (False, "loss"), compiled  # compiled, kfit compiles the loss with the model
    config, task, model, optimizer, autocast = setup(name, rows)
    torch._dynamo.reset()
    loss_fn = lambda x, y: task.loss(model(x), y)  # noqa: E731
    fwd_loss = torch.compile(loss_fn, dynamic=False) if compiled else loss_fn  # a graph per shape, as a run's
    data = {b: tuple(t.to(DEVICE) for t in task.example_batch(b)) for b in batches}

    def step(b):
        with autocast:
            loss = fwd_loss(*data[b])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=not CPU)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    first = {}
    for b in batches:
        t0 = time.perf_counter()
        step(b)
        sync()
        first[b] = round(time.perf_counter() - t0, 2)
    rounds = {b: [] for b in batches}
    for r in range(PAIRED_ROUNDS):
        if time.monotonic() > DEADLINE and r >= 3:
            break
        for b in (batches if r % 2 == 0 else batches[::-1]):
            rounds[b].append(median_ms(lambda: step(b), n=PAIRED_STEPS))
    line = {"model": name, "rows": rows, "compiled": bool(compiled), "loss_compiled": compiled == "loss",
            "precision": "bf16", "first_call_s": first, "steps_per_round": PAIRED_STEPS,
            "rounds_step_ms": {str(b): ms for b, ms in rounds.items()},
            "device": torch.cuda.get_device_name() if not CPU else "cpu"}
    print(json.dumps(line), flush=True)
    OUT.write(json.dumps(line) + "\n")
    OUT.flush()
    del model, optimizer, data, fwd_loss, loss_fn
    if not CPU:
        torch.cuda.empty_cache()


for case in CASES:
    if time.monotonic() > DEADLINE:
        print(f"deadline: not run {case}", flush=True)
        continue
    (run_paired if PAIRED else run_case)(*case)
