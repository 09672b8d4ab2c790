"""The plan's types: what the resolver decides (Plan), what a batch policy answers (BatchChoice).

These are plain data. They import only the config and hardware types, so the
predictors, the batch policies, the resolver and the trainer can all import
them without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Protocol

from .config import Config
from .hardware import HardwareProfile
from .units import BatchSplit, batch_split


@dataclass(frozen=True)
class ModelDescription:
    """What the resolver needs to know about the model."""

    name: str  # lenet5 | resnet18 | resnet50 | gpt2
    preset: str | None = None  # GPT-2 size preset
    parameters: int | None = None

    @classmethod
    def from_config(cls, config: Config) -> "ModelDescription":
        from .models.registry import preset_of

        return cls(name=config.model, preset=preset_of(config))


@dataclass(frozen=True)
class Plan:
    """Every machine-dependent training choice, with the reason for each."""

    mode: str  # auto | manual
    policy: str  # the batch policy's name, "manual" in MANUAL mode
    device_type: str  # torch device type: cuda | mps | cpu (ROCm GPUs are "cuda" in torch)
    accelerator: str  # cuda | rocm | mps | cpu
    device_name: str
    world_size: int
    micro_batch: int
    grad_accum: int
    effective_batch: int
    target_effective_batch: int | None
    eval_batch: int
    compile: bool
    compile_mode: str | None
    precision: str  # bf16 | fp16 | fp32
    grad_scaler: bool
    tf32: bool
    cudnn_benchmark: bool
    gradient_checkpointing: bool
    num_workers: int
    cpu_threads: int  # intra-op threads per process (lib.threads)
    pin_memory: bool
    model: str
    reasons: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # How the processes share the model (lib/parallel.py): none | ddp | fsdp | fsdp_grad_op | hsdp
    strategy: str = "none"
    nodes: int = 1  # machines the processes span (HSDP shards within one)
    # FSDP: reduce-scatter gradients once per optimizer step ("step": the micro-batches before the last keep
    # whole unsharded gradients) or after every micro-batch ("micro_batch": less memory, more communication)
    gradient_sync: str = "step"
    cpu_offload: bool = False  # FSDP2's CPUOffloadPolicy (CUDA only)
    prefetch_factor: int = 0  # batches each loader worker prepares ahead (0: torch's default, 2; unused without workers)
    float8: str | None = None  # torchao's float8 recipe for the linear layers (lib/float8.py); None: off
    # processes per tensor-parallel group (CONFIG_TP): they split each block and see the same samples, so the
    # batch is shared by world_size / tensor_parallel data-parallel groups (`data_parallel`)
    tensor_parallel: int = 1
    # pipeline stages (CONFIG_PP, lib/pipeline.py): world_size / pipeline_parallel processes each, the same samples
    # flowing through them; the schedule (1F1B | Interleaved1F1B | GPipe) orders their micro-batches
    pipeline_parallel: int = 1
    pipeline_schedule: str = "1F1B"
    # processes per context-parallel group (CONFIG_CP, lib/context_parallel.py): each holds 1/CP of every
    # sample's tokens; they see the same samples, and FSDP shards over them and the data-parallel groups
    context_parallel: int = 1
    # The memory planner's prediction (None under the tier policy and in MANUAL mode).
    max_micro_batch: int | None = None  # the largest micro-batch that fits, before divisibility
    predicted_peak_bytes: int | None = None  # training step at micro_batch, device overheads included
    budget_bytes: int | None = None  # free memory x memory profile
    memory_breakdown: dict[str, int] | None = None  # category -> bytes at the peak; sums to the peak
    eval_predicted_peak_bytes: int | None = None
    # lib.steptime's prediction (None where the device's speed is unknown); reasons["step_time"] says how.
    predicted_step_seconds: float | None = None  # one optimizer step
    predicted_samples_per_second: float | None = None  # over all processes
    predicted_run_seconds: float | None = None  # the configured epochs / steps (time limit), evaluations included
    predicted_energy_kwh: float | None = None  # the device's power limit x the run's time
    predicted_mfu: float | None = None  # model FLOPs utilisation: counted FLOPs/s over the datasheet peak
    predicted_step_uncertainty: float | None = None  # the relative half-width of the interval around the step time
    # the runner-up splits of the same effective batch, fastest first: (micro-batch, accumulation, predicted step
    # seconds); a run whose first steps fall outside the interval times them and may switch (lib/trainer/trial.py)
    alternatives: tuple[tuple[int, int, float], ...] = ()

    @property
    def split(self) -> BatchSplit:
        """How a step's effective batch runs as micro-batches over the processes (lib.units.batch_split): its
        text() and compact() are what every line showing the micro-batch and accumulation prints."""
        unit = ("pipeline" if self.pipeline_parallel > 1 else "context-parallel group" if self.context_parallel > 1
                else "tensor-parallel group" if self.tensor_parallel > 1 else "process")
        return batch_split(self.effective_batch, self.micro_batch, self.data_parallel, unit)

    @property
    def data_parallel(self) -> int:
        """The data-parallel groups the effective batch is shared by: every process, but one per tensor-parallel
        group, context-parallel group and pipeline."""
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel * self.context_parallel)

    @property
    def local_data_parallel(self) -> int:
        """The data-parallel groups on one machine, as the strategies see them (HSDP shards within it)."""
        return local_groups(self.data_parallel, self.nodes, self.pipeline_parallel)

    @property
    def last_micro_batch(self) -> int:
        """The last micro-batch of each process's step: short where the micro-batch does not divide the share."""
        return self.split.last_micro_batch

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["alternatives"] = [list(a) for a in self.alternatives]  # as JSON has it: a checkpoint's plan equals plan.json's
        d["last_micro_batch"] = self.last_micro_batch  # beside micro_batch and grad_accum: they multiply with it
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        """The plan to_dict() wrote (plan.json, the launcher's plan for its ranks); a ValueError for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"a plan is a JSON object, not {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{**{k: v for k, v in data.items() if k in names}, "notes": tuple(data.get("notes", ())),
                          "alternatives": tuple(tuple(a) for a in data.get("alternatives", ()))})
        except TypeError as err:
            raise ValueError(f"not a plan: {err}") from None


@dataclass(frozen=True)
class BatchChoice:
    """What a batch policy decided, and (for the planner) what it predicted."""

    max_micro: int
    reason: str
    eval_batch: int
    eval_reason: str
    budget_bytes: int | None = None
    eval_peak_bytes: int | None = None
    # batch -> lib.memory.Prediction (the planner only), for the memory figures of the chosen micro-batch
    predict: Callable[[int], Any] | None = field(default=None, compare=False, repr=False)


def local_groups(groups: int, nodes: int, pipeline: int = 1) -> int:
    """Data-parallel groups on one machine: `groups` over the machines one pipeline stage spans (the stages are
    the outermost cut: with `pipeline` stages over `nodes` machines a stage spans nodes / pipeline of them, or
    part of one), at least one."""
    return max(1, groups // max(1, nodes // pipeline))


class BatchPolicy(Protocol):
    """How AUTO mode sizes the micro-batch: lib.planning.memory_policy.PlannerPolicy (default) or lib.planning.tiers.TierPolicy."""

    name: str

    def choose(self, *, config: Config, hardware: HardwareProfile, model: ModelDescription, device_type: str,
               compile: bool, compile_mode: str | None, precision: str, world_size: int,
               target: int, strategy: str = "none", local_world_size: int | None = None,
               cpu_offload: bool = False, tensor: int = 1, pipeline: tuple[int, str] | None = None,
               nodes: int = 1, context: int = 1) -> BatchChoice:
        """The largest micro-batch the device should run and the evaluation batch, with reasons; the
        memory is one process's under `strategy` (lib/parallel.py) over `world_size` processes (data-parallel
        groups of `tensor` processes each, under tensor parallelism; `pipeline`: (stages, schedule), a
        process holding its stages' blocks; `context` > 1: each group's processes split every sample's
        sequence, and a sharded strategy shards over them too)."""
