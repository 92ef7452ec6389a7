"""Layers that store a model's tensors padded to channel counts tensor cores take, while the model
stays the paper's: its state_dict, its parameter count and its FLOPs are the unpadded model's.

A convolution's weight and BatchNorm's gamma, beta and running statistics are stored at the padded
channel counts, the extra parts zero, and used as they are: a step runs the same operators as the
unpadded model, with no pad on the way. The extra parts stay zero under SGD (momentum, weight decay
and all) because their gradients are exactly zero: a weight reading a padded input channel
multiplies zeros, a weight writing a padded output channel feeds a BatchNorm whose gamma is zero
there, and a zero gamma's own gradient is the sum of its output's gradient times a normalised zero.
Beta's padded part is the exception: through the identity shortcut, a padded channel of one block is
a real channel of a later one, so it does receive a gradient. `mask_padded_gradients` zeroes those
gradients before every optimizer step, in one multi-tensor op.

`state_dict()` holds the paper's shapes (the padded parts cut off) and `load_state_dict()` takes
them (the padded parts zero): checkpoints move between padded and unpadded models both ways.
Under FSDP2 a parameter is a DTensor of which each rank holds a slice: the state_dict then holds
the padded slices, and common/state.py cuts the whole tensors to the paper's shapes once
gathered (`to_paper`, `to_stored`).
"""
from __future__ import annotations

import sys

import torch
from torch import nn


def _is_dtensor(tensor: torch.Tensor) -> bool:
    # nothing is a DTensor before it is imported
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


class PaddedStorage:
    """What a layer with padded storage tells the rest: which of its tensors are padded, their
    paper shapes, and how to turn a stored tensor into the paper's and back (for the state_dict
    and the optimizer's momentum)."""

    padded: tuple[str, ...] = ()  # the names of the tensors stored padded

    def paper_shape(self, name: str) -> torch.Size:
        raise NotImplementedError

    def to_paper(self, name: str, stored: torch.Tensor) -> torch.Tensor:
        """The paper's part of a stored tensor (a contiguous tensor of the paper's shape)."""
        return stored[tuple(slice(0, size) for size in self.paper_shape(name))].contiguous()

    def to_stored(self, name: str, paper: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A tensor of the paper's shape, padded to `like`'s shape (and dtype and
        device) with `like`'s values: the extra parts of the layer's own tensor (zeros;
        a running variance's ones)."""
        stored = like.detach().clone()
        stored[tuple(slice(0, size) for size in paper.shape)] = paper.to(stored)
        return stored

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in self.padded:
            value = destination.get(prefix + name)
            if value is not None and not _is_dtensor(value):  # DTensor slices: cut once gathered
                destination[prefix + name] = self.to_paper(name, value)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in self.padded:  # the paper's shape gets this layer's padded parts (and layout)
            value = state_dict.get(prefix + name)
            if (isinstance(value, torch.Tensor) and not _is_dtensor(value)
                and value.shape == self.paper_shape(name)):
                state_dict[prefix + name] = self.to_stored(name, value, getattr(self, name))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def store_padded(self, name: str, shape: tuple[int, ...]) -> None:
        """Replace the tensor `name`, of the paper's shape, by one of
        `shape` holding it, the rest zero."""
        paper = getattr(self, name)
        stored = torch.zeros(shape, dtype=paper.dtype, device=paper.device)
        stored[tuple(slice(0, size) for size in paper.shape)] = paper.detach()
        if isinstance(paper, nn.Parameter):
            setattr(self, name, nn.Parameter(stored, requires_grad=paper.requires_grad))
        else:
            setattr(self, name, stored)


class AlignedConv2d(PaddedStorage, nn.Conv2d):
    """A bias-free convolution of the paper's `in_channels` to `out_channels`, reading an
    input stored at `in_stored` channels and writing an output stored at `out_stored`, the
    extra channels zero. Built at the paper's shape (the same random draws), its weight is
    stored padded by `store_padded()`.

    `weight_nhwc()` stores the weight as (out, kh, kw, in), contiguous, and hands cuDNN its (out,
    in, kh, kw) view: channels_last without a non-contiguous parameter, which FSDP2 cannot shard."""

    padded = ("weight",)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, in_stored: int,
                 out_stored: int, stride: int = 1, padding: int = 0):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         bias=False)
        self.in_stored, self.out_stored = in_stored, out_stored
        self.nhwc = False

    def paper_shape(self, name: str) -> torch.Size:
        return torch.Size((self.out_channels, self.in_channels, *self.kernel_size))

    def store_padded(self, name: str = "weight", shape=None) -> None:
        super().store_padded("weight", (self.out_stored, self.in_stored, *self.kernel_size))

    def weight_nhwc(self) -> None:
        """Store the weight as (out, kh, kw, in), contiguous: its (out, in,
        kh, kw) view is channels_last."""
        self.weight = nn.Parameter(self.weight.detach().permute(0, 2, 3, 1).contiguous())
        self.nhwc = True

    def conv_weight(self) -> torch.Tensor:
        """The weight as the convolution takes it, (out, in, kh, kw); a view of
        an (out, kh, kw, in) storage."""
        return self.weight.permute(0, 3, 1, 2) if self.nhwc else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.conv_weight(), None)

    def to_paper(self, name: str, stored: torch.Tensor) -> torch.Tensor:
        return super().to_paper(name, stored.permute(0, 3, 1, 2) if self.nhwc else stored)

    def to_stored(self, name: str, paper: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if not self.nhwc:
            return super().to_stored(name, paper, like)
        stored = super().to_stored(name, paper, like.permute(0, 3, 1, 2))
        return stored.permute(0, 2, 3, 1).contiguous()


class AlignedBatchNorm2d(PaddedStorage, nn.BatchNorm2d):
    """BatchNorm of the paper's `num_features` channels over an input stored at `stored` channels.
    Gamma, beta and the running statistics are stored at that length, gamma and beta zero in the
    extra channels, so that a padded channel, all zeros, stays exactly zero (BatchNorm of a constant
    channel outputs beta). Its forward is nn.BatchNorm2d's own."""

    padded = ("weight", "bias", "running_mean", "running_var")

    def __init__(self, num_features: int, stored_features: int):
        super().__init__(num_features)
        self.stored = stored_features
        self.running_mean = torch.zeros(stored_features)
        self.running_var = torch.ones(stored_features)

    def paper_shape(self, name: str) -> torch.Size:
        return torch.Size((self.num_features,))

    def store_padded(self, name: str = "", shape=None) -> None:
        for name in ("weight", "bias"):
            super().store_padded(name, (self.stored,))


def weights_nhwc(model: nn.Module) -> None:
    """Every aligned convolution of `model` stores its weight as (out, kh, kw, in),
    contiguous, and convolves with its (out, in, kh, kw) view, which is channels_last: what
    FSDP2, which shards contiguous parameters only, can hand cuDNN without a layout conversion
    of every weight in every pass."""
    for module in model.modules():
        if isinstance(module, AlignedConv2d):
            module.weight_nhwc()


def padded_layers(model: nn.Module) -> dict[str, PaddedStorage]:
    """Every layer of `model` that stores tensors padded, by its qualified name ("" for none)."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, PaddedStorage)}


def paper_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """The shape of every entry of `model.state_dict()` in the paper's model, by
    key: the checkpoints' shapes."""
    shapes = {key: value.shape for key, value in model.state_dict().items()}
    for prefix, layer in padded_layers(model).items():
        for name in layer.padded:
            key = f"{prefix}.{name}" if prefix else name
            shapes[key] = layer.paper_shape(name)
    return shapes


def _owner(model: nn.Module, key: str) -> tuple[PaddedStorage | None, str]:
    prefix, _, name = key.rpartition(".")
    layer = model.get_submodule(prefix) if prefix else model
    return ((layer, name) if isinstance(layer, PaddedStorage) and name in layer.padded
            else (None, name))


def to_paper(model: nn.Module, key: str, stored: torch.Tensor) -> torch.Tensor:
    """A whole tensor of `model` as it stores it (a parameter, buffer or momentum, by its
    state_dict key) in the paper's shape; any other tensor (one already of the paper's shape, of
    a layer not padded) as it is."""
    layer, name = _owner(model, key)
    if layer is None or stored.shape != getattr(layer, name).shape:
        return stored
    return layer.to_paper(name, stored)


def to_stored(model: nn.Module, key: str, paper: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor of the paper's shape as `model` stores it under `key`: padded to `like`
    (whose padded parts it takes), in its layout. Any other tensor (of another shape, of
    a layer not padded) as it is."""
    layer, name = _owner(model, key)
    if layer is None or paper.shape != layer.paper_shape(name):
        return paper
    return layer.to_stored(name, paper, like)


def mask_padded_gradients(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Before every step of `optimizer`, zero the gradients of beta's padded parts (the only
    padded parts that receive any), so that they stay zero: one multi-tensor multiply by 0/1
    masks. Under FSDP2 the masks are DTensors sliced as the parameters are. Nothing is registered
    for a model without padded BatchNorms."""
    norms = [layer for layer in padded_layers(model).values()
             if isinstance(layer, AlignedBatchNorm2d) and layer.stored > layer.num_features]
    if not norms:
        return
    betas = [norm.bias for norm in norms]
    masks = [_mask(norm.bias, norm.num_features) for norm in norms]

    def zero_padded_gradients(_optimizer, _args, _kwargs):
        pairs = [(beta.grad, mask) for beta, mask in zip(betas, masks) if beta.grad is not None]
        if pairs:
            grads, kept = zip(*pairs)
            torch._foreach_mul_(list(grads), list(kept))

    optimizer.register_step_pre_hook(zero_padded_gradients)


def _mask(beta: torch.Tensor, real: int) -> torch.Tensor:
    """Ones over the real channels and zeros over the padded ones,
    shaped and placed as `beta` is."""
    whole = torch.zeros(beta.shape, dtype=beta.dtype, device=beta.device)
    whole[:real] = 1
    if not _is_dtensor(beta):
        return whole
    from torch.distributed.tensor import distribute_tensor

    local = whole.to(beta.to_local().device)  # each rank cuts its own slice: nothing is sent
    return distribute_tensor(local, beta.device_mesh, beta.placements, src_data_rank=None)
