"""What one training step does, counted before running one: FLOPs, bytes moved and ops dispatched.

A micro-batch's forward (with the loss), its backward, and the optimizer step
(gradient clipping included) are run under FakeTensorMode, as the memory tracer
does (lib/memory/trace.py), with one dispatch mode that counts, per phase:

    flops           matmul, convolution and attention FLOPs (torch.utils.flop_counter's formulas,
                    plus the CPU flash-attention kernels it does not list)
    compute_bytes   bytes read and written by those FLOP-counted ops (inputs + outputs)
    memory_bytes    bytes read and written by every other op (elementwise, reductions, copies, the optimizer)
    ops             kernels dispatched (views and non-aten queries such as prim.device excluded): what
                    per-op launch or dispatch overhead multiplies
    conv_flops      the part of flops in convolutions, which reach a smaller share of a GPU's peak
    attention_flops the part of flops in fused attention (scaled_dot_product_*), with its own share of peak;
                    flops - conv_flops - attention_flops are the matmuls' (mm, bmm, addmm, baddbmm). Causal
                    attention counts the work a flash-attention kernel does (`causal_share`), not the full
                    square torch's formulas count
    conv_ops        the part of ops that are convolutions (forward or backward): on a CPU each costs far
                    more to set up than another op (device.py's conv_op_s)
    unaligned_flops the part of the matmuls' FLOPs in matmuls with a dimension that is not a whole number
                    of 16 bytes (GPT-2's 50,257-token head): a GPU's BLAS runs those with slower kernels
    matmul_operand_bytes  the bytes of the two operands of the aligned matmuls: what float8 training casts
                    (an amax and a cast of each operand, lib/float8.py), which the step-time model charges
    float8_excluded_flops, float8_excluded_operand_bytes  the part of the aligned matmuls (and of their
                    operands' bytes) in linear layers float8 leaves in the precision's matmuls: the output layer
                    and shared weights (lib/float8.py eligible), Llama's 128,256-row head among them

Counts are linear in the batch (a constant part from the weights, a part per
sample), so a step is counted at two batch sizes only (`COUNT_BATCHES`) and
`Counts.at(b)` interpolates. They are cached as JSON next to the memory traces,
keyed with lib.memory's fingerprint of the step (the model, precision,
optimizer, gradient checkpointing, device type, torch) and the code of the
models, the task, lib/step.py and this file (`counts_key`; `step_key` leaves
this file out, for what real steps measured).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config
from ..errors import KfitError
from ..fileio import cache_note, is_number
from ..memory import default_cache_dir, fingerprint
from ..memory.cache import traced_precision
from ..memory.depth import at_depth, depth_of, line, shallow_depths
from .cache import is_count, read_json, write_json

FORMAT = 9  # 2: conv_flops; prim.device no longer counted as an op moving its tensor; 3: attention_flops; 4: conv_ops;
# 5: unaligned_flops; 6: the loss's part apart; 7: not apart (kfit compiles the loss with the model); 8: causal
# attention at a flash-attention kernel's share (causal_share); 9: matmul_operand_bytes, float8_excluded_*
COUNT_BATCHES = (1, 2)
PHASES = ("forward", "backward", "optimizer")
FIELDS = ("flops", "compute_bytes", "memory_bytes", "ops", "conv_flops", "attention_flops", "conv_ops",
          "unaligned_flops", "matmul_operand_bytes", "float8_excluded_flops", "float8_excluded_operand_bytes")


@dataclass(frozen=True)
class Phase:
    """One phase of a step (forward, backward or optimizer) at one batch size."""

    flops: float = 0.0
    compute_bytes: float = 0.0
    memory_bytes: float = 0.0
    ops: float = 0.0
    conv_flops: float = 0.0
    attention_flops: float = 0.0
    conv_ops: float = 0.0
    unaligned_flops: float = 0.0
    matmul_operand_bytes: float = 0.0
    float8_excluded_flops: float = 0.0
    float8_excluded_operand_bytes: float = 0.0

    @property
    def matmul_flops(self) -> float:
        """The FLOPs of aligned plain matmuls: what is neither a convolution, nor fused attention, nor a
        matmul with an unaligned dimension."""
        return max(0.0, self.flops - self.conv_flops - self.attention_flops - self.unaligned_flops)

    @property
    def float8_flops(self) -> float:
        """The aligned matmuls' FLOPs float8 training runs in float8: all but its excluded layers'."""
        return max(0.0, self.matmul_flops - self.float8_excluded_flops)

    def __add__(self, other: "Phase") -> "Phase":
        return Phase(*(getattr(self, f) + getattr(other, f) for f in FIELDS))

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in FIELDS}


@dataclass(frozen=True)
class Counts:
    """A step's counts at COUNT_BATCHES, with what a plan needs to know about the data set."""

    phases: dict[int, dict[str, Phase]]  # batch -> phase -> counts
    parameters: int
    train_samples: int
    eval_samples: int

    def at(self, batch: float, phase: str) -> Phase:
        """The counts of `phase` at `batch`, on the line through the two counted batch sizes."""
        (b0, p0), (b1, p1) = sorted(self.phases.items())[:2]
        a, b = p0[phase], p1[phase]
        t = (batch - b0) / (b1 - b0)
        return Phase(*(max(0.0, getattr(a, f) + t * (getattr(b, f) - getattr(a, f))) for f in FIELDS))

    def micro_batch(self, batch: float) -> Phase:
        """Forward and backward of one micro-batch."""
        return self.at(batch, "forward") + self.at(batch, "backward")

    @classmethod
    def on_line(cls, shallow: "list[Counts]", layers: int, depths: tuple[int, int]) -> "Counts":
        """The counts of a transformer `layers` blocks deep from its counts at `depths` (depth.py's): each
        figure on the line through the two (a period of blocks does the same work wherever it is)."""
        a, b = shallow

        def phase(x: Phase, y: Phase) -> Phase:
            return Phase(**{f: max(0.0, line(getattr(x, f), getattr(y, f), layers, depths)) for f in FIELDS})

        phases = {batch: {name: phase(a.phases[batch][name], b.phases[batch][name]) for name in b.phases[batch]}
                  for batch in b.phases}
        return cls(phases=phases, parameters=round(line(a.parameters, b.parameters, layers, depths)),
                   train_samples=b.train_samples, eval_samples=b.eval_samples)

    def to_json(self) -> dict:
        return {"phases": {str(b): {k: v.to_json() for k, v in p.items()} for b, p in self.phases.items()},
                "parameters": self.parameters, "train_samples": self.train_samples,
                "eval_samples": self.eval_samples}

    @classmethod
    def from_json(cls, d: dict) -> "Counts":
        """The counts as to_json wrote them, every field checked: ValueError naming the first that is wrong."""
        phases = d.get("phases") if isinstance(d, dict) else None
        if not isinstance(phases, dict) or len(phases) < 2:
            raise ValueError("phases is not an object of at least two batch sizes")
        parsed: dict[int, dict[str, Phase]] = {}
        for batch, by_phase in phases.items():
            if not str(batch).isdigit() or int(batch) < 1 or not isinstance(by_phase, dict) \
                    or set(by_phase) != set(PHASES):
                raise ValueError(f"phases[{batch!r}] is not a batch size with {', '.join(PHASES)}")
            for name, fields in by_phase.items():
                if not isinstance(fields, dict) or set(fields) != set(FIELDS) or not all(
                        is_number(v) and v >= 0 for v in fields.values()):
                    raise ValueError(f"phases[{batch!r}][{name!r}] is not counts of {', '.join(FIELDS)}")
            parsed[int(batch)] = {k: Phase(**v) for k, v in by_phase.items()}
        for name in ("parameters", "train_samples", "eval_samples"):
            if not is_count(d.get(name), 0):
                raise ValueError(f"{name} is not a count")
        return cls(phases=parsed, parameters=d["parameters"], train_samples=d["train_samples"],
                   eval_samples=d["eval_samples"])


# --------------------------------------------------------------------------
# The counting dispatch mode


# Flash attention's tile of keys (FlashAttention-2 and torch's CUDA kernels: 64-128 per block; 128 on Hopper).
ATTENTION_TILE = 128


def causal_share(query_len: int, key_len: int) -> float:
    """The share of full attention's FLOPs a causal flash-attention kernel computes: the tiles under the
    diagonal, the diagonal's own tiles in full (masked inside), so half the square and half a tile row more:
    0.5625 at 1,024 tokens, 0.508 at 8,192. torch's formulas count the full square."""
    if query_len <= 1 or key_len <= 1:
        return 1.0
    return min(1.0, 0.5 + 0.5 * ATTENTION_TILE / max(query_len, key_len))


def _is_causal(func, args, kwargs) -> bool:
    """Whether a scaled_dot_product op (forward or backward) runs causally: its is_causal argument, by name."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "is_causal":
            value = kwargs.get("is_causal", args[i] if i < len(args) and not arg.kwarg_only else False)
            return bool(value)
    return False


def _attention_flops(name: str, args) -> int | None:
    """FLOPs of a scaled_dot_product kernel (CUDA's flash, efficient and cuDNN ones, the CPU's flash one that
    torch's flop registry does not list), forward or backward, by torch's formulas. Grouped-query attention
    (fewer key/value heads than query heads) counts as its kernels run it, each query head against its
    group's keys: the key/value shapes are given the query's heads. torch 2.11's formulas assert equal heads
    and stopped every Llama 3 step-time prediction on a GPU (validate-gpu, H200, 2026-11-27)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    if "_scaled_dot_product_" not in name:
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    backward = "backward" in name
    grad_out, (q, k, v) = (tensors[0] if backward else None), tensors[1:4] if backward else tensors[:3]
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return None
    heads = q.shape[1]
    key, value = (k.shape[0], heads, *k.shape[2:]), (v.shape[0], heads, *v.shape[2:])
    if backward:
        return sdpa_backward_flop_count(grad_out.shape, q.shape, key, value)
    return sdpa_flop_count(q.shape, key, value)


CONVOLUTIONS = (torch.ops.aten.convolution, torch.ops.aten.convolution_backward)
MATMULS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)
ALIGNMENT_BYTES = 16


def operands(args) -> tuple[torch.Tensor, torch.Tensor]:
    """A matmul's (M, K) and (K, N) operands: its last two tensor arguments (mm, bmm; addmm and baddbmm add
    to a first)."""
    a, b = [t for t in args if isinstance(t, torch.Tensor)][-2:]
    return a, b


def unaligned(args) -> bool:
    """Whether a matmul's (M, K) x (K, N) has a dimension that is not a whole number of ALIGNMENT_BYTES."""
    a, b = operands(args)
    step = max(1, ALIGNMENT_BYTES // a.element_size())
    return any(d % step for d in (a.shape[-2], a.shape[-1], b.shape[-1]))


class _Counter:
    """Accumulates Phase counts; `mode()` is the TorchDispatchMode that feeds it."""

    def __init__(self) -> None:
        self.totals = {f: 0.0 for f in FIELDS}
        self.backward = False  # past the forward: a forward now is a checkpointed block's recompute
        self._deferred: dict[str, float] = {}  # what the backward phase will do, known in the forward

    def take(self) -> Phase:
        phase, self.totals = Phase(**self.totals), {f: 0.0 for f in FIELDS}
        for name, value in self._deferred.items():
            self.totals[name] += value
        self._deferred = {}
        return phase

    def float8_excluded(self, model: torch.nn.Module, precision: str) -> list:
        """Forward hooks on the aligned linear layers float8 leaves out (lib/float8.py eligible): each adds its
        matmuls' FLOPs and operand bytes, forward now and backward (input and weight gradients) to the
        backward phase."""
        from ..float8 import eligible

        converted, step = eligible(model), max(1, ALIGNMENT_BYTES // (4 if precision == "fp32" else 2))
        counter = self

        def hook(module, inputs, output):
            k, n = module.in_features, module.out_features
            m, size = inputs[0].numel() // k, output.element_size()
            counter.totals["float8_excluded_flops"] += 2 * m * k * n
            counter.totals["float8_excluded_operand_bytes"] += (m * k + k * n) * size
            if not counter.backward:
                for name, value in (("float8_excluded_flops", 4 * m * k * n),
                                    ("float8_excluded_operand_bytes", (2 * m * n + n * k + k * m) * size)):
                    counter._deferred[name] = counter._deferred.get(name, 0.0) + value

        return [module.register_forward_hook(hook) for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and name not in converted
                and module.in_features % step == 0 and module.out_features % step == 0]

    def mode(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
        from torch.utils.flop_counter import flop_registry

        counter = self

        class CountMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if getattr(func, "is_view", False) or func.namespace != "aten":
                    return out  # views launch nothing; prim.device, profiler marks are queries, not kernels
                seen, moved = set(), 0
                for t in tree_flatten((args, kwargs, out))[0]:
                    if isinstance(t, torch.Tensor) and id(t) not in seen:
                        seen.add(id(t))
                        moved += t.numel() * t.element_size()
                packet = func.overloadpacket
                flops = _attention_flops(str(packet), args)
                if flops is None and packet in flop_registry:
                    flops = flop_registry[packet](*args, **kwargs, out_val=out)
                totals = counter.totals
                totals["ops"] += 1
                if packet in CONVOLUTIONS:
                    totals["conv_ops"] += 1
                if flops:
                    totals["flops"] += flops
                    totals["compute_bytes"] += moved
                    if packet in CONVOLUTIONS:
                        totals["conv_flops"] += flops
                    elif "scaled_dot_product" in str(packet) or "attention" in str(packet):
                        if _is_causal(func, args, kwargs):  # the kernel skips the tiles above the diagonal
                            q = next(t for t in args if isinstance(t, torch.Tensor))
                            share = causal_share(q.shape[-2], q.shape[-2])
                            totals["flops"] -= flops * (1 - share)
                            flops *= share
                        totals["attention_flops"] += flops
                    elif packet in MATMULS and unaligned(args):
                        totals["unaligned_flops"] += flops
                    elif packet in MATMULS:
                        totals["matmul_operand_bytes"] += sum(t.numel() * t.element_size() for t in operands(args))
                else:
                    totals["memory_bytes"] += moved
                return out

        return CountMode()


def counted(fn) -> Phase:
    """The counts of what `fn()` dispatches, run on real tensors (device.py's micro-benchmarks count theirs)."""
    counter = _Counter()
    with counter.mode():
        fn()
    return counter.take()


def count_step(task, config: Config, *, batch: int, precision: str, device_type: str,
               gradient_checkpointing: bool, real: bool = False) -> tuple[dict[str, Phase], int]:
    """The counts of one micro-batch's forward and backward and one optimizer step at `batch`.

    Under FakeTensorMode, as the memory tracer runs; `real`: on real CPU tensors instead (the model built and
    initialised, a real batch), for a model with an op that has no fake kernel (lib/memory/measured.py):
    the same counts, at the cost of running the step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..memory import step_optimizer
    from ..memory.autocast import TracedAutocast
    from ..memory.fake import fake_copy, fake_kernels

    x1, y1 = task.example_batch(1)
    with contextlib.nullcontext() if real else torch.device("meta"):
        model = task.build(gradient_checkpointing)
    parameters = sum(p.numel() for p in model.parameters())
    autocast = TracedAutocast(precision, device_type)  # fake tensors are CPU ones
    counter = _Counter()
    phases: dict[str, Phase] = {}
    with contextlib.nullcontext() if real else FakeTensorMode(), contextlib.nullcontext() if real else fake_kernels():
        model = model if real else fake_copy(model)
        model.train()
        optimizer = step_optimizer(config, model, device_type)
        if real:
            x, y = task.example_batch(batch)
        else:
            x = torch.empty((batch, *x1.shape[1:]), dtype=x1.dtype)
            y = torch.zeros((batch, *y1.shape[1:]), dtype=y1.dtype)
        hooks = counter.float8_excluded(model, precision)
        with counter.mode(), autocast.step():  # the casts reach a checkpointed recompute (TracedAutocast)
            with autocast:
                loss = task.loss(model(x), y)
            phases["forward"] = counter.take()
            counter.backward = True
            loss.backward()
            phases["backward"] = counter.take()
        for hook in hooks:
            hook.remove()
        optimizer.step()  # the first step creates the optimizer's state: count a steady-state one
        with counter.mode():
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=device_type == "cuda")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            phases["optimizer"] = counter.take()
    return phases, parameters


# --------------------------------------------------------------------------
# The cache


def task_for(config: Config):
    from ..memory import model_fingerprint
    from ..task import task_once

    return task_once(config, json.dumps(model_fingerprint(config), sort_keys=True))


@functools.lru_cache(maxsize=2)
def _code_hash(count_code: bool) -> str:
    """kfit's code that shapes a real step (the models, the task, lib/step.py), and this counter's too."""
    lib = Path(__file__).resolve().parent.parent
    files = [*sorted((lib / "models").glob("*.py")), lib / "step.py", lib / "task.py"]
    digest = hashlib.sha256()
    for path in files + ([Path(__file__)] if count_code else []):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def step_key(config: Config, *, device_type: str, precision: str, gradient_checkpointing: bool) -> str:
    """What a real step's time depends on, besides the machine: lib.memory's fingerprint of the step
    (model, precision, optimizer, checkpointing, device type, torch) with the model and step code in
    place of the memory tracer's, which changes no step."""
    _, contents = fingerprint(config, device_type=device_type, precision=precision,
                              gradient_checkpointing=gradient_checkpointing, train=True)
    contents = {**contents, "code": _code_hash(False), "precision": precision}  # a real fp16 step is not a bf16 one
    return hashlib.sha256(json.dumps(contents, sort_keys=True).encode()).hexdigest()[:24]


def counts_key(config: Config, *, device_type: str, precision: str, gradient_checkpointing: bool,
               scaled: tuple[int, ...] = ()) -> str:
    """The counts' cache key: the step's key and this counter's own code (and, `scaled`, the depths of the two
    shallow steps whose line the counts are on: lib/memory/depth.py)."""
    key = step_key(config, device_type=device_type, precision=traced_precision(precision, device_type),
                   gradient_checkpointing=gradient_checkpointing)  # counted alike where traced alike
    how = f":scaled{list(scaled)}" if scaled else ""
    return hashlib.sha256(f"{FORMAT}:{_code_hash(True)}:{key}{how}".encode()).hexdigest()[:24]


class StepCounter:
    """Counts steps through a JSON cache in <cache dir>/steptime; `counted` says how many ran."""

    def __init__(self, cache_dir: Path | str | None = None, *, full_depth: bool = False) -> None:
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._memo: dict[str, Counts] = {}
        self.counted = 0
        self.full_depth = full_depth  # count every block of a deep transformer (else lib/memory/depth.py's two)

    @property
    def cache_dir(self) -> Path:
        return (self._cache_dir or default_cache_dir()) / "steptime"

    def counts(self, config: Config, *, device_type: str, precision: str, gradient_checkpointing: bool,
               task=None) -> Counts:
        layers = None if self.full_depth else depth_of(config)
        depths = shallow_depths(config, False)
        key = counts_key(config, device_type=device_type, precision=precision,
                         gradient_checkpointing=gradient_checkpointing, scaled=depths if layers else ())
        if key in self._memo:
            return self._memo[key]
        path = self.cache_dir / f"counts-{key}.json"
        data = read_json(path)
        if data or path.is_file():  # {} from a file that is there: an empty object, checked (and noted) below
            try:
                self._memo[key] = Counts.from_json(data)
                return self._memo[key]
            except ValueError as err:
                cache_note(path, f"invalid ({err})", then="dropped; counted again")
        step = dict(precision=precision, device_type=device_type, gradient_checkpointing=gradient_checkpointing)
        if layers is not None:  # every count is affine in the depth: two shallow steps' on a line
            shallow = [self.counts(at_depth(config, d), **step) for d in depths]
            self._memo[key] = counts = Counts.on_line(shallow, layers, depths)
            write_json(path, counts.to_json())
            return counts
        task = task or task_for(config)
        phases, parameters = {}, 0
        try:
            for batch in COUNT_BATCHES:
                phases[batch], parameters = count_step(task, config, batch=batch, **step)
        except KfitError:
            raise
        except Exception:  # noqa: BLE001 - an op with no fake kernel: count a real step on the CPU instead
            for batch in COUNT_BATCHES:
                phases[batch], parameters = count_step(task, config, batch=batch, real=True, **step)
        self.counted += 1
        counts = Counts(phases=phases, parameters=parameters, train_samples=len(task.train),
                        eval_samples=len(task.eval))
        self._memo[key] = counts
        write_json(path, counts.to_json())
        return counts
