"""A Llama-style decoder (Touvron et al. 2023; the Llama 3 / Qwen 2 layout): what people pre-train today.

Pre-norm blocks with RMSNorm (torch.nn.RMSNorm), rotary position embeddings (no learned positions),
grouped-query attention through scaled_dot_product_attention (`enable_gqa`: n_kv_head key/value heads
shared by n_head query heads, repeated in memory only under context parallelism: Attention.expand_kv), a
SwiGLU MLP, no biases anywhere, and the
output layer optionally tied to the token embedding. The blocks are an nn.ModuleList (`layers`), so
lib/parallel.py's FSDP2 shards them one by one; `grad_checkpointing` recomputes each block in backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .checkpointing import Recompute, run_block


@dataclass(frozen=True)
class LlamaConfig:
    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 4
    hidden_dim: int = 2048  # SwiGLU width (about 8/3 dim, rounded)
    block_size: int = 1024
    vocab_size: int = 32000
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.dim % self.n_head:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if (self.dim // self.n_head) % 2:
            raise ValueError(f"the head width {self.dim // self.n_head} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


def rotary(T: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (T, head_dim / 2) in float32, of the rotation each position applies to each pair."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def tensor_parallel_problem(config: LlamaConfig, degree: int, block_size: int) -> str | None:
    """Why `degree` processes cannot split this Llama with Llama.tensor_parallel_plan(), or None: each takes
    whole query and key/value heads, an equal slice of the hidden units, and of the sequence between blocks."""
    for what, count in (("key/value heads", config.n_kv_head), ("attention heads", config.n_head),
                        ("MLP hidden units", config.hidden_dim), ("tokens of context (CONFIG_LLAMA_BLOCK_SIZE)",
                                                                   block_size)):
        if count % degree:
            return f"its {count} {what} do not divide into {degree} equal parts"
    return None


def tensor_parallel_traffic(config: LlamaConfig, block_size: int, checkpointed: bool) -> int:
    """The activation elements per sample that Llama.tensor_parallel_plan()'s collectives carry in one
    micro-batch: in each block's forward an all-gather of the sequence before the attention and before the
    MLP and a reduce-scatter after each (4 x context x dim), the same in backward, and again in a recomputed
    forward; the embedding's reduce-scatter and the final norm's all-gather (and their backward). The logits
    stay split (the loss reduces a few numbers per token). Each collective's full size: a ring moves
    (N - 1) / N of it through every process's link."""
    stream = block_size * config.dim
    per_block = (4 + 4 + (4 if checkpointed else 0)) * stream
    return config.n_layer * per_block + 4 * stream


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position: the halves (x1, x2) of each head as Llama's rotate_half pairs them."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class Attention(nn.Module):
    # under context parallelism (Llama.context_parallel_positions): the key/value heads expanded to the query
    # heads' count before the attention, as torchtitan's Llama does, so that torch's ring runs on any of its
    # CUDA kernels (grouped-query attention is not every kernel's), for gathers of that many heads
    expand_kv = False

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.q_proj = nn.Linear(config.dim, config.n_head * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_head * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_head * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_head * config.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.expand_kv and k.size(1) != q.size(1):
            k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1))
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # The rotation in the residual stream's dtype, whoever cast (or did not cast) it on the way in: FSDP2's
        # bf16 policy casts a block's float inputs before forward, but torch 2.11 skips that hook when a
        # checkpointed block is recomputed in backward, so the recompute saw float32 tables where forward saw
        # bf16 ones and torch.utils.checkpoint refused the step (an H200, 2026-11-27). The same cast either way.
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig, grad_checkpointing: bool = False,
                 recompute: Recompute = Recompute(), expand_kv: bool = False) -> None:
        super().__init__()
        self.config = config
        self.grad_checkpointing = grad_checkpointing
        self.recompute = recompute  # what a checkpointed block keeps (lib/models/checkpointing.py)
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        if expand_kv:
            self._expand_kv()
        # the residual projections, scaled down with depth as in GPT-2 so the stream's variance stays put
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def tensor_parallel_plan() -> tuple[dict, dict]:
        """(each block's plan, the root's) for DTensor's parallelize_module (lib/parallel.py), as Megatron-LM
        and torchtitan split a Llama: q/k/v and gate/up column-wise (each process computes whole heads and a
        slice of the hidden units), o and down row-wise (their partial sums reduce-scattered back to a
        sequence shard), the norms sequence-parallel (each process normalises its slice of the tokens), the
        embedding row-wise over the vocabulary and the output layer column-wise, its logits left split over the
        vocabulary for the loss. The residual stream between blocks stays sharded along the sequence."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                       SequenceParallel)

        block = {
            "attn_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                       desired_input_layouts=(Replicate(), None, None)),
            "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp_norm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        }
        root = {
            "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            # the logits stay split over the vocabulary: the loss runs under loss_parallel (tensor_parallel_loss)
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        }
        return block, root

    # the split logits' cross-entropy is computed where they lie (torch's loss_parallel): no process ever holds
    # a micro-batch's whole logits and their gradient in fp32, which at 128k tokens of vocabulary is most of a
    # large model's temporaries
    tensor_parallel_loss = True

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # the rotary tables a context-parallel step's tokens rotate by (None: computed for the tokens given)
    positions: tuple[torch.Tensor, torch.Tensor] | None = None

    def context_parallel_positions(self, tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole context's rotary tables (tokens, head width / 2), held as this model's positions: under
        context parallelism (lib/context_parallel.py) they are sharded along the sequence with the tokens, so
        each process's chunks rotate by their places in the whole; and the attention expands its key/value
        heads (Attention.expand_kv)."""
        self._expand_kv()
        self.positions = rotary(tokens, self.config.head_dim, self.config.rope_theta, device)
        return self.positions

    def _expand_kv(self) -> None:
        for module in self.modules():
            if isinstance(module, Attention):
                module.expand_kv = True

    # what lib/pipeline.py cuts into stages: the first stage's embedding, the blocks, the last stage's head
    pipeline_parts = ("embed", "layers", ("norm", "lm_head"))

    def pipeline_activation(self, idx: torch.Tensor) -> torch.Tensor:
        """Zeros shaped as the activations one stage sends the next for token ids `idx` (the residual stream)."""
        return torch.zeros(*idx.shape, self.config.dim)

    def forward(self, idx: torch.Tensor, stage: int | None = None) -> torch.Tensor:
        """The logits of token ids `idx`; under pipeline parallelism (lib/pipeline.py keep_stages) one of this
        process's stages: from the token ids on the first stage, else from the previous stage's activations,
        to the logits on the last stage, else to the activations the next one takes."""
        stages = getattr(self, "pipeline_stages", None)
        if stage is not None:
            first, blocks, last = stages[stage]
        elif stages:  # a cut model run whole (the memory tracer's step of one process): all its stages in turn
            first, blocks, last = any(s[0] for s in stages.values()), None, any(s[2] for s in stages.values())
        else:
            first, blocks, last = True, None, True
        # a later pipeline stage under TP receives its slice of the sequence: the rotation is the whole one's
        T = idx.size(1) * (1 if first else getattr(self, "sequence_shards", 1))
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        cos, sin = self.positions or rotary(T, self.config.head_dim, self.config.rope_theta, idx.device)
        x = self.embed(idx) if first else idx
        layers = self.layers.items() if isinstance(self.layers, nn.ModuleDict) else enumerate(self.layers)
        for i, block in layers:
            i = int(i)
            if blocks is not None and i not in blocks:
                continue
            if self.grad_checkpointing and self.training:
                x = run_block(block, i, self.recompute, x, cos, sin)
            else:
                x = block(x, cos, sin)
        return self.lm_head(self.norm(x)) if last else x


# The family's sizes; block_size, vocab_size and tie_embeddings come from build_model. The small presets'
# parameters with a 32,000-token vocabulary, tied: about 5M (tiny), 19M, 63M, 125M and 335M. From 1b on they are
# the published Llama 3 shapes (Meta's model cards and params.json: Llama 3.2 1B and 3B, Llama 3.1 8B, 70B and
# 405B), with 128,256 tokens: 1.24B and 3.21B tied, 8.03B, 70.6B and 405.9B untied.
LLAMA_PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(dim=128, n_layer=4, n_head=4, n_kv_head=2, hidden_dim=384),  # CPU smoke runs
    "20m": LlamaConfig(dim=320, n_layer=8, n_head=8, n_kv_head=4, hidden_dim=864),
    "60m": LlamaConfig(dim=512, n_layer=16, n_head=8, n_kv_head=4, hidden_dim=1408),
    "125m": LlamaConfig(dim=768, n_layer=16, n_head=12, n_kv_head=4, hidden_dim=2048),
    "350m": LlamaConfig(dim=1024, n_layer=24, n_head=16, n_kv_head=8, hidden_dim=3072),
    "1b": LlamaConfig(dim=2048, n_layer=16, n_head=32, n_kv_head=8, hidden_dim=8192, rope_theta=500000.0),
    "3b": LlamaConfig(dim=3072, n_layer=28, n_head=24, n_kv_head=8, hidden_dim=8192, rope_theta=500000.0),
    "8b": LlamaConfig(dim=4096, n_layer=32, n_head=32, n_kv_head=8, hidden_dim=14336, rope_theta=500000.0),
    "70b": LlamaConfig(dim=8192, n_layer=80, n_head=64, n_kv_head=8, hidden_dim=28672, rope_theta=500000.0),
    "405b": LlamaConfig(dim=16384, n_layer=126, n_head=128, n_kv_head=8, hidden_dim=53248, rope_theta=500000.0),
}
LLAMA3_VOCAB = 128256  # the Llama 3 tokenizer's tokens (tiktoken-based, 128,000 + 256 special)
