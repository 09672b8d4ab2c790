"""The per-process peak of a sharded (FSDP2) training step, traced in one process.

What is traced is trace.py's step (`training_steps`: two steps, the second
accumulating, then zero_grad; the optimizer of `step_optimizer`, foreach on
CUDA; autocast.py's TracedAutocast) on the model as `lib.parallel.shard_model` shards it for
the strategy (fsdp, fsdp_grad_op, hsdp) -- the function the trainer applies, so
what is traced is what runs. Everything is a fake tensor (no memory, no
arithmetic); the collectives go to torch's "fake" process group of the target
world size, whose all-gather and reduce-scatter return at once with the shapes
rank 0 would see. torch's FSDPMemTracker counts every storage, and names it:

    FSDPMemTracker        breakdown (trace.CATEGORIES)
    Sharded Param         parameters            this rank's shards (padded to equal sizes)
    Unsharded Param       unsharded_parameters  a unit's gathered parameters while it runs
    Buffer                buffers
    Sharded Grad          gradients             reduce-scattered, this rank's shards
    Unsharded Grad        unsharded_gradients   a unit's full gradients until reduce-scattered
    Activation, Temp      activations, temporaries
    All Gather,           communication         the all-gather output and the reduce-scatter
      Reduce Scatter                            input (a unit's full size each)
    OptState              optimizer_state       state, and the optimizer's temporaries
    Inputs                batch
    (kernel_workspace)    workspace             as in workspace.py: convolution scratch, CPU type
                                                promotion copies, cuDNN's workspace; on a CPU
                                                also gloo's copy inside an all-gather or a
                                                reduce-scatter (`collective_scratch`)

Trace.parameters is the whole model's parameter count, not a shard's.

Measured by make bench-memory (torch 2.13, gloo on a 2-core CPU, 2 processes
under torchrun, each measuring its own RSS growth): GPT-2 tiny fsdp at
micro-batch 8/16/32 and fsdp_grad_op at 8/32, GPT-2 124M (64 tokens) fsdp at
1/4, fp32: -0.36% to +0.13% of the largest rank's peak. The 124M steps peak
inside an all-gather: without gloo's scratch copy they were 3.4% under.
On an H100 (make validate-gpu's fsdp check, torch 2.11, NCCL, one process):
GPT-2 124M bf16 fsdp at 8/16, fsdp_grad_op, CPU offload and fp32, +1.6% to
+5.1% of max_memory_reserved, once the trace made CUDA's float32 autocast
casts (autocast.py; -5.8% to -10.1% before); in the two runs of 2026-11-26,
-2.5% to -0.2%, and gpt2-tiny bf16 at 128 +7.3% (its traced step allocated
363.3 MiB, 363.4 measured), once the check took off the cuBLAS workspaces
its process already held.

Two corrections to FSDPMemTracker under fake tensors:
  * DTensor works out an op's output metadata by running the op on fake tensors
    of the GLOBAL shapes (ShardingPropagator._propagate_tensor_meta_non_cached),
    in the fake mode it finds active. In a real run that is a throwaway fake mode
    and costs nothing; here it is the trace's own mode, so the tracker counted
    those global-shaped tensors as memory. Only the optimizer step, the gradient
    clipping and the state's creation run DTensor ops (forward and backward run
    on the gathered plain tensors), so the error is there and grows with foreach:
    one foreach op holds the global-shaped copies of whole lists of parameters.
    Measured, GPT-2 124M preset (86M parameters with the byte vocabulary) at 2
    processes, AdamW foreach (CUDA's): 1475 MiB "OptState" at the peak against
    328 MiB of real state. With propagation left out the optimizer step peaks at
    328 MiB + 164 MiB, one list of shard-sized temporaries (exp_avg_sq's square
    root), which is what CUDA's foreach AdamW holds; per-tensor (the CPU's) at
    328 + 13.5 MiB, the largest shard's. The tracker ignores what runs inside
    that propagation.
  * Its per-module statistics (walked after every op) are not kept, as in trace.py.

CPU offload (FSDP2's CPUOffloadPolicy, CUDA only) cannot be traced as such on a
CPU (the policy pins host memory), and need not be: the step is the same, but
the sharded parameters, sharded gradients and the optimizer's state and scratch
live in host memory. For cpu_offload the tracker picks the moment with the most
bytes left on the device (everything but those three) -- Trace.peak_bytes is
then the total at that moment, not the largest total -- and the predictor
subtracts the three as the named term "cpu_offload" (predict.py). An estimate:
the transient device copies of one unit's shards (before its all-gather, after
its reduce-scatter) are not counted.

The trace runs in a child process (sharded_process.py: `ShardedTracer`).
"""

from __future__ import annotations

import contextlib
import time

import torch

from ..config import Config
from .fake import fake_copy, fake_kernels, model_features
from .trace import SegmentPeaks, Trace, evaluation_pass, step_optimizer, training_steps
from .workspace import kernel_workspace

# FSDPMemTracker's categories (_FSDPRefType values) -> ours.
FSDP_CATEGORIES = {"Sharded Param": "parameters", "Unsharded Param": "unsharded_parameters", "Buffer": "buffers",
                   "Sharded Grad": "gradients", "Unsharded Grad": "unsharded_gradients",
                   "Activation": "activations", "Temp": "temporaries", "All Gather": "communication",
                   "Reduce Scatter": "communication", "OptState": "optimizer_state", "Inputs": "batch",
                   "Workspace": "workspace",
                   # MemTracker's, for a tensor-parallel step with no FSDP (one data-parallel group)
                   "Parameter": "parameters", "Gradient": "gradients", "Optstate": "optimizer_state"}
BREAKDOWN = tuple(dict.fromkeys(FSDP_CATEGORIES.values()))
OFFLOADED = ("Sharded Param", "Sharded Grad", "OptState")  # in host memory under CPUOffloadPolicy
OFFLOADED_CATEGORIES = tuple(FSDP_CATEGORIES[k] for k in OFFLOADED)  # predict.py's "cpu_offload" term


# --------------------------------------------------------------------------
# The trace (in the process that holds the fake process group)


def _fake_group(world_size: int) -> None:
    """Make the default process group torch's fake one of `world_size` (replacing an earlier fake one)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise RuntimeError("this process holds a real process group: trace sharded steps in a child process "
                               "(ShardedTracer)")
        if dist.get_world_size() == world_size:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())


def collective_scratch(func, args, device_type: str) -> int:
    """What a collective allocates inside itself: on a CPU, gloo's all_gather_into_tensor gathers into a
    flat copy of its output and its reduce_scatter_tensor reduces a copy of its input (measured with
    torch.profiler, torch 2.13: the full tensor's bytes, freed when it returns). NCCL works in place."""
    if device_type != "cpu":
        return 0
    c10d = torch.ops.c10d
    if func is c10d._allgather_base_.default:
        return args[0].numel() * args[0].element_size()
    if func is c10d._reduce_scatter_base_.default:
        return args[1].numel() * args[1].element_size()
    # DTensor's (tensor parallelism's) functional collectives reach the same gloo calls: an all-gather's
    # output (input x group size), a reduce-scatter's input
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and func is functional.all_gather_into_tensor.default:
        return args[0].numel() * args[0].element_size() * args[1]
    if functional is not None and func is functional.reduce_scatter_tensor.default:
        return args[0].numel() * args[0].element_size()
    return 0


def _tracker(model, optimizer, device_type: str, offload: bool):
    """FSDPMemTracker keeping only the step's peak (of device-resident bytes when `offload`), with kernel
    workspaces counted as in trace._peak_tracker and DTensor's sharding propagation left out (docstring)."""
    from torch._guards import active_fake_mode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    fsdp = isinstance(model, FSDPModule)  # else tensor-parallel DTensors only: torch's plain MemTracker

    class ShardedPeakTracker(FSDPMemTracker if fsdp else MemTracker):
        propagating = 0

        if not fsdp:
            def track_inputs(self, inputs) -> None:  # FSDPMemTracker's "Inputs": here the batch counts as "Other"
                pass

        def _resident(self, snap) -> int:
            if not offload:
                return snap["Total"]
            return snap["Total"] - sum(v for k, v in snap.items() if getattr(k, "value", None) in OFFLOADED)

        def _keep(self, dev, snap, extra: int = 0) -> None:
            if self._peak_mem.get(dev, 0) < self._resident(snap) + extra:
                self._peak_mem[dev] = self._resident(snap) + extra
                self._peak_mem_snap[dev] = ({**snap, "Workspace": extra, "Total": snap["Total"] + extra}
                                            if extra else dict(snap))

        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                self._keep(dev, snap)

        def __enter__(self):
            if self._depth == 0:  # torch 2.13's MemTracker keeps this itself; 2.11's does not
                self.entry_fake_mode = active_fake_mode()
            super().__enter__()
            if self._depth == 1 and offload:  # the starting point, counted as the device holds it
                self._peak_mem, self._peak_mem_snap = {}, {}
                self._update_peak_stats(None)
            return self

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.propagating:  # global-shaped fakes of DTensor's metadata propagation: no memory in a real run
                return func(*args, **(kwargs or {}))
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or active_fake_mode() is not self.entry_fake_mode:
                return out
            extra = kernel_workspace(func, args, out, device_type) + collective_scratch(func, args, device_type)
            if extra:  # inputs and outputs are live while the kernel's scratch is
                for dev, snap in self._curr_mem_snap.items():
                    self._keep(dev, snap, extra)
            return out

    if fsdp:
        return ShardedPeakTracker(model, optimizer)
    tracker = ShardedPeakTracker()
    tracker.track_external(model, *([optimizer] if optimizer is not None else []))
    return tracker


@contextlib.contextmanager
def _propagation_untracked(tracker):
    """Tell the tracker while DTensor propagates an op's metadata on global-shaped fakes (docstring)."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        original = ShardingPropagator._propagate_tensor_meta_non_cached
    except (ImportError, AttributeError):  # another torch: the optimizer's figure is then inflated
        yield
        return

    def propagate(self, op_schema):
        tracker.propagating += 1
        try:
            return original(self, op_schema)
        finally:
            tracker.propagating -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextlib.contextmanager
def _meshes_made_outside_fake_mode():
    """fully_shard of a tensor-parallel model joins the data-parallel and tensor-parallel meshes into one
    (DeviceMesh._concatenate); the new mesh indexes its ranks with real integer tensors, which the trace's
    fake mode refuses. Made outside it, as they are in a real run: no memory of the step's."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__init__

    def init(self, *args, **kwargs):
        with unset_fake_temporarily():
            original(self, *args, **kwargs)

    DeviceMesh.__init__ = init
    try:
        yield
    finally:
        DeviceMesh.__init__ = original


def trace_sharded_step(task, config: Config, *, batch: int, precision: str, device_type: str,
                       gradient_checkpointing: bool, strategy: str, world_size: int, local_world_size: int,
                       cpu_offload: bool = False, train: bool = True, tensor: int = 1,
                       part: tuple[bool, bool] | None = None) -> Trace:
    """Rank 0's peak for one sharded step (or, with train=False, one evaluation forward) at `batch`.
    world_size and local_world_size count the data-parallel groups; `tensor` > 1: each a tensor-parallel
    group of that many processes (lib.parallel.tensor_parallelize), the strategy applied across the groups
    (none: one group).

    Needs the default process group to be free or fake: run it through ShardedTracer from a process
    that may hold a real one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..parallel import is_sharded, make_mesh, shard_model, tensor_parallelize
    from .autocast import TracedAutocast

    if not is_sharded(strategy) and tensor == 1:
        raise ValueError(f"{strategy!r} is not a sharded strategy")
    start = time.perf_counter()
    x1, y1 = task.example_batch(1)
    with torch.device("meta"):  # as trace_step: the built-in models initialise nothing here
        model = task.build(gradient_checkpointing and train)
    features = model_features(model)
    loss_fn = task.loss
    if part is not None:  # one pipeline process's blocks (trace.trace_step's `part`)
        from ..pipeline import traced_part

        model, x1, loss_fn = traced_part(model, *part, x1, loss_fn)
    parameters = sum(p.numel() for p in model.parameters())  # the whole model's (the process's part's)
    autocast = TracedAutocast(precision, device_type)
    _fake_group(world_size * tensor)
    # outside FakeTensorMode: it runs collectives
    mesh = make_mesh("cpu", strategy, world_size * tensor, local_world_size * tensor, tensor)
    with FakeTensorMode(), fake_kernels(), _meshes_made_outside_fake_mode():
        model = fake_copy(model)
        if tensor > 1:
            model = tensor_parallelize(model, mesh)
        if is_sharded(strategy) and world_size > 1:
            model = shard_model(model, strategy, mesh, precision=precision)
        optimizer = step_optimizer(config, model, device_type) if train else None
        tracker = _tracker(model, optimizer, device_type, cpu_offload)

        # a later pipeline stage under TP receives the previous stage's activations as they left it: this
        # process's slice of the sequence (the residual stream between blocks is sequence-parallel)
        received = part is not None and not part[0] and tensor > 1

        def batch_tensors():  # made inside the tracker: the batch is on the device during the step
            shape = (batch, x1.shape[1] // tensor, *x1.shape[2:]) if received else (batch, *x1.shape[1:])
            x, y = torch.empty(shape, dtype=x1.dtype), torch.zeros((batch, *y1.shape[1:]), dtype=y1.dtype)
            tracker.track_inputs((x, y))
            return x, y

        segments = SegmentPeaks(tracker, model)
        with _propagation_untracked(tracker):
            if train:
                with tracker:
                    x, y = batch_tensors()
                    training_steps(model, optimizer, loss_fn, x, y, autocast=autocast,
                                   grad_clip=config.grad_clip, foreach=device_type == "cuda",
                                   before_each=tracker.reset_mod_stats, segment_end=segments.end,
                                   forward_end=segments.forward_end)
            else:
                model.eval()
                with tracker, torch.no_grad(), autocast:
                    evaluation_pass(model, task, *batch_tensors(), loss_fn=loss_fn)
                    segments.end()
        segments.close()

    def breakdown_of(snap: dict) -> tuple[int, dict[str, int]]:
        breakdown = {name: 0 for name in BREAKDOWN}
        for k, v in snap.items():
            name = getattr(k, "value", k)
            if name in FSDP_CATEGORIES:
                breakdown[FSDP_CATEGORIES[name]] += int(v)
        return int(snap.get("Total", 0)), breakdown

    total, breakdown = breakdown_of(segments.highest())
    return Trace(batch=batch, peak_bytes=total, breakdown=breakdown, parameters=parameters,
                 features=features, eval_samples=len(task.eval), seconds=time.perf_counter() - start,
                 segments=tuple(dict(zip(("peak_bytes", "breakdown"), breakdown_of(snap)))
                                for _, snap in segments.peaks), forward_segment=segments.forward_index,
                 autograd_nodes=segments.autograd_nodes)
