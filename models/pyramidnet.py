"""PyramidNet for CIFAR, as in Han, Kim & Kim, "Deep Pyramidal Residual Networks" (CVPR 2017).

The width grows by alpha / N after every one of the N residual blocks (additive widening), from 16
channels to 16 + alpha: PyramidNet-110 alpha=270 has 18 basic blocks a stage and ends at 286
channels. A block has a BatchNorm first and last and no ReLU after the addition; its shortcut is
the identity, zero-padded to the new width (with 2x2 average pooling where a stage halves the
resolution), so that every parameter sits on the residual branch. It imports only torch: copy it.

    model = PyramidNet(depth=110, alpha=270, num_classes=10)   # 28.5 M parameters
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """BN - conv3x3 - BN - ReLU - conv3x3 - BN, plus the padded identity."""
    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(out)))
        return shortcut_added(self.bn3(out), x, self.stride)


class Bottleneck(nn.Module):
    """BN - conv1x1 - BN - ReLU - conv3x3 - BN - ReLU - conv1x1 (4x the width) - BN, plus the
    padded identity."""
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn4 = nn.BatchNorm2d(width * 4)
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(out)))
        out = self.conv3(F.relu(self.bn3(out)))
        return shortcut_added(self.bn4(out), x, self.stride)


def shortcut_added(residual: torch.Tensor, x: torch.Tensor, stride: int) -> torch.Tensor:
    """The block's output: its residual plus the identity, 2x2-average-pooled where the block
    downsamples and zero-padded to the residual's channels."""
    if stride != 1:
        x = F.avg_pool2d(x, kernel_size=2, stride=2, ceil_mode=True)
    return residual + F.pad(x, (0, 0, 0, 0, 0, residual.shape[1] - x.shape[1]))


BLOCKS = {"basic": (BasicBlock, 6), "bottleneck": (Bottleneck, 9)}  # layers a block: 6n+2, 9n+2


class PyramidNet(nn.Module):
    def __init__(self, depth: int = 110, alpha: float = 270, block: str = "basic",
                 num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"block must be basic or bottleneck, not {block!r}")
        block_class, layers = BLOCKS[block]
        blocks_per_stage, remainder = divmod(depth - 2, layers)
        if remainder or blocks_per_stage < 1:
            raise ValueError(f"depth {depth} does not suit {block} blocks: give {layers}n+2 "
                             f"({layers + 2}, {2 * layers + 2}, ...)")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a positive widening factor (48, 270...), not {alpha}")
        step = alpha / (3 * blocks_per_stage)  # the width every block adds
        width, channels = 16.0, 16
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        stages = []
        for stage in range(3):
            blocks = []
            for index in range(blocks_per_stage):
                width += step
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(block_class(channels, int(round(width)), stride))
                channels = int(round(width)) * block_class.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.bn_final = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():  # He (fan-out) convolutions, BatchNorm the identity
            if isinstance(module, nn.Conv2d):
                fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
                nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.conv1(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = F.relu(self.bn_final(x))
        return self.fc(x.mean((2, 3)))  # global average pooling (deterministic on CUDA too)
