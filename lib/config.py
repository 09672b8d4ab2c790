"""The one reader of .config: Kconfig files + defconfigs + fragments -> a typed, frozen Config.

Everything goes through the kconfiglib API (no regex parsing anywhere else).
kconfiglib is lenient by design: an unknown symbol, a malformed or
out-of-range number, or an assignment whose dependencies are unmet only
produces a warning, and the value silently falls back to a default. Here every
such case is an error that names the symbol, the file it came from and why,
and nothing is written to disk unless the whole configuration is valid.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import kconfiglib

from .errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
KCONFIG = ROOT / "Kconfig"
DEFCONFIG_DIR = ROOT / "defconfigs"
FRAGMENT_DIR = DEFCONFIG_DIR / "fragments"
DEFAULT_DEFCONFIG = "lenet5"


def config_path() -> Path:
    """The .config in use: $KCONFIG_CONFIG as in the kernel, else ./.config."""
    return Path(os.environ.get("KCONFIG_CONFIG") or ".config")


# --------------------------------------------------------------------------
# The typed config


@dataclass(frozen=True)
class Config:
    """A validated configuration. Field names follow the Kconfig symbols."""

    model: str  # lenet5 | resnet18 | resnet50 | gpt2 | custom
    gpt2_preset: str | None  # tiny | 124m | 355m | 774m | 1558m
    gpt2_block_size: int | None
    gpt2_dropout: float | None
    resnet_image_size: int | None
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
    workers_mode: str  # auto | manual
    dataloader_workers: int | None
    cpu_fallback: bool  # DEVICE_AUTO: train on the CPU when the GPU fails at start

    # runtime adaptation
    probe: str  # auto | always | never
    oom_recovery: bool
    oom_max_halvings: int | None
    checkpoint_interval: str  # auto (minutes of measured step time) | steps
    checkpoint_minutes: int | None
    checkpoint_every_steps: int | None
    checkpoint_keep: int
    resume: bool
    monitor: bool
    monitor_interval_ms: int | None
    nproc_mode: str  # auto | manual
    nproc: int | None  # MANUAL: processes per machine

    # learning-rate finder
    lr_finder_min_lr: float
    lr_finder_max_lr: float
    lr_finder_steps: int
    lr_finder_smoothing: float
    lr_finder_diverge: float

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
# Loading and strict validation


def _new_kconfig() -> kconfiglib.Kconfig:
    kconf = kconfiglib.Kconfig(str(KCONFIG), warn_to_stderr=False)
    if kconf.warnings:  # a broken Kconfig tree is our bug, not the user's
        raise ConfigError("Kconfig tree has problems:\n  " + "\n  ".join(kconf.warnings))
    kconf.warn_assign_undef = True
    kconf.warn_assign_override = False  # fragments override on purpose
    kconf.warn_assign_redun = False
    return kconf


def _user_str(sym: kconfiglib.Symbol) -> str:
    if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE):
        return kconfiglib.TRI_TO_STR[sym.user_value]
    return sym.user_value


def _why_not(sym: kconfiglib.Symbol, requested: str) -> str:
    """Explain why a requested value did not take."""
    choice = sym.choice
    if choice is not None and choice.visibility == 0:
        return f"its choice is hidden: it depends on {kconfiglib.expr_str(choice.direct_dep)}, which is not met"
    if not any(node.prompt for node in sym.nodes):
        return "it has no prompt: it is derived from other options and cannot be set"
    if sym.visibility == 0:
        return f"its dependencies are not met: it depends on {kconfiglib.expr_str(sym.direct_dep)}"
    if sym.orig_type in (kconfiglib.INT, kconfiglib.HEX):
        for low, high, cond in sym.ranges:
            if kconfiglib.expr_value(cond):
                return f"it is outside the allowed range {low.str_value}..{high.str_value}"
    if choice is not None and requested == "n" and choice.selection is sym:
        return ("it is the choice's default: to deselect it, set another member of the "
                "choice to y")
    if sym.rev_dep is not sym.kconfig.n and kconfiglib.expr_value(sym.rev_dep):
        return f"it is forced by select from {kconfiglib.expr_str(sym.rev_dep)}"
    return f"kconfiglib resolved it to '{sym.str_value}'"


def _display(sym: kconfiglib.Symbol, value: str) -> str:
    if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE) and value == "n":
        return f"# CONFIG_{sym.name} is not set"
    if sym.orig_type == kconfiglib.STRING:
        return f'CONFIG_{sym.name}="{value}"'
    return f"CONFIG_{sym.name}={value}"


def _load_strict(files: Sequence[Path], notes: list[str] | None = None) -> kconfiglib.Kconfig:
    """Load files in order (the first replaces, the rest merge) and require every value to take.

    Each file's values must take at the point it is merged. A later fragment may
    override or hide what an earlier file set (switching to MANUAL hides the
    base's TARGET_EFFECTIVE_BATCH): that is what fragments are for, so such a
    superseded value is reported in `notes`, as the kernel's merge_config does,
    not refused.
    """
    kconf = _new_kconfig()
    requested: dict[str, tuple[kconfiglib.Symbol, str, Path]] = {}
    errors: list[str] = []
    for i, path in enumerate(files):
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        errors += _contradictions(path)
        before = {s.name: s.user_value for s in kconf.unique_defined_syms}
        kconf.load_config(str(path), replace=(i == 0))
        # set_value() warnings (a malformed number) carry no file name: add it
        errors += [w.replace("warning: ", "", 1) if w.startswith(str(path)) else
                   f"{path}: " + w.replace("warning: ", "", 1) for w in kconf.warnings]
        kconf.warnings.clear()
        for sym in kconf.unique_defined_syms:
            if sym.user_value is not None and (i == 0 or before[sym.name] != sym.user_value):
                requested[sym.name] = (sym, _user_str(sym), path)
        errors += [f"{src}: {_display(sym, value)} did not take: {_why_not(sym, value)}"
                   for sym, value, src in _not_taken(requested.values()) if src == path]
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    if notes is not None:
        notes += [f"{src}: {_display(sym, value)} no longer applies after the later fragments "
                  f"({_why_not(sym, value)})" for sym, value, src in _not_taken(requested.values())]
    return kconf


def _contradictions(path: Path) -> list[str]:
    """Assignments within one file that contradict each other (only the last would silently win)."""
    kconf = _new_kconfig()
    kconf.warn_assign_override = True
    kconf.load_config(str(path))
    found = [w.replace("warning: ", "", 1) for w in kconf.warnings if "set more than once" in w]
    for choice in kconf.unique_choices:
        chosen = [sym.name for sym in choice.syms if sym.user_value == 2]
        if len(chosen) > 1:
            found.append(f"{path}: sets {' and '.join('CONFIG_' + n + '=y' for n in chosen)}, but they are "
                         "members of one choice: keep one")
    return found


def _not_taken(requests):
    for sym, value, path in requests:
        choice = sym.choice
        if choice is not None and value == "y" and choice.user_selection is not sym:
            continue  # a later assignment selected another member of the same choice
        if value != sym.str_value:
            yield sym, value, path


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


_RUN_NAME = re.compile(r"[A-Za-z0-9._-]*")
_FACTORY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_PROFILES = {"CONSERVATIVE": 0.50, "BALANCED": 0.75, "EXTREME": 0.95}


def _memory_profile(kconf) -> float | None:
    for name, share in _PROFILES.items():
        if _bool(kconf, "MEMORY_PROFILE_" + name):
            return share
    percent = _int(kconf, "MEMORY_PROFILE_PERCENT")
    return percent / 100 if percent is not None else None


def _ordered(low_name: str, low: float, high_name: str, high: float) -> None:
    if low >= high:
        raise ConfigError(f"CONFIG_{low_name}={low:g} must be below CONFIG_{high_name}={high:g}")


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


def _typed(kconf: kconfiglib.Kconfig, source: str) -> Config:
    run_name = _str(kconf, "RUN_NAME") or ""
    if not _RUN_NAME.fullmatch(run_name) or run_name in (".", ".."):
        raise ConfigError(f'CONFIG_RUN_NAME="{run_name}" may only hold letters, digits, ".", "-" and "_"')
    factory = _str(kconf, "CUSTOM_MODEL_FACTORY")
    if factory is not None and not _FACTORY.fullmatch(factory):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{factory}" must look like package.module:function')
    return Config(
        model=_choice(kconf, "MODEL_", {"LENET5": "lenet5", "RESNET18": "resnet18",
                                        "RESNET50": "resnet50", "GPT2": "gpt2", "CUSTOM": "custom"}),
        gpt2_preset=_choice(kconf, "GPT2_PRESET_", {"TINY": "tiny", "124M": "124m", "355M": "355m",
                                                    "774M": "774m", "1558M": "1558m"}),
        gpt2_block_size=_int(kconf, "GPT2_BLOCK_SIZE"),
        gpt2_dropout=_number(kconf, "GPT2_DROPOUT", low=0, high=1, high_open=True),
        resnet_image_size=_int(kconf, "RESNET_IMAGE_SIZE"),
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
        seed=_int(kconf, "SEED"),
        log_interval=_int(kconf, "LOG_INTERVAL"),
        eval_interval=_int(kconf, "EVAL_INTERVAL"),
        output_dir=_str(kconf, "OUTPUT_DIR") or "runs",
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
        workers_mode=_choice(kconf, "DATALOADER_WORKERS_", {"AUTO": "auto", "MANUAL": "manual"}),
        dataloader_workers=_int(kconf, "DATALOADER_WORKERS"),
        cpu_fallback=_bool(kconf, "CPU_FALLBACK"),
        probe=_choice(kconf, "PROBE_", {"AUTO": "auto", "ALWAYS": "always", "NEVER": "never"}),
        oom_recovery=_bool(kconf, "OOM_RECOVERY"),
        oom_max_halvings=_int(kconf, "OOM_MAX_HALVINGS"),
        checkpoint_interval=_choice(kconf, "CHECKPOINT_INTERVAL_", {"AUTO": "auto", "STEPS": "steps"}),
        checkpoint_minutes=_int(kconf, "CHECKPOINT_MINUTES"),
        checkpoint_every_steps=_int(kconf, "CHECKPOINT_EVERY_STEPS"),
        checkpoint_keep=_int(kconf, "CHECKPOINT_KEEP"),
        resume=_bool(kconf, "RESUME"),
        monitor=_bool(kconf, "MONITOR"),
        monitor_interval_ms=_int(kconf, "MONITOR_INTERVAL_MS"),
        nproc_mode=_choice(kconf, "NPROC_", {"AUTO": "auto", "MANUAL": "manual"}),
        nproc=_int(kconf, "NPROC"),
        **_tuning(kconf),
        source=source,
        text=_config_text(kconf),
        symbols={s.name: s.str_value for s in kconf.unique_defined_syms},
    )


def _config_text(kconf: kconfiglib.Kconfig) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config"
        kconf.write_config(str(path), save_old=False)
        return path.read_text()


def _write_atomic(kconf: kconfiglib.Kconfig, out: Path, *, minimal: bool = False) -> None:
    """Write via a temporary file and rename, keeping the previous file as <out>.old like the kernel."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        if minimal:
            kconf.write_min_config(tmp)
        else:
            kconf.write_config(tmp, save_old=False)
        if out.exists() and not minimal:
            os.replace(out, out.with_name(out.name + ".old"))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --------------------------------------------------------------------------
# The operations behind the make targets


def _load_existing(path: Path) -> kconfiglib.Kconfig:
    if not path.is_file():
        raise ConfigError(f"{path}: no such file: run 'make <name>-defconfig' or 'make menuconfig' first "
                          "(see 'make help' for the defconfigs)")
    return _load_strict([path])


def read_config(path: Path | str | None = None) -> Config:
    """Read and validate a .config (or any config file) into a Config. Changes nothing on disk."""
    path = Path(path) if path is not None else config_path()
    return _typed(_load_existing(path), str(path))


def defconfig_names() -> list[str]:
    return sorted(p.name for p in DEFCONFIG_DIR.iterdir() if p.is_file())


def fragment_names() -> list[str]:
    return sorted(p.name for p in FRAGMENT_DIR.iterdir() if p.is_file()) if FRAGMENT_DIR.is_dir() else []


def _named(name: str, directory: Path, names: list[str], what: str) -> Path:
    path = Path(name)
    if path.is_file() and (os.sep in name or not (directory / name).is_file()):
        return path  # an explicit path to a file of the user's
    if (directory / name).is_file():
        return directory / name
    raise ConfigError(f"unknown {what} '{name}': choose one of {', '.join(names) or '(none)'} "
                      f"(files in {directory.relative_to(ROOT)}/), or give a path to a file")


def defconfig_file(name: str) -> Path:
    return _named(name, DEFCONFIG_DIR, defconfig_names(), "defconfig")


def fragment_file(name: str) -> Path:
    return _named(name, FRAGMENT_DIR, fragment_names(), "fragment")


def make_defconfig(name: str, fragments: Sequence[str] = (), out: Path | None = None,
                   notes: list[str] | None = None) -> Config:
    """Base defconfig + fragments -> a full, validated .config written atomically.

    Values of the base that a fragment supersedes are appended to `notes`.
    """
    out = out or config_path()
    files = [defconfig_file(name)] + [fragment_file(f) for f in fragments]
    kconf = _load_strict(files, notes)
    config = _typed(kconf, str(out))
    _write_atomic(kconf, out)
    return config


def olddefconfig(path: Path | None = None) -> Config:
    """Validate the existing .config and rewrite it with defaults for new symbols."""
    path = path or config_path()
    kconf = _load_existing(path)
    config = _typed(kconf, str(path))  # typed checks (numbers in strings) before anything is written
    _write_atomic(kconf, path)
    return config


def savedefconfig(path: Path | None = None, out: Path = Path("defconfig")) -> Path:
    """Write the minimal config that reproduces the current one (as the kernel's savedefconfig)."""
    path = path or config_path()
    kconf = _load_existing(path)
    _typed(kconf, str(path))
    _write_atomic(kconf, out, minimal=True)
    return out


def minimal_config_text(path: Path) -> str:
    """What savedefconfig would write for a config file."""
    kconf = _load_strict([path])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "defconfig"
        kconf.write_min_config(str(out))
        return out.read_text()


def listnewconfig(path: Path | None = None) -> list[str]:
    """Visible symbols the config does not set yet, as 'CONFIG_X=default' lines (as the kernel prints)."""
    kconf = _load_existing(path or config_path())
    new = []
    for sym in kconf.unique_defined_syms:
        if sym.user_value is None and sym.visibility and any(n.prompt for n in sym.nodes):
            if sym.choice is not None and sym.choice.user_selection is not None:
                continue  # the choice was answered by another member
            new.append(_display(sym, sym.str_value))
    return new


# --------------------------------------------------------------------------
# Changing values programmatically (LR finder APPLY=1, hpo-apply, HPO trials)


def _assignment_lines(assignments: Mapping[str, object]) -> str:
    """.config lines for {symbol: value}; names may carry the CONFIG_ prefix, values are Python or text."""
    kconf = _new_kconfig()
    lines = []
    for name, value in assignments.items():
        name = name.removeprefix("CONFIG_")
        sym = kconf.syms.get(name)
        if sym is None or not sym.nodes:
            raise ConfigError(f"CONFIG_{name} is not a kfit option (see 'make menuconfig')")
        if isinstance(value, bool):
            value = "y" if value else "n"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        text = str(value)
        if sym.orig_type == kconfiglib.STRING:
            text = text.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(_display(sym, text))
    return "\n".join(lines) + "\n"


def _merged(base_text: str, assignments: Mapping[str, object], source: str,
            notes: list[str] | None) -> tuple[kconfiglib.Kconfig, Config]:
    with tempfile.TemporaryDirectory() as tmp:
        base, change = Path(tmp) / "config", Path(tmp) / "changes"
        base.write_text(base_text)
        change.write_text(_assignment_lines(assignments))
        try:
            kconf = _load_strict([base, change], notes)
        except ConfigError as err:  # name the user's file and "the requested change", not temp paths
            raise ConfigError(str(err).replace(str(change), "requested change").replace(str(base), source)) from None
        return kconf, _typed(kconf, source)


def derive(config: Config, assignments: Mapping[str, object]) -> Config:
    """`config` with some symbols changed, validated as strictly as a fragment. Writes nothing.

    Every value must take (a hidden symbol, an out-of-range number or a bad
    string is a ConfigError naming it), exactly as for a defconfig fragment.
    """
    return _merged(config.text, assignments, config.source, None)[1]


def apply_assignments(path: Path, assignments: Mapping[str, object], notes: list[str] | None = None) -> Config:
    """Change symbols in the config file at `path` through the same validation, then write it atomically.

    Nothing is written unless the result is valid; the previous file is kept as <path>.old.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file: run 'make <name>-defconfig' first")
    kconf, config = _merged(path.read_text(), assignments, str(path), notes)
    _write_atomic(kconf, path)
    return config

