"""What several processes add to a step: the collectives of each data-parallel strategy, over the links.

Ring collectives move (n - 1) / n of the data through each process's link per
all-gather or reduce-scatter, twice that per all-reduce. Per optimizer step:

    ddp            all-reduce of the gradients (fp32) once, after the last micro-batch:
                   kfit's out-of-memory-safe step sums them in one flat buffer after all
                   ranks agreed (lib/distributed.py), so nothing overlaps it
    fsdp           per micro-batch an all-gather of the parameters for forward and again
                   for backward (reshard after forward), the gradients reduce-scattered
                   in the last backward
    fsdp_grad_op   one all-gather per micro-batch (parameters kept until backward ends)
    hsdp           fsdp within a machine, then an all-reduce of each shard's gradients
                   across the machines over the network

Tensor parallelism (CONFIG_TP, `tensor` processes per group, always within one machine):
each micro-batch's forward and backward gather and reduce-scatter the activations
between the split layers (the family's TensorParallel.traffic, elements per
sample); the next layer needs them, so none of it overlaps compute. The data-parallel
collectives above then run over the groups (world_size counts groups), each
process gathering its tensor-parallel share of the parameters.

Context parallelism (CONFIG_CP, `context` processes per group, within one machine):
each block's attention all-gathers the group's keys and values, in forward and again
in backward (and in a recomputed forward), and passes their float32 gradients round
the group (lib/context_parallel.py traffic_bytes); the attention waits for the gather,
so none of it overlaps compute. The FSDP collectives then shard over the groups and
their context-parallel processes together (world_size counts them all).

FSDP prefetches the next unit's parameters while the current one computes, so
a micro-batch takes max(compute, its collectives): only what the compute
cannot hide is added. Achieved bus bandwidth is BUS_EFFICIENCY of the link's
one-direction figure (lib/hardware/catalog.py): NCCL's own tests reach about
80% on NVLink and PCIe. Not measured by kfit yet (no multi-GPU machine here);
on a CPU (gloo) the links are unknown and nothing is added.
"""

from __future__ import annotations

from dataclasses import dataclass

BUS_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Communication:
    strategy: str  # ddp | fsdp | fsdp_grad_op | hsdp
    world_size: int
    shard_size: int  # processes a parameter is sharded over (hsdp: those of one machine)
    parameter_bytes: int  # all parameters in the dtype they are gathered in
    gradient_bytes: int  # all gradients in the dtype they are reduced in
    link_bytes_per_s: float  # within a machine, one direction
    network_bytes_per_s: float | None = None  # between machines; None on one machine
    reduce_every_micro_batch: bool = False  # FSDP with plan.gradient_sync "micro_batch"
    tensor: int = 1  # processes per tensor-parallel group
    tensor_bytes_per_sample: float = 0.0  # what its collectives carry per sample in a micro-batch
    pipeline: int = 1  # pipeline stages (CONFIG_PP)
    pipeline_bytes_per_sample: float = 0.0  # what a stage sends the next per sample (and the gradient back)
    pipeline_bytes_per_s: float = 0.0  # the link between stages: the network where they are on other machines
    context: int = 1  # processes per context-parallel group
    context_bytes_per_sample: float = 0.0  # what its ring collectives carry per sample in a micro-batch

    def pipeline_seconds(self, samples: float) -> float:
        """One send of a micro-batch of `samples`' activations (or their gradient) to the next stage."""
        if self.pipeline == 1 or not self.pipeline_bytes_per_s:
            return 0.0
        return self.pipeline_bytes_per_sample * samples / (self.pipeline_bytes_per_s * BUS_EFFICIENCY)

    def tensor_seconds(self, samples: float) -> float:
        """The tensor-parallel collectives of a micro-batch of `samples`, within the machine."""
        return self._seconds(self.tensor_bytes_per_sample * samples, self.tensor, self.link_bytes_per_s)

    def context_seconds(self, samples: float) -> float:
        """The context-parallel ring collectives of a micro-batch of `samples`, within the machine."""
        return self._seconds(self.context_bytes_per_sample * samples, self.context, self.link_bytes_per_s)

    def _seconds(self, volume: float, over: int, bandwidth: float) -> float:
        return (over - 1) / over * volume / (bandwidth * BUS_EFFICIENCY) if over > 1 else 0.0

    @property
    def _bandwidth(self) -> float:
        """The slowest link a ring over all processes crosses: the network once it spans machines."""
        if self.network_bytes_per_s and self.strategy != "hsdp":
            return min(self.link_bytes_per_s, self.network_bytes_per_s)
        return self.link_bytes_per_s

    def gather_seconds(self) -> float:
        """All-gathers of one micro-batch (forward, and backward after resharding)."""
        if self.strategy in ("ddp", "none"):
            return 0.0
        times = 1 if self.strategy == "fsdp_grad_op" else 2
        return times * self._seconds(self.parameter_bytes, self.shard_size, self._bandwidth)

    def reduce_seconds(self) -> float:
        """The gradients' reduction, once per optimizer step."""
        if self.strategy == "none":
            return 0.0
        if self.strategy == "ddp":
            return 2 * self._seconds(self.gradient_bytes, self.world_size, self._bandwidth)
        seconds = self._seconds(self.gradient_bytes, self.shard_size, self._bandwidth)
        replicas = self.world_size // self.shard_size
        if self.strategy == "hsdp" and replicas > 1:
            across = self.network_bytes_per_s or self.link_bytes_per_s
            seconds += 2 * self._seconds(self.gradient_bytes / self.shard_size, replicas, across)
        return seconds

    def exposed_seconds(self, micro_seconds: list[float], sizes: list[int] | None = None) -> float:
        """What a step's collectives add to its micro-batches' compute (`micro_seconds`, in order, of `sizes`
        samples each: the tensor- and context-parallel collectives, all exposed)."""
        tensor = sum(self.tensor_seconds(s) + self.context_seconds(s) for s in sizes or ())
        if self.strategy == "ddp":
            return self.reduce_seconds() + tensor
        gather, exposed = self.gather_seconds(), tensor
        for i, compute in enumerate(micro_seconds):
            reduces = self.reduce_every_micro_batch or i == len(micro_seconds) - 1
            collectives = gather + (self.reduce_seconds() if reduces else 0.0)
            exposed += max(0.0, collectives - compute)
        return exposed

    def describe(self) -> str:
        link, network = self.link_bytes_per_s / 1e9, (self.network_bytes_per_s or 0) / 1e9
        if not self.network_bytes_per_s:
            links = f"at {BUS_EFFICIENCY:.0%} of {link:.0f} GB/s"
        elif self.strategy == "hsdp":
            links = (f"sharded within a machine at {BUS_EFFICIENCY:.0%} of {link:.0f} GB/s, gradients all-reduced "
                     f"across machines at {BUS_EFFICIENCY:.0%} of {network:.0f} GB/s (the network)")
        else:
            links = (f"at {BUS_EFFICIENCY:.0%} of {self._bandwidth / 1e9:.0f} GB/s: a ring over every process crosses "
                     f"the network between machines ({network:.0f} GB/s; {link:.0f} GB/s within one)")
        tensor = (f"tensor parallelism over {self.tensor} processes: {self.tensor_seconds(1) * 1e3:.2f} ms of "
                  f"activation collectives per sample at {BUS_EFFICIENCY:.0%} of {link:.0f} GB/s"
                  if self.tensor > 1 else "")
        if self.context > 1:
            ring = (f"context parallelism over {self.context} processes: {self.context_seconds(1) * 1e3:.2f} ms of "
                    f"key/value collectives per sample at {BUS_EFFICIENCY:.0%} of {link:.0f} GB/s")
            tensor = f"{tensor}; {ring}" if tensor else ring
        if self.pipeline > 1:
            where = ("the link within a machine" if self.pipeline_bytes_per_s == self.link_bytes_per_s
                     else f"the network ({self.pipeline_bytes_per_s / 1e9:.0f} GB/s)")
            sends = (f"{self.pipeline} pipeline stages: {self.pipeline_seconds(1) * 1e3:.3f} ms a sample per send "
                     f"to the next stage over {where}")
            tensor = f"{tensor}; {sends}" if tensor else sends
        if self.strategy == "none":
            return tensor
        return (f"{self.strategy} over {self.world_size} {'groups' if self.tensor > 1 else 'processes'}: "
                f"{self.gather_seconds() * 1e3:.1f} ms of all-gathers per micro-batch, "
                f"{self.reduce_seconds() * 1e3:.1f} ms of gradient reduction per step, {links}"
                + (f"; {tensor}" if tensor else ""))


def communication_for(strategy: str, *, world_size: int, local_world_size: int, parameters: int,
                      precision: str, device_name: str, device_kind: str,
                      network_gbps: float | None = None, link_gbps: float | None = None, tensor: int = 1,
                      tensor_elements_per_sample: int = 0, pipeline: int = 1, pipeline_elements_per_sample: int = 0,
                      pipeline_across_machines: bool = False, context: int = 1,
                      context_bytes_per_sample: int = 0) -> Communication | None:
    """The strategy's collectives on this device's links; None for one process, or where the links are
    unknown (a CPU, a GPU the catalog does not know). `network_gbps`: the network between machines per GPU
    (CONFIG_NET_GBPS), else the catalog's; never more than the GPU's own link. `link_gbps`: the GPU's link
    within a machine where a HW= profile states it (GPUSpeed.link_gbs), else the catalog's. `tensor` > 1:
    world sizes count tensor-parallel groups of that many processes, whose collectives carry
    `tensor_elements_per_sample` activation elements per sample in a micro-batch. `pipeline` > 1: stages
    that send `pipeline_elements_per_sample` to the next per sample, between machines where
    `pipeline_across_machines` (the stages are the mesh's outermost dimension); `parameters` then are one
    stage's. `context` > 1: world sizes count every process of the context-parallel groups (FSDP shards over
    them), whose ring collectives carry `context_bytes_per_sample` per sample in a micro-batch."""
    if (world_size <= 1 or strategy == "none") and tensor == 1 and pipeline == 1 or device_kind != "gpu":
        return None
    from ..hardware import catalog

    link = link_gbps * 1e9 if link_gbps else catalog.link_bytes_per_s(device_name)
    if link is None:
        return None
    nodes = max(1, world_size // max(1, local_world_size))
    network = None
    if nodes > 1 or pipeline_across_machines:
        network = min(link, network_gbps * 1e9) if network_gbps else \
            catalog.link_bytes_per_s(device_name, across_machines=True)
    shard = local_world_size if strategy == "hsdp" and nodes > 1 else world_size
    gathered = 2 if precision in ("bf16", "fp16") else 4  # lib.parallel.mixed_precision
    share = parameters // tensor  # a process gathers and reduces its tensor-parallel share only
    return Communication(strategy=strategy if world_size > 1 else "none", world_size=world_size, shard_size=shard,
                         parameter_bytes=share * gathered, gradient_bytes=share * 4,
                         link_bytes_per_s=link, network_bytes_per_s=network if nodes > 1 else None, tensor=tensor,
                         tensor_bytes_per_sample=float(tensor_elements_per_sample * gathered), pipeline=pipeline,
                         pipeline_bytes_per_sample=float(pipeline_elements_per_sample * gathered),
                         pipeline_bytes_per_s=(network if pipeline_across_machines and network else link),
                         context=context, context_bytes_per_sample=float(context_bytes_per_sample))
