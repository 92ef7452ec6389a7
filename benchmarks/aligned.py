"""The fast path's PyramidNet: models/pyramidnet.py's own model, built as the train files build it,
then changed in how it computes and stores, never in what it is.

    model = fast_pyramidnet(110, 270, "basic", 10, 3, align=8)  # what benchmarks/fast.py trains
    mask_padded_gradients(model, optimizer)                    # before every optimizer step
    paper_optimizer_state(model, optimizer)                    # its state_dict: paper's shapes

- The shortcut added in place (`ShortcutSum`), and the ReLUs: a block's output is its residual
  with the shortcut added into its first channels, the sum the paper's padded identity makes
  without a padded copy of the shortcut forward, nor a sliced copy of its gradient backward. Each
  block keeps its layers: its class becomes a subclass whose forward differs in those only
  (fully_shard turns a module into an FSDPModule the same way, by its __class__). Under
  torch.compile the padded sum itself, which inductor fuses into one kernel, no copy either, and
  which AOTAutograd's cache keeps (a custom autograd Function makes it bypass the cache: a warm
  compile would trace the model again).
- Channels stored aligned (`align_channels`, align > 1): every activation stored at a channel count
  rounded up to a multiple of `align`, the extra channels exactly zero, so that cuDNN gets
  tensor-core shapes without padding them itself on every call. The weights that touch them are
  stored padded too: each convolution's weight, BatchNorm's gamma, beta and running statistics, the
  extra parts zero (a running variance's one), so a step runs the unaligned model's operators with
  nothing padded on the way. They stay zero because their gradients are exactly zero (they read
  zero channels, or feed a BatchNorm whose gamma is zero there), except beta's: through the
  identity shortcut a padded channel of one block is a real channel of a later one, so before every
  optimizer step one multi-tensor multiply zeroes beta's padded gradients (`mask_padded_gradients`).
  The model stays the paper's: its parameter names, its state_dict (the padding cut on saving,
  restored on loading), its FLOPs and its checkpoints, which the plain train.py loads, and which it
  loads from the plain train.py.
- `width_multiple` > 1: a different, wider model, every block's width rounded up to a multiple of
  it (the paper's widths mostly are not multiples of 8): what tensor-core widths are worth.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path += [str(path) for path in (REPO, REPO / "models") if str(path) not in sys.path]

from pyramidnet import BLOCKS, BasicBlock, Bottleneck, PyramidNet  # noqa: E402


def fast_pyramidnet(depth: int = 110, alpha: float = 270, block: str = "basic",
                    num_classes: int = 10, in_channels: int = 3, *, align: int = 0,
                    width_multiple: int = 1) -> PyramidNet:
    """PyramidNet(depth, alpha, block, num_classes, in_channels), the paper's (the same random
    draws in the same order), its shortcuts added in place and, with `align` > 1, its channels
    stored aligned; with `width_multiple` > 1 the wider model instead. A ValueError names a depth
    or alpha no PyramidNet has, as PyramidNet's own does."""
    if width_multiple > 1:
        model = wider_pyramidnet(depth, alpha, block, num_classes, in_channels, width_multiple)
    else:
        model = PyramidNet(depth, alpha, block, num_classes, in_channels)
    sum_in_place(model)
    if align > 1:
        align_channels(model, align)
    return model


# --------------------------------------------------------------------------- the shortcut in place
class ShortcutSum(torch.autograd.Function):
    """residual + the shortcut zero-padded to the residual's channels, computed as the shortcut
    added in place into the residual's first channels: the zeros would add nothing (r + 0 is r;
    only a -0.0 would have become +0.0). Backward, the output's gradient is the residual's, and its
    first channels (a view) the shortcut's: no copy either way. (Left to autograd, an in-place sum
    into a slice is undone and redone on a clone of the gradient, backward: two copies a block.)
    The residual is the block's last BatchNorm's output, which its backward does not need
    (BatchNorm saves its input), so it may be written over."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor, shortcut: torch.Tensor) -> torch.Tensor:
        ctx.channels = shortcut.shape[1]
        residual.narrow(1, 0, ctx.channels).add_(shortcut)
        ctx.mark_dirty(residual)
        return residual

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.narrow(1, 0, ctx.channels)


def shortcut_in_place(residual: torch.Tensor, x: torch.Tensor, stride: int) -> torch.Tensor:
    """pyramidnet.shortcut_added's sum, the shortcut added in place (ShortcutSum); compiled, the
    padded sum as the paper writes it."""
    if stride != 1:
        x = F.avg_pool2d(x, kernel_size=2, stride=2, ceil_mode=True)
    if torch.compiler.is_compiling():
        return residual + F.pad(x, (0, 0, 0, 0, 0, residual.shape[1] - x.shape[1]))
    return ShortcutSum.apply(residual, x)


class InPlaceBasicBlock(BasicBlock):
    """models/pyramidnet.py's BasicBlock, its forward but for the sum and its ReLU in place (the
    BatchNorm before it saves its input, not its output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(out), inplace=True))
        return shortcut_in_place(self.bn3(out), x, self.stride)


class InPlaceBottleneck(Bottleneck):
    """models/pyramidnet.py's Bottleneck, its forward but for the sum and its ReLUs in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(out), inplace=True))
        out = self.conv3(F.relu(self.bn3(out), inplace=True))
        return shortcut_in_place(self.bn4(out), x, self.stride)


IN_PLACE = {BasicBlock: InPlaceBasicBlock, Bottleneck: InPlaceBottleneck}


def sum_in_place(model: nn.Module) -> nn.Module:
    """Every block of `model` adding its shortcut in place: the same layers, the same state_dict."""
    for module in model.modules():
        if type(module) in IN_PLACE:
            module.__class__ = IN_PLACE[type(module)]
    return model


# ----------------------------------------------------------------------- channels stored aligned
def stored(channels: int, align: int) -> int:
    """The channels an activation of `channels` is stored at: rounded up to a multiple of
    `align` (0 or 1: as it is)."""
    return -(-channels // align) * align if align > 1 else channels


class Padded:
    """A layer whose tensors `paper` names are stored larger than the paper's shapes, which its
    state_dict holds (the stored tensor's first part) and load_state_dict takes (padded with the
    stored tensor's own extra parts)."""

    paper: dict[str, torch.Size]

    def pad(self, name: str, shape: tuple[int, ...], fill: float = 0.0) -> None:
        """Store the tensor `name` at `shape`, its paper's values first, `fill` in the rest."""
        tensor = getattr(self, name)
        self.paper = {**getattr(self, "paper", {}), name: tensor.shape}
        padded = torch.full(shape, fill, dtype=tensor.dtype, device=tensor.device)
        padded[paper_part(tensor.shape)] = tensor.detach()
        if isinstance(tensor, nn.Parameter):
            setattr(self, name, nn.Parameter(padded, requires_grad=tensor.requires_grad))
        else:
            setattr(self, name, padded)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, shape in self.paper.items():
            if prefix + name in destination:  # a copy of the paper's part: no padded storage saved
                value = destination[prefix + name][paper_part(shape)]
                destination[prefix + name] = value.clone(memory_format=torch.contiguous_format)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name, shape in self.paper.items():
            value = state_dict.get(prefix + name)
            if isinstance(value, torch.Tensor) and value.shape == shape:
                state_dict[prefix + name] = padded_like(value, getattr(self, name))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def paper_part(shape) -> tuple[slice, ...]:
    return tuple(slice(0, size) for size in shape)


def padded_like(paper: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`paper` in the first part of a copy of `like` (its padding, layout, dtype and device)."""
    padded = like.detach().clone()
    padded[paper_part(paper.shape)] = paper.to(padded)
    return padded


class AlignedConv2d(Padded, nn.Conv2d):
    """nn.Conv2d between activations stored aligned: its weight (out, in, kh, kw) stored at the
    stored channels of both, zero beyond the paper's."""


class AlignedBatchNorm2d(Padded, nn.BatchNorm2d):
    """nn.BatchNorm2d of an activation stored aligned: gamma and beta zero in the extra channels,
    so that a padded channel, all zeros, stays exactly zero (BatchNorm of a constant channel is
    beta)."""


class RealChannels(nn.Linear):
    """The classifier of the paper's channels, the first of those stored: a classifier over the
    padded ones too would add up its products in another order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x[:, :self.in_features])


def align_channels(model: PyramidNet, align: int) -> PyramidNet:
    """`model` with every activation stored at stored(channels, align) channels (the images keep
    their own): its own layers, their tensors padded."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.__class__ = AlignedConv2d
            reads = module.in_channels if module is model.conv1 else stored(module.in_channels,
                                                                            align)
            module.pad("weight", (stored(module.out_channels, align), reads,
                                  *module.kernel_size))
        elif isinstance(module, nn.BatchNorm2d):
            module.__class__ = AlignedBatchNorm2d
            width = stored(module.num_features, align)
            for name in ("weight", "bias", "running_mean"):
                module.pad(name, (width,))
            module.pad("running_var", (width,), fill=1.0)
    model.fc.__class__ = RealChannels
    return model


def paper_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """Each stored-padded tensor of `model` by its state_dict key: its paper's shape."""
    return {f"{prefix}.{name}" if prefix else name: shape
            for prefix, module in model.named_modules() if isinstance(module, Padded)
            for name, shape in module.paper.items()}


def mask_padded_gradients(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Before every step of `optimizer`, zero the gradients of beta's padded parts (the only padded
    parts that receive any), so that they stay zero: one multi-tensor multiply by 0/1 masks.
    Nothing is registered for a model without padded BatchNorms."""
    norms = [module for module in model.modules() if isinstance(module, AlignedBatchNorm2d)
             and module.bias.shape != module.paper["bias"]]
    if not norms:
        return
    betas = [norm.bias for norm in norms]
    masks = [torch.zeros_like(beta).index_fill_(0, torch.arange(norm.num_features,
                                                                device=beta.device), 1.0)
             for norm, beta in zip(norms, betas)]

    def zero_padded_gradients(_optimizer, _args, _kwargs):
        pairs = [(beta.grad, mask) for beta, mask in zip(betas, masks) if beta.grad is not None]
        if pairs:
            grads, kept = zip(*pairs)
            torch._foreach_mul_(list(grads), list(kept))

    optimizer.register_step_pre_hook(zero_padded_gradients)


def paper_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.state_dict()` and `load_state_dict()` in the paper's shapes: the momentum of a
    padded parameter saved as its paper's part, and loaded padded with zeros, so that a checkpoint
    is the plain train.py's."""
    shapes = {id(getattr(module, name)): shape for module in model.modules()
              if isinstance(module, Padded) for name, shape in module.paper.items()}
    params = [param for group in optimizer.param_groups for param in group["params"]]
    save, load = optimizer.state_dict, optimizer.load_state_dict

    def state_dict() -> dict:
        state = save()  # each parameter's entry is the optimizer's own dict: new ones here
        entries = {}
        for index, entry in state["state"].items():
            shape = shapes.get(id(params[index]))
            entries[index] = {key: value[paper_part(shape)].clone(
                memory_format=torch.contiguous_format) if shape is not None
                and torch.is_tensor(value) and value.shape != shape else value
                for key, value in entry.items()}
        return {**state, "state": entries}

    def load_state_dict(state: dict) -> None:
        entries = {}
        for index, entry in state["state"].items():
            param = params[index]
            entries[index] = {key: padded_like(value, torch.zeros_like(param))
                              if torch.is_tensor(value) and value.shape == shapes.get(id(param))
                              and value.shape != param.shape else value
                              for key, value in entry.items()}
        load({**state, "state": entries})

    optimizer.state_dict, optimizer.load_state_dict = state_dict, load_state_dict


# ------------------------------------------------------------------------------ the wider model
def wider_pyramidnet(depth: int, alpha: float, block: str, num_classes: int, in_channels: int,
                     multiple: int) -> PyramidNet:
    """PyramidNet's construction (models/pyramidnet.py) with every block's width rounded up to a
    multiple of `multiple`: a different model, wider, initialised as PyramidNet is."""
    model = PyramidNet(depth, alpha, block, num_classes, in_channels)  # its checks and stem
    block_class, layers = BLOCKS[block]
    blocks_per_stage = (depth - 2) // layers
    step, width, channels = alpha / (3 * blocks_per_stage), 16.0, 16
    for stage in (model.layer1, model.layer2, model.layer3):
        for index in range(blocks_per_stage):
            width += step
            planes = -(-int(round(width)) // multiple) * multiple
            stride = 2 if stage is not model.layer1 and index == 0 else 1
            stage[index] = block_class(channels, planes, stride)
            channels = planes * block_class.expansion
    model.bn_final = nn.BatchNorm2d(channels)
    model.fc = nn.Linear(channels, num_classes)
    for module in model.modules():  # as PyramidNet initialises its own
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
    return model
