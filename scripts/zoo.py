"""Models nobody in this project wrote: Hugging Face transformers families built from small configs
(no weights, no download), as custom-model factories (CONFIG_CUSTOM_MODEL_FACTORY="scripts.zoo:<name>").

make bench-memory measures kfit's predicted peak against real steps of each, and the test suite plans
each one (tests/test_zoo.py). Every family is one a user brings, at a size a CPU steps in seconds:

    llama        decoder LLM: grouped-query attention (8 heads, 2 key/value heads), rotary embeddings, SwiGLU
    mixtral      mixture of experts: 4 experts, top-2 routing (transformers' grouped-matmul experts)
    t5           encoder-decoder: a source of 48 tokens, a target of 16
    vit          vision transformer: 32x32 images in 4x4 patches, 10 classes
    convnext     convolutional (no attention): ConvNeXt stages on 32x32 images
    mamba        state-space (no attention): selective-scan blocks, torch's sequential path on a CPU

A model's output is its ModelOutput, whose .logits the loss reads, as a user's training script does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

VOCAB, SEQ = 1024, 64
SOURCE, TARGET = 48, 16  # t5: a row of the batch holds the source, then the decoder's input
IMAGE, CLASSES = 32, 10


def _lm_batch(n: int, generator: torch.Generator):
    """Next-token prediction on random tokens."""
    x = torch.randint(0, VOCAB, (n, SEQ), generator=generator)
    return x, torch.roll(x, -1, dims=1)


def _lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten())


def _image_batch(n: int, generator: torch.Generator):
    x = torch.randn((n, 3, IMAGE, IMAGE), generator=generator)
    return x, torch.randint(0, CLASSES, (n,), generator=generator)


def _image_loss(out, y):
    return F.cross_entropy(out.logits.float(), y)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=SEQ,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config), _lm_batch, _lm_loss


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=SEQ)
    return MixtralForCausalLM(config), _lm_batch, _lm_loss


class Seq2Seq(torch.nn.Module):
    """An encoder-decoder over one tensor of tokens per sample: the source, then the decoder's input
    (the target shifted right), as the factory's model takes one input."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(input_ids=tokens[:, :SOURCE], decoder_input_ids=tokens[:, SOURCE:])


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)

    def make_batch(n, generator):  # copy the source's first TARGET tokens, shifted right in the decoder
        source = torch.randint(1, VOCAB, (n, SOURCE), generator=generator)
        target = source[:, :TARGET]
        decoder_input = torch.cat([torch.zeros((n, 1), dtype=torch.long), target[:, :-1]], dim=1)
        return torch.cat([source, decoder_input], dim=1), target

    return Seq2Seq(T5ForConditionalGeneration(config)), make_batch, _lm_loss


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=IMAGE, patch_size=4, num_channels=3, hidden_size=128, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=256, num_labels=CLASSES,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(config), _image_batch, _image_loss


def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(num_channels=3, patch_size=2, hidden_sizes=[32, 64, 128], depths=[1, 1, 2],
                            num_labels=CLASSES, image_size=IMAGE, num_stages=3)
    return ConvNextForImageClassification(config), _image_batch, _image_loss


def mamba():
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2,
                         conv_kernel=4, use_mambapy=False)
    return MambaForCausalLM(config), _lm_batch, _lm_loss


FACTORIES = ("llama", "mixtral", "t5", "vit", "convnext", "mamba")
