"""Model zoo: every model the trainer can build, by name.

Image models map (B, C, H, W) images to (B, num_classes) logits; GPT-2 and Llama map (B, T)
token ids to (B, T, vocab_size) logits. None computes a loss: the trainer does.
"""

from dataclasses import replace

import torch

from .gpt2 import GPT2, GPT2Config
from .llama import LLAMA_PRESETS, Llama, LlamaConfig
from .registry import BUILT_IN, MODELS, spec_for

MODEL_NAMES = BUILT_IN

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


def build_model(
    name: str,
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    image_size: int = 32,
    gpt2_preset: str = "124m",
    block_size: int = 1024,
    vocab_size: int = 50257,
    dropout: float = 0.0,
    grad_checkpointing: bool = False,
    llama_preset: "str | LlamaConfig" = "125m",
    tie_embeddings: bool = True,
    recompute=None,
    context_parallel: bool = False,
) -> torch.nn.Module:
    """Build a freshly initialised model. LeNet-5 is too small to need grad_checkpointing and ignores it.
    `dropout` is GPT-2's on its attention and residual paths, an image model's before its last Linear layer
    (none at 0); Llama has none. `llama_preset` names a preset, or is a LlamaConfig whose shape is taken.
    `recompute`: what a checkpointed GPT-2 or Llama block keeps (lib/models/checkpointing.py's Recompute).
    `context_parallel`: built to split its sequences (CONFIG_CP > 1; Llama's Attention.expand_kv).

    Build under `with torch.device("meta"):` to get shapes and counts without allocating memory.
    """
    spec = MODELS.get(name)
    if spec is None or spec.builder is None:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    gpt2_config = llama_config = None
    if name == "llama":
        if isinstance(llama_preset, LlamaConfig):  # a shape of its own (CONFIG_LLAMA_PRESET_CUSTOM)
            shape = llama_preset
        elif llama_preset in LLAMA_PRESETS:
            shape = LLAMA_PRESETS[llama_preset]
        else:
            raise ValueError(f"unknown llama preset {llama_preset!r}; choose one of {', '.join(LLAMA_PRESETS)}")
        llama_config = replace(shape, block_size=block_size, vocab_size=vocab_size, tie_embeddings=tie_embeddings)
    elif spec.data == "text":
        if gpt2_preset not in GPT2_PRESETS:
            choices = ", ".join(GPT2_PRESETS)
            raise ValueError(f"unknown gpt2 preset {gpt2_preset!r}; choose one of {choices}")
        gpt2_config = replace(GPT2_PRESETS[gpt2_preset], block_size=block_size, vocab_size=vocab_size,
                              dropout=dropout)
    return spec.builder(num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                        gpt2_config=gpt2_config, llama_config=llama_config, grad_checkpointing=grad_checkpointing,
                        dropout=dropout, recompute=recompute, context_parallel=context_parallel)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameter scalars; a tied weight counts once since parameters() yields each tensor once."""
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODEL_NAMES", "MODELS", "GPT2_PRESETS", "GPT2", "GPT2Config", "LLAMA_PRESETS", "Llama", "LlamaConfig", "build_model", "count_parameters", "spec_for"]
