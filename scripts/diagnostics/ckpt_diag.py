"""Why a checkpointed bf16 step's trace for CUDA fails on one torch and not another (validate-gpu's fsdp check,
NVIDIA H200, torch 2.11, 2026-11-27): traces GPT-2 124M at micro-batch 16, checkpointed, for a CUDA target, under
FSDP2 and unsharded, bf16 and fp32, and prints each outcome with torch.utils.checkpoint's whole message (which
tensors were recomputed with other metadata). One JSON line per case. Run: python3 scripts/diagnostics/ckpt_diag.py
"""

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import torch

    from lib import config as kconfig
    from lib.memory.sharded import trace_sharded_step
    from lib.memory.trace import trace_step
    from lib.task import load_task

    from lib.memory import autocast as casts

    calls = {"backward": 0, "cast_in_backward": 0}
    original, inside = casts.CudaCastLists._backward, [False]

    def counted(self, func, args, kwargs):  # is backward routed through the mode, and does the recompute cast?
        calls["backward"] += 1
        inside[0] = True
        try:
            return original(self, func, args, kwargs)
        finally:
            inside[0] = False

    handler = casts.CudaCastLists.__torch_function__

    def seen(self, func, types, args=(), kwargs=None):
        if inside[0] and func in casts.FP32_INPUTS and torch.is_autocast_enabled("cpu"):
            calls["cast_in_backward"] += 1
        return handler(self, func, types, args, kwargs)

    casts.CudaCastLists._backward, casts.CudaCastLists.__torch_function__ = counted, seen
    print(json.dumps({"torch": torch.__version__}), flush=True)
    out = Path(tempfile.mkdtemp())
    config = kconfig.make_defconfig("gpt2", out=out / "gpt2.config")
    config = kconfig.derive(config, {"GRADIENT_CHECKPOINTING": True})
    task = load_task(config)
    cases = [("fsdp", "bf16"), ("none", "bf16"), ("fsdp", "fp32")]
    for strategy, precision in cases:
        start = time.perf_counter()
        row = {"strategy": strategy, "precision": precision}
        try:
            if strategy == "none":
                trace = trace_step(task, config, batch=16, precision=precision, device_type="cuda",
                                   gradient_checkpointing=True)
            else:
                trace = trace_sharded_step(task, config, batch=16, precision=precision, device_type="cuda",
                                           gradient_checkpointing=True, strategy=strategy, world_size=1,
                                           local_world_size=1)
            row["peak_mib"] = round(trace.peak_bytes / 2**20, 1)
        except Exception as err:  # noqa: BLE001 - the message is the finding
            row["error"] = f"{type(err).__name__}: {err}"[:4000]
            row["where"] = traceback.format_exc(limit=-4)[-2500:]
        row["seconds"] = round(time.perf_counter() - start, 1)
        row.update(calls)
        calls.update(backward=0, cast_in_backward=0)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
