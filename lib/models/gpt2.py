"""GPT-2 (Radford et al. 2019): a pre-LayerNorm decoder-only transformer.

Module names follow the original checkpoints (transformer.wte, h.N.attn.c_attn, ...).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .checkpointing import Recompute, run_block


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50257
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


# Shape of each published GPT-2 size; block_size, vocab_size and dropout come from build_model.
GPT2_PRESETS: dict[str, GPT2Config] = {
    "tiny": GPT2Config(n_layer=4, n_head=4, n_embd=128),  # for CPU smoke runs
    "30m": GPT2Config(n_layer=6, n_head=6, n_embd=384),
    "51m": GPT2Config(n_layer=8, n_head=8, n_embd=512),
    "124m": GPT2Config(n_layer=12, n_head=12, n_embd=768),
    "355m": GPT2Config(n_layer=24, n_head=16, n_embd=1024),
    "774m": GPT2Config(n_layer=36, n_head=20, n_embd=1280),
    "1558m": GPT2Config(n_layer=48, n_head=25, n_embd=1600),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # the approximation GPT-2 was trained with
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config, grad_checkpointing: bool = False,
                 recompute: Recompute = Recompute()) -> None:
        super().__init__()
        self.config = config
        self.grad_checkpointing = grad_checkpointing
        self.recompute = recompute  # what a checkpointed block keeps (lib/models/checkpointing.py)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: input and output token embeddings share one matrix.
        self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # Every block adds two residual projections to the stream; scale them so its
        # variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            if self.grad_checkpointing and self.training:
                x = run_block(block, i, self.recompute, x)
            else:
                x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
