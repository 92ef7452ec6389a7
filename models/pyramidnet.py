"""PyramidNet for CIFAR, as in Han, Kim & Kim, "Deep Pyramidal Residual Networks" (CVPR 2017).

The width grows by alpha / N after every one of the N residual blocks (additive widening), from 16
channels to 16 + alpha; PyramidNet-110 alpha=270 has 18 basic blocks per stage and ends at 286
channels. Blocks have no ReLU after the addition, a BatchNorm first and last, and an identity
shortcut zero-padded to the new width (with 2x2 average pooling where a stage halves the
resolution), so every parameter sits on the residual branch.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.aligned import AlignedBatchNorm2d, AlignedConv2d, PaddedStorage


def stored(channels: int, align: int | None) -> int:
    """How many channels an activation of `channels` is stored at: rounded up to a multiple of
    `align` (0, 1 or None: as it is)."""
    return -(-channels // align) * align if align and align > 1 else channels


def conv(in_channels: int, out_channels: int, kernel_size: int, align: int | None, stride: int = 1,
         padding: int = 0, aligned_input: bool = True) -> nn.Conv2d:
    """A bias-free convolution between activations stored aligned (its input too, unless
    `aligned_input` is False: the images): nn.Conv2d itself without alignment, else an AlignedConv2d
    of the same weight (padded where either side is)."""
    if not (align and align > 1):
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         bias=False)
    in_stored = stored(in_channels, align) if aligned_input else in_channels
    out_stored = stored(out_channels, align)
    return AlignedConv2d(in_channels, out_channels, kernel_size, in_stored=in_stored,
                         out_stored=out_stored, stride=stride, padding=padding)


def batch_norm(channels: int, align: int | None) -> nn.BatchNorm2d:
    """BatchNorm of an activation stored aligned: nn.BatchNorm2d itself where it is not padded."""
    width = stored(channels, align)
    return nn.BatchNorm2d(channels) if width == channels else AlignedBatchNorm2d(channels, width)


class BasicBlock(nn.Module):
    """BN - conv3x3 - BN - ReLU - conv3x3 - BN, plus the padded identity (add_shortcut)."""

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int, align: int | None = 0):
        super().__init__()
        self.bn1 = batch_norm(in_channels, align)
        self.conv1 = conv(in_channels, width, 3, align, stride=stride, padding=1)
        self.bn2 = batch_norm(width, align)
        self.conv2 = conv(width, width, 3, align, padding=1)
        self.bn3 = batch_norm(width, align)
        self.stride = stride
        self.out_stored = stored(width, align)  # the output's channels as stored

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(out), inplace=True))
        return self.bn3(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add_shortcut(self.residual(x), x, self.stride)


class Bottleneck(nn.Module):
    """BN - conv1x1 - BN - ReLU - conv3x3 - BN - ReLU - conv1x1 (4x width) -
    BN, plus the padded identity (add_shortcut)."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int, align: int | None = 0):
        super().__init__()
        out_channels = width * self.expansion
        self.bn1 = batch_norm(in_channels, align)
        self.conv1 = conv(in_channels, width, 1, align)
        self.bn2 = batch_norm(width, align)
        self.conv2 = conv(width, width, 3, align, stride=stride, padding=1)
        self.bn3 = batch_norm(width, align)
        self.conv3 = conv(width, out_channels, 1, align)
        self.bn4 = batch_norm(out_channels, align)
        self.stride = stride
        self.out_stored = stored(out_channels, align)  # the output's channels as stored

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(out), inplace=True))
        out = self.conv3(F.relu(self.bn3(out), inplace=True))
        return self.bn4(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return add_shortcut(self.residual(x), x, self.stride)


def add_shortcut(residual: torch.Tensor, x: torch.Tensor, stride: int) -> torch.Tensor:
    """The block's output: `residual` plus the paper's identity shortcut (2x2 average pooling where
    the block downsamples, zero channels appended to the residual's width), added in place into
    the residual's first channels (ShortcutSum); under torch.compile the padded sum itself, which
    inductor compiles into one kernel, no padded copy either: in fp32 it trains bit for bit as the
    compiled ShortcutSum did, in bf16 within bf16's rounding of it, as far as either is from eager
    (BENCHMARKS.md)."""
    if stride != 1:
        x = F.avg_pool2d(x, kernel_size=2, stride=2, ceil_mode=True)
    if torch.compiler.is_compiling():
        # compiled, the padded sum as the paper writes it: inductor fuses the pad into the addition
        # (no copy either), and a graph without a custom autograd Function is one AOTAutograd's
        # cache keeps (its check refuses autograd_function_apply): a warm compile skips tracing
        return residual + F.pad(x, (0, 0, 0, 0, 0, residual.shape[1] - x.shape[1]))
    return ShortcutSum.apply(residual, x)


class ShortcutSum(torch.autograd.Function):
    """residual + the shortcut zero-padded to the residual's channels, computed as the shortcut
    added in place into the residual's first channels: the zeros would add nothing (r + 0 is r;
    only a -0.0 would have become +0.0), so this is the same sum without a padded copy of the
    shortcut. Backward, the output's gradient is the residual's, and its first channels (a view)
    the shortcut's: no copy either way. (Left to autograd, an in-place sum into a slice is undone
    and redone on a clone of the gradient, backward: two copies a block.) The residual is the
    block's last BatchNorm's output, which its backward does not need (BatchNorm saves its input),
    so it may be written over."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor, shortcut: torch.Tensor) -> torch.Tensor:
        ctx.channels = shortcut.shape[1]
        residual.narrow(1, 0, ctx.channels).add_(shortcut)
        ctx.mark_dirty(residual)
        return residual

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.narrow(1, 0, ctx.channels)


# block -> (class, layers per block per stage x 3)
BLOCKS = {"basic": (BasicBlock, 6), "bottleneck": (Bottleneck, 9)}


class PyramidNet(nn.Module):
    def __init__(self, depth: int = 110, alpha: float = 270, block: str = "basic",
                 num_classes: int = 10, in_channels: int = 3, width_multiple: int = 1,
                 align_channels: int | None = 0):
        super().__init__()
        block_class, blocks_per_stage = check_arguments(depth, alpha, block, num_classes,
                                                        in_channels)
        if width_multiple < 1:
            raise ValueError("width_multiple must be 1 (the paper's widths) or "
                             f"more, not {width_multiple}")
        if align_channels is not None and align_channels < 0:
            raise ValueError(f"align_channels must be 0 (off) or more, not {align_channels}")
        step = alpha / (3 * blocks_per_stage)  # the width added by every block
        width = 16.0
        channels = 16
        # the images keep their channels; every activation after them is stored aligned
        self.conv1 = conv(in_channels, channels, 3, align_channels, padding=1, aligned_input=False)
        self.bn1 = batch_norm(channels, align_channels)
        stages = []
        for stage in range(3):
            blocks = []
            for index in range(blocks_per_stage):
                width += step
                stride = 2 if stage > 0 and index == 0 else 1
                # rounded up to the multiple
                planes = -(-int(round(width)) // width_multiple) * width_multiple
                blocks.append(block_class(channels, planes, stride, align_channels))
                channels = planes * block_class.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.bn_final = batch_norm(channels, align_channels)
        self.fc = nn.Linear(channels, num_classes)
        self.out_channels = channels
        # at the paper's shapes: the unaligned model's random draws, in its order; then every
        # aligned layer's tensors padded with zeros
        self._init_weights()
        for module in self.modules():
            if isinstance(module, PaddedStorage):
                module.store_padded()

    def _init_weights(self) -> None:
        """He (fan-out) init for convolutions, BN as identity, zero bias for the classifier."""
        for module in self.modules():
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
        x = F.relu(self.bn_final(x), inplace=True)
        # global average pooling; CUDA's adaptive_avg_pool2d backward is not deterministic
        x = x.mean((2, 3))
        # the real channels (the rest are zeros): a classifier over the padded
        # ones would sum in another order
        return self.fc(x[:, :self.out_channels])


def check_arguments(depth, alpha, block, num_classes, in_channels):
    """The block class and blocks per stage, or a ValueError naming the valid forms."""
    if block not in BLOCKS:
        raise ValueError(f"block must be 'basic' or 'bottleneck', not {block!r}")
    block_class, layers_per_block = BLOCKS[block]
    blocks_per_stage, remainder = divmod(depth - 2, layers_per_block)
    if remainder or blocks_per_stage < 1:
        forms = ("6n+2 (8, 14, 20, ..., 110, 272)" if block == "basic"
                 else "9n+2 (11, 20, ..., 164, 200, 272)")
        raise ValueError(f"depth {depth} is not valid for {block} blocks: use {forms}")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError("alpha must be a positive widening factor (e.g. 48, "
                         f"84, 270), not {alpha}")
    if num_classes < 1 or in_channels < 1:
        raise ValueError("num_classes and in_channels must be at least 1")
    return block_class, blocks_per_stage


# Convolution weights of residual block j, per (width of block j-1) x (width of j) and per (width of
# j) squared: basic: conv1 3x3 from the previous width, conv2 3x3; bottleneck: conv1 1x1 from 4x the
# previous width, conv2 3x3 and conv3 1x1 to 4x the width.
BLOCK_WEIGHTS = {"basic": (9, 9), "bottleneck": (4, 9 + 4)}


def parameters_at_least(depth: int, alpha: float, block: str = "basic",
                        width_multiple: int = 1) -> float:
    """A lower bound of pyramidnet(depth, alpha, block, width_multiple=...)'s parameter count,
    in constant time whatever the depth, without building it: to refuse a model that cannot fit
    in memory before anything is allocated. Only the residual blocks' convolutions count, block
    j of N at a width of at least 15 + alpha * j / N (its unrounded 16 + alpha * j / N less
    rounding's 0.5, with room for the running sum's float error) and at least `width_multiple`.
    From 77 % (depth 8) to 99 % (PyramidNet-110 alpha 270) of the real count. A float: it may
    exceed any count a machine could hold."""
    _, blocks_per_stage = check_arguments(depth, alpha, block, 10, 3)
    cross, square = BLOCK_WEIGHTS[block]
    n, step, low = 3 * blocks_per_stage, alpha / (3 * blocks_per_stage), 15.0
    widths = n * low + step * n * (n + 1) / 2  # sum over j of low + step * j
    squares = n * low * low + low * step * n * (n + 1) + step * step * n * (n + 1) * (2 * n + 1) / 6
    first = low + step
    # sum over j >= 2 of width(j-1) * width(j)
    neighbours = (squares - first * first) - step * (widths - first)
    by_width = square * squares + cross * neighbours
    by_multiple = width_multiple ** 2 * (square * n + cross * (n - 1))
    return max(by_width, by_multiple)


def pyramidnet(depth: int = 110, alpha: float = 270, block: str = "basic", num_classes: int = 10,
               in_channels: int = 3, width_multiple: int = 1,
               align_channels: int | None = 0) -> PyramidNet:
    """PyramidNet-`depth` with widening factor `alpha`; depth is 6n+2 for basic blocks, 9n+2
    for bottlenecks. `width_multiple` > 1 rounds every block's width up to a multiple of it
    (8 suits tensor cores): a wider model. `align_channels` > 1 keeps the paper's model (its
    parameters, state_dict and FLOPs) but stores every activation, and the weights that
    touch it (models/aligned.py), at a channel count rounded up to a multiple of it, the
    extra channels exactly zero, so that the convolutions run on the shapes tensor cores
    take without cuDNN padding them on every call. Train it with common/optim.py's
    build_optimizer (or call models.aligned.mask_padded_gradients on the optimizer):
    BatchNorm beta's padding must not move."""
    return PyramidNet(depth, alpha, block, num_classes, in_channels, width_multiple, align_channels)
