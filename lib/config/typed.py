"""The typed, frozen Config, and building it from a loaded (already strictly validated) kconfig.

Kconfig has no float type and cannot express every range: the parsers here check
numbers held in string symbols, names and cross-field orderings.
"""

from __future__ import annotations

import os

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Mapping

import kconfiglib

from ..errors import ConfigError
from .kconfig import config_text
from .profiles import MEMORY_PROFILES


@dataclass(frozen=True)
class Config:
    """A validated configuration. Field names follow the Kconfig symbols."""

    model: str  # a name in lib/models/registry.py's MODELS (lenet5, gpt2, llama, custom, ...)
    gpt2_preset: str | None  # tiny | 30m | 51m | 124m | 355m | 774m | 1558m
    gpt2_block_size: int | None
    gpt2_dropout: float | None
    resnet_image_size: int | None
    llama_preset: str | None  # tiny | 20m | 60m | 125m | 350m | 1b (MODEL_LLAMA)
    llama_block_size: int | None
    llama_tie_embeddings: bool | None
    custom_model_factory: str | None  # "package.module:function" (MODEL_CUSTOM)
    custom_train_samples: int | None
    custom_eval_samples: int | None

    dataset: str | None  # embedded | dir; None for a custom model (its factory makes the batches)
    data_dir: str | None
    dataset_format: str | None  # mnist | cifar10 | cifar100 (image models from a directory)

    epochs: int
    max_steps: int  # 0 = no limit
    time_limit_s: int  # 0 = no limit
    optimizer: str  # sgd | adam | adamw
    sgd_momentum: float | None
    learning_rate: float
    weight_decay: float
    lr_schedule: str  # cosine | constant
    warmup_steps: int
    grad_clip: float
    # parameter-name patterns (fnmatch) whose parameters are frozen: no gradient, no optimizer state
    freeze: tuple[str, ...]
    seed: int
    log_interval: int
    eval_interval: int
    output_dir: str
    run_name: str

    hyperparam_mode: str  # auto | manual
    hyperparam_policy: str | None  # planner | tiers (AUTO only)
    memory_profile: float | None  # share of free memory the planner may use (planner only)
    target_effective_batch: int | None
    batch_size: int | None
    gradient_accumulation: int | None
    eval_batch_size: int | None  # MANUAL only; 0 = twice the micro-batch

    compile_mode: str  # auto | manual
    compile_model: bool | None  # MANUAL only
    compile_kind: str | None  # default | reduce-overhead | max-autotune

    device: str  # auto | cuda | cpu
    precision: str  # auto | bf16 | fp16 | fp32
    tf32: str  # auto | on | off
    cudnn_benchmark: str  # auto | on | off
    gradient_checkpointing: bool
    # a custom model's blocks to checkpoint, by class name; () = its own switch or its repeated blocks
    checkpoint_modules: tuple[str, ...]
    workers_mode: str  # auto | manual
    dataloader_workers: int | None
    data_prefetch_factor: int  # batches each loader worker prepares ahead; 0 = torch's default (2)
    cpu_threads: int  # intra-op threads per process; 0 = AUTO (lib.threads)
    cpu_fallback: bool  # DEVICE_AUTO: train on the CPU when the GPU fails at start

    # runtime adaptation
    probe: str  # auto | always | never
    oom_recovery: bool
    oom_max_halvings: int | None
    # out-of-memory ladder (lib/planning/ladder.py): the rungs allowed, in the order they are taken
    oom_ladder: tuple[str, ...]  # of "checkpointing", "autocast", "offload"
    checkpoint_interval: str  # auto (at most minutes, at most a share of the predicted run) | steps
    checkpoint_minutes: int | None
    checkpoint_lost_work_percent: int | None  # AUTO: most of the predicted run a crash may lose
    checkpoint_every_steps: int | None
    checkpoint_keep: int
    checkpoint_best_keep: int  # 0 = off: best-<step>.pt of the best evaluations by checkpoint_best_metric
    checkpoint_best_metric: str | None  # an evaluation metric (None while best-k and early stopping are off)
    early_stop_patience: int  # 0 = off: evaluations without improvement before stopping
    early_stop_min_delta: float | None  # the improvement that counts (None while early stopping is off)
    resume: bool
    monitor: bool
    monitor_interval_ms: int | None
    tracking: tuple[str, ...]  # experiment tracking sinks (lib/tracking.py): "tensorboard", "wandb", "mlflow"
    tracking_project: str | None
    thermal_policy: str | None  # warn | pause (None without the monitor)
    thermal_pause_at_c: int | None
    thermal_resume_below_c: int | None
    battery_low_percent: int  # 0 = never adapt
    battery_checkpoint_minutes: int | None
    battery_stop: bool
    nproc_mode: str  # auto | manual
    nproc: int | None  # MANUAL: processes per machine
    parallel_strategy: str  # auto | ddp | fsdp | fsdp_grad_op | hsdp (lib/parallel.py)
    fsdp_cpu_offload: bool

    # learning-rate finder
    lr_finder_min_lr: float
    lr_finder_max_lr: float
    lr_finder_steps: int
    lr_finder_smoothing: float
    lr_finder_diverge: float
    lr_scaling: str  # auto | linear | sqrt | none: the finder's rate converted to the effective batch

    # hyperparameter search
    hpo_trials: int
    hpo_timeout_s: int  # 0 = none
    hpo_study_name: str
    hpo_lr_min: float
    hpo_lr_max: float
    hpo_wd_min: float
    hpo_wd_max: float
    hpo_batch_sizes: tuple[int, ...]
    hpo_optimizers: tuple[str, ...]
    hpo_min_resource: int
    hpo_max_resource: int
    hpo_reduction_factor: int
    hpo_bootstrap_count: int
    hpo_patience: int  # 0 = off
    hpo_space: str = ""  # CONFIG_HPO_SPACE as written; "" = the learning rate, weight decay, optimizer, batch
    hpo_objective: str = "eval_loss"  # eval_loss | accuracy | macro_f1
    hpo_folds: int = 1  # cross-validation folds; 1 = none

    source: str = ""  # the file this was read from
    text: str = ""  # the full .config as kconfiglib writes it (stored with checkpoints)
    # every symbol's value, for the record (left out of the hash: a dict is not hashable)
    symbols: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def image_size(self) -> int:
        """The input size image models train at (LeNet-5 is fixed at 32)."""
        return self.resnet_image_size or 32

    def to_dict(self) -> dict:
        d = asdict(self)
        d["symbols"] = dict(self.symbols)
        del d["text"]
        return d


# --------------------------------------------------------------------------
# Parsing a loaded kconfig


def _str(kconf, name: str) -> str | None:
    sym = kconf.syms[name]
    return sym.str_value if sym.visibility or sym.str_value else None


def _int(kconf, name: str) -> int | None:
    sym = kconf.syms[name]
    # Base 10 as the C tools read it: "040" is forty, not an octal literal.
    return int(sym.str_value, 16 if sym.orig_type == kconfiglib.HEX else 10) if sym.str_value else None


def _bool(kconf, name: str) -> bool:
    return kconf.syms[name].str_value == "y"


def _choice(kconf, prefix: str, options: Mapping[str, str]) -> str | None:
    """The selected member of a choice, mapped to a short name; None if hidden."""
    for suffix, value in options.items():
        if _bool(kconf, prefix + suffix):
            return value
    return None


def _member(kconf, prefix: str) -> str | None:
    """The selected member of the choice whose members are all named PREFIX<NAME>, as <name> in lower case
    (CONFIG_MODEL_RESNET18 -> "resnet18"); None if hidden. The menu holds the names: the model choice's
    members are lib/models/registry.py's models, which tests/test_hygiene.py checks."""
    for choice in kconf.choices:
        if choice.syms and all(sym.name.startswith(prefix) for sym in choice.syms):
            return next((sym.name[len(prefix):].lower() for sym in choice.syms if sym.str_value == "y"), None)
    raise ConfigError(f"the Kconfig tree has no choice of {prefix}* symbols")


def _number(kconf, name: str, *, low: float, high: float = math.inf, low_open: bool = False,
            high_open: bool = False) -> float | None:
    """Parse a string symbol holding a number (Kconfig has no float type)."""
    text = _str(kconf, name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f'CONFIG_{name}="{text}" is not a number: write it like 3e-4 or 0.1') from None
    if not math.isfinite(value):
        raise ConfigError(f'CONFIG_{name}="{text}" must be a finite number')
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        bound = f"{'>' if low_open else '>='} {low:g}"
        if high != math.inf:
            bound = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f'CONFIG_{name}="{text}" is out of range: it must be {bound}')
    return value


# Groups of bool symbols the reader needs at least one of (Kconfig cannot say so); allnoconfig keeps one.
ONE_OF = (("HPO_OPTIMIZER_SGD", "HPO_OPTIMIZER_ADAM", "HPO_OPTIMIZER_ADAMW"),)

_RUN_NAME = re.compile(r"[A-Za-z0-9._-]*")
_FACTORY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def _memory_profile(kconf) -> float | None:
    for name, share in MEMORY_PROFILES.items():
        if _bool(kconf, "MEMORY_PROFILE_" + name):
            return share
    percent = _int(kconf, "MEMORY_PROFILE_PERCENT")
    return percent / 100 if percent is not None else None


def _ordered(low_name: str, low: float, high_name: str, high: float) -> None:
    if low >= high:
        raise ConfigError(f"CONFIG_{low_name}={low:g} must be below CONFIG_{high_name}={high:g}")


def _words(kconf, name: str) -> tuple[str, ...]:
    """A string symbol's words, separated by spaces or commas, each once, in order."""
    return tuple(dict.fromkeys(w for w in re.split(r"[\s,]+", _str(kconf, name) or "") if w))


_CLASS_NAME = re.compile(r"[A-Za-z_]\w*")


def _class_names(kconf) -> tuple[str, ...]:
    names = _words(kconf, "CHECKPOINT_MODULES")
    bad = [n for n in names if not _CLASS_NAME.fullmatch(n)]
    if bad:
        raise ConfigError(f'CONFIG_CHECKPOINT_MODULES="{_str(kconf, "CHECKPOINT_MODULES")}": {bad[0]!r} is not a '
                          'class name: name module classes, separated by spaces or commas (e.g. "LlamaDecoderLayer")')
    return names


def _batch_sizes(kconf) -> tuple[int, ...]:
    text = _str(kconf, "HPO_BATCH_SIZES") or ""
    try:
        sizes = tuple(int(word, 10) for word in text.split())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError(f'CONFIG_HPO_BATCH_SIZES="{text}" must be whole numbers >= 1 separated by '
                          'spaces, like "16 32 64"')
    return tuple(sorted(set(sizes)))


def _tuning(kconf) -> dict:
    """The LR-finder and HPO fields, checked for ranges that Kconfig cannot express."""
    t = dict(
        lr_finder_min_lr=_number(kconf, "LR_FINDER_MIN_LR", low=0, low_open=True),
        lr_finder_max_lr=_number(kconf, "LR_FINDER_MAX_LR", low=0, low_open=True),
        lr_finder_steps=_int(kconf, "LR_FINDER_STEPS"),
        lr_finder_smoothing=_number(kconf, "LR_FINDER_SMOOTHING", low=0, high=1, low_open=True),
        lr_finder_diverge=_number(kconf, "LR_FINDER_DIVERGE", low=1, low_open=True),
        lr_scaling=_choice(kconf, "LR_SCALING_", {"AUTO": "auto", "LINEAR": "linear", "SQRT": "sqrt", "NONE": "none"}),
        hpo_trials=_int(kconf, "HPO_TRIALS"),
        hpo_timeout_s=_int(kconf, "HPO_TIMEOUT"),
        hpo_study_name=_str(kconf, "HPO_STUDY_NAME") or "",
        hpo_lr_min=_number(kconf, "HPO_LR_MIN", low=0, low_open=True),
        hpo_lr_max=_number(kconf, "HPO_LR_MAX", low=0, low_open=True),
        hpo_wd_min=_number(kconf, "HPO_WD_MIN", low=0, low_open=True),
        hpo_wd_max=_number(kconf, "HPO_WD_MAX", low=0, low_open=True),
        hpo_batch_sizes=_batch_sizes(kconf),
        hpo_optimizers=tuple(o for o in ("sgd", "adam", "adamw") if _bool(kconf, "HPO_OPTIMIZER_" + o.upper())),
        hpo_min_resource=_int(kconf, "HPO_MIN_RESOURCE"),
        hpo_max_resource=_int(kconf, "HPO_MAX_RESOURCE"),
        hpo_reduction_factor=_int(kconf, "HPO_REDUCTION_FACTOR"),
        hpo_bootstrap_count=_int(kconf, "HPO_BOOTSTRAP_COUNT"),
        hpo_patience=_int(kconf, "HPO_PATIENCE"),
        hpo_space=" ".join((_str(kconf, "HPO_SPACE") or "").split()),
        hpo_objective=_choice(kconf, "HPO_OBJECTIVE_", {"EVAL_LOSS": "eval_loss", "ACCURACY": "accuracy",
                                                        "MACRO_F1": "macro_f1"}),
        hpo_folds=_int(kconf, "HPO_FOLDS"),
    )
    _ordered("LR_FINDER_MIN_LR", t["lr_finder_min_lr"], "LR_FINDER_MAX_LR", t["lr_finder_max_lr"])
    _ordered("HPO_LR_MIN", t["hpo_lr_min"], "HPO_LR_MAX", t["hpo_lr_max"])
    _ordered("HPO_WD_MIN", t["hpo_wd_min"], "HPO_WD_MAX", t["hpo_wd_max"])
    if t["hpo_min_resource"] > t["hpo_max_resource"]:
        raise ConfigError(f"CONFIG_HPO_MIN_RESOURCE={t['hpo_min_resource']} must not exceed "
                          f"CONFIG_HPO_MAX_RESOURCE={t['hpo_max_resource']}")
    if not t["hpo_optimizers"]:
        raise ConfigError("no optimizer to search over: set at least one of CONFIG_HPO_OPTIMIZER_SGD, "
                          "CONFIG_HPO_OPTIMIZER_ADAM, CONFIG_HPO_OPTIMIZER_ADAMW")
    return t


_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def lower_is_better(metric: str) -> bool | None:
    """Whether a smaller value of an evaluation metric is better, decided by its name: losses and
    perplexities are, accuracies and F1 scores are not; None for a name that says neither."""
    name = metric.lower()
    if "loss" in name or "perplexity" in name:
        return True
    if "accuracy" in name or "f1" in name:
        return False
    return None


def _checkpoint_control(kconf) -> dict:
    """Best-k checkpoints and early stopping; the metric's name must say which way is better (whether this
    model's evaluation reports it is checked when training starts: lib/trainer/best.py)."""
    c = dict(
        checkpoint_best_keep=_int(kconf, "CHECKPOINT_BEST_KEEP"),
        checkpoint_best_metric=_str(kconf, "CHECKPOINT_BEST_METRIC"),
        early_stop_patience=_int(kconf, "EARLY_STOP_PATIENCE"),
        early_stop_min_delta=_number(kconf, "EARLY_STOP_MIN_DELTA", low=0),
    )
    metric = c["checkpoint_best_metric"]
    if metric is not None and (not _METRIC.fullmatch(metric) or lower_is_better(metric) is None):
        raise ConfigError(f'CONFIG_CHECKPOINT_BEST_METRIC="{metric}" is not a metric kfit can rank: use eval_loss '
                          "(every model), accuracy (image models) or perplexity (GPT-2)")
    return c


LADDER_RUNGS = ("checkpointing", "autocast", "offload")  # the out-of-memory ladder's order


def _adaptation(kconf) -> dict:
    """The ladder's allowed rungs and the thermal and battery policies, with the order Kconfig cannot check."""
    a = dict(
        oom_ladder=tuple(r for r in LADDER_RUNGS if _bool(kconf, "OOM_LADDER_" + r.upper())),
        thermal_policy=_choice(kconf, "THERMAL_", {"WARN": "warn", "PAUSE": "pause"}),
        thermal_pause_at_c=_int(kconf, "THERMAL_PAUSE_AT_C"),
        thermal_resume_below_c=_int(kconf, "THERMAL_RESUME_BELOW_C"),
        battery_low_percent=_int(kconf, "BATTERY_LOW_PERCENT"),
        battery_checkpoint_minutes=_int(kconf, "BATTERY_CHECKPOINT_MINUTES"),
        battery_stop=_bool(kconf, "BATTERY_STOP"),
    )
    if a["thermal_policy"] == "pause":
        _ordered("THERMAL_RESUME_BELOW_C", a["thermal_resume_below_c"], "THERMAL_PAUSE_AT_C",
                 a["thermal_pause_at_c"])
    return a


def _prefetch_factor(kconf) -> int:
    """CONFIG_DATA_PREFETCH_FACTOR, which only loader worker processes use: refused with MANUAL 0 workers."""
    factor = _int(kconf, "DATA_PREFETCH_FACTOR") or 0
    if factor and _choice(kconf, "DATALOADER_WORKERS_", {"AUTO": "auto", "MANUAL": "manual"}) == "manual" \
            and not _int(kconf, "DATALOADER_WORKERS"):
        raise ConfigError(f"CONFIG_DATA_PREFETCH_FACTOR={factor} needs data loader worker processes: set "
                          "CONFIG_DATALOADER_WORKERS above 0, or CONFIG_DATA_PREFETCH_FACTOR=0")
    return factor


def typed_config(kconf: kconfiglib.Kconfig, source: str) -> Config:
    run_name = _str(kconf, "RUN_NAME") or ""
    if not _RUN_NAME.fullmatch(run_name) or run_name in (".", ".."):
        raise ConfigError(f'CONFIG_RUN_NAME="{run_name}" may only hold letters, digits, ".", "-" and "_"')
    factory = _str(kconf, "CUSTOM_MODEL_FACTORY")
    if factory is not None and not _FACTORY.fullmatch(factory):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{factory}" must look like package.module:function')
    return Config(
        model=_member(kconf, "MODEL_"),
        gpt2_preset=_choice(kconf, "GPT2_PRESET_", {"TINY": "tiny", "30M": "30m", "51M": "51m", "124M": "124m", "355M": "355m",
                                                    "774M": "774m", "1558M": "1558m"}),
        gpt2_block_size=_int(kconf, "GPT2_BLOCK_SIZE"),
        gpt2_dropout=_number(kconf, "GPT2_DROPOUT", low=0, high=1, high_open=True),
        resnet_image_size=_int(kconf, "RESNET_IMAGE_SIZE"),
        llama_preset=_choice(kconf, "LLAMA_PRESET_", {p.upper(): p for p in ("tiny", "20m", "60m", "125m", "350m", "1b")}),
        llama_block_size=_int(kconf, "LLAMA_BLOCK_SIZE"),
        llama_tie_embeddings=_bool(kconf, "LLAMA_TIE_EMBEDDINGS") if kconf.syms["LLAMA_TIE_EMBEDDINGS"].visibility else None,
        custom_model_factory=factory,
        custom_train_samples=_int(kconf, "CUSTOM_TRAIN_SAMPLES"),
        custom_eval_samples=_int(kconf, "CUSTOM_EVAL_SAMPLES"),
        dataset=_choice(kconf, "DATASET_", {"EMBEDDED": "embedded", "DIR": "dir"}),
        data_dir=_str(kconf, "DATA_DIR"),
        dataset_format=_choice(kconf, "DATASET_FORMAT_", {"MNIST": "mnist", "CIFAR10": "cifar10",
                                                          "CIFAR100": "cifar100"}),
        epochs=_int(kconf, "EPOCHS"),
        max_steps=_int(kconf, "MAX_STEPS"),
        time_limit_s=_int(kconf, "TIME_LIMIT"),
        optimizer=_choice(kconf, "OPTIMIZER_", {"SGD": "sgd", "ADAM": "adam", "ADAMW": "adamw"}),
        sgd_momentum=_number(kconf, "SGD_MOMENTUM", low=0, high=1, high_open=True),
        learning_rate=_number(kconf, "LEARNING_RATE", low=0, low_open=True),
        weight_decay=_number(kconf, "WEIGHT_DECAY", low=0),
        lr_schedule=_choice(kconf, "LR_SCHEDULE_", {"COSINE": "cosine", "CONSTANT": "constant"}),
        warmup_steps=_int(kconf, "WARMUP_STEPS"),
        grad_clip=_number(kconf, "GRAD_CLIP", low=0),
        freeze=_words(kconf, "FREEZE"),
        seed=_int(kconf, "SEED"),
        log_interval=_int(kconf, "LOG_INTERVAL"),
        eval_interval=_int(kconf, "EVAL_INTERVAL"),
        output_dir=os.path.expanduser(_str(kconf, "OUTPUT_DIR") or "runs"),  # ~ as for DATA_DIR: never a "./~"
        run_name=run_name,
        hyperparam_mode=_choice(kconf, "HYPER_PARAM_", {"AUTO": "auto", "MANUAL": "manual"}),
        hyperparam_policy=_choice(kconf, "HYPER_PARAM_POLICY_", {"PLANNER": "planner", "TIERS": "tiers"}),
        memory_profile=_memory_profile(kconf),
        target_effective_batch=_int(kconf, "TARGET_EFFECTIVE_BATCH"),
        batch_size=_int(kconf, "BATCH_SIZE"),
        gradient_accumulation=_int(kconf, "GRADIENT_ACCUMULATION"),
        eval_batch_size=_int(kconf, "EVAL_BATCH_SIZE"),
        compile_mode=_choice(kconf, "COMPILE_", {"AUTO": "auto", "MANUAL": "manual"}),
        compile_model=_bool(kconf, "COMPILE_MODEL") if kconf.syms["COMPILE_MODEL"].visibility else None,
        compile_kind=_choice(kconf, "COMPILE_MODE_", {"DEFAULT": "default",
                                                      "REDUCE_OVERHEAD": "reduce-overhead",
                                                      "MAX_AUTOTUNE": "max-autotune"}),
        device=_choice(kconf, "DEVICE_", {"AUTO": "auto", "CUDA": "cuda", "CPU": "cpu"}),
        precision=_choice(kconf, "PRECISION_", {"AUTO": "auto", "BF16": "bf16", "FP16": "fp16",
                                                "FP32": "fp32"}),
        tf32=_choice(kconf, "TF32_", {"AUTO": "auto", "ON": "on", "OFF": "off"}),
        cudnn_benchmark=_choice(kconf, "CUDNN_BENCHMARK_", {"AUTO": "auto", "ON": "on", "OFF": "off"}),
        gradient_checkpointing=_bool(kconf, "GRADIENT_CHECKPOINTING"),
        checkpoint_modules=_class_names(kconf),
        workers_mode=_choice(kconf, "DATALOADER_WORKERS_", {"AUTO": "auto", "MANUAL": "manual"}),
        dataloader_workers=_int(kconf, "DATALOADER_WORKERS"),
        data_prefetch_factor=_prefetch_factor(kconf),
        cpu_threads=_int(kconf, "CPU_THREADS"),
        cpu_fallback=_bool(kconf, "CPU_FALLBACK"),
        probe=_choice(kconf, "PROBE_", {"AUTO": "auto", "ALWAYS": "always", "NEVER": "never"}),
        oom_recovery=_bool(kconf, "OOM_RECOVERY"),
        oom_max_halvings=_int(kconf, "OOM_MAX_HALVINGS"),
        checkpoint_interval=_choice(kconf, "CHECKPOINT_INTERVAL_", {"AUTO": "auto", "STEPS": "steps"}),
        checkpoint_minutes=_int(kconf, "CHECKPOINT_MINUTES"),
        checkpoint_lost_work_percent=_int(kconf, "CHECKPOINT_LOST_WORK_PERCENT"),
        checkpoint_every_steps=_int(kconf, "CHECKPOINT_EVERY_STEPS"),
        checkpoint_keep=_int(kconf, "CHECKPOINT_KEEP"),
        resume=_bool(kconf, "RESUME"),
        monitor=_bool(kconf, "MONITOR"),
        monitor_interval_ms=_int(kconf, "MONITOR_INTERVAL_MS"),
        tracking=tuple(sink for sink in ("tensorboard", "wandb", "mlflow") if _bool(kconf, f"TRACK_{sink.upper()}")),
        tracking_project=_str(kconf, "TRACKING_PROJECT"),
        nproc_mode=_choice(kconf, "NPROC_", {"AUTO": "auto", "MANUAL": "manual"}),
        nproc=_int(kconf, "NPROC"),
        parallel_strategy=_choice(kconf, "PARALLEL_", {"AUTO": "auto", "DDP": "ddp", "FSDP": "fsdp",
                                                      "FSDP_GRAD_OP": "fsdp_grad_op", "HSDP": "hsdp"}),
        fsdp_cpu_offload=_bool(kconf, "FSDP_CPU_OFFLOAD"),
        **_tuning(kconf),
        **_adaptation(kconf),
        **_checkpoint_control(kconf),
        source=source,
        text=config_text(kconf),
        symbols={s.name: s.str_value for s in kconf.unique_defined_syms},
    )
