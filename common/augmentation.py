"""How a run augments its training images, the same in both loaders: the crop and flip it chooses
(--augment, --flip: an `Augmentation`; CIFAR's pad-4 random crop and horizontal flip by default,
chosen for the dataset at its image size), and each image's crop and flip, a function of (seed,
epoch, image index) drawn for the whole dataset at once by `augmentation_draws`: an image is
cropped and flipped alike in an epoch whatever the loader, the number of DataLoader workers or
processes, or a resume in between. The two loaders' batches then differ only in the rounding of the
normalisation, by at most one float32 ulp (2**-22 for values in [2, 4)). Images are stored at their
own size (the synthetic set at 32 pixels at most); at another --image_size both loaders resize each
augmented image with the same bilinear interpolation (`resized`), so that holds there too.

An image folder (--dataset imagefolder) is evaluated as ImageNet is, its images resized to
image_size * 256 // 224 and centre-cropped (common/folders.py); up to 64 pixels (`at_size`,
common/data.py) it trains on pad crops of those evaluation images, the same pixels in both
loaders, and above on ImageNet's random resized crop and a flip drawn from (seed, epoch, index) by
`resized_crop_draws`, whose box in the original image's pixels (`crop_boxes`) is the same in both
loaders. The torchvision loader crops the decoded original with PIL; the gpu loader holds every
image decoded once, squashed to a fixed stored side (`stored_side`), and crops the same box there
(torchvision.ops.roi_align), so its crops are the same region of the same image at the stored
resolution. Its evaluation images are PIL's, the same as the other's."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from common.data import PAD, DatasetInfo, config_fields, dataset_info


@dataclass(frozen=True)
class Augmentation:
    """How a run augments its training images (--augment, --flip): the random crop, pad (CIFAR's:
    the image padded by DatasetInfo.pad pixels on every side, then cut back to its own size at a
    random place) or resized (ImageNet's: a random 8 % to 100 % of its area, resized to the image
    size), and whether half the images are mirrored left to right. Drawn from (seed, epoch, image
    index): the same in both loaders."""
    crop: str
    flip: bool


def augmentation(cfg) -> Augmentation | None:
    """The augmentation of a run's training images (None: --augment off): --augment's crop (auto:
    the dataset's at its image size, at_size) and --flip (default: the dataset's, at_size: not for
    mnist, nor for an image folder's pad crops)."""
    if config_fields(cfg).augment in ("off", False):
        return None
    info = dataset_info(cfg)
    return Augmentation(info.crop, info.flip)


def explicit_augmentation(cfg):
    """The Config `cfg` with --augment auto and --flip's default made the crop and the flip they
    stand for at its image size: what results.json and a checkpoint record of a run."""
    chosen = augmentation(cfg)
    augment, flip = (chosen.crop, chosen.flip) if chosen else ("off", False)  # off mirrors none
    return dataclasses.replace(cfg, augment=augment, flip=flip)


def describe_augmentation(cfg) -> str:
    """The augmentation a run applies, for its first line: `pad-4 crop and flip`, `random resized
    crop, no flip`, `off`."""
    chosen = augmentation(cfg)
    if chosen is None:
        return "off"
    crop = f"pad-{dataset_info(cfg).pad} crop" if chosen.crop == "pad" else "random resized crop"
    return f"{crop} and flip" if chosen.flip else f"{crop}, no flip"


def loader_augmentation(augment: Augmentation | bool | None,
                        info: DatasetInfo) -> Augmentation | None:
    """A loader's `augment` as an Augmentation: True is the dataset's own at its size (its
    DatasetInfo's crop and flip), None or False none."""
    if augment is True:
        return Augmentation(info.crop, info.flip)
    return augment or None


# ---- drawn from (seed, epoch, image index): the same in both loaders ----

def augmentation_draws(seed: int, epoch: int, size: int, flip: bool,
                       pad: int = PAD) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top, left, flip) of every image of a `size`-image dataset in epoch `epoch`: the offsets of
    its crop (of the image's own size) from the image padded by `pad` on every side, and whether the
    crop is mirrored (never where `flip` is False). Indexed by the dataset index: neither the
    loader, the worker, the rank nor a resume enters."""
    rng = np.random.default_rng([seed, epoch])
    top, left = rng.integers(0, 2 * pad + 1, (2, size))
    mirrored = rng.random(size) < 0.5 if flip else np.zeros(size, dtype=bool)
    return top, left, mirrored


def resized_crop_draws(seed: int, epoch: int, size: int, flip: bool) -> tuple[np.ndarray, ...]:
    """(area, aspect, down, across, flip) of every image of a `size`-image folder in epoch
    `epoch`: the random resized crop of RandomResizedCrop's defaults, drawn once per image from
    (seed, epoch): the fraction of the image's area the crop covers (0.08 to 1), its aspect ratio
    (3/4 to 4/3, log-uniform), where it lies (fractions of the room left, down and across), and
    whether it is mirrored. `crop_boxes` turns them into pixels of each image. Indexed by the
    dataset index, as augmentation_draws."""
    rng = np.random.default_rng([seed, epoch])
    area = rng.uniform(0.08, 1.0, size)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), size))
    down, across = rng.random((2, size))
    mirrored = rng.random(size) < 0.5 if flip else np.zeros(size, dtype=bool)
    return area, aspect, down, across, mirrored


def crop_boxes(draws, widths, heights) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(top, left, height, width) in pixels of the crops `draws` (resized_crop_draws at some
    indices) of images of `widths` x `heights` pixels, as torchvision's RandomResizedCrop.get_params
    computes them, except that a box larger than the image is clamped to it where torchvision draws
    again. Only +, *, /, sqrt, rint and floor, which IEEE 754 rounds exactly: the same boxes for one
    image or a whole dataset at once, in any process."""
    area, aspect, down, across = (np.asarray(draw, dtype=np.float64) for draw in draws[:4])
    widths, heights = np.asarray(widths, dtype=np.float64), np.asarray(heights, dtype=np.float64)
    target = area * widths * heights
    width = np.clip(np.rint(np.sqrt(target * aspect)), 1, widths)
    height = np.clip(np.rint(np.sqrt(target / aspect)), 1, heights)
    top = np.floor(down * (heights - height + 1))
    left = np.floor(across * (widths - width + 1))
    return tuple(value.astype(np.int64) for value in (top, left, height, width))


def resized(images: torch.Tensor, size: int) -> torch.Tensor:
    """Float images (N, C, h, w) resized to size x size: bilinear, antialiased when shrinking. Both
    loaders resize CIFAR-10, MNIST and the synthetic set to another --image_size with it, each
    image after its augmentation."""
    return torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear",
                                           align_corners=False, antialias=True)
