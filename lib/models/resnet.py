"""ResNet-18 and ResNet-50 (He et al. 2015), stride on the 3x3 conv of the bottleneck (v1.5)."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

# Up to this size the ImageNet stem's 4x downsampling would throw away most of the image.
CIFAR_STEM_MAX_SIZE = 64


def _conv_bn(in_ch: int, out_ch: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_ch),
    )


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return _conv_bn(in_ch, out_ch, 1, stride)


class _Residual(nn.Module):
    """relu(branch(x) + shortcut(x)); subclasses build the branch and shortcut."""

    expansion: int  # output channels / width
    branch: nn.Sequential
    shortcut: nn.Module

    def last_bn(self) -> nn.BatchNorm2d:
        return self.branch[-1][1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


class BasicBlock(_Residual):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        self.branch = nn.Sequential(
            _conv_bn(in_ch, width, 3, stride),
            nn.ReLU(inplace=True),
            _conv_bn(width, width, 3),
        )
        self.shortcut = _shortcut(in_ch, width, stride)


class Bottleneck(_Residual):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.branch = nn.Sequential(
            _conv_bn(in_ch, width, 1),
            nn.ReLU(inplace=True),
            _conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            _conv_bn(width, out_ch, 1),
        )
        self.shortcut = _shortcut(in_ch, out_ch, stride)


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[_Residual],
        depths: list[int],
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: int = 32,
        grad_checkpointing: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.grad_checkpointing = grad_checkpointing
        if image_size <= CIFAR_STEM_MAX_SIZE:
            self.stem = nn.Sequential(_conv_bn(in_channels, 64, 3), nn.ReLU(inplace=True))
        else:
            self.stem = nn.Sequential(
                _conv_bn(in_channels, 64, 7, stride=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        self.stages = nn.ModuleList()
        in_ch = 64
        for i, depth in enumerate(depths):
            width = 64 * 2**i
            blocks = []
            for j in range(depth):
                # The first block of every stage but the first halves the resolution.
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(block(in_ch, width, stride))
                in_ch = width * block.expansion
            self.stages.append(nn.Sequential(*blocks))
        self.pool = nn.AdaptiveAvgPool2d(1)
        # Dropout before fc (CONFIG_DROPOUT), as torchvision's and timm's heads place it; none at 0. It holds
        # no state, so a checkpoint's keys are the same at any rate.
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.fc = nn.Linear(in_ch, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # Each residual block starts as its shortcut alone (near-identity), so a deep
        # net trains like a shallow one early on.
        for stage in self.stages:
            for blk in stage:
                nn.init.zeros_(blk.last_bn().weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            # Recompute activations in backward; BatchNorm running stats get one extra
            # update per step from the recompute, the usual accepted cost of this trade.
            if self.grad_checkpointing and self.training:
                x = checkpoint(stage, x, use_reentrant=False)
            else:
                x = stage(x)
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x if self.dropout is None else self.dropout(x))


def resnet18(num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
             grad_checkpointing: bool = False, dropout: float = 0.0) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, in_channels, image_size, grad_checkpointing, dropout)


def resnet50(num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
             grad_checkpointing: bool = False, dropout: float = 0.0) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, in_channels, image_size, grad_checkpointing, dropout)
