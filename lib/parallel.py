"""How several processes share a model: the data-parallel strategies and the one way kfit applies FSDP2.

    ddp            DistributedDataParallel: a full replica per process (lib/trainer/engine.py)
    fsdp           fully_shard: parameters, gradients, optimizer state sharded (ZeRO-3-like)
    fsdp_grad_op   fully_shard(reshard_after_forward=False): parameters stay gathered from
                   forward to the end of backward (ZeRO-2-like: one all-gather per micro-batch)
    hsdp           a 2-D mesh (machines x processes per machine): sharded within a machine,
                   replicated across machines

Tensor parallelism (CONFIG_TP) adds a last mesh dimension, "tp", of that many consecutive ranks: DTensor's
parallelize_module splits each block's matrix multiplies over it (`tensor_parallelize`, with the plan the
model itself states: `tensor_parallel_plan()`), and the strategy above applies over the rest of the mesh, the
data-parallel groups, as torchtitan composes them.

`shard_model` is used by both the trainer and the memory tracer
(lib/memory/sharded.py), so what is predicted is what runs: fully_shard on
every unit `shard_units` finds (transformer blocks, residual stages), then on
the root, which holds what is left (embeddings, the head).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

STRATEGIES = ("none", "ddp", "fsdp", "fsdp_grad_op", "hsdp")
SHARDED = ("fsdp", "fsdp_grad_op", "hsdp")

LABELS = {"none": "one process", "ddp": "DDP (a full replica per process)",
          "fsdp": "FSDP full shard (parameters, gradients and optimizer state sharded)",
          "fsdp_grad_op": "FSDP with parameters kept after forward (gradients and optimizer state sharded)",
          "hsdp": "HSDP (sharded within a machine, replicated across machines)"}

SYMBOLS = {"ddp": "CONFIG_PARALLEL_DDP", "fsdp": "CONFIG_PARALLEL_FSDP",
           "fsdp_grad_op": "CONFIG_PARALLEL_FSDP_GRAD_OP", "hsdp": "CONFIG_PARALLEL_HSDP"}


def is_sharded(strategy: str | None) -> bool:
    return strategy in SHARDED


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules fully_shard wraps one by one, in forward order: the items of every nn.ModuleList
    (GPT-2's blocks, the usual transformer layout, Hugging Face's included) or nn.ModuleDict of numbered
    blocks (a pipeline stage's, lib/pipeline.py); without any, the root's
    nn.Sequential children that hold parameters (a ResNet's stages). Each unit's parameters are
    gathered together, so a unit is the granularity of the all-gather buffer."""
    units = [item for module in model.modules() if _holds_blocks(module) for item in module.children()
             if any(True for _ in item.parameters())]
    if units:
        return units
    return [child for child in model.children()
            if isinstance(child, nn.Sequential) and any(True for _ in child.parameters())]


def _holds_blocks(module: nn.Module) -> bool:
    """An nn.ModuleList, or an nn.ModuleDict keyed by block numbers (what keep_stages leaves of one)."""
    return isinstance(module, nn.ModuleList) or (
        isinstance(module, nn.ModuleDict) and len(module) > 0 and all(k.isdigit() for k in module.keys()))


def mesh_shape(strategy: str, world_size: int, local_world_size: int, tensor: int = 1,
               pipeline: int = 1, context: int = 1) -> tuple[int, ...]:
    """The device mesh: 1-D over every process, or (replicas, shard) for HSDP; with `tensor` > 1 processes
    per tensor-parallel group, the data-parallel shape over world_size / tensor, then the group; with
    `context` > 1 processes per context-parallel group, that group before the tensor-parallel one (as
    torchtitan orders them); with `pipeline` > 1 stages, the stage first (its processes the farthest apart:
    across machines), then the shape of one stage's world_size / pipeline processes."""
    if pipeline > 1:
        rest = world_size // pipeline
        return (pipeline, *mesh_shape(strategy, rest, min(local_world_size, rest), tensor, context=context))
    if tensor > 1:
        return (*mesh_shape(strategy, world_size // tensor, max(1, local_world_size // tensor), context=context),
                tensor)
    if context > 1:
        return (*mesh_shape(strategy, world_size // context, max(1, local_world_size // context)), context)
    if strategy == "hsdp" and 1 < local_world_size < world_size and world_size % local_world_size == 0:
        return (world_size // local_world_size, local_world_size)
    if strategy == "hsdp":
        return (1, world_size)  # one machine: nothing to replicate across
    return (world_size,)


def make_mesh(device_type: str, strategy: str, world_size: int, local_world_size: int,
              tensor: int = 1, pipeline: int = 1, context: int = 1) -> "DeviceMesh":
    """The whole mesh: "pp" with `pipeline` > 1, dimensions "shard" (or "replicate", "shard" for HSDP), "cp"
    with `context` > 1, then "tp" with `tensor` > 1."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(strategy, world_size, local_world_size, tensor, pipeline, context)
    data = len(shape) - (tensor > 1) - (pipeline > 1) - (context > 1)
    names = ((("pp",) if pipeline > 1 else ()) + ("replicate", "shard")[2 - data:] + (("cp",) if context > 1 else ())
             + (("tp",) if tensor > 1 else ()))
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def data_mesh(mesh: "DeviceMesh") -> "DeviceMesh":
    """The part of `mesh` the data-parallel strategy shards and replicates over (all of it without "pp" and
    "tp"): with "cp", its shard dimension and the context-parallel one as one, "shard_cp" (FSDP shards over a
    context-parallel group too, and so reduces its gradients, as torchtitan's dp_shard_cp)."""
    names = mesh.mesh_dim_names or ()
    rest = tuple(n for n in names if n not in ("pp", "tp"))
    if "cp" in rest:
        try:
            mesh["shard_cp"]
        except (KeyError, RuntimeError, ValueError):  # not flattened yet (DeviceMesh has no public way)
            mesh[("shard", "cp")]._flatten("shard_cp")
        rest = tuple(n for n in rest if n not in ("shard", "cp")) + ("shard_cp",)
    if rest == names:
        return mesh
    return mesh[rest if len(rest) > 1 else rest[0]]


def tensor_parallelize(model: nn.Module, mesh: "DeviceMesh") -> nn.Module:
    """Split the model's matrix multiplies over the mesh's "tp" dimension (in place), with the plans the
    model states: `model.tensor_parallel_plan()` -> (each block's plan, the root's plan), parallelize_module's
    dictionaries of submodule name -> ParallelStyle. Before fully_shard, which then shards the DTensors over
    the data-parallel dimensions; before the optimizer and compile."""
    from torch.distributed.tensor.parallel import parallelize_module

    plans = getattr(model, "tensor_parallel_plan", None)
    if plans is None:
        raise ValueError(f"{type(model).__name__} states no tensor_parallel_plan(): it cannot be split with TP")
    block_plan, root_plan = plans()
    tp = mesh["tp"]
    _quiet_about_harmless_layouts()
    tied = _tied_parameters(model)
    for unit in shard_units(model):
        parallelize_module(unit, tp, block_plan)
    # a pipeline stage holds the root's parts it needs only (lib/pipeline.py keep_stages): the others' entries go
    root_plan = {name: style for name, style in root_plan.items() if getattr(model, name, None) is not None}
    parallelize_module(model, tp, root_plan)
    model.loss_parallel = bool(getattr(model, "tensor_parallel_loss", False))  # its logits stay split
    # between blocks each process holds 1 / degree of the sequence (a later pipeline stage receives that slice)
    model.sequence_shards = tp.size()
    for places in tied:  # each style replaced the shared parameter with its own DTensor: one again
        first_module, first_name = places[0]
        shared = getattr(first_module, first_name)
        for module, name in places[1:]:
            mine = getattr(module, name)
            if getattr(mine, "placements", None) != getattr(shared, "placements", None):
                raise ValueError(f"the tied parameters {first_name} and {name} are split differently by the "
                                 f"tensor-parallel plan ({getattr(shared, 'placements', None)} against "
                                 f"{getattr(mine, 'placements', None)}): they cannot stay one parameter")
            setattr(module, name, shared)
    return model


def loss_context(model: nn.Module):
    """Where the loss (and its backward) of `model`'s outputs must run: torch's loss_parallel where
    tensor_parallelize left the logits split over the vocabulary, else nowhere special."""
    import contextlib

    if not getattr(model, "loss_parallel", False):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor: under loss_parallel it is a replicated DTensor, the same on every process."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _quiet_about_harmless_layouts() -> None:
    """Two notices every rank of a tensor-parallel run printed once, about nothing that costs it: the output
    layer's logits come back from its redistribution as a view, which FSDP's root warns an in-place op could
    break (the loss never changes them), and the gradient norm's scalar crosses a 2-D mesh in two
    all-reduces."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _tied_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Every parameter held under more than one name (an output layer tied to the embedding): the (module,
    attribute) places of each."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            places.setdefault(id(parameter), []).append((module, name))
    return [where for where in places.values() if len(where) > 1]


def mixed_precision(precision: str):
    """FSDP2's policy for the plan's precision: parameters gathered in bf16/fp16, gradients reduced in
    fp32 (a sum of many low-precision gradients loses bits); None for fp32."""
    if precision == "fp32":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard_model(model: nn.Module, strategy: str, mesh: "DeviceMesh", *, precision: str = "fp32",
                cpu_offload: bool = False) -> nn.Module:
    """Apply fully_shard to each unit, then to the root (in place; returns the model). Must run before
    the optimizer is made: fully_shard replaces the parameters with sharded DTensors."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kwargs = {"mesh": data_mesh(mesh), "reshard_after_forward": strategy != "fsdp_grad_op"}
    policy = mixed_precision(precision)
    if policy is not None:
        kwargs["mp_policy"] = policy
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for unit in shard_units(model):
        fully_shard(unit, **kwargs)
    # The root's own parameters are used first (embeddings) and last (the head): keeping them gathered
    # after forward saves one all-gather, as torchtitan does.
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    return model
