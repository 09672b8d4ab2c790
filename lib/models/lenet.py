"""LeNet-5, modernised: ReLU and max-pooling instead of tanh and average pooling."""

import torch
from torch import nn


def _flat_side(image_size: int, padding: int) -> int:
    """Spatial side after conv5 -> pool2 -> conv5 -> pool2."""
    side = (image_size + 2 * padding - 4) // 2
    return (side - 4) // 2


class LeNet5(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 32,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if image_size < 28:
            raise ValueError(f"LeNet-5 needs image_size >= 28, got {image_size}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        # Padding 2 turns 28x28 MNIST into the 32x32 input the layout was designed for.
        padding = 2 if image_size == 28 else 0
        side = _flat_side(image_size, padding)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )
        # Dropout before the last Linear (CONFIG_DROPOUT), outside `classifier` so its layers keep their
        # indices (and a checkpoint its keys) at any rate; none at 0, where the model is the one it always was.
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout is None:
            return self.classifier(self.features(x))
        *hidden, last = self.classifier
        x = self.features(x)
        for layer in hidden:
            x = layer(x)
        return last(self.dropout(x))
