"""An example custom model for CONFIG_MODEL_CUSTOM: torch.nn.Transformer on a toy sequence task.

Select it with CONFIG_MODEL_CUSTOM=y and
CONFIG_CUSTOM_MODEL_FACTORY="scripts.custom_model_example:build" (the default),
or copy this file next to your project and point the factory at it.

The task: each sequence holds random tokens; the target at each position is the
token that came `LAG` positions earlier, which a transformer learns quickly.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, WIDTH, LAG = 32, 32, 64, 3


class SequenceTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Embedding(SEQ, WIDTH)
        self.transformer = nn.Transformer(d_model=WIDTH, nhead=4, num_encoder_layers=2, num_decoder_layers=1,
                                          dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position.weight
        return self.head(self.transformer(h, h))


def make_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=generator)
    targets = torch.roll(tokens, LAG, dims=1)
    targets[:, :LAG] = -100  # nothing to copy yet: ignored by the loss
    return tokens, targets


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def build():
    return SequenceTransformer(), make_batch, loss_fn
