"""Which data-parallel strategy a plan uses (CONFIG_PARALLEL_*; the strategies are lib/parallel.py's).

One process shares nothing ("none"). A configured strategy is used as it is,
and when it does not fit the error says what would (FSDP, for DDP). AUTO keeps
DDP while a full replica fits with a micro-batch that is not starved (at least
MIN_MICRO_BATCH, or the whole per-process share): it communicates least.
Otherwise every sharded strategy the batch policy can fit is a candidate, and
the one with the most predicted samples/s wins (lib.steptime, collectives
included); without a step-time prediction, the first that fits in the order
below (the less communication, the earlier). The memory of each candidate is
the batch policy's per-process prediction for that strategy (lib.memory traces
the sharded step).
"""

from __future__ import annotations

import math
from typing import Callable

from ..config import Config
from ..errors import NoFitError, PlanError
from ..parallel import LABELS, SHARDED, SYMBOLS
from ..plan import BatchChoice, BatchPolicy
from .request import ChooseArgs

MIN_MICRO_BATCH = 8
AUTO_ORDER = ("ddp", "fsdp_grad_op", "fsdp", "hsdp")

# (strategy, choice) -> the fastest candidate's samples/s and the choose_fastest result, or None
Speed = Callable[[str, BatchChoice], "tuple[float, object] | None"]


def candidates(config: Config, world_size: int, nodes: int, tensor: int = 1,
               pipeline: int = 1, context: int = 1) -> tuple[tuple[str, ...], str]:
    """The strategies to consider over `world_size` data-parallel groups, in order, and why. Tensor-parallel
    groups (`tensor` > 1) and pipelines (`pipeline` > 1) hold DTensors or parts of the model, which only FSDP
    shards across them (decisions.decide_tensor_parallel and decide_pipeline refuse DDP); a context-parallel
    group's processes (`context` > 1) hold gradients of their own tokens, which FSDP reduces as it shards over
    them, even with one group."""
    configured = config.parallel_strategy or "auto"
    if world_size == 1 and context > 1:
        strategy = configured if configured in SHARDED else "fsdp"
        return (strategy,), (f"one data-parallel group: {LABELS[strategy]} over its {context} context-parallel "
                             "processes, which reduces the gradients of their tokens")
    if world_size == 1:
        why = (f"one pipeline of {pipeline} stages x {tensor} process(es): no other to share the batch with"
               if pipeline > 1 else
               f"one tensor-parallel group of {tensor} processes: no other to share the batch with" if tensor > 1
               else "one process: nothing to share")
        if configured in SHARDED:
            why += (f" ({SYMBOLS[configured]} applies with several; this run's checkpoints resume under it, "
                    "and it resumes theirs)")
        return ("none",), why
    if configured != "auto":
        why = f"{SYMBOLS[configured]} as configured"
        if configured == "hsdp" and nodes == 1:
            why += ": on one machine HSDP shards over every process, as FSDP full shard does"
        return (configured,), why
    options = tuple(s for s in AUTO_ORDER if (s != "hsdp" or nodes > 1)
                    and (s != "ddp" or tensor == pipeline == context == 1))
    return options, "AUTO" + (": FSDP across the pipelines (DDP cannot replicate a stage)" if pipeline > 1 else
                              ": FSDP across the tensor-parallel groups (DDP cannot replicate them)" if tensor > 1
                              else ": FSDP over the groups and their context-parallel processes" if context > 1
                              else "")


def pick(config: Config, policy: BatchPolicy, choose: ChooseArgs, *, world_size: int, nodes: int, target: int,
         speed: Speed, tensor: int = 1, pipeline: int = 1,
         context: int = 1) -> tuple[str, BatchChoice, object, str]:
    """(strategy, its batch choice, its choose_fastest result or None, why). Raises PlanError when no
    candidate fits."""
    options, why = candidates(config, world_size, nodes, tensor, pipeline, context)
    share = math.ceil(target / world_size)
    if len(options) == 1:
        strategy = options[0]
        try:
            choice = choose.choose(policy, config, strategy)
        except PlanError as err:
            if strategy != "ddp":
                raise
            hint = _sharded_hint(config, policy, choose)
            if isinstance(err, NoFitError):
                raise NoFitError(err.what, err.helps, err.hint + hint) from None
            raise PlanError(f"{err}{hint}") from None
        found = speed(strategy, choice)
        return strategy, choice, found[1] if found else None, why

    failures: list[str] = []
    fitted: list[tuple[str, BatchChoice, tuple | None]] = []
    no_fit = True  # every strategy refused for lack of memory: the out-of-memory ladder may help
    helps: tuple[str, ...] = ()  # what would help, said with the refusal of them all
    for strategy in options:
        try:
            choice = choose.choose(policy, config, strategy)
        except PlanError as err:
            no_fit = no_fit and isinstance(err, NoFitError)
            failures.append(f"{strategy}: {err.what if isinstance(err, NoFitError) else err}")
            if isinstance(err, NoFitError) and (not helps or strategy == "fsdp"):
                helps = err.helps  # the most sharded strategy's: what helps where sharding has done its part
            continue
        if strategy == "ddp" and choice.max_micro >= min(share, MIN_MICRO_BATCH):
            found = speed(strategy, choice)
            return "ddp", choice, found[1] if found else None, (
                f"AUTO: {LABELS['ddp']}: a replica fits with micro-batch up to {choice.max_micro}")
        if strategy == "ddp":
            failures.append(f"ddp: fits only micro-batch {choice.max_micro} (< {min(share, MIN_MICRO_BATCH)})")
        fitted.append((strategy, choice, speed(strategy, choice)))
    if not fitted:
        message = "no data-parallel strategy fits: " + "; ".join(failures)
        raise NoFitError(message, helps) if no_fit else PlanError(message)
    timed = [f for f in fitted if f[2] is not None]
    if timed:
        strategy, choice, found = max(timed, key=lambda f: f[2][0])
        rates = ", ".join(f"{s} {f[0]:,.1f} samples/s" for s, _, f in timed)
        how = f"the fastest predicted that fits ({rates})"
    else:
        strategy, choice, found = fitted[0]
        how = "the first that fits (step time not predicted)"
    return strategy, choice, found[1] if found else None, f"AUTO: {LABELS[strategy]}: {how}; " + "; ".join(failures)


def _sharded_hint(config: Config, policy: BatchPolicy, choose: ChooseArgs) -> str:
    """For a DDP plan that does not fit: whether FSDP full shard would, with its micro-batch."""
    try:
        choice = choose.choose(policy, config, "fsdp")
    except PlanError:
        return (f". Sharding with FSDP ({SYMBOLS['fsdp']}) does not fit at {choose.world_size} processes "
                "either")
    return (f". FSDP would fit: with {SYMBOLS['fsdp']} (or CONFIG_PARALLEL_AUTO) each of the "
            f"{choose.world_size} processes holds 1/{choose.world_size} of the parameters, gradients and "
            f"optimizer state, and micro-batches up to {choice.max_micro} fit ({choice.reason})")
