"""The one factory of the models every mode trains: PyramidNet (models/pyramidnet.py, with
its own flags) or any classification model torchvision lists, built by name with no
pretrained weights (nothing is downloaded).

    build_model(cfg, data)     # cfg.model and its flags, for data's channels, classes, image size
    model_refusal(name, data)  # why that model cannot take those images, in one line (None: it can)
    on_meta(build)             # build() without memory (the meta device): to count or shard a model

A torchvision model is built with `torchvision.models.get_model(name, num_classes=...,
weights=None)`; those that are built for one image size take it from the data (the ViTs'
`image_size`, MaxViT's `input_size`), and GoogLeNet and Inception v3 leave out their auxiliary
classifiers, whose extra outputs the loss does not take.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import os

import torch
from torch import nn

from models.pyramidnet import pyramidnet

PYRAMIDNET = "pyramidnet"


@contextlib.contextmanager
def environment_as_found():
    """Whatever runs inside leaves os.environ as it found it. Importing torchvision imports
    torch._dynamo, whose compiled-code cache (torch/_dynamo/package.py, DynamoCache) asks inductor
    for its cache folder (torch/_inductor/runtime/cache_dir_utils.py, cache_dir), which sets
    TORCHINDUCTOR_CACHE_DIR to torch's default, /tmp/torchinductor_<user>, for the rest of the
    process and every process it starts: the suite would take it for the user's choice of a
    compile cache (common.compiling.compile_cache_folder)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in [name for name in os.environ if name not in before]:
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def torchvision():
    """The torchvision package, its first import leaving the environment as it was."""
    with environment_as_found():
        import torchvision

    return torchvision


@functools.cache
def model_names() -> tuple[str, ...]:
    """Every name --model takes: pyramidnet, then torchvision's classification models."""
    models = torchvision().models
    return (PYRAMIDNET, *sorted(models.list_models(module=models)))


def unknown_model(name: str) -> str | None:
    """What to give instead of a --model that is no model's name (None: it is
    one), with the closest names."""
    if name == PYRAMIDNET or name in model_names():
        return None
    close = difflib.get_close_matches(name.lower(), model_names(), n=3, cutoff=0.5)
    closest = (f"the closest: {', '.join(close)}" if close
               else f"e.g. resnet50, vit_b_16, {PYRAMIDNET}")
    return f"pyramidnet or a classification model torchvision lists ({closest})"


def build_model(cfg, data) -> nn.Module:
    """The model `cfg.model` names, for images of data.channels x data.size x data.size
    and data.classes classes, initialised from the global RNG (seed it first: every
    mode draws the same weights)."""
    if cfg.model == PYRAMIDNET:
        return pyramidnet(cfg.depth, cfg.alpha, cfg.block, num_classes=data.classes,
                          in_channels=data.channels, width_multiple=cfg.width_multiple,
                          align_channels=cfg.align_channels)
    return torchvision().models.get_model(cfg.model, weights=None, num_classes=data.classes,
                                          **size_arguments(cfg.model, data.size))


def size_arguments(name: str, size: int) -> dict:
    """The constructor arguments of torchvision's `name` that fix the image size, or drop what the
    loss cannot take."""
    if name.startswith("vit_"):
        return {"image_size": size}
    if name == "maxvit_t":
        return {"input_size": (size, size)}
    if name in ("googlenet", "inception_v3"):
        return {"aux_logits": False, "init_weights": True}
    return {}


def model_refusal(cfg, data) -> str | None:
    """Why `cfg.model` cannot train on `data`'s images, in one line that says what to give (None: it
    can): a torchvision model takes 3-channel images of a size its layers can reduce. Found by a
    forward pass of the model built on the meta device (shapes only, no memory)."""
    if cfg.model == PYRAMIDNET:
        return None
    if data.channels != 3:
        return (f"--model {cfg.model} takes 3-channel images and --dataset {cfg.dataset} has "
                f"{data.channels}: use --model {PYRAMIDNET}, or a dataset of colour images")
    try:
        model = on_meta(lambda: build_model(cfg, data))
        model.train()(torch.empty(2, 3, data.size, data.size, device="meta"))
    except (RuntimeError, ValueError, AssertionError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"--model {cfg.model} cannot take {data.size}x{data.size} images ({reason}): give "
                f"another --image_size{hint(cfg.model)}")
    return None


def hint(name: str) -> str:
    """What image sizes suit torchvision's `name`, for the refusal."""
    patch = name.rsplit("_", 1)[-1]
    if name.startswith("vit_") and patch.isdigit():
        return f" (a multiple of its {patch}-pixel patches, e.g. 224)"
    return " (224, the size torchvision's models are made for, suits them all)"


def on_meta(build):
    """`build()` without memory: every parameter and buffer of the model it returns on the meta
    device (shapes only). Inside `torch.device("meta")` first; a constructor that computes on
    tensors there fails (RegNet's widths call .tolist()), and is then run on the CPU with each
    tensor moved to the meta device as it is registered."""
    try:
        with torch.device("meta"):
            return build()
    except (RuntimeError, NotImplementedError):
        with _registered_on_meta():
            return build()


@contextlib.contextmanager
def _registered_on_meta():
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter_on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(module, name, param)

    def buffer_on_meta(module, name, tensor, persistent=True):
        register_buffer(module, name, None if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter_on_meta, buffer_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = (register_parameter,
                                                                   register_buffer)
