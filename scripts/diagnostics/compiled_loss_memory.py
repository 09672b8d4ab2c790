"""One-off diagnostic (not part of kfit): the peak memory of a language model's step eager against compiled
with its loss (lib/step.py forward_loss, as kfit compiles), beside what the planner predicts from its eager
trace, on this CPU.

GPT-2 (preset $2, default TINY) on GPT-2's 50,304-token padded vocabulary (random token ids, no download),
fp32, micro-batch $3 (default 2), block 1,024: the logits and the cross-entropy dominate the step. Each
step is measured as lib/validation/measure.py's measure_cpu measures (the profiler's memory timeline), the
compiled one after its first (compiling) call. Appends JSON lines to $1/compiled_loss_memory.jsonl.
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

from lib.memory import MemoryPredictor
from lib.task import load_task
from lib.validation import vocab
from lib.validation.measure import build_step, profiled_peak

R = Path(sys.argv[1])
PRESET = sys.argv[2] if len(sys.argv) > 2 else "TINY"
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 2
R.mkdir(parents=True, exist_ok=True)
config = vocab.make_config(R, f"loss-memory-{PRESET}", {f"GPT2_PRESET_{PRESET}": True},
                           vocab_size=vocab.PADDED_VOCAB)
task = load_task(config)
prediction = MemoryPredictor().predict(config, batch=BATCH, device_type="cpu", precision="fp32")
with open(R / "compiled_loss_memory.jsonl", "a") as out:
    for compiled in (False, True):
        torch._dynamo.reset()
        run, kept = build_step(task, config, batch=BATCH, precision="fp32", device="cpu", device_type="cpu",
                               compile=compiled)
        started = time.perf_counter()
        run()  # compiled: the first call compiles
        line = {"preset": PRESET, "batch": BATCH, "rows": vocab.PADDED_VOCAB, "compiled": compiled,
                "first_call_s": round(time.perf_counter() - started, 1),
                "measured_mib": round(profiled_peak(run) / 2**20, 1),
                "predicted_mib": round(prediction.peak_bytes / 2**20, 1), "torch": torch.__version__}
        print(json.dumps(line), flush=True)
        out.write(json.dumps(line) + "\n")
        del run, kept
