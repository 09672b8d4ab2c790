"""Model zoo: every model the trainer can build, by name.

Image models map (B, C, H, W) images to (B, num_classes) logits; GPT-2 and Llama map (B, T)
token ids to (B, T, vocab_size) logits. None computes a loss: the trainer does.
"""

import torch

from .gpt2 import GPT2, GPT2_PRESETS, GPT2Config
from .llama import LLAMA_PRESETS, Llama, LlamaConfig
from .registry import BUILT_IN, MODELS, spec_for

MODEL_NAMES = BUILT_IN


def build_model(name: str, **arguments) -> torch.nn.Module:
    """Build a freshly initialised model: the family's builder (lib/models/registry.py) called with its own
    keywords, the ones its `build_args` makes from a config and its data (an image model's num_classes,
    in_channels, image_size, dropout; GPT-2's gpt2_preset, block_size, vocab_size, dropout, recompute; Llama's
    llama_preset, a preset's name or a LlamaConfig, block_size, vocab_size, tie_embeddings, recompute,
    context_parallel), and grad_checkpointing. A keyword the family does not take is ignored.

    Build under `with torch.device("meta"):` to get shapes and counts without allocating memory.
    """
    spec = MODELS.get(name)
    if spec is None or spec.builder is None:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    return spec.builder(**arguments)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameter scalars; a tied weight counts once since parameters() yields each tensor once."""
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODEL_NAMES", "MODELS", "GPT2_PRESETS", "GPT2", "GPT2Config", "LLAMA_PRESETS", "Llama", "LlamaConfig", "build_model", "count_parameters", "spec_for"]
