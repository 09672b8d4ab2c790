"""make randcheck: the configuration space tested as a space, as the kernel tests its own with randconfig.

Each draw is a random valid config, drawn the kernel's way (lib/config/generate.py: every visible choice,
bool and ranged number at random, in menu order) after the options users run most were weighted in: a
model family first (language models most), then for language models bf16, checkpointing and FSDP, for image
models compile. Sizes are clamped small (SMALL: the tiny presets, short contexts, small batches): the logic
under test is the same at any size, and the sweep stays minutes long. Every draw is strict: what the reader
refuses is drawn again, as randconfig does.

Each draw is planned by the real planner (the memory planner, never the tier policy) for TARGETS: this CPU,
a catalog H100 with one process, with GPUS=8, and two machines of 8. A plan must carry a predicted peak; a
refusal must be one KfitError line that names a setting to change (CONFIG_..., or a variable such as GPUS=).
Anything else, a traceback among them, is a failure.

A sample of the draws whose CPU plan succeeded is trained on this CPU through `make train` with command-line
overrides (MAX_STEPS=2, TIME_LIMIT=0, CONFIG_SEED, OUTPUT_DIR), in one process and in two (GPUS=2, gloo), and checked: the
run's recorded config holds the overrides, it ran exactly the steps asked, its plan's effective batch is the
one configured; and, for one process, the step's real peak under the CPU allocator (the instrument the
measured fallback and make bench-memory use: lib.memory.measured.measure_case) lies within the planner's
stated bound of the predicted peak (docs/memory.md: at most 2% under, within 5% or one MiB).

Draws take the seeds KCONFIG_SEED, +1, ...: every failure prints its seed and the command that reproduces
it alone (`make randcheck N=1 KCONFIG_SEED=S TRAIN=1`).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import Config
from .env import environ
from .errors import ConfigError, KfitError

# Families and their weights: what users run, language models first (a defconfig as each family's base)
FAMILIES = (("llama-tiny", 4), ("gpt2-tiny", 3), ("lenet5", 2), ("resnet18", 2), ("custom-transformer", 1))
TEXT = ("llama-tiny", "gpt2-tiny", "custom-transformer")
# Choices weighted before the rest is drawn at random: (choice's prefix, {member: weight}) per kind of model
COMMON = (("DEVICE", {"AUTO": 6, "CPU": 1, "CUDA": 1}), ("DATASET", {"EMBEDDED": 6, "DIR": 1}))
# float8 plans on the H100 targets and is refused on this CPU: mostly off, so most draws train here. Drawn from
# a stream of its own (the rest of a seed's draw is what it was before float8 existed: randomize skips a choice
# already made)
FLOAT8 = {"OFF": 6, "TENSORWISE": 1, "ROWWISE": 1}
# CONFIG_TP from a stream of its own (set before the rest is drawn, which it then leaves as it was): for the
# Llama, which states a tensor-parallel plan, 2 and AUTO (0) often (4 is refused by the tiny preset's 2
# key/value heads, and any degree where a machine's processes do not divide into groups); for the others,
# whose refusal is one line, rarely
TENSOR_PARALLEL = {"llama-tiny": {1: 4, 2: 3, 0: 2, 4: 1}, None: {1: 12, 2: 1, 0: 1}}
# CONFIG_PP likewise, from a stream of its own: for the Llama, which can be cut into stages, 2 often (its
# schedule and whether its output layer is tied, which PP refuses, drawn with the rest); AUTO (0) and 4 at times
# (4 blocks: the interleaved schedule's 8 stages are refused); for the others, whose refusal is one line, rarely
PIPELINE_PARALLEL = {"llama-tiny": {1: 5, 2: 3, 0: 1, 4: 1}, None: {1: 12, 2: 1}}
UNTIED_UNDER_PP = 0.75  # of the pipeline draws, those whose output layer is untied (the rest: PP's refusal)
# CONFIG_CP likewise: for the Llama, which can split its sequences, 2 often (planned for the H100 targets,
# refused in one line on this CPU, whose attention torch's ring does not take) and AUTO (0) at times; for the
# others, whose refusal is one line, rarely
CONTEXT_PARALLEL = {"llama-tiny": {1: 6, 2: 2, 0: 1}, None: {1: 12, 2: 1}}
WEIGHTED = {
    "text": (("PRECISION", {"BF16": 5, "AUTO": 2, "FP16": 1, "FP32": 2}),
             ("PARALLEL", {"FSDP": 4, "AUTO": 3, "DDP": 1, "FSDP_GRAD_OP": 1, "HSDP": 1})),
    "images": (("PRECISION", {"AUTO": 2, "BF16": 1, "FP16": 1, "FP32": 2}),
               ("PARALLEL", {"AUTO": 4, "DDP": 2, "FSDP": 1, "FSDP_GRAD_OP": 1, "HSDP": 1})),
}
BOOLS = {"text": {"GRADIENT_CHECKPOINTING": 0.6}, "images": {"COMPILE_MODEL": 0.5, "GRADIENT_CHECKPOINTING": 0.3}}
# Sizes clamped small: the model presets, contexts, batches, data and loops
SMALL_CHOICES = ("GPT2_PRESET_TINY", "LLAMA_PRESET_TINY", "HYPER_PARAM_POLICY_PLANNER")
# Shapes from a few values each, so that draws share their traces (the trace cache keys on them)
SHAPES = {"GPT2_BLOCK_SIZE": (64,), "LLAMA_BLOCK_SIZE": (64,), "RESNET_IMAGE_SIZE": (32,)}
SMALL = {"TARGET_EFFECTIVE_BATCH": 256,
         "BATCH_SIZE": 64, "GRADIENT_ACCUMULATION": 4, "EVAL_BATCH_SIZE": 256, "EPOCHS": 3,
         "CUSTOM_TRAIN_SAMPLES": 512, "CUSTOM_EVAL_SAMPLES": 128, "DATALOADER_WORKERS": 2, "CPU_THREADS": 2,
         "NPROC": 8, "OOM_MAX_HALVINGS": 4, "LR_FINDER_STEPS": 20, "HPO_TRIALS": 4, "VOCAB_SIZE": 4096}
# A Llama of its own shape (CONFIG_LLAMA_PRESET_CUSTOM) in this share of the Llama draws, from these small
# dimensions; a shape the config refuses is drawn again, and the deeper ones are planned by lib/memory/depth.py
CUSTOM_LLAMA_SHARE = 0.3
CUSTOM_LLAMA = {"LLAMA_DIM": (64, 96, 128), "LLAMA_LAYERS": (2, 3, 8), "LLAMA_HEADS": (2, 4, 6),
                "LLAMA_KV_HEADS": (1, 2, 4), "LLAMA_FFN_DIM": (128, 256)}
# A GPT-2 of its own size (CONFIG_GPT2_PRESET_CUSTOM) likewise, drawn from a stream of its own so that the
# other draws of a seed stay as they were; the 8-block ones are planned by lib/memory/depth.py
CUSTOM_GPT2_SHARE = 0.3
CUSTOM_GPT2 = {"GPT2_LAYERS": (2, 3, 8), "GPT2_HEADS": (2, 4), "GPT2_WIDTH": (64, 128)}
# Off in every draw, said: they reach services outside this machine
OFF = ("TRACK_WANDB", "TRACK_MLFLOW")
# The four machines a draw is planned for: (name, api.machine's keywords, processes, machines)
TARGETS = (("cpu", dict(gpu="cpu"), None, 1), ("h100", dict(gpu="h100"), 1, 1),
           ("h100 x8", dict(gpu="h100", gpus=8), 8, 1), ("2 nodes x8", dict(gpu="h100", gpus=8), 16, 2))
# What a refusal must name: a Kconfig symbol, a make variable, or a make target to run
NAMES_A_SETTING = re.compile(r"\bCONFIG_[A-Z0-9_]+|\b[A-Z][A-Z0-9_]+=|'make [a-z]")
MIB = 2**20
TRAIN_BATCH = 16  # the most samples a trained draw's optimizer step takes (per data-parallel group, MANUAL)


@dataclass
class Draw:
    seed: int
    family: str
    config: Config
    path: Path

    @property
    def label(self) -> str:
        """What the draw is, in a few words: model, precision (float8), strategy, batch mode, checkpointing,
        compile."""
        from .models.registry import label

        c = self.config
        bits = [label(c), _member(c, "PRECISION") + (f"+fp8-{c.float8}" if c.float8 != "off" else ""),
                _member(c, "PARALLEL"), c.hyperparam_mode]
        bits += [f"{name}{degree or '-auto'}" for name, degree in (("tp", c.tensor_parallel),
                 ("pp", c.pipeline_parallel), ("cp", c.context_parallel)) if degree != 1]
        if c.gradient_checkpointing:
            bits.append("ckpt")
        if c.symbols.get("COMPILE_MODEL") == "y":
            bits.append("compile")
        return " ".join(bits)


def _member(config: Config, choice: str) -> str:
    """The member of a choice (by its members' common prefix) the config selects, lower case: PRECISION -> bf16."""
    chosen = [name for name, value in config.symbols.items() if name.startswith(choice + "_") and value == "y"
              and name[len(choice) + 1:] in {m for _, weights in WEIGHTED["text"] for m in weights}]
    return chosen[0][len(choice) + 1:].lower() if chosen else "?"


@dataclass
class Outcome:
    seed: int
    what: str  # "plan <target>", "train x1", "train x2", "memory", "draw"
    ok: bool
    detail: str
    reproduce: str = ""
    memory: tuple[int, int] | None = None  # (predicted, measured) peak bytes, where the step was measured


@dataclass
class Summary:
    draws: int = 0
    targets: int = len(TARGETS)
    plans: int = 0
    refusals: int = 0
    trainings: int = 0
    memory_checks: int = 0
    failures: list[Outcome] = field(default_factory=list)
    tracebacks: int = 0
    plan_seconds: float = 0.0  # where the time went: drawing and planning, then training and measuring
    train_seconds: float = 0.0

    def line(self, seconds: float) -> str:
        return (f"randcheck: draws={self.draws} targets={self.targets} plans={self.plans} "
                f"refusals={self.refusals} trainings={self.trainings} memory_checks={self.memory_checks} "
                f"tracebacks={self.tracebacks} failures={len(self.failures)} seconds={seconds:.0f} "
                f"(planning {self.plan_seconds:.0f}, training {self.train_seconds:.0f})")


def draw(seed: int, out: Path) -> Draw:
    """The random config of `seed` (the same seed, the same config), written to `out`."""
    from .config import DEFCONFIG_DIR
    from .config.generate import RANDCONFIG_DRAWS, randomize, write_checked
    from .config.kconfig import new_kconfig

    rng = random.Random(seed)
    float8 = random.Random(f"float8:{seed}").choices(list(FLOAT8), list(FLOAT8.values()))[0]
    last: Exception | None = None
    for _ in range(RANDCONFIG_DRAWS):
        family = rng.choices([f for f, _ in FAMILIES], [w for _, w in FAMILIES])[0]
        kind = "text" if family in TEXT else "images"
        kconf = new_kconfig()
        kconf.load_config(str(DEFCONFIG_DIR / family))
        for prefix, weights in (*COMMON, *WEIGHTED[kind]):
            kconf.syms[f"{prefix}_{rng.choices(list(weights), list(weights.values()))[0]}"].set_value(2)
        for name, p in BOOLS[kind].items():
            sym = kconf.syms[name]
            if sym.visibility:
                sym.set_value(2 if rng.random() < p else 0)
        kconf.syms[f"FLOAT8_{float8}"].set_value(2)
        degrees = TENSOR_PARALLEL.get(family, TENSOR_PARALLEL[None])
        tensor = random.Random(f"tp:{seed}:{family}").choices(list(degrees), list(degrees.values()))[0]
        kconf.syms["TP"].set_value(str(tensor))  # set before randomize, which then draws the rest as before
        stages = PIPELINE_PARALLEL.get(family, PIPELINE_PARALLEL[None])
        pipeline = random.Random(f"pipeline:{seed}:{family}")
        degree = pipeline.choices(list(stages), list(stages.values()))[0]
        kconf.syms["PP"].set_value(str(degree))
        if degree > 1 and pipeline.random() < UNTIED_UNDER_PP and kconf.syms["LLAMA_TIE_EMBEDDINGS"].visibility:
            kconf.syms["LLAMA_TIE_EMBEDDINGS"].set_value(0)  # what a pipeline's user sets: PP refuses tied
        splits = CONTEXT_PARALLEL.get(family, CONTEXT_PARALLEL[None])
        kconf.syms["CP"].set_value(str(random.Random(f"cp:{seed}:{family}").choices(list(splits),
                                                                                     list(splits.values()))[0]))
        for name in SMALL_CHOICES:
            kconf.syms[name].set_value(2)
        for name in OFF:
            kconf.syms[name].set_value(0)
        randomize(kconf, rng)  # the rest the kernel's way; what is set above is kept
        for name, high in SMALL.items():
            sym = kconf.syms[name]
            if sym.visibility and sym.str_value and int(sym.str_value, 0) > high:
                sym.set_value(str(high))
        for name, values in SHAPES.items():
            if kconf.syms[name].visibility:
                kconf.syms[name].set_value(str(rng.choice(values)))
        for name in SMALL_CHOICES:  # a choice re-drawn above a preset is clamped again
            if kconf.syms[name].visibility:
                kconf.syms[name].set_value(2)
        if kconf.syms["LLAMA_PRESET_CUSTOM"].visibility and rng.random() < CUSTOM_LLAMA_SHARE:
            kconf.syms["LLAMA_PRESET_CUSTOM"].set_value(2)
            for name, values in CUSTOM_LLAMA.items():
                kconf.syms[name].set_value(str(rng.choice(values)))
        gpt2 = random.Random(f"gpt2:{seed}:{family}")
        if kconf.syms["GPT2_PRESET_CUSTOM"].visibility and gpt2.random() < CUSTOM_GPT2_SHARE:
            kconf.syms["GPT2_PRESET_CUSTOM"].set_value(2)
            for name, values in CUSTOM_GPT2.items():
                kconf.syms[name].set_value(str(gpt2.choice(values)))
        label = f"randcheck (seed {seed})"
        try:
            return Draw(seed, family, write_checked(kconf, out, label), out)
        except ConfigError as err:
            last = err
    raise ConfigError(f"randcheck seed {seed}: no valid configuration in {RANDCONFIG_DRAWS} draws: {last}")


def _refusal_ok(err: BaseException) -> tuple[bool, str]:
    text = str(err)
    if "\n" in text.strip():
        return False, f"a refusal of more than one line: {text[:300]!r}"
    if not NAMES_A_SETTING.search(text):
        return False, f"a refusal that names no setting to change: {text[:300]}"
    return True, text


def plan_draw(d: Draw, settings) -> list[Outcome]:
    """The draw planned for every target: a plan with a predicted peak, or one error line naming a setting."""
    from . import api
    from .planning import make_plan

    outcomes = []
    for name, machine, world, nodes in TARGETS:
        command = f"make randcheck N=1 KCONFIG_SEED={d.seed} TRAIN=0"
        try:
            hardware = api.machine(**machine)
            plan = make_plan(d.config, hardware, world_size=world, nodes=nodes, settings=settings).plan
        except KfitError as err:
            ok, detail = _refusal_ok(err)
            outcomes.append(Outcome(d.seed, f"plan {name}", ok, "refused: " + detail, command))
            continue
        except Exception:  # noqa: BLE001 - the bug this check looks for
            outcomes.append(Outcome(d.seed, f"plan {name}", False, "traceback:\n" + traceback.format_exc(), command))
            continue
        if plan.predicted_peak_bytes is None:
            outcomes.append(Outcome(d.seed, f"plan {name}", False, f"no predicted peak ({plan.policy} plan, "
                                    f"micro-batch {plan.micro_batch})", command))
        else:
            outcomes.append(Outcome(d.seed, f"plan {name}", True, f"micro-batch {plan.micro_batch} x "
                                    f"{plan.grad_accum}, {plan.strategy}, peak {plan.predicted_peak_bytes / MIB:.1f} MiB"))
    return outcomes


def _make(workdir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    from .resources import CHECKOUT

    env = {k: v for k, v in environ().items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES",
                                                              "KFIT_OVERRIDES", "KFIT_SET")}
    env["KFIT_STEPTIME_MEASURE"] = "0"  # as the plans above: real step timings at every size took minutes
    return subprocess.run(["make", "--no-print-directory", "-f", str(CHECKOUT / "Makefile"), *args], cwd=workdir,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def train_draw(d: Draw, processes: int, workdir: Path) -> Outcome:
    """`make train` of the draw with command-line overrides, and the run it leaves checked."""
    runs = workdir / f"runs-{d.seed}-x{processes}"
    seed = 1000 + d.seed % 1000
    # TIME_LIMIT=0 too: a drawn limit of seconds stops a CPU run after its first step, rightly (seed 202)
    overrides = ["MAX_STEPS=2", "TIME_LIMIT=0", f"CONFIG_SEED={seed}", f"OUTPUT_DIR={runs}"]
    # and the batch cut to TRAIN_BATCH samples a step at most: the combination under test is the same, and
    # ResNet-18's 256 took 30-70 s a run on this CPU
    manual = d.config.hyperparam_mode == "manual"
    batch = ({"BATCH_SIZE": min(d.config.batch_size, max(1, TRAIN_BATCH // d.config.gradient_accumulation))}
             if manual else {"TARGET_EFFECTIVE_BATCH": min(d.config.target_effective_batch, TRAIN_BATCH)})
    overrides += [f"{name}={value}" for name, value in batch.items()]
    args = ["train", f"KCONFIG_CONFIG={d.path}", *overrides, f"GPUS={processes}"]
    command = f"make randcheck N=1 KCONFIG_SEED={d.seed} TRAIN=1   # it runs: make {' '.join(args)}"
    what = f"train x{processes}"
    try:
        done = _make(workdir, *args)
    except subprocess.TimeoutExpired:
        return Outcome(d.seed, what, False, "did not finish in 600 s", command)
    err = done.stderr
    if "Traceback" in err or "Traceback" in done.stdout:
        return Outcome(d.seed, what, False, "traceback:\n" + (err or done.stdout)[-3000:], command)
    if done.returncode != 0:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        if len(errors) == 1 and NAMES_A_SETTING.search(errors[0]):
            return Outcome(d.seed, what, True, "refused: " + errors[0], command)
        return Outcome(d.seed, what, False, f"exit {done.returncode}: {err[-1500:]}", command)
    steps = re.search(r"^Done: (\d+) steps", done.stdout, re.M)
    dirs = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    problems, memory = [], None
    if not steps or int(steps.group(1)) != 2:
        why = re.search(r"\((\S+ reached)[^)]*\)", done.stdout)
        problems.append(f"trained {steps.group(1) if steps else '?'} steps, not the 2 asked"
                        + (f" ({why.group(1)})" if why else ""))
    if len(dirs) != 1:
        problems.append(f"{len(dirs)} run directories under the overridden OUTPUT_DIR")
    else:
        recorded = (dirs[0] / "config").read_text()
        for line in ("CONFIG_MAX_STEPS=2", "CONFIG_TIME_LIMIT=0", f"CONFIG_SEED={seed}", f'CONFIG_OUTPUT_DIR="{runs}"',
                     *(f"CONFIG_{name}={value}" for name, value in batch.items())):
            if line not in recorded.splitlines():
                problems.append(f"the run's config lacks {line}")
        plan = json.loads((dirs[0] / "plan.json").read_text())
        # MANUAL: each data-parallel group (the processes of a tensor-parallel group, a context-parallel one or a
        # pipeline together) takes the batch
        groups = processes // (plan.get("tensor_parallel", 1) * plan.get("pipeline_parallel", 1)
                               * plan.get("context_parallel", 1))
        want = (batch["BATCH_SIZE"] * d.config.gradient_accumulation * groups if manual
                else batch["TARGET_EFFECTIVE_BATCH"])
        if plan.get("effective_batch") != want or plan.get("world_size") != processes:
            problems.append(f"effective batch {plan.get('effective_batch')} at world size {plan.get('world_size')}, "
                            f"configured {want} at {processes}")
        if processes == 1:
            memory = _measured_peak(d, plan)
            if isinstance(memory, str):
                problems.append(memory)
            elif memory is not None:
                problems += _memory_problems(memory, plan)
    memory = memory if isinstance(memory, tuple) else None
    fine = f"2 steps, effective batch {plan['effective_batch']}" if not problems else ""
    if memory and not problems:
        fine += f"; peak {memory[0] / MIB:.2f} MiB predicted, {memory[1] / MIB:.2f} measured"
    return Outcome(d.seed, what, not problems, "; ".join(problems) or fine, command, memory=memory)


def _memory_problems(memory: tuple[int, int], plan: dict) -> list[str]:
    """Past the planner's stated bound (docs/memory.md): more than 2% (or 1 MiB) under, or 5% (or 1 MiB) off."""
    predicted, measured = memory
    if measured - predicted > max(0.02 * measured, MIB) or abs(predicted - measured) > max(0.05 * measured, MIB):
        return [f"allocator peak {measured / MIB:.2f} MiB against the predicted {predicted / MIB:.2f} MiB "
                f"({(predicted - measured) / measured:+.1%}) at micro-batch {plan['micro_batch']} {plan['precision']}"]
    return []


def _measured_peak(d: Draw, plan: dict) -> tuple[int, int] | str | None:
    """(predicted, measured): the run's step (its plan's micro-batch, precision and checkpointing, eager) under
    the CPU allocator in a child process, and the planner's trace of the same step at the same threads; None
    for a plan on no CPU or sharded; the reason where the measurement failed."""
    from .memory import MemoryPredictor

    if plan.get("device_type") != "cpu" or plan.get("strategy") not in ("none", None):
        return None
    case = dict(config=str(d.path), device="cpu", batch=plan["micro_batch"], train=True,
                precision=plan["precision"], gradient_checkpointing=bool(plan["gradient_checkpointing"]))
    threads = plan.get("cpu_threads") or 1  # the run's: a convolution's scratch is per thread
    code = ("import json,sys; from lib.memory.measured import measure_case; "
            "print(json.dumps(measure_case(json.loads(sys.argv[1]))))")
    from .resources import CHECKOUT

    done = subprocess.run([sys.executable, "-c", code, json.dumps(case)], cwd=CHECKOUT, capture_output=True,
                          text=True, timeout=600, env={**environ(), "OMP_NUM_THREADS": str(threads)})
    if done.returncode != 0:
        return f"the memory measurement failed: {done.stderr[-800:]}"
    measured = json.loads(done.stdout.strip().splitlines()[-1])["peak"]
    from .threads import using_threads

    predictor = MemoryPredictor()
    try:
        with using_threads(threads):
            predicted = predictor.trace(d.config, batch=case["batch"], device_type="cpu", precision=case["precision"],
                                        gradient_checkpointing=case["gradient_checkpointing"]).peak_bytes
    finally:
        predictor.close()
    return predicted, measured


def _plan_seed(seed: int, workdir: str) -> tuple[int, Draw | None, list[Outcome]]:
    """One seed drawn and planned (in a worker process): (seed, the draw or None, its outcomes)."""
    from .planning import Settings

    try:
        d = draw(seed, Path(workdir) / f"config-{seed}")
    except Exception:  # noqa: BLE001 - a draw the strict reader never settles is a bug too
        return seed, None, [Outcome(seed, "draw", False, "traceback:\n" + traceback.format_exc(),
                                    f"make randcheck N=1 KCONFIG_SEED={seed} TRAIN=0")]
    return seed, d, plan_draw(d, Settings(measure=False))  # real step timings only change how long it takes


def _planned(seeds: list[int], workdir: Path, jobs: int):
    """(seed, draw, outcomes) in seed order, planned in `jobs` worker processes (each starts torch once)."""
    if jobs <= 1 or len(seeds) < 2:
        yield from (_plan_seed(seed, str(workdir)) for seed in seeds)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from .planning.memory_policy import trace_in_process

    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=trace_in_process) as pool:
        yield from pool.map(_plan_seed, seeds, [str(workdir)] * len(seeds))


def run(seeds: list[int], *, train: int, jobs: int = 2, log: Callable[[str], None] = print) -> Summary:
    """Draw and plan every seed (in `jobs` processes), train `train` of the plannable draws; the table as it
    goes, then the failures with their commands, then the summary line."""
    summary = Summary()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kfit-randcheck-") as tmp:
        workdir = Path(tmp)
        trainable: list[Draw] = []
        log(f"{'seed':>10}  {'draw':<42} {'cpu':>8} {'h100':>8} {'h100x8':>8} {'2x8':>8}")
        for seed, d, outcomes in _planned(seeds, workdir, jobs):
            if d is None:
                summary.failures += outcomes
                summary.tracebacks += 1
                continue
            summary.draws += 1
            cells = []
            for o in outcomes:
                refused = o.detail.startswith("refused")
                summary.plans += o.ok and not refused
                summary.refusals += o.ok and refused
                summary.tracebacks += o.detail.startswith("traceback")
                cells.append("ok" if o.ok and not refused else "refused" if o.ok else "FAIL")
                if not o.ok:
                    summary.failures.append(o)
            log(f"{seed:>10}  {d.label[:42]:<42} " + " ".join(f"{c:>8}" for c in cells))
            if outcomes[0].ok and not outcomes[0].detail.startswith("refused"):
                trainable.append(d)
        summary.plan_seconds = time.perf_counter() - start
        for d in trainable[:train]:
            for processes in (1, 2):
                began = time.perf_counter()
                o = train_draw(d, processes, workdir)
                took = time.perf_counter() - began
                summary.trainings += 1
                summary.tracebacks += o.detail.startswith("traceback")
                summary.memory_checks += o.memory is not None
                log(f"{d.seed:>10}  {d.label[:42]:<42} train x{processes}: {'ok' if o.ok else 'FAIL'} "
                    f"{o.detail[:90]} ({took:.0f} s)")
                if not o.ok:
                    summary.failures.append(o)
    summary.train_seconds = time.perf_counter() - start - summary.plan_seconds
    for f in summary.failures:
        log(f"FAIL seed {f.seed} {f.what}: {f.detail}\n  reproduce: {f.reproduce}")
    log(summary.line(time.perf_counter() - start))
    return summary
