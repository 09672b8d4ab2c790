"""Factories (CONFIG_CUSTOM_MODEL_FACTORY="tests.checkpoint_freeze_models:<name>") for the tests of gradient
checkpointing on any model and of CONFIG_FREEZE: Hugging Face models from small configs (no weights), plain
PyTorch models with and without repeated blocks, and an encoder-decoder to freeze half of."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, CONTEXT = 256, 32


def tokens(batch_size: int, generator: torch.Generator):
    """Random token sequences and their next tokens, as a causal language model trains."""
    seq = torch.randint(0, VOCAB, (batch_size, CONTEXT + 1), generator=generator)
    return seq[:, :-1], seq[:, 1:]


def lm_loss(outputs, targets):
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def hf_llama():
    """transformers' LlamaForCausalLM (grouped-query attention, rotary embeddings), 2 small layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         use_cache=False, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config), tokens, lm_loss


def hf_gpt2():
    """transformers' GPT2LMHeadModel, 2 small layers (tied embeddings)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config), tokens, lm_loss


class Block(nn.Module):
    """A pre-norm residual MLP block: what a ModuleList of identical layers holds."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    """Embedding, a ModuleList of identical blocks, a head: no checkpointing switch of its own."""

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def blocks():
    torch.manual_seed(0)
    return Stack(), tokens, lm_loss


def features(batch_size: int, generator: torch.Generator):
    x = torch.randn(batch_size, 32, generator=generator)
    return x, (x[:, :8].sum(dim=1) > 0).long()


def mlp():
    """Leaves only: nothing to checkpoint."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)), features, F.cross_entropy


class EncoderDecoder(nn.Module):
    """An encoder to freeze and a decoder to train. The encoder's output is what the decoder's first layer
    saves for its own gradient either way, so freezing the encoder changes no saved activation: its gradients
    and optimizer state go, and the gradient of its output, which backward no longer computes."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 512))
        self.decoder = nn.Sequential(nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def encoder_decoder():
    torch.manual_seed(0)
    return EncoderDecoder(), features, F.cross_entropy


def middle():
    """Layer "2" sits between trainable ones: frozen, backward still runs through it (to layer "0"), and the
    ReLUs save the activations either way, so only its gradient and optimizer state go."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 2))
    return model, features, F.cross_entropy
