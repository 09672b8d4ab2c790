"""Three ready-to-train configurations for a machine: conservative, balanced, extreme (seed 002).

Each mode is a memory profile (the share of free memory the planner may use:
kfit's MEMORY_PROFILE_CONSERVATIVE / BALANCED / EXTREME, whose shares lib/config/profiles.py holds), a
Chinchilla ratio of training tokens to parameters (12, 20, 25: Hoffmann et al.
2022 put the compute-optimal ratio near 20), the seed's parameter range, a
context length, and the longest run the mode accepts (2 h, 6 h, 72 h: the
seed's "30 min-2 h", "2-6 h" and "6 h+", the last bounded at three days).

For the language-model families (GPT-2 and the Llama-style decoder) the model
is chosen: among a family's presets (`Shape`s), the largest in the mode's range
that the planner fits in the mode's memory and that trains its token budget
within the mode's time. Where none can, the mode is out of reach, and the
largest model that can is recommended instead, saying so. The configured
family's choice is the mode's recommendation; the other family's is offered
beside it (`Recommendation.alternatives`). Other models (LeNet-5, ResNet, a
custom model) keep their model; the modes then differ in memory share (so
micro-batch, checkpointing and strategy) and time, for the configured epochs.

A token budget larger than the training data repeats it: `corpus_warning` says
how many epochs that is and names the largest preset whose budget the data
covers (the tokenized corpus's real token count, from its meta.json, when the
config trains on one).

Every figure comes from the plan (lib.planning.make_plan, passed in as
`plan`): the predicted peak against the budget, the step time, the strategy.
Before a shape is traced, two lower bounds rule out what cannot work: the
model's state (parameters, gradients and AdamW's two moments, 16 bytes per
parameter, shared over the processes when sharded) against the budget, and
6 x parameters x tokens FLOPs (the training compute of Kaplan et al. 2020)
against the device's reachable FLOP/s for the mode's time.

The performance score (`score`) rates the machine for training on a log
scale of reachable training FLOP/s, 0 at SCORE_LOW (a 2-core laptop CPU) and
10 at SCORE_HIGH (8 H100s in bf16 at the step-time model's 60% of the
datasheet's dense peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .config import MEMORY_PROFILES, Config
from .errors import PlanError
from .models.registry import MODELS
from .plan import Plan
from .units import format_bytes

STATE_BYTES_PER_PARAMETER = 16  # fp32 weights + gradients + AdamW's exp_avg and exp_avg_sq
TRAINING_FLOPS_PER_PARAMETER_TOKEN = 6  # forward 2, backward 4
SCORE_LOW = 2e10  # FLOP/s: a 2-core laptop CPU in fp32
SCORE_HIGH = 8 * 989e12 * 0.6  # FLOP/s: 8 H100 SXM, bf16 dense peak x GPU_COMPUTE_EFFICIENCY
DATA_READ_SHARE = 0.1  # reading the data once may take this share of the run before the warning
MAX_EPOCHS = 100000  # CONFIG_EPOCHS' upper bound: the token budget's MAX_STEPS is what stops a run
# CONFIG_MODEL_<name> -> its title: the families recommend chooses a size in (those with presets)
FAMILIES = {name: spec.named for name, spec in MODELS.items() if spec.sized is not None}  # the sizes it chooses among
REPEAT_EPOCHS = 4  # repeating data up to about 4 epochs costs little loss (Muennighoff et al. 2023)


@dataclass(frozen=True)
class Mode:
    name: str
    profile: str  # MEMORY_PROFILE_<profile>
    share: float
    tokens_per_parameter: int
    parameters: tuple[float, float | None]  # the seed's range for the mode
    context: int  # the context length (tokens) in this mode
    max_hours: float


MODES = (
    Mode("conservative", "CONSERVATIVE", MEMORY_PROFILES["CONSERVATIVE"], 12, (23e6, 70e6), 512, 2.0),
    Mode("balanced", "BALANCED", MEMORY_PROFILES["BALANCED"], 20, (70e6, 200e6), 1024, 6.0),
    Mode("extreme", "EXTREME", MEMORY_PROFILES["EXTREME"], 25, (200e6, None), 2048, 72.0),
)


@dataclass(frozen=True)
class Shape:
    """A model kfit can build: CONFIG_<FAMILY>_PRESET_<preset> of a family of FAMILIES (gpt2, llama), and its
    parameters with the data's vocabulary."""

    preset: str
    parameters: int
    family: str = "gpt2"

    @property
    def name(self) -> str:
        return f"{self.family} {self.preset}"

    def assignments(self, mode: Mode) -> dict:
        """The CONFIG_ symbols (without the prefix) that select this shape at the mode's context and memory."""
        prefix = self.family.upper()
        return {f"MODEL_{prefix}": True, f"{prefix}_PRESET_{self.preset.upper()}": True,
                f"{prefix}_BLOCK_SIZE": mode.context, f"MEMORY_PROFILE_{mode.profile}": True}


@dataclass
class Recommendation:
    mode: Mode
    config: Config
    plan: Plan | None
    assignments: dict  # CONFIG_ symbols (without the prefix) that make this configuration from the base
    parameters: int | None = None
    tokens: int | None = None  # the token budget (a chosen size); None: the configured epochs
    steps: int | None = None
    seconds: float | None = None
    energy_kwh: float | None = None
    watts: float | None = None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    out_of_reach: str | None = None  # why the mode's range of sizes cannot be met here
    bar: dict | None = None  # the HTML page's memory bar (render_page)
    shape: Shape | None = None  # the chosen size; None: the configured model
    alternatives: list = field(default_factory=list)  # the other family's Recommendation for this mode
    notes: list[str] = field(default_factory=list)  # why the other family has none here

    def to_dict(self) -> dict:
        plan = self.plan
        return {"mode": self.mode.name, "memory_share": self.mode.share, "parameters": self.parameters,
                "model": self.config.model, "preset": self.shape.preset if self.shape else None,
                "context": self.mode.context if self.shape else None,
                "alternatives": [a.to_dict() for a in self.alternatives], "notes": self.notes,
                "tokens_per_parameter": self.mode.tokens_per_parameter if self.tokens else None,
                "tokens": self.tokens, "steps": self.steps, "seconds": self.seconds,
                "energy_kwh": self.energy_kwh, "watts": self.watts, "assignments": self.assignments,
                "reasons": self.reasons, "warnings": self.warnings, "out_of_reach": self.out_of_reach,
                "plan": plan.to_dict() if plan else None}


def token_budget(parameters: int, mode: Mode) -> int:
    """Training tokens for a model: the mode's Chinchilla ratio x parameters."""
    return mode.tokens_per_parameter * parameters


def steps_for(tokens: int, effective_batch: int, context: int) -> int:
    """Optimizer steps that train `tokens` at `effective_batch` sequences of `context` tokens (at least 1)."""
    return max(1, math.ceil(tokens / (effective_batch * context)))


def score(flops: float) -> float:
    """The performance score of a machine reaching `flops` training FLOP/s: 0-10, one decimal."""
    value = 10 * math.log(max(flops, 1.0) / SCORE_LOW) / math.log(SCORE_HIGH / SCORE_LOW)
    return round(min(10.0, max(0.0, value)), 1)


def compute_hours(parameters: int, tokens: int, flops: float) -> float:
    """A lower bound of the training time: 6 N D FLOPs at the device's reachable FLOP/s."""
    return TRAINING_FLOPS_PER_PARAMETER_TOKEN * parameters * tokens / flops / 3600


def state_fits(parameters: int, budget: int, *, processes: int, sharded: bool) -> bool:
    """Whether the model's state alone fits one process's budget (a lower bound of the peak)."""
    per_process = STATE_BYTES_PER_PARAMETER * parameters / (processes if sharded else 1)
    return per_process <= budget


def in_range(parameters: int, mode: Mode) -> bool:
    low, high = mode.parameters
    return parameters >= low and (high is None or parameters <= high)


def recommend_family(base: Config, shapes: list[Shape], *, plan: Callable[[Config], Plan],
                     derive: Callable[[Config, dict], Config], flops: float, budget: int, processes: int,
                     mode: Mode) -> Recommendation:
    """The largest of one family's shapes in the mode's range that fits and trains within the mode's time;
    else the largest that does (out of reach)."""
    effective = base.target_effective_batch or 1
    feasible, reasons = [], []
    for shape in sorted(shapes, key=lambda s: s.parameters):
        tokens = token_budget(shape.parameters, mode)
        hours = compute_hours(shape.parameters, tokens, flops)
        if hours > mode.max_hours:
            reasons.append(f"{shape.preset}: at least {hours:,.1f} h for {tokens:,} tokens")
            continue
        if not state_fits(shape.parameters, int(budget * mode.share), processes=processes, sharded=processes > 1):
            reasons.append(f"{shape.preset}: its state alone is above {mode.share:.0%} of memory")
            continue
        feasible.append(shape)
    wanted = [s for s in feasible if in_range(s.parameters, mode)]
    # out of reach (none in range fits, or trains in time by the planner's step time): the largest smaller
    # model, never one above the mode's range
    smaller = [s for s in feasible if s.parameters < mode.parameters[0]]
    order = sorted(wanted, key=lambda s: -s.parameters) + sorted(smaller, key=lambda s: -s.parameters)
    for shape in order:
        assignments = shape.assignments(mode)
        config = derive(base, assignments)
        try:
            chosen = plan(config)
        except PlanError as err:
            reasons.append(f"{shape.preset}: {str(err).split('. ')[0]}")
            continue
        tokens = token_budget(shape.parameters, mode)
        steps = steps_for(tokens, chosen.effective_batch, mode.context)
        rec = Recommendation(mode, config, chosen, {**assignments, "MAX_STEPS": steps, "EPOCHS": MAX_EPOCHS},
                             parameters=shape.parameters, tokens=tokens, steps=steps, shape=shape)
        if chosen.predicted_step_seconds and steps * chosen.predicted_step_seconds > mode.max_hours * 3600:
            reasons.append(f"{shape.preset}: {steps:,} steps x {chosen.predicted_step_seconds:.2f} s is over "
                           f"{mode.max_hours:g} h")
            continue
        timed(rec)
        larger = [s for s in sorted(shapes, key=lambda s: s.parameters) if s.parameters > shape.parameters]
        rec.reasons = [f"{shape.parameters / 1e6:.1f}M parameters x {mode.tokens_per_parameter} tokens each "
                       f"= {tokens:,} tokens = {steps:,} steps of {chosen.effective_batch} x {mode.context} tokens",
                       # why not the next size up
                       *[r for r in reasons if larger and r.startswith(larger[0].preset + ":")][:1]]
        if shape not in wanted:
            low, high = mode.parameters
            span = f"{low / 1e6:g}M-{high / 1e6:g}M" if high else f"{low / 1e6:g}M+"
            rec.out_of_reach = (f"no model in this mode's {span} range trains {mode.tokens_per_parameter} tokens per "
                                f"parameter within {mode.max_hours:g} h in {mode.share:.0%} of this machine's memory; "
                                f"the largest that does: {shape.parameters / 1e6:.1f}M ({shape.preset})")
        return rec
    family = FAMILIES.get(shapes[0].family, shapes[0].family) if shapes else "model"
    raise PlanError(f"{mode.name}: no {family} shape trains here within {mode.max_hours:g} h: " + "; ".join(reasons))


def recommend_fixed(base: Config, *, plan: Callable[[Config], Plan], derive: Callable[[Config, dict], Config],
                    mode: Mode) -> Recommendation:
    """A model that is not chosen (LeNet-5, ResNet, custom): the mode's memory share, the configured epochs."""
    assignments = {f"MEMORY_PROFILE_{mode.profile}": True}
    config = derive(base, assignments)
    chosen = plan(config)
    rec = Recommendation(mode, config, chosen, assignments)
    timed(rec)
    rec.reasons = [f"{base.model}: the configured model and epochs; {mode.share:.0%} of free memory"]
    return rec


def timed(rec: Recommendation) -> None:
    """Time and energy from the plan's step time (its power: the plan's energy over its run time)."""
    plan = rec.plan
    if not plan or not plan.predicted_step_seconds:
        return
    rec.seconds = (rec.steps * plan.predicted_step_seconds if rec.steps else plan.predicted_run_seconds)
    if plan.predicted_energy_kwh and plan.predicted_run_seconds:
        rec.watts = plan.predicted_energy_kwh * 3.6e6 / plan.predicted_run_seconds
        rec.energy_kwh = rec.watts * rec.seconds / 3.6e6 if rec.seconds else None


@dataclass(frozen=True)
class DataSource:
    """Where the training data is read from, for the slow-disk warning: its bytes, the bytes one training
    sample reads, and the measured sequential read speed of its directory (None: built in, or not measured)."""

    bytes: int
    bytes_per_sample: float
    read_bytes_per_s: float | None
    ram_available: int


def data_warning(source: DataSource | None, plan: Plan | None, seconds: float | None) -> str | None:
    """A warning when reading the data would hold training back: data larger than free memory is read
    from disk every epoch, so the disk must keep up with the samples training consumes; data that fits
    is read once (then the page cache serves it), which matters when that read is a sizeable part of
    the run (over DATA_READ_SHARE)."""
    if source is None or not source.read_bytes_per_s or plan is None or not plan.predicted_step_seconds:
        return None
    speed = source.read_bytes_per_s
    needed = plan.effective_batch * source.bytes_per_sample / plan.predicted_step_seconds
    if source.bytes > source.ram_available and needed > speed:
        return (f"the data ({source.bytes / 2**30:.1f} GiB) is larger than free memory and is read from disk at "
                f"{speed / 2**20:,.0f} MiB/s, below the {needed / 2**20:,.0f} MiB/s training consumes: the disk, "
                "not the device, sets the speed; move it to a faster disk (NVMe) or a machine with more memory")
    once = source.bytes / speed
    if seconds and once > DATA_READ_SHARE * seconds:
        return (f"reading the data once takes {once:,.0f} s at {speed / 2**20:,.0f} MiB/s, {once / seconds:.0%} "
                "of the run: a faster disk (NVMe) shortens the first epoch")
    return None


def epochs_for(tokens: int, data_tokens: int) -> float:
    """How many times a token budget reads data of `data_tokens` training tokens."""
    return tokens / max(1, data_tokens)


def largest_covered(shapes: list[Shape], mode: Mode, data_tokens: int) -> Shape | None:
    """The largest shape whose token budget in this mode the data holds without repeating; None: not even
    the smallest's."""
    covered = [s for s in shapes if token_budget(s.parameters, mode) <= data_tokens]
    return max(covered, key=lambda s: s.parameters, default=None)


def corpus_warning(rec: Recommendation, data_tokens: int, shapes: list[Shape] | None = None, *,
                   corpus: bool = False) -> str | None:
    """A token budget larger than the data: the epochs it takes, and the largest of `shapes` (the chosen
    one's family) whose budget the data covers. `corpus`: a tokenized corpus (make data), not the embedded
    text."""
    if not data_tokens or not rec.tokens or rec.tokens <= data_tokens:
        return None
    epochs = epochs_for(rec.tokens, data_tokens)
    what = "the tokenized corpus" if corpus else "the data"
    out = (f"{what} holds {data_tokens:,} training tokens: {rec.tokens:,} tokens "
           f"({rec.mode.tokens_per_parameter} per parameter) read it {epochs:,.1f} times")
    if epochs <= REPEAT_EPOCHS:
        out += f" (up to about {REPEAT_EPOCHS} epochs of repeated data lose little)"
    family = [s for s in shapes or [] if rec.shape is None or s.family == rec.shape.family]
    covered = largest_covered(family, rec.mode, data_tokens)
    if covered is not None:
        out += (f"; the largest model it covers at {rec.mode.tokens_per_parameter} tokens per parameter: "
                f"{covered.name} ({covered.parameters / 1e6:.1f}M parameters, "
                f"{token_budget(covered.parameters, rec.mode):,} tokens)")
    elif family:
        out += f"; it covers no {FAMILIES.get(family[0].family, family[0].family)} size's budget"
    more = "make data CORPUS=<more text>" if corpus else "CONFIG_DATA_DIR to a tokenized corpus (make data)"
    return out + f": for a real run, {more}"


def warnings_for(rec: Recommendation, *, on_battery: bool | None, dataset_tokens: int | None,
                 data: DataSource | None = None, shapes: list[Shape] | None = None,
                 corpus: bool = False) -> list[str]:
    """The seed's warnings and suggestions, each tied to a figure of this recommendation."""
    out = []
    plan = rec.plan
    if rec.mode.name == "extreme":
        out.append(f"{rec.mode.share:.0%} of free memory: another process's allocation can end the run in "
                   "out-of-memory (kfit then halves the micro-batch, keeping the effective batch)")
        if rec.seconds and rec.seconds > 6 * 3600:
            out.append(f"{rec.seconds / 3600:,.0f} h at full power: watch temperatures and throttling "
                       "(make train's monitor warns when the GPU throttles); cooling decides the speed")
    if on_battery:
        out.append("on battery: plug in before a long run (kfit checkpoints on SIGTERM, so a shutdown loses little)")
    if plan and plan.precision == "fp32" and plan.device_type == "cuda":
        out.append("fp32 on a GPU: bf16 autocast (CONFIG_PRECISION_AUTO) roughly halves activations and "
                   "speeds matmuls where the GPU supports it")
    if plan and plan.gradient_checkpointing and not rec.config.gradient_checkpointing:
        out.append(f"gradient checkpointing is on (the planner's choice: {plan.reasons.get('gradient_checkpointing', 'AUTO')}):"
                   f" activations are recomputed in the backward pass, about a third more compute, for micro-batch "
                   f"{plan.micro_batch} in {rec.mode.share:.0%} of memory")
    if warning := data_warning(data, plan, rec.seconds):
        out.append(warning)
    if warning := corpus_warning(rec, dataset_tokens or 0, shapes, corpus=corpus):
        out.append(warning)
    return out


def render_page(recs: list[Recommendation], *, score_value: float, definition: str, machine: str, processes: int,
                free_bytes: int) -> str:
    """The three recommendations side by side as one self-contained HTML page (lib/templates/recommend.html.j2)."""
    from datetime import datetime
    from pathlib import Path

    import jinja2

    from .monitor import format_duration

    colors = {"conservative": "#59a14f", "balanced": "#4e79a7", "extreme": "#e15759"}
    for rec in recs:
        plan = rec.plan
        if plan and plan.predicted_peak_bytes and plan.budget_bytes and free_bytes:
            rec.bar = {"free": free_bytes, "color": colors[rec.mode.name],
                       "budget": round(min(100.0, 100 * plan.budget_bytes / free_bytes), 2),
                       "peak": round(min(100.0, 100 * plan.predicted_peak_bytes / free_bytes), 2)}

    def size(n: int | None) -> str:
        return "-" if n is None else format_bytes(n, 1, sep=" ")

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    return env.get_template("recommend.html.j2").render(
        recs=recs, score=score_value, definition=definition, machine=machine, processes=processes,
        model=recs[0].config.model if recs else "", generated=datetime.now().strftime("%Y-%m-%d %H:%M"), size=size,
        duration=lambda s: format_duration(s) if s else "unknown")
