"""What the comparison needs of the runs' model and data before any run, or beyond what a run
measures: the images (channels, side, classes), the model's shapes built on the meta device (no
memory, nothing computed) for the projection's units and its sweep over wider PyramidNets, FSDP's
units as fsdp/train.py finds them, and a model that cannot take the images, refused in one line.

A run measures its own model (results.json's `parameters` and `flops_per_image`, counted on the
model object that ran); the report takes those. The projection needs more (each FSDP unit's
parameters and FLOPs, models wider than the one that ran): for that PyramidNet's layers are laid
out here as models/pyramidnet.py lays them out (the paper's: the same convolutions, BatchNorms
and classifier; the shortcut, which has neither parameters nor FLOPs, left out), and
`projected_model_differs` holds the two to each other through the runs' results.json. A
torchvision model is torchvision's own, built by name as the train files build it.
"""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch
from torch import nn

PYRAMIDNET = "pyramidnet"
# each dataset's images as the train files read them: (side, channels); an image folder's side is
# --image_size (224 by default), its classes its folders
IMAGES = {"cifar10": (32, 3), "synthetic": (32, 3), "mnist": (28, 1), "imagefolder": (None, 3)}
CLASSES = {"cifar10": 10, "synthetic": 10, "mnist": 10}
BLOCKS = {"basic": 6, "bottleneck": 9}  # layers a block: depth 6n+2, 9n+2


# --------------------------------------------------------------------------------------- the data
@functools.cache
def image_folder(data_dir: str) -> dict | None:
    """An image folder's images as torchvision's ImageFolder finds them: {"train": images,
    "val": images, "classes": class folders}; None where it cannot be read (the runs then say
    why, in their own line)."""
    from torchvision.datasets import ImageFolder

    try:
        train, val = (ImageFolder(str(Path(data_dir) / split)) for split in ("train", "val"))
    except (OSError, FileNotFoundError, RuntimeError):
        return None
    return {"train": len(train), "val": len(val), "classes": len(train.classes)}


def image_size(config: dict) -> int:
    """The side of the images the runs train on: --image_size, or as the train files default it
    (the dataset's own side for PyramidNet, 224 for a torchvision model or an image folder)."""
    side = IMAGES[config["dataset"]][0]
    native = config["model"] == PYRAMIDNET and config["dataset"] != "imagefolder"
    return config.get("image_size") or (side if native else 224)


def data_shape(config: dict) -> tuple[int, int, int]:
    """(channels, side, classes) of the images a run's config (results.json's, or the flags as the
    train file's parser read them) trains on."""
    channels = IMAGES[config["dataset"]][1]
    classes = CLASSES.get(config["dataset"])
    if classes is None:
        folder = image_folder(config["data_dir"])
        classes = folder["classes"] if folder else 2
    return channels, image_size(config), classes


def training_images(config: dict) -> int | None:
    """One epoch's images: --synthetic_size, CIFAR-10's and MNIST's training sets, an image
    folder's train/ (None where it cannot be listed)."""
    dataset = config["dataset"]
    if dataset == "synthetic":
        return config["synthetic_size"]
    if dataset == "imagefolder":
        folder = image_folder(config["data_dir"])
        return folder and folder["train"]
    return {"cifar10": 50_000, "mnist": 60_000}[dataset]


def test_images(config: dict) -> int | None:
    """The test set's images: a fifth of --synthetic_size, CIFAR-10's and MNIST's 10,000, an image
    folder's val/."""
    dataset = config["dataset"]
    if dataset == "synthetic":
        return config["synthetic_size"] // 5
    if dataset == "imagefolder":
        folder = image_folder(config["data_dir"])
        return folder and folder["val"]
    return 10_000


# ------------------------------------------------------------------------------------ the models
class Block(nn.Module):
    """A PyramidNet residual block's layers, in order: BN, conv, BN, ReLU, conv, BN (bottleneck:
    three convolutions, 1x1, 3x3, 1x1 at 4x the width). Its padded identity shortcut has neither
    parameters nor FLOPs, so the shapes leave it out; the next block takes this one's output."""

    def __init__(self, layers: dict[str, nn.Module]):
        super().__init__()
        for name, layer in layers.items():
            self.add_module(name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.children():
            x = layer(x)
        return x


class PyramidNetShape(nn.Module):
    """PyramidNet's layers as models/pyramidnet.py builds them (Han, Kim & Kim, CVPR 2017): a 3x3
    stem, three stages of blocks, each block widening by alpha / blocks, the second and third
    stages halving the resolution in their first block, then BN, ReLU, global pooling and the
    classifier. Parameter names follow that file's (conv1, bn1, layer1.0.conv1 ...)."""

    def __init__(self, depth: int, alpha: float, block: str, classes: int, channels: int):
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"block must be basic or bottleneck, not {block!r}")
        per_stage, remainder = divmod(depth - 2, BLOCKS[block])
        if remainder or per_stage < 1:
            layers = BLOCKS[block]
            raise ValueError(f"depth {depth} does not suit {block} blocks: give {layers}n+2 "
                             f"({layers + 2}, {2 * layers + 2}, ...)")
        step, width, inputs = alpha / (3 * per_stage), 16.0, 16
        self.conv1 = nn.Conv2d(channels, inputs, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(inputs)
        for stage in range(3):
            blocks = []
            for index in range(per_stage):
                width += step
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(self.block(block, inputs, int(round(width)), stride))
                inputs = int(round(width)) * (4 if block == "bottleneck" else 1)
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.bn_final = nn.BatchNorm2d(inputs)
        self.fc = nn.Linear(inputs, classes)

    @staticmethod
    def block(kind: str, inputs: int, width: int, stride: int) -> Block:
        """The layers of one block, named as models/pyramidnet.py names them (bn1, conv1, ...)."""
        if kind == "basic":
            layers = {"bn1": nn.BatchNorm2d(inputs),
                      "conv1": nn.Conv2d(inputs, width, 3, stride, 1, bias=False),
                      "bn2": nn.BatchNorm2d(width), "relu": nn.ReLU(),
                      "conv2": nn.Conv2d(width, width, 3, 1, 1, bias=False),
                      "bn3": nn.BatchNorm2d(width)}
        else:
            layers = {"bn1": nn.BatchNorm2d(inputs),
                      "conv1": nn.Conv2d(inputs, width, 1, bias=False),
                      "bn2": nn.BatchNorm2d(width), "relu1": nn.ReLU(),
                      "conv2": nn.Conv2d(width, width, 3, stride, 1, bias=False),
                      "bn3": nn.BatchNorm2d(width), "relu2": nn.ReLU(),
                      "conv3": nn.Conv2d(width, 4 * width, 1, bias=False),
                      "bn4": nn.BatchNorm2d(4 * width)}
        return Block(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn1(self.conv1(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.relu(self.bn_final(x))
        return self.fc(x.mean((2, 3)))


def model_on_meta(config: dict, alpha: float | None = None) -> nn.Module:
    """The runs' model (a results.json config, or the flags as the train file's parser read them)
    on the meta device; PyramidNet at `alpha` in place of the runs' width where given. Raises
    ValueError for a PyramidNet depth neither block can have."""
    channels, size, classes = data_shape(config)
    with torch.device("meta"), uninitialised():
        if config["model"] == PYRAMIDNET:
            return PyramidNetShape(config["depth"], alpha or config["alpha"], config["block"],
                                   classes, channels)
        import torchvision

        sized = {"image_size": size} if config["model"].startswith("vit_") else {}
        return torchvision.models.get_model(config["model"], num_classes=classes, **sized)


@contextlib.contextmanager
def uninitialised():
    """torch.nn.init's in-place functions do nothing while the block runs: on the meta device they
    compute nothing anyway, yet take most of a model's build, and the memory projection builds
    some 50 models (its search over widths)."""
    names = [name for name, value in vars(torch.nn.init).items()
             if name.endswith("_") and not name.startswith("_") and callable(value)]
    originals = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(torch.nn.init, name, function)


def pipeline_piece_count(config: dict) -> int | None:
    """The pieces pipeline_parallel/train.py cuts the runs' model into, at most a stage each
    (its model_pieces): PyramidNet's stem, each of its blocks and its head. None for a --model of
    torchvision's, none of which is an nn.Sequential, which it refuses (a Sequential of the user's
    goes in its get_model, where no flag names it); nothing is built, so a model the images do not
    suit is model_refusal's to say, as is a PyramidNet depth neither block can have."""
    if config["model"] == PYRAMIDNET:
        return 3 * ((config["depth"] - 2) // BLOCKS[config["block"]]) + 2
    return None


def model_refusal(config: dict) -> str | None:
    """Why the runs' model cannot train on their images, in one line that says what to give (None:
    it can): a PyramidNet depth neither block has, a torchvision model that takes 3-channel images
    given 1-channel ones, or images its layers cannot reduce. Found by a forward pass on the meta
    device (shapes only)."""
    channels, size, _ = data_shape(config)
    name = config["model"]
    if name != PYRAMIDNET and channels != 3:
        return (f"--model {name} takes 3-channel images and --dataset {config['dataset']} has "
                f"{channels}: use --model {PYRAMIDNET}, or a dataset of colour images")
    try:
        model = model_on_meta(config)
        model.train()(torch.empty(2, channels, size, size, device="meta"))
    except (RuntimeError, ValueError, AssertionError, NotImplementedError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if name == PYRAMIDNET:
            return f"--depth {config['depth']}: {reason}"
        return (f"--model {name} cannot take {size}x{size} images ({reason}): give another "
                f"--image_size (224, the size torchvision's models are made for, suits them all)")
    return None


def flops_per_image(model: nn.Module, channels: int, size: int) -> int:
    """One training image's FLOPs (forward and backward), counted by FlopCounterMode on `model`
    built on the meta device: what a run of it will count on the model object itself."""
    from torch.utils.flop_counter import FlopCounterMode

    images = torch.empty(2, channels, size, size, device="meta", requires_grad=False)
    with FlopCounterMode(display=False) as counter:
        model.train()(images).float().sum().backward()
    return counter.get_total_flops() // 2


def projected_model_differs(model: nn.Module, results: list[dict]) -> str | None:
    """Where the model the projection builds here is not the one the runs trained: the two
    parameter counts (the runs' from results.json, counted on the model object that ran); None
    where they agree or no run reported one."""
    counted = {r["summary"].get("parameters") for r in results if r.get("summary")} - {None}
    built = sum(p.numel() for p in model.parameters())
    if not counted or counted == {built}:
        return None
    return (f"the runs' model has {', '.join(f'{c:,}' for c in sorted(counted))} parameters and "
            f"the one built here to project from {built:,}")


# ------------------------------------------------------------------------------------ FSDP's units
CONTAINERS = (nn.Sequential, nn.ModuleList)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one at a time, as fsdp/train.py finds them: the children of the
    model's Sequentials and ModuleLists that hold weights, are no such container themselves, and
    whose class is repeated among those inside no other (PyramidNet's and ResNet's residual blocks,
    ViT's encoder layers, not its head). [] where nothing repeats: the model is then one unit,
    the root."""
    children = [child for module in model.modules() if isinstance(module, CONTAINERS)
                for child in module.children() if next(child.parameters(), None) is not None
                and not isinstance(child, CONTAINERS)]
    inside = {id(sub) for child in children for sub in child.modules() if sub is not child}
    outer = [child for child in children if id(child) not in inside]  # those inside no other
    kinds = [type(child) for child in outer]  # a class repeated only inside blocks is no block
    return [child for child in outer if kinds.count(type(child)) > 1]
