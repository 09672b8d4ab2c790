"""One-off GPU diagnostic (not part of kfit): the caching allocator's event stream of each memory-check step.

For every eager case of lib.validation.memory_check (full mode), runs the step
as measure_cuda does (fresh cache, one call of training_steps) under
torch.cuda.memory._record_memory_history and writes, per case, the max
reserved/allocated and the compact events [action, addr, size, stream] to
$1/alloc_events.jsonl: ground truth for an allocator model built off the GPU.
An optional $2 keeps only the cases whose label contains it (e.g. gpt2-124m-50k).
"""
import gzip
import tempfile
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lib.hardware  # noqa: F401  (expandable segments, as kfit runs)
import torch

from lib import config as kconfig
from lib.task import load_task
from lib.validation.measure import CudaDevice, build_step
from lib.validation import vocab
from lib.validation.memory_check import cases

R = Path(sys.argv[1])
WORK = Path(tempfile.mkdtemp(prefix="alloc-events-"))  # configs and corpora: not in the output folder
OUT = gzip.open(R / "alloc_events.jsonl.gz", "at")
cuda = CudaDevice()
loaded = {}
for case in cases("cuda", quick=False):
    if case.compile or (len(sys.argv) > 2 and sys.argv[2] not in case.label):
        continue
    if case.model not in loaded:
        loaded.clear()
        config = vocab.make_config(WORK, case.model) if case.model == vocab.MODEL else \
            kconfig.make_defconfig(case.model, out=WORK / f"{case.model}.config")
        loaded[case.model] = config, load_task(config)
    config, task = loaded[case.model]
    if case.checkpointing:
        config = kconfig.derive(config, {"GRADIENT_CHECKPOINTING": True})
    cuda.reset_peaks()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python", context="alloc")
    run, kept = build_step(task, config, batch=case.batch, precision=case.precision, device=cuda.device,
                           device_type="cuda")
    run()
    torch.cuda.synchronize()
    reserved, allocated = cuda.peaks()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [[e["action"], e["addr"], e["size"], e.get("stream", 0)] for e in snap["device_traces"][0]]
    line = {"case": case.label, "max_reserved": reserved, "max_allocated": allocated, "n_events": len(events),
            "segments": [[s["address"], s["total_size"], s["allocated_size"], s.get("segment_type"), s.get("stream")]
                         for s in snap["segments"]], "events": events}
    OUT.write(json.dumps(line) + "\n")
    print(case.label, reserved / 2**20, allocated / 2**20, len(events), flush=True)
    del run, kept
OUT.close()
