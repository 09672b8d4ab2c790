"""Does a sharded trace leave state that fails the next, checkpointed one? (validate-gpu's fsdp check on torch 2.11,
2026-11-27: a fresh process traced GPT-2 124M bf16 checkpointed for CUDA, ckpt_diag.py, while the check's tracer
process, which had traced the unsharded cases first, raised CheckpointError.) In one process: GPT-2 124M bf16 under
FSDP2 in the fsdp check's cases and order (the checkpointed ones last; pass "as is"), then the same with DTensor's sharding-propagation caches
cleared before each trace (pass "caches cleared"). One JSON line per trace."""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def clear_caches() -> list[str]:
    from torch.distributed.tensor import DTensor

    prop, cleared = DTensor._op_dispatcher.sharding_propagator, []
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        clear = getattr(getattr(prop, name, None), "cache_clear", None)
        if clear:
            clear()
            cleared.append(name)
    return cleared


def main() -> None:
    import torch

    from lib import config as kconfig
    from lib.memory.sharded import trace_sharded_step
    from lib.task import load_task
    from lib.validation.fsdp_check import cases

    print(json.dumps({"torch": torch.__version__}), flush=True)
    out = Path(tempfile.mkdtemp())
    tasks = {}
    for mode in ("as is", "caches cleared"):
        for case in cases("cuda", False):
            if case.model not in tasks:
                base = kconfig.make_defconfig(case.model, out=out / f"{case.model}.config")
                tasks[case.model] = base, load_task(base)
            config, task = tasks[case.model]
            if case.checkpointing:
                config = kconfig.derive(config, {"GRADIENT_CHECKPOINTING": True})
            row = {"pass": mode, "case": case.label}
            if mode == "caches cleared":
                row["cleared"] = clear_caches()
            start = time.perf_counter()
            try:
                trace = trace_sharded_step(task, config, batch=case.batch, precision=case.precision,
                                           device_type="cuda", gradient_checkpointing=case.checkpointing,
                                           strategy=case.strategy, world_size=1, local_world_size=1,
                                           cpu_offload=case.cpu_offload)
                row["peak_mib"] = round(trace.peak_bytes / 2**20, 1)
            except Exception as err:  # noqa: BLE001 - the message is the finding
                row["error"] = f"{type(err).__name__}: {err}"[:3000]
            row["seconds"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
