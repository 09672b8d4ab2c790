"""The typed, frozen Config, and building it from a loaded (already strictly validated) kconfig.

Each field is its option's value as lib/config/options.py types it (numbers held in string symbols, patterns
and cross-option orders are checked beside their options, lib/config/validators.py), or derived here from the
options: a renamed choice, a list of words, a Llama's custom shape, a default for a hidden option.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

import kconfiglib

from ..errors import ConfigError
from ..redact import shown
from .kconfig import config_text
from .options import Options, options_of
from .profiles import MEMORY_PROFILES
from .symbols import bool_of, choice_of, int_of, member_of, str_of


@dataclass(frozen=True)
class Config:
    """A validated configuration. Field names follow the Kconfig symbols.

    A field typed_config derives (a list of words, a renamed choice, a default for a hidden option) is built
    there; every other field is its option's value exactly as `options` types it (lib/config/options.py), so
    its type, range and help are stated once, in the Kconfig tree: the field only names it for type checkers."""

    model: str  # a name in lib/models/registry.py's MODELS (lenet5, gpt2, llama, custom, ...)
    gpt2_preset: str | None  # tiny | 30m | 51m | 124m | 355m | 774m | 1558m | custom (GPT2_LAYERS, ...)
    gpt2_block_size: int | None
    gpt2_dropout: float | None
    resnet_image_size: int | None
    dropout: float | None  # before an image model's last Linear, [0, 1) (LeNet-5, ResNets); None: a model without it
    llama_preset: str | None  # a key of lib/models/llama.py's LLAMA_PRESETS, or custom (MODEL_LLAMA)
    # LLAMA_PRESET_CUSTOM's shape: (dim, layers, heads, key/value heads, SwiGLU width), rope theta
    llama_dims: tuple[int, int, int, int, int] | None
    llama_rope_theta: float | None
    llama_block_size: int | None
    llama_tie_embeddings: bool | None
    vocab_size: int | None  # CONFIG_VOCAB_SIZE: GPT-2's and Llama's tokens, 0 = the data's; None for other models
    pad_vocab: bool | None
    custom_model_factory: str | None  # "package.module:function" (MODEL_CUSTOM)
    custom_train_samples: int | None
    custom_eval_samples: int | None

    dataset: str | None  # embedded | dir; None for a custom model (its factory makes the batches)
    data_dir: str | None
    dataset_format: str | None  # mnist | cifar10 | cifar100 (image models from a directory)

    epochs: int
    max_steps: int  # 0 = no limit
    time_limit_s: int  # 0 = no limit
    optimizer: str  # sgd | adam | adamw | custom
    optimizer_name: str | None  # custom: a torch.optim class name, or module:function (lib/step.py)
    sgd_momentum: float | None
    learning_rate: float
    weight_decay: float
    weight_decay_embeddings: bool  # n: embedding tables are not decayed, as biases and norms never are
    lr_schedule: str  # cosine | linear | wsd | constant | custom (lib/trainer/schedule.py)
    lr_min_ratio: float | None  # cosine, linear, wsd: where the decay ends, a share of the peak
    lr_decay_fraction: float | None  # wsd: the share of the steps after warm-up that decay
    lr_schedule_function: str | None  # custom: module:function(step[, total_steps]) -> multiplier
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
    float8: str  # off | tensorwise | rowwise (torchao's float8 training recipes)
    tf32: str  # auto | on | off
    cudnn_benchmark: str  # auto | on | off
    gradient_checkpointing: bool
    # what a checkpointed GPT-2 or Llama block keeps: full | selective_op | selective_layer (None: other models)
    recompute_policy: str | None
    recompute_every: int | None  # selective_layer: every k-th block checkpointed
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
    tensor_parallel: int  # CONFIG_TP: processes per tensor-parallel group (1: none; 0: AUTO, the planner's)
    pipeline_parallel: int  # CONFIG_PP: pipeline stages the layers are cut into (1: none; 0: AUTO, the planner's)
    pipeline_schedule: str  # 1F1B | Interleaved1F1B | GPipe (torch.distributed.pipelining's, torchtitan's names)
    context_parallel: int  # CONFIG_CP: processes each sample's sequence is split over (1: none; 0: AUTO)
    net_gbps: int  # between machines, GB/s per GPU in one direction; 0: the catalog's NETWORK_GBS

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
    # every option of the Kconfig tree, typed, with no field of its own here (lib/config/options.py): what an
    # option added to the tree is read as; left out of comparisons, which the fields above decide
    options: Options = field(default_factory=lambda: Options({}), compare=False, hash=False, repr=False)

    @property
    def image_size(self) -> int:
        """The input size image models train at (LeNet-5 is fixed at 32)."""
        return self.resnet_image_size or 32

    def to_dict(self) -> dict:
        d = asdict(self)
        d["symbols"] = dict(self.symbols)
        d["options"] = self.options.as_dict()
        del d["text"]
        return d


# --------------------------------------------------------------------------
# Parsing a loaded kconfig


# Groups of bool symbols the reader needs at least one of (Kconfig cannot say so); allnoconfig keeps one.
ONE_OF = (("HPO_OPTIMIZER_SGD", "HPO_OPTIMIZER_ADAM", "HPO_OPTIMIZER_ADAMW"),)

_RUN_NAME = re.compile(r"[A-Za-z0-9._-]*")


def _memory_profile(kconf) -> float | None:
    for name, share in MEMORY_PROFILES.items():
        if bool_of(kconf, "MEMORY_PROFILE_" + name):
            return share
    percent = int_of(kconf, "MEMORY_PROFILE_PERCENT")
    return percent / 100 if percent is not None else None


def _words(kconf, name: str) -> tuple[str, ...]:
    """A string symbol's words, separated by spaces or commas, each once, in order."""
    return tuple(dict.fromkeys(w for w in re.split(r"[\s,]+", str_of(kconf, name) or "") if w))


_CLASS_NAME = re.compile(r"[A-Za-z_]\w*")


def _class_names(kconf) -> tuple[str, ...]:
    names = _words(kconf, "CHECKPOINT_MODULES")
    bad = [n for n in names if not _CLASS_NAME.fullmatch(n)]
    if bad:
        raise ConfigError(f'CONFIG_CHECKPOINT_MODULES="{str_of(kconf, "CHECKPOINT_MODULES")}": {bad[0]!r} is not a '
                          'class name: name module classes, separated by spaces or commas (e.g. "LlamaDecoderLayer")')
    return names


def _batch_sizes(kconf) -> tuple[int, ...]:
    text = str_of(kconf, "HPO_BATCH_SIZES") or ""
    try:
        sizes = tuple(int(word, 10) for word in text.split())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError(f'CONFIG_HPO_BATCH_SIZES="{text}" must be whole numbers >= 1 separated by '
                          'spaces, like "16 32 64"')
    return tuple(sorted(set(sizes)))


def _tuning(kconf) -> dict:
    """The HPO fields kfit derives from the options (a list of batch sizes, the optimizers searched)."""
    t = dict(
        hpo_timeout_s=int_of(kconf, "HPO_TIMEOUT"),
        hpo_study_name=str_of(kconf, "HPO_STUDY_NAME") or "",
        hpo_batch_sizes=_batch_sizes(kconf),
        hpo_optimizers=tuple(o for o in ("sgd", "adam", "adamw") if bool_of(kconf, "HPO_OPTIMIZER_" + o.upper())),
        hpo_space=" ".join((str_of(kconf, "HPO_SPACE") or "").split()),
    )
    if not t["hpo_optimizers"]:
        raise ConfigError("no optimizer to search over: set at least one of CONFIG_HPO_OPTIMIZER_SGD, "
                          "CONFIG_HPO_OPTIMIZER_ADAM, CONFIG_HPO_OPTIMIZER_ADAMW")
    return t


LADDER_RUNGS = ("checkpointing", "autocast", "offload")  # the out-of-memory ladder's order


def _adaptation(kconf) -> dict:
    """The ladder's allowed rungs and the thermal and battery policies (their order: lib/config/validators.py)."""
    return dict(
        oom_ladder=tuple(r for r in LADDER_RUNGS if bool_of(kconf, "OOM_LADDER_" + r.upper())),
        thermal_policy=choice_of(kconf, "THERMAL_", {"WARN": "warn", "PAUSE": "pause"}),
        battery_stop=bool_of(kconf, "BATTERY_STOP"),
    )


def _prefetch_factor(kconf) -> int:
    """CONFIG_DATA_PREFETCH_FACTOR (its rule with the workers: lib/config/validators.py)."""
    return int_of(kconf, "DATA_PREFETCH_FACTOR") or 0


def _llama_shape(kconf) -> dict:
    """LLAMA_PRESET_CUSTOM's dimensions, checked as the model will check them, so a shape that cannot be built
    is refused when the config is read, naming the settings."""
    dim = int_of(kconf, "LLAMA_DIM")
    if dim is None:
        return dict(llama_dims=None)
    dims = (dim, int_of(kconf, "LLAMA_LAYERS"), int_of(kconf, "LLAMA_HEADS"), int_of(kconf, "LLAMA_KV_HEADS"),
            int_of(kconf, "LLAMA_FFN_DIM"))
    _, _, heads, kv_heads, _ = dims
    if dim % heads:
        raise ConfigError(f"CONFIG_LLAMA_DIM={dim} is not a multiple of CONFIG_LLAMA_HEADS={heads}: choose a width "
                          f"that is (e.g. {dim // heads * heads or heads * 2}) or another head count")
    if (dim // heads) % 2:
        raise ConfigError(f"CONFIG_LLAMA_DIM={dim} / CONFIG_LLAMA_HEADS={heads} gives heads {dim // heads} wide: "
                          "rotary embeddings need an even head width, so choose a width or head count that gives one")
    if heads % kv_heads:
        raise ConfigError(f"CONFIG_LLAMA_KV_HEADS={kv_heads} does not divide CONFIG_LLAMA_HEADS={heads}: choose a "
                          "divisor of the query heads (1 up to their number)")
    return dict(llama_dims=dims)


def typed_config(kconf: kconfiglib.Kconfig, source: str) -> Config:
    run_name = str_of(kconf, "RUN_NAME") or ""
    if not _RUN_NAME.fullmatch(run_name) or run_name in (".", ".."):
        raise ConfigError(f'CONFIG_RUN_NAME="{shown(run_name, 80)}" may only hold letters, digits, ".", "-" and "_"')
    parsed = dict(
        **_llama_shape(kconf),
        time_limit_s=int_of(kconf, "TIME_LIMIT"),
        warmup_steps=int_of(kconf, "WARMUP_STEPS") or 0,  # hidden (0) under a schedule function of the user's
        freeze=_words(kconf, "FREEZE"),
        output_dir=os.path.expanduser(str_of(kconf, "OUTPUT_DIR") or "runs"),  # ~ as for DATA_DIR: never a "./~"
        run_name=run_name,
        hyperparam_mode=choice_of(kconf, "HYPER_PARAM_", {"AUTO": "auto", "MANUAL": "manual"}),
        hyperparam_policy=choice_of(kconf, "HYPER_PARAM_POLICY_", {"PLANNER": "planner", "TIERS": "tiers"}),
        memory_profile=_memory_profile(kconf),
        compile_mode=choice_of(kconf, "COMPILE_", {"AUTO": "auto", "MANUAL": "manual"}),
        compile_kind=choice_of(kconf, "COMPILE_MODE_", {"DEFAULT": "default",
                                                      "REDUCE_OVERHEAD": "reduce-overhead",
                                                      "MAX_AUTOTUNE": "max-autotune"}),
        gradient_checkpointing=bool_of(kconf, "GRADIENT_CHECKPOINTING"),
        recompute_policy=member_of(kconf, "ACTIVATION_CHECKPOINT_"),
        recompute_every=int_of(kconf, "ACTIVATION_CHECKPOINT_EVERY"),
        checkpoint_modules=_class_names(kconf),
        workers_mode=choice_of(kconf, "DATALOADER_WORKERS_", {"AUTO": "auto", "MANUAL": "manual"}),
        data_prefetch_factor=_prefetch_factor(kconf),
        cpu_fallback=bool_of(kconf, "CPU_FALLBACK"),
        tracking=tuple(sink for sink in ("tensorboard", "wandb", "mlflow") if bool_of(kconf, f"TRACK_{sink.upper()}")),
        parallel_strategy=choice_of(kconf, "PARALLEL_", {"AUTO": "auto", "DDP": "ddp", "FSDP": "fsdp",
                                                      "FSDP_GRAD_OP": "fsdp_grad_op", "HSDP": "hsdp"}),
        fsdp_cpu_offload=bool_of(kconf, "FSDP_CPU_OFFLOAD"),
        tensor_parallel=1 if int_of(kconf, "TP") is None else int_of(kconf, "TP"),
        pipeline_parallel=1 if int_of(kconf, "PP") is None else int_of(kconf, "PP"),
        context_parallel=1 if int_of(kconf, "CP") is None else int_of(kconf, "CP"),
        pipeline_schedule=choice_of(kconf, "PP_SCHEDULE_", {"1F1B": "1F1B", "INTERLEAVED_1F1B": "Interleaved1F1B",
                                                            "GPIPE": "GPipe"}) or "1F1B",
        net_gbps=int_of(kconf, "NET_GBPS") or 0,
        **_tuning(kconf),
        **_adaptation(kconf),
    )
    options = options_of(kconf)  # its validators run after the rules above, as they always have
    # every other field is its option's value as the tree types it: stated in the Kconfig tree only
    taken = {f.name: getattr(options, f.name) for f in fields(Config) if f.name not in parsed and f.name not in _RECORD}
    return Config(**taken, **parsed, source=source, text=config_text(kconf),
                  symbols={s.name: s.str_value for s in kconf.unique_defined_syms}, options=options)


_RECORD = ("source", "text", "symbols", "options")  # what a Config records beside its options
