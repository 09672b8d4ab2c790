#!/usr/bin/env python3
"""Predicted vs measured peak memory of a training step (make bench-memory).

For each model x three micro-batches x fp32/bf16, a fresh process (forked from a
server that has only imported torch and kfit) runs the step the predictor traces
(lib.memory.training_steps: two steps, the second accumulating, then zero_grad)
for real, its C heap set to hand freed memory back
(lib.hardware.allocator.return_freed_memory; KFIT_KEEP_MALLOC=1 keeps glibc's
defaults, KFIT_BENCH_HEAP=keep measures what keep_freed_memory, a CPU run's
setting where RAM is not short, keeps), and measures it with instruments that share nothing with the tracer:
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
make bench-memory installs); the Llama family's tiny and 20M presets with and
without gradient checkpointing (VARIANTS: a defconfig with changes).

Sharded cases (SHARDED_CASES, e.g. "gpt2-tiny-fsdp-x2"; CPU only): the
per-process peak of a data-parallel step. torchrun starts N processes with gloo
on this CPU; each builds the model, applies lib.parallel.tensor_parallelize
(CONFIG_TP's cases) and shard_model (what the trainer runs), runs the same step pair and measures it as above with its own
instruments; the table shows the largest rank's figures against the prediction
for that strategy at world size N (rank 0's trace). The allocator column can
count one collective's scratch twice there: gloo frees it on its own thread,
where the profiler records no free (seen on one rank of GPT-2 124M: +27 MiB).
Last line: memory-accuracy: device=<cpu|cuda> cases=N max_rel_err=X mean_rel_err=Y max_under=Z
(max_under: the largest under-prediction, 0 when none). --models picks cases by name
(a model of CASES, or a SHARDED_CASES name).
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
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_memory_instruments import PeakRSS, allocator_peak, rss  # noqa: E402  (allocator_peak: test_memory too)
from kfit_env import run_main  # noqa: E402
from lib import config as kconfig  # noqa: E402
from lib.env import env_choice  # noqa: E402
from lib.errors import KfitError  # noqa: E402

# model -> micro-batches; "outside" and "hf-*" are custom-model factories (below)
CASES = {"lenet5": (512, 1024, 2048), "resnet18": (8, 16, 32), "gpt2-tiny": (8, 16, 32),
         "custom-transformer": (32, 128, 512), "outside": (8, 32, 128),
         "hf-gpt2": (8, 32, 128), "hf-bert": (8, 32, 128),
         "llama-tiny": (16, 64), "llama-tiny-ckpt": (16, 64), "llama-20m": (4, 16), "llama-20m-ckpt": (4, 16),
         "llama-20m-sac-op": (4, 16), "llama-20m-sac-layer": (4, 16),
         # the zoo (scripts/zoo.py): Hugging Face families from small configs, at micro-batches a run of them
         # trains at. Not Mamba: on a CPU its reference scan allocates thousands of sub-64 KiB tensors per step,
         # which live in the C heap, where RSS moved 2-5 MiB (-7% to +5%) around the allocator's peak
         "hf-llama": (16, 64, 128), "hf-mixtral": (16, 64, 128), "hf-t5": (16, 64, 128), "hf-vit": (16, 64, 128),
         "hf-convnext": (16, 64, 128)}
# a CASES name that is a defconfig with changes: name -> (defconfig, its changes). Llama 20M at 256 tokens
# keeps a case's run short on a CPU; "-ckpt": gradient checkpointing (each block recomputed in backward);
# "-sac-*": selective activation checkpointing (CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_*).
VARIANTS = {"llama-tiny-ckpt": ("llama-tiny", {"GRADIENT_CHECKPOINTING": True}),
            "llama-20m": ("llama-tiny", {"LLAMA_PRESET_20M": True, "LLAMA_BLOCK_SIZE": 256}),
            "llama-20m-ckpt": ("llama-tiny", {"LLAMA_PRESET_20M": True, "LLAMA_BLOCK_SIZE": 256,
                                              "GRADIENT_CHECKPOINTING": True}),
            # selective activation checkpointing: each block keeps its attention and every other matmul
            # ("-sac-op"), or every second block is checkpointed in full ("-sac-layer")
            "llama-20m-sac-op": ("llama-tiny", {"LLAMA_PRESET_20M": True, "LLAMA_BLOCK_SIZE": 256,
                                                "GRADIENT_CHECKPOINTING": True,
                                                "ACTIVATION_CHECKPOINT_SELECTIVE_OP": True}),
            "llama-20m-sac-layer": ("llama-tiny", {"LLAMA_PRESET_20M": True, "LLAMA_BLOCK_SIZE": 256,
                                                   "GRADIENT_CHECKPOINTING": True,
                                                   "ACTIVATION_CHECKPOINT_SELECTIVE_LAYER": True})}
FACTORIES = {"outside": "outside_model:build", "hf-gpt2": "scripts.bench_memory:hf_gpt2",
             "hf-bert": "scripts.bench_memory:hf_bert",
             **{f"hf-{name}": f"scripts.zoo:{name}" for name in ("llama", "mixtral", "t5", "vit", "convnext")}}
# name -> (defconfig, its changes, strategy, processes, micro-batches, precisions): torchrun, CPU only.
# GPT-2 124M at 64 tokens: a model whose peak falls inside an all-gather (gloo's scratch copy counts there).
SHARDED_CASES = {"gpt2-tiny-fsdp-x2": ("gpt2-tiny", {}, "fsdp", 2, (8, 16, 32), ("fp32",)),
                 "gpt2-tiny-fsdp_grad_op-x2": ("gpt2-tiny", {}, "fsdp_grad_op", 2, (8, 32), ("fp32",)),
                 "gpt2-124m-fsdp-x2": ("gpt2", {"GPT2_PRESET_124M": True, "GPT2_BLOCK_SIZE": 64}, "fsdp", 2, (1, 4),
                                       ("fp32",)),
                 # tensor parallelism (CONFIG_TP): one group of 2, then 2 groups of 2 under FSDP
                 "llama-tiny-tp2-x2": ("llama-tiny", {"TP": 2}, "none", 2, (8, 32), ("fp32",)),
                 "llama-20m-tp2-x2": ("llama-tiny", {"LLAMA_PRESET_20M": True, "TP": 2}, "none", 2, (4,), ("fp32",)),
                 "llama-tiny-tp2-fsdp-x4": ("llama-tiny", {"TP": 2}, "fsdp", 4, (8,), ("fp32",)),
                 # pipeline parallelism (CONFIG_PP): PIPELINE_MICRO_BATCHES micro-batches of the batch a step
                 "llama-tiny-pp2-x2": ("llama-tiny", {"PP": 2, "LLAMA_TIE_EMBEDDINGS": False}, "none", 2, (8, 32),
                                       ("fp32",)),
                 "llama-20m-pp2-interleaved-x2": ("llama-tiny", {"LLAMA_PRESET_20M": True, "PP": 2,
                                                                 "PP_SCHEDULE_INTERLEAVED_1F1B": True,
                                                                 "LLAMA_TIE_EMBEDDINGS": False}, "none", 2, (4,),
                                                  ("fp32",)),
                 "llama-20m-pp2-gpipe-x2": ("llama-tiny", {"LLAMA_PRESET_20M": True, "PP": 2, "PP_SCHEDULE_GPIPE": True,
                                                           "LLAMA_TIE_EMBEDDINGS": False}, "none", 2, (4,), ("fp32",))}
PIPELINE_MICRO_BATCHES = 4  # a pipeline case's step: this many micro-batches of its batch (1F1B holds 2 at once)
MiB = 2**20
DEVICES = ("auto", "cpu", "cuda")

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
    """The case's Config (a VARIANTS name: its defconfig with its changes); the out-of-tree factory is
    written under workdir (put on sys.path)."""
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    (workdir / "outside_model.py").write_text(OUTSIDE_FACTORY)
    defconfig, changes = VARIANTS.get(name, (name, {}))
    config = kconfig.make_defconfig(defconfig if defconfig in kconfig.defconfig_names() else "custom-transformer",
                                    out=workdir / f"{name}.config")
    if changes:
        config = kconfig.derive(config, changes)
    if name in FACTORIES:
        config = kconfig.derive(config, {"CUSTOM_MODEL_FACTORY": FACTORIES[name]})
    return config


# --------------------------------------------------------------------------
# The measuring process (--measure): one case, a fresh interpreter


def measure(case: dict, mesh=None) -> dict:
    """One case's figures in this process; `mesh` (a rank under torchrun): shard the model on it first."""
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
        model = task.build(config.gradient_checkpointing).train()
        if config.pipeline_parallel > 1:
            return pipeline_pair(model, steps)
        model = model.to(device)
        if mesh is not None:
            from lib.parallel import is_sharded, shard_model, tensor_parallelize

            if config.tensor_parallel > 1:
                model = tensor_parallelize(model, mesh)
            if is_sharded(case["strategy"]):
                model = shard_model(model, case["strategy"], mesh, precision=precision)
        optimizer = step_optimizer(config, model, device)
        x, y = (t.to(device) for t in task.example_batch(batch))
        holder.update(model=model, optimizer=optimizer, x=x, y=y)  # freed by release()
        if not steps:
            return
        training_steps(model, optimizer, task.loss, x, y, grad_clip=config.grad_clip, foreach=device == "cuda",
                       autocast=autocast_for(SimpleNamespace(precision=precision, device_type=device)))
        if device == "cuda":
            torch.cuda.synchronize()

    def pipeline_pair(model, steps: bool) -> None:
        """A pipeline process's step pair as the trainer runs it: its stages of the model, the schedule over
        PIPELINE_MICRO_BATCHES micro-batches of `batch`, clipped across stages, the optimizer."""
        import torch.distributed as dist

        from lib.parallel import is_sharded, shard_model, tensor_parallelize
        from lib.pipeline import Pipeline, clip_grad_norm, keep_stages, process_stages, stages_per_process

        degree, schedule = config.pipeline_parallel, config.pipeline_schedule
        stage_rank = dist.get_rank() // (dist.get_world_size() // degree)
        per = stages_per_process(schedule)
        keep_stages(model, process_stages(stage_rank, degree, per), degree * per)
        if config.tensor_parallel > 1:
            model = tensor_parallelize(model, mesh)
        if is_sharded(case["strategy"]):
            model = shard_model(model, case["strategy"], mesh, precision=precision)
        pipeline = Pipeline(model, mesh["pp"].get_group(), stage_rank, degree, schedule, torch.device(device))
        optimizer = step_optimizer(config, model, device)
        share = batch * PIPELINE_MICRO_BATCHES
        x, y = task.example_batch(share)
        holder.update(model=model, optimizer=optimizer, x=x, y=y, pipeline=pipeline)
        if not steps:
            return
        for _ in range(2):  # lib.memory.training_steps' pair: the second accumulates on the first's gradients
            pipeline.step(x, y, share_max=share, micro_batch=batch, window=share, grad_factor=1, loss_fn=task.loss)
            if config.grad_clip > 0:
                clip_grad_norm(list(model.parameters()), config.grad_clip, pipeline.group)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def release() -> None:
        holder.clear()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        trim()

    base = rss()
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
    base, start = rss(), time.perf_counter()
    with PeakRSS() as steady:
        pair()
    seconds = time.perf_counter() - start
    release()
    allocated = allocator_peak(pair)  # last: the profiler leaves state behind that a later RSS would count
    return {"measured": steady.peak - base, "rss_first": first_growth, "allocated": allocated, "seconds": seconds}


def _set_heap() -> None:
    """The C heap as the bench measures it: freed memory returned (RSS holds to the prediction only then,
    lib/hardware/allocator.py); KFIT_BENCH_HEAP=keep measures keep_freed_memory's retention instead."""
    from lib.hardware.allocator import keep_freed_memory, return_freed_memory

    keep_freed_memory() if os.environ.get("KFIT_BENCH_HEAP") == "keep" else return_freed_memory()


def _measure_child(case: dict, conn) -> None:
    _set_heap()
    try:
        conn.send(("ok", measure(case)))
    except BaseException:  # noqa: BLE001 - reported by the parent
        conn.send(("error", traceback.format_exc()))


def _measure_rank(path: str) -> None:
    """A torchrun rank of a sharded case: join gloo, make the mesh, measure, write rank<N>.json beside `path`."""
    import json

    import torch.distributed as dist

    from lib.parallel import make_mesh

    _set_heap()
    case = json.loads(Path(path).read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = kconfig.read_config(case["config"])
    mesh = make_mesh("cpu", case["strategy"], dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                     config.tensor_parallel, config.pipeline_parallel)
    try:
        result = {"ok": measure(case, mesh)}
    except BaseException:  # noqa: BLE001 - reported by the parent
        result = {"error": traceback.format_exc()}
    Path(path).with_name(f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _pipeline_views(config, batch: int, strategy: str, precision: str) -> list[dict]:
    """The predictor's keywords for a case's processes: each of a pipeline's bounding ones (the planner's)."""
    from lib.planning.memory_policy import pipeline_views as views

    stages = config.pipeline_parallel
    return views(config, (stages, config.pipeline_schedule) if stages > 1 else None, batch * PIPELINE_MICRO_BATCHES,
                 strategy=strategy, precision=precision, tensor=config.tensor_parallel)


def measure_sharded(config, workdir: Path, strategy: str, processes: int, batch: int, precision: str) -> dict:
    """A sharded case under torchrun (gloo, this CPU): every rank's figures, and the largest rank's."""
    import json
    import subprocess

    case_dir = workdir / "sharded"
    case_dir.mkdir(exist_ok=True)
    for old in case_dir.glob("rank*.json"):
        old.unlink()
    (case_dir / "case.config").write_text(config.text)
    path = case_dir / "case.json"
    path.write_text(json.dumps({"config": str(case_dir / "case.config"), "device": "cpu", "batch": batch,
                                "precision": precision, "strategy": strategy}))
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes)),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(workdir), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(processes), __file__, "--measure-rank", str(path)],
                         env=env, cwd=str(ROOT), capture_output=True, text=True)
    ranks = []
    for r in range(processes):
        f = case_dir / f"rank{r}.json"
        result = json.loads(f.read_text()) if f.is_file() else {"error": "no result"}
        if "ok" not in result:
            sys.exit(f"measuring {strategy} x{processes} batch {batch} failed on rank {r} (torchrun exit "
                     f"{run.returncode}):\n{result['error']}\n{run.stderr[-3000:]}")
        ranks.append(result["ok"])
    worst = max(ranks, key=lambda m: m["measured"])
    return {**worst, "ranks": ranks}


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
    parser.add_argument("--device", choices=DEVICES, default=None, help="default: $DEVICE, else auto")
    parser.add_argument("--models", default=",".join([*CASES, *SHARDED_CASES]),
                        help="comma-separated subset of " + ", ".join([*CASES, *SHARDED_CASES]))
    parser.add_argument("--measure-rank", help=argparse.SUPPRESS)  # a torchrun rank of a sharded case
    args = parser.parse_args()
    if args.measure_rank:
        _measure_rank(args.measure_rank)
        return 0
    from lib.memory import MemoryPredictor

    device = args.device or env_choice("DEVICE", DEVICES, "auto")
    if device == "cuda" and not torch.cuda.is_available():  # refused before any case is traced or run
        raise KfitError(f"DEVICE=cuda, but torch sees no CUDA GPU (torch {torch.__version__}, CUDA build "
                        f"{torch.version.cuda or 'none'}): use DEVICE=cpu, or DEVICE=auto to take the GPU when "
                        "there is one")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    names = args.models.split(",")
    unknown = [n for n in names if n not in CASES and n not in SHARDED_CASES]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}: choose from {', '.join([*CASES, *SHARDED_CASES])}")
    if device != "cpu" and any(n in SHARDED_CASES for n in names):
        print(f"note: {', '.join(n for n in names if n in SHARDED_CASES)} skipped: the sharded cases run on a CPU")
        names = [n for n in names if n not in SHARDED_CASES]
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
        print(f"{'model':<26} {'batch':>5} {'prec':<5} {'predicted MiB':>13} {instrument:>12} {'rel err':>8} "
              f"{second:>13}" + ("" if device == "cuda" else f" {'RSS 1st':>8}") + f" {'trace s':>7} {'run s':>6}")
        for name in names:
            sharded = SHARDED_CASES.get(name)
            config = config_for(sharded[0] if sharded else name, workdir)
            if sharded and sharded[1]:
                config = kconfig.derive(config, sharded[1])
            for precision in (sharded[5] if sharded else ("fp32", "bf16")):
                for batch in (sharded[4] if sharded else CASES[name]):
                    if sharded:
                        strategy, nproc = sharded[2:4]
                        tensor, stages = config.tensor_parallel, config.pipeline_parallel
                        predicted = max((predictor.predict(config, batch=batch, device_type=device,
                                                           precision=precision, strategy=strategy,
                                                           world_size=nproc // (tensor * stages), tensor=tensor,
                                                           **view)
                                         for view in _pipeline_views(config, batch, strategy, precision)),
                                        key=lambda p: p.peak_bytes)  # the largest process's, as measured
                        m = measure_sharded(config, workdir, strategy, nproc, batch, precision)
                        label = name if stages > 1 else name.split("-tp")[0].rsplit("-", 2 if tensor == 1 else 0)[0] + (
                            f" {strategy} x{nproc}" if tensor == 1 else
                            f" tp{tensor}{'' if strategy == 'none' else ' ' + strategy} x{nproc}")
                    else:
                        predicted = predictor.predict(config, batch=batch, device_type=device, precision=precision)
                        m = processes.measure(config, workdir, device, batch, precision)
                        label = name
                    err = (predicted.peak_bytes - m["measured"]) / m["measured"]
                    errors.append(err)
                    print(f"{label:<26} {batch:>5} {precision:<5} {predicted.peak_bytes / MiB:>13.1f} "
                          f"{m['measured'] / MiB:>12.1f} {err:>+8.2%} {m['allocated'] / MiB:>13.1f}"
                          + ("" if device == "cuda" else f" {m['rss_first'] / MiB:>8.1f}")
                          + f" {predicted.trace.seconds:>7.2f} {m['seconds']:>6.1f}", flush=True)
    print(f"memory-accuracy: device={device} cases={len(errors)} max_rel_err={max(map(abs, errors)):.4f} "
          f"mean_rel_err={sum(map(abs, errors)) / len(errors):.4f} max_under={max(0.0, -min(errors)):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
