"""The memory planner: AUTO's default batch policy (CONFIG_HYPER_PARAM_POLICY_PLANNER).

budget = free memory (GPU free, or RAM available on a CPU) x CONFIG_MEMORY_PROFILE_*.
The micro-batch cap is the largest batch, up to the per-process share of the
target, whose predicted training peak (lib.memory: traced step + device
overheads) fits the budget; the resolver then splits the target effective
batch with calculate_gradient_accumulation. The evaluation batch comes from its
own forward-only trace, with the training state that stays alive during
evaluation (gradients, optimizer state) added, up to the evaluation split.
Both searches run on lib.memory.PeakCurve: the cached traces, and the affine
stretches they prove, so a cached plan traces nothing even when the budget moves.
"""

from __future__ import annotations

import dataclasses

import math
import functools
from typing import TYPE_CHECKING, Callable

from ..config import DEFAULT_SHARE, LARGEST_SHARE, Config, profile_name
from ..errors import NoFitError
from ..hardware import HardwareProfile, gib
from ..models.registry import can_checkpoint, spec_for
from ..plan import BatchChoice
from ..units import format_bytes
from ..models.registry import label as model_label

if TYPE_CHECKING:  # lib.memory (and so torch) is imported on first use: the resolver imports this module
    from ..memory import MemoryPredictor, Prediction

MAX_MICRO_BATCH = 65536  # CONFIG_BATCH_SIZE's upper bound


def profile_label(config: Config) -> str:
    share = config.memory_profile or DEFAULT_SHARE
    custom = config.symbols.get("MEMORY_PROFILE_CUSTOM") == "y"
    return f"{'custom' if custom else profile_name(share) or 'custom'} {share:.0%}"


def memory_budget(config: Config, hardware: HardwareProfile, device_type: str) -> tuple[int, str]:
    """(bytes the planner may use, how that was worked out)."""
    share = config.memory_profile or DEFAULT_SHARE  # the shares and their margin evidence: lib/config/profiles.py
    if device_type == "cpu":
        free, where = hardware.cpu.ram_available_bytes, "RAM available"
    else:
        gpu = hardware.primary_gpu
        free, where = gpu.free_bytes, f"free on {gpu.name}"
    return int(free * share), f"{gib(free):.1f}GiB {where} x {profile_label(config)}"


_fmt = format_bytes  # sizes in the planner's reasons: 15MiB, 1.23GiB


class PlannerPolicy:
    """Largest micro-batch whose predicted peak fits free memory x the memory profile.

    It holds its memory predictor, made on first use, whose in-process memo of traces serves every plan the
    policy makes; cache_dir None: lib.memory.default_cache_dir() at each use."""

    name = "planner"

    def __init__(self, cache_dir: str | None = None) -> None:
        self.cache_dir = cache_dir

    def __repr__(self) -> str:
        return f"PlannerPolicy(cache_dir={self.cache_dir!r})"

    @functools.cached_property
    def predictor(self) -> "MemoryPredictor":
        from ..memory import MemoryPredictor

        return MemoryPredictor(self.cache_dir)

    def choose(self, *, config: Config, hardware: HardwareProfile, model, device_type: str, compile: bool,
               compile_mode: str | None, precision: str, world_size: int, target: int, strategy: str = "none",
               local_world_size: int | None = None, cpu_offload: bool = False, tensor: int = 1,
               pipeline: tuple[int, str] | None = None, nodes: int = 1, context: int = 1) -> BatchChoice:
        budget, budget_why = memory_budget(config, hardware, device_type)
        # one process's memory: a replica (none, ddp), or its shards (lib/parallel.py), traced at this world size
        sharding = _sharding(strategy, world_size, local_world_size, cpu_offload, tensor, context)
        whole, (config, gathers) = config, context_view(config, context, precision)
        # A process never needs more than its share of the target, so the search stops there: when the share
        # fits (usual on a CPU) its one trace is cached for good and a budget that moves never traces again.
        # Below it, the search reads the affine stretches the cached traces prove (lib/memory/predict.py).
        share = math.ceil(target / world_size)
        limit = min(share, MAX_MICRO_BATCH)
        views = with_terms(pipeline_views(config, pipeline, share, strategy=strategy, precision=precision,
                                          tensor=tensor), gathers)
        if pipeline:  # a micro-batch per stage at least, or the schedule cuts smaller ones itself
            limit = min(limit, max(1, share // pipeline[0]))
        replica = not sharding or (sharding["strategy"] == "ddp" and "tensor" not in sharding)
        if replica and not pipeline:  # a whole model in each process: its state alone may rule it out, untraced
            floor = self.predictor.state_floor(config)
            if floor > budget:
                raise self._state_over(config, floor, budget, budget_why, whole, device_type)
        train = _worst([self.predictor.curve(config, device_type=device_type, precision=precision,
                                             compile_mode=compile_mode, **sharding, **view) for view in views])
        cap = train.largest_fitting(budget, limit, low_first=train.deep)
        if cap == 0:
            raise self._no_fit(config, train.prediction(1), budget, budget_why, device_type, precision,
                               sharding, whole)
        reason = f"predicted peak {_fmt(train.at(cap))} at {cap} fits the budget {_fmt(budget)} ({budget_why})"
        if cap == share:
            reason += f"; {cap} is the whole per-process share of the target (the search stops there)"
        elif pipeline and cap == limit:
            reason += (f"; {cap} makes one micro-batch per pipeline stage of the share of {share} at least "
                       f"(CONFIG_PP={pipeline[0]})")
        elif cap == limit:
            reason += f"; {cap} is the largest micro-batch kfit plans (CONFIG_BATCH_SIZE's upper bound)"
        else:
            reason += f"; {cap + 1} would need {_fmt(train.at(cap + 1))}"
        measured = self.predictor.measured_note(train.trace(cap), config, device_type=device_type,
                                                precision=precision, train=True, **sharding)
        if measured:  # the tracer could not run the model (lib/memory/measured.py)
            reason = reason.replace("predicted peak", "peak", 1) + f"; {measured}"

        # Evaluation runs while the gradients and optimizer state are alive (they are freed at the next step).
        at = train.trace(cap)
        offloaded = cpu_offload and strategy not in ("none", "ddp")  # FSDP's CPU offload: the state is in host memory
        state = 0 if offloaded else at.breakdown["gradients"] + at.breakdown["optimizer_state"]
        samples = at.eval_samples
        evaluate = _worst([self.predictor.curve(config, device_type=device_type, precision=precision, train=False,
                                                plus=state, **sharding, **view) for view in views])
        # >= cap: no backward, no saved activations; at most the split (or cap when the split is smaller)
        eval_batch = cap if samples <= cap else max(cap, evaluate.largest_fitting(budget, samples))
        eval_peak = evaluate.at(eval_batch)
        eval_reason = (f"forward-only trace: predicted peak {_fmt(eval_peak)} at {eval_batch}, with the "
                       f"{_fmt(state)} of gradients and optimizer state that stay alive during evaluation")
        eval_reason += (f"; covers the whole evaluation split ({samples} samples) in one batch"
                        if eval_batch >= samples else f"; {eval_batch + 1} would not fit the budget")
        if "measured" in evaluate.trace(eval_batch).features:
            eval_reason = eval_reason.replace("forward-only trace: predicted peak", "forward only: peak", 1) + (
                "; measured by real steps, as the training step")
        return BatchChoice(max_micro=cap, reason=reason, eval_batch=eval_batch, eval_reason=eval_reason,
                           budget_bytes=budget, eval_peak_bytes=eval_peak, predict=train.prediction)

    def at_batch(self, *, config: Config, hardware: HardwareProfile, device_type: str, compile_mode: str | None,
                 precision: str, micro: int, eval_batch: int, strategy: str = "none", world_size: int = 1,
                 local_world_size: int | None = None, cpu_offload: bool = False,
                 tensor: int = 1, pipeline: tuple[int, str] | None = None,
                 grad_accum: int = 1, context: int = 1) -> tuple[dict, str | None]:
        """The plan's memory figures at a micro-batch chosen without this policy (MANUAL's CONFIG_BATCH_SIZE,
        the tier policy's table), and a warning where it is predicted not to fit: a batch the user fixed is
        theirs to keep, so it is said, never refused."""
        budget, budget_why = memory_budget(config, hardware, device_type)
        sharding = _sharding(strategy, world_size, local_world_size, cpu_offload, tensor, context)
        config, gathers = context_view(config, context, precision)
        views = with_terms(pipeline_views(config, pipeline, micro * grad_accum, strategy=strategy,
                                          precision=precision, tensor=tensor), gathers)
        train = _worst([self.predictor.curve(config, device_type=device_type, precision=precision,
                                             compile_mode=compile_mode, **sharding, **view) for view in views])
        at = train.prediction(micro)
        offloaded = cpu_offload and strategy not in ("none", "ddp")
        state = 0 if offloaded else at.trace.breakdown["gradients"] + at.trace.breakdown["optimizer_state"]
        evaluate = _worst([self.predictor.curve(config, device_type=device_type, precision=precision, train=False,
                                                plus=state, **sharding, **view) for view in views])
        eval_peak = evaluate.at(eval_batch)
        memory = dict(predicted_peak_bytes=at.peak_bytes, budget_bytes=budget, memory_breakdown=at.breakdown,
                      eval_predicted_peak_bytes=eval_peak)
        over = [f"{what} {n} is predicted to peak at {_fmt(peak)}" for what, n, peak in
                (("micro-batch", micro, at.peak_bytes), ("evaluation batch", eval_batch, eval_peak)) if peak > budget]
        if not over:
            return memory, None
        cap = train.largest_fitting(budget, micro)
        fits = f"micro-batch {cap} is predicted to fit" if cap else "not even micro-batch 1 is predicted to fit"
        return memory, (f"{' and '.join(over)}, over the budget {_fmt(budget)} ({budget_why}): it may run "
                        f"out of memory; {fits} (CONFIG_BATCH_SIZE, or AUTO to let the planner choose)")

    def _state_over(self, config: Config, floor: int, budget: int, budget_why: str, whole: Config,
                    device_type: str) -> NoFitError:
        """The refusal of a replica whose parameters, gradients and optimizer state alone exceed the budget:
        what helps is what shrinks those (neither checkpointing nor autocast does)."""
        helps = [*self._optimizer_helps(config), *self._size_helps(config)]
        if device_type == "cuda":
            helps.append("FSDP over several GPUs (CONFIG_PARALLEL_FSDP: each process holds a share of the state)")
        helps.append("a device with more free memory (stop other processes, or see 'make plan-matrix')")
        return NoFitError(f"{model_label(whole)} does not fit even at micro-batch 1: its parameters, gradients and "
                          f"optimizer state alone take {_fmt(floor)} but the budget is {_fmt(budget)} "
                          f"({budget_why})", helps)

    @staticmethod
    def _optimizer_helps(config: Config) -> list[str]:
        if config.optimizer in ("adam", "adamw"):
            return [f"SGD instead of {config.optimizer} (CONFIG_OPTIMIZER_SGD: one state tensor per parameter "
                    "instead of two)"]
        if config.optimizer == "custom":
            return [f"SGD instead of {config.optimizer_name} (CONFIG_OPTIMIZER_SGD: at most one state tensor "
                    "per parameter)"]
        return []

    @staticmethod
    def _size_helps(config: Config) -> list[str]:
        smaller = spec_for(config.model).smaller
        return ([smaller] if smaller else []) + (
            ["a larger share of memory (CONFIG_MEMORY_PROFILE_EXTREME)"]
            if (config.memory_profile or DEFAULT_SHARE) < LARGEST_SHARE else [])

    def _no_fit(self, config: Config, one: "Prediction", budget: int, budget_why: str, device_type: str,
                precision: str, sharding: dict, whole: Config | None = None) -> NoFitError:
        """`config`: what a process traces (its share of the context under CP); `whole`: the model as configured."""
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in one.breakdown.items() if v >= 2**20)
        label = model_label(whole or config)
        helps = []
        if precision == "fp32":
            bf16 = self.predictor.predict(config, batch=1, device_type=device_type, precision="bf16", **sharding)
            helps.append(f"bf16 autocast (CONFIG_PRECISION_BF16 or _AUTO on a bf16 GPU): {_fmt(bf16.peak_bytes)}")
        if not config.gradient_checkpointing and can_checkpoint(config):
            ckpt = self.predictor.predict(config, batch=1, device_type=device_type, precision=precision,
                                          gradient_checkpointing=True, **sharding)
            helps.append(f"gradient checkpointing (CONFIG_GRADIENT_CHECKPOINTING=y): {_fmt(ckpt.peak_bytes)}")
        elif config.gradient_checkpointing and config.recompute_policy not in (None, "full"):
            full = self.predictor.predict(dataclasses.replace(config, recompute_policy="full"), batch=1,
                                          device_type=device_type, precision=precision, **sharding)
            helps.append(f"full checkpointing (CONFIG_ACTIVATION_CHECKPOINT_FULL): {_fmt(full.peak_bytes)}")
        sharded_state = sum(one.breakdown.get(k, 0) for k in ("parameters", "gradients", "optimizer_state"))
        if (sharding and sharding["strategy"] == "fsdp" and spec_for(config.model).text
                and 2 * sharded_state <= one.peak_bytes):  # most of the peak is what more ranks do not shrink
            helps.append(("tensor parallelism (CONFIG_TP=2 or more: each process holds a share of every block's "
                          "activations)" if spec_for(config.model).tensor_parallel is not None else
                          "a model that tensor parallelism can split (Llama: CONFIG_TP)")
                         + ": FSDP shards the weights, not a sequence's activations, so more GPUs alone leave this "
                         "peak where it is")
        helps += [*self._optimizer_helps(config), *self._size_helps(config)]
        helps.append("a device with more free memory (stop other processes, or see 'make plan-matrix')")
        if sharding and "tensor" not in sharding:
            label += f" ({sharding['strategy']} over {sharding['world_size']} processes)"
        elif sharding:
            groups = sharding["world_size"]
            label += (f" (tensor-parallel over {sharding['tensor']} processes"
                      + (f", {sharding['strategy']} over {groups} such groups)" if sharding["strategy"] != "none"
                         else ")"))
        return NoFitError(f"{label} does not fit even at micro-batch 1: the predicted peak is "
                          f"{_fmt(one.peak_bytes)} ({parts}) but the budget is {_fmt(budget)} ({budget_why})", helps)


def pipeline_views(config: Config, pipeline: tuple[int, str] | None, share: int, *, strategy: str = "none",
                   precision: str = "fp32", tensor: int = 1) -> list[dict]:
    """The predictor's keywords for each process that bounds a pipeline's memory (lib/pipeline.py
    process_parts: its blocks and ends; process_terms: what it holds beyond one micro-batch, the share cut as
    Pipeline.step cuts it); [{}] without one: the whole model, one micro-batch."""
    if not pipeline or pipeline[0] == 1:
        return [{}]
    from ..parallel import is_sharded
    from ..pipeline import process_parts, process_terms

    degree, schedule = pipeline
    blocks, _, elements = spec_for(config.model).pipeline(config)
    # what a stage sends: the residual stream, float32 under autocast (the embedding's dtype), FSDP's
    # parameter dtype under its mixed precision; under TP each process's slice of the sequence
    sample_bytes = elements * (2 if is_sharded(strategy) and precision in ("bf16", "fp16") else 4) // tensor
    return [{"part": (first, last, held),
             "pipeline_terms": functools.partial(process_terms, schedule, degree, share, rank, sample_bytes)}
            for rank, first, last, held in process_parts(blocks, degree, schedule)]


def context_view(config: Config, context: int, precision: str) -> tuple[Config, Callable | None]:
    """(the config a process of a context-parallel group traces: its share of the context, what it holds
    beyond that trace: lib/context_parallel.py gather_terms); (config, None) without one."""
    if context == 1:
        return config, None
    from ..context_parallel import gather_terms

    support = spec_for(config.model).context_parallel
    tokens, _, kv_elements = support.shape(config)
    element = 2 if precision in ("bf16", "fp16") else 4  # the keys and values are the activations' dtype
    return support.local(config, context), gather_terms(context, tokens, kv_elements, element)


def with_terms(views: list[dict], terms: Callable | None) -> list[dict]:
    """`views` with `terms` held beside each one's own (a pipeline process's and a context-parallel one's)."""
    if terms is None:
        return views

    def merged(own: Callable | None) -> Callable:
        return terms if own is None else (lambda batch, activations: {**own(batch, activations),
                                                                      **terms(batch, activations)})

    return [{**view, "pipeline_terms": merged(view.get("pipeline_terms"))} for view in views]


class _Worst:
    """The larger of several processes' curves at every batch (a pipeline's first and last stage): what all
    of them fit. One curve is itself."""

    def __init__(self, curves: list) -> None:
        self.curves = curves
        self.deep = any(c.deep for c in curves)

    def prediction(self, batch: int):
        return max((c.prediction(batch) for c in self.curves), key=lambda p: p.peak_bytes)

    def trace(self, batch: int):
        return max(((c.at(batch), c.trace(batch)) for c in self.curves), key=lambda pair: pair[0])[1]

    def at(self, batch: int) -> int:
        return max(c.at(batch) for c in self.curves)

    def largest_fitting(self, budget: int, limit: int, **options) -> int:
        return min(c.largest_fitting(budget, limit, **options) for c in self.curves)


def _worst(curves: list):
    return curves[0] if len(curves) == 1 else _Worst(curves)


def _sharding(strategy: str, world_size: int, local_world_size: int | None, cpu_offload: bool,
              tensor: int, context: int = 1) -> dict:
    """The predictor's keywords for one process of the layout ({}: a replica, traced as one process). FSDP
    shards over the data-parallel groups and each one's context-parallel processes together."""
    if strategy == "none" and tensor == 1:
        return {}
    world_size *= context
    local_world_size = local_world_size * context if local_world_size else None
    layout = dict(strategy=strategy, world_size=world_size, local_world_size=local_world_size,
                  cpu_offload=cpu_offload)
    return {**layout, "tensor": tensor} if tensor > 1 else layout


PLANNER = PlannerPolicy()  # shared, so its in-process trace memo serves every resolve() of a process


def trace_in_process() -> None:
    """For a worker of a process pool that plans on every core (plan-matrix, randcheck): trace in the worker
    itself. The pool already takes the cores, so tracing children of its own (the two shallow depths of a deep
    model at once) would only add an interpreter's start-up; a sharded step still takes one child."""
    PLANNER.predictor.trace_processes = 1
