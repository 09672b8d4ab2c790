#!/usr/bin/env python3
"""Predicted vs measured peak memory of a training step (make bench-memory).

For each model x three micro-batches x fp32/bf16, a fresh process (forked from a
server that has only imported torch and kfit) runs the step the predictor traces
(lib.memory.training_steps: two steps, the second accumulating, then zero_grad)
for real, its C heap set to hand freed memory back
(lib.hardware.allocator.return_freed_memory; KFIT_KEEP_MALLOC=1 keeps glibc's
defaults), and measures it with instruments that share nothing with the tracer:
  cpu   RSS growth, the error's instrument: the process's peak resident memory
        (VmHWM, reset through /proc/self/clear_refs; elsewhere psutil sampled
        every millisecond) over its resident memory before the model is built.
        A warm-up pair at the same batch runs first: what a process pays once
        (kernels for these shapes, thread pools, lazy imports) is not a step's;
        its growth is printed as "RSS 1st".
        Beside it, the allocator's figure: torch.profiler's memory events over a
        last pair that builds everything it uses (the CPU allocator's peak running
        total, the scratch kernels allocate inside an op included).
  cuda  torch.cuda.max_memory_reserved after the warm-up (what other processes
        cannot use, the error's instrument); max_memory_allocated beside it.
The prediction is lib.memory's for the same device, overhead terms included,
from a fresh trace cache. Models: the shipped defconfigs, an out-of-tree
nn.TransformerEncoder, and Hugging Face GPT-2 and BERT built from small configs
(no download) whose outputs are ModelOutputs, all three through the custom-model
factory; the Hugging Face ones need `transformers` (requirements-bench.txt, which
make bench-memory installs).
Last line: memory-accuracy: device=<cpu|cuda> cases=N max_rel_err=X mean_rel_err=Y max_under=Z
(max_under: the largest under-prediction, 0 when none).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import multiprocessing
import os
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lib import config as kconfig  # noqa: E402
from lib.validation.measure import quiet_stderr  # noqa: E402

# model -> micro-batches; "outside" and "hf-*" are custom-model factories (below)
CASES = {"lenet5": (512, 1024, 2048), "resnet18": (8, 16, 32), "gpt2-tiny": (8, 16, 32),
         "custom-transformer": (32, 128, 512), "outside": (8, 32, 128),
         "hf-gpt2": (8, 32, 128), "hf-bert": (8, 32, 128)}
FACTORIES = {"outside": "outside_model:build", "hf-gpt2": "scripts.bench_memory:hf_gpt2",
             "hf-bert": "scripts.bench_memory:hf_bert"}
MiB = 2**20

# A custom model that lives outside the project: a torch.nn.Transformer encoder classifier.
OUTSIDE_FACTORY = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 96)
            layer = nn.TransformerEncoderLayer(96, 4, 384, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
            self.head = nn.Linear(96, 5)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def make_batch(n, generator):
        x = torch.randint(0, 64, (n, 48), generator=generator)
        return x, x[:, 0] % 5

    def build():
        return Classifier(), make_batch, lambda out, y: F.cross_entropy(out.float(), y)
''')

# --------------------------------------------------------------------------
# Models nobody in this project wrote: Hugging Face transformers, small configs, no download.
# The model itself is the factory's model: its output is a ModelOutput the loss reads .logits from.

HF_VOCAB, HF_SEQ = 4096, 64


def _tokens(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, HF_VOCAB, (n, HF_SEQ), generator=generator)


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=HF_VOCAB, n_positions=HF_SEQ,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    def make_batch(n, generator):  # next-token prediction on random tokens
        x = _tokens(n, generator)
        return x, torch.roll(x, -1, dims=1)

    def loss_fn(out, y):
        return F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten())

    return GPT2LMHeadModel(config), make_batch, loss_fn


def hf_bert():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                        vocab_size=HF_VOCAB, max_position_embeddings=HF_SEQ, num_labels=4,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    def make_batch(n, generator):
        x = _tokens(n, generator)
        return x, x[:, 0] % 4

    return BertForSequenceClassification(config), make_batch, lambda out, y: F.cross_entropy(out.logits.float(), y)


def config_for(name: str, workdir: Path):
    """The case's Config; the out-of-tree factory is written under workdir (put on sys.path)."""
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    (workdir / "outside_model.py").write_text(OUTSIDE_FACTORY)
    config = kconfig.make_defconfig(name if name in kconfig.defconfig_names() else "custom-transformer",
                                    out=workdir / f"{name}.config")
    if name in FACTORIES:
        config = kconfig.derive(config, {"CUSTOM_MODEL_FACTORY": FACTORIES[name]})
    return config


# --------------------------------------------------------------------------
# The measuring process (--measure): one case, a fresh interpreter


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakRSS:
    """Peak resident memory over a block: the kernel's VmHWM (reset first) on Linux, else psutil sampling."""

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            self._sampler = None
        except OSError:
            import psutil

            process, self._stop = psutil.Process(), threading.Event()
            self._samples = [process.memory_info().rss]

            def sample():
                while not self._stop.wait(0.001):
                    self._samples.append(process.memory_info().rss)

            self._sampler = threading.Thread(target=sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc):
        if self._sampler is None:
            self.peak = _status_bytes("VmHWM")
        else:
            self._stop.set()
            self._sampler.join()
            self.peak = max(self._samples)


def _rss() -> int:
    rss = _status_bytes("VmRSS")
    if rss is None:
        import psutil

        rss = psutil.Process().memory_info().rss
    return rss


def allocator_peak(run) -> int:
    """torch.profiler's memory events around run(), which builds everything it uses: the CPU allocator's peak."""
    from torch._C._profiler import _EventType

    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                profile_memory=True) as prof:
        run()
    allocations, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def measure(case: dict) -> dict:
    from lib.hardware.allocator import trim
    from lib.memory import step_optimizer, training_steps
    from lib.step import autocast_for, seed_everything
    from lib.task import load_task

    config = kconfig.read_config(case["config"])
    device, batch, precision = case["device"], case["batch"], case["precision"]
    task = load_task(config)
    holder = {}

    def pair(steps: bool = True) -> None:
        """Build the model, optimizer and batch on the device and run the traced step pair."""
        seed_everything(0)
        model = task.build(config.gradient_checkpointing).train().to(device)
        optimizer = step_optimizer(config, model, device)
        x, y = (t.to(device) for t in task.example_batch(batch))
        holder.update(model=model, optimizer=optimizer, x=x, y=y)  # freed by release()
        if not steps:
            return
        training_steps(model, optimizer, task.loss, x, y, grad_clip=config.grad_clip, foreach=device == "cuda",
                       autocast=autocast_for(SimpleNamespace(precision=precision, device_type=device)))
        if device == "cuda":
            torch.cuda.synchronize()

    def release() -> None:
        holder.clear()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        trim()

    base = _rss()
    with PeakRSS() as first:  # the first pair pays what a process pays once (kernels, thread pools, imports)
        pair()
    first_growth = first.peak - base
    release()
    pair(steps=False)  # a second model build still finds caches to fill (about 0.3 MiB)
    release()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        pair()
        return {"measured": torch.cuda.max_memory_reserved(), "allocated": torch.cuda.max_memory_allocated(),
                "seconds": time.perf_counter() - start}
    base, start = _rss(), time.perf_counter()
    with PeakRSS() as steady:
        pair()
    seconds = time.perf_counter() - start
    release()
    allocated = allocator_peak(pair)  # last: the profiler leaves state behind that a later RSS would count
    return {"measured": steady.peak - base, "rss_first": first_growth, "allocated": allocated, "seconds": seconds}


def _measure_child(case: dict, conn) -> None:
    from lib.hardware.allocator import return_freed_memory

    return_freed_memory()  # RSS holds to the prediction only then (lib/hardware/allocator.py)
    try:
        conn.send(("ok", measure(case)))
    except BaseException:  # noqa: BLE001 - reported by the parent
        conn.send(("error", traceback.format_exc()))


class FreshProcesses:
    """Each case in a fresh process, forked from a server that has only imported torch and kfit
    (and transformers): the case's heap, threads and RSS start clean, without paying `import torch`."""

    def __init__(self) -> None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.context = multiprocessing.get_context(method)
        # torch._dynamo: the optimizers import it on first use (2 s)
        preload = ["torch", "torch._dynamo", "lib.memory", "lib.task", "lib.hardware.allocator", "__main__"]
        if importlib.util.find_spec("transformers"):
            preload.append("transformers")
        if method == "forkserver":
            self.context.set_forkserver_preload(preload)

    def measure(self, config, workdir: Path, device: str, batch: int, precision: str) -> dict:
        path = workdir / "case.config"
        path.write_text(config.text)
        case = {"config": str(path), "device": device, "batch": batch, "precision": precision}
        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_measure_child, args=(case, send))
        process.start()
        send.close()
        try:
            status, value = receive.recv()
        except EOFError:
            status, value = "error", "the measuring process died"
        process.join()
        if status != "ok":
            sys.exit(f"measuring {case} failed (exit {process.exitcode}):\n{value}")
        return value


# --------------------------------------------------------------------------
# The table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=os.environ.get("DEVICE", "auto"))
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    args = parser.parse_args()
    from lib.memory import MemoryPredictor

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    names = args.models.split(",")
    if importlib.util.find_spec("transformers") is None:
        skipped = [n for n in names if n.startswith("hf-")]
        names = [n for n in names if not n.startswith("hf-")]
        if skipped:
            print(f"note: {', '.join(skipped)} skipped: transformers is not installed "
                  "(make bench-memory installs requirements-bench.txt)")
    os.environ["HF_HUB_OFFLINE"] = "1"  # the Hugging Face models are built from configs: never download
    processes = FreshProcesses()
    errors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        predictor = MemoryPredictor(cache_dir=workdir)  # a fresh cache: every prediction is traced here
        instrument = "reserved MiB" if device == "cuda" else "RSS MiB"
        second = "allocated MiB" if device == "cuda" else "allocator MiB"
        print(f"{'model':<20} {'batch':>5} {'prec':<5} {'predicted MiB':>13} {instrument:>12} {'rel err':>8} "
              f"{second:>13}" + ("" if device == "cuda" else f" {'RSS 1st':>8}") + f" {'trace s':>7} {'run s':>6}")
        for name in names:
            config = config_for(name, workdir)
            for precision in ("fp32", "bf16"):
                for batch in CASES[name]:
                    predicted = predictor.predict(config, batch=batch, device_type=device, precision=precision)
                    m = processes.measure(config, workdir, device, batch, precision)
                    err = (predicted.peak_bytes - m["measured"]) / m["measured"]
                    errors.append(err)
                    print(f"{name:<20} {batch:>5} {precision:<5} {predicted.peak_bytes / MiB:>13.1f} "
                          f"{m['measured'] / MiB:>12.1f} {err:>+8.2%} {m['allocated'] / MiB:>13.1f}"
                          + ("" if device == "cuda" else f" {m['rss_first'] / MiB:>8.1f}")
                          + f" {predicted.trace.seconds:>7.2f} {m['seconds']:>6.1f}", flush=True)
    print(f"memory-accuracy: device={device} cases={len(errors)} max_rel_err={max(map(abs, errors)):.4f} "
          f"mean_rel_err={sum(map(abs, errors)) / len(errors):.4f} max_under={max(0.0, -min(errors)):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
