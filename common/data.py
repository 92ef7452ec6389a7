"""Datasets, samplers and the two loaders: the one data path every mode shares.

Both loaders draw indices from a torch Sampler, so the epoch order depends only on the seed and the
epoch: `ShuffleSampler` (one process) gives exactly the order of `DistributedSampler` with one
replica. Every mode calls the loader's `start_epoch` each epoch (the epoch's augmentation, a
ShuffleSampler's order, and where a resumed epoch goes on); the process-group modes call their
DistributedSampler's `set_epoch` before it, as DDP needs. Batches come out on the device,
normalised, as (float images NCHW, int64 labels).

The augmentation (--augment, --flip: an `Augmentation`; CIFAR's pad-4 random crop and horizontal
flip by default) is a function of (seed, epoch, image index), drawn for the whole dataset at once by
`augmentation_draws`: an image is cropped and flipped alike in an epoch whatever the loader, the
number of DataLoader workers or processes, or a resume in between. The two loaders' batches then
differ only in the rounding of the normalisation, by at most one float32 ulp (2**-22 for values in
[2, 4)). Images are stored at their own size (the synthetic set at 32 pixels at most); at another
--image_size both loaders resize each augmented image with the same bilinear interpolation
(`resized`), so that holds there too.

An image folder (--dataset imagefolder) is evaluated as ImageNet is, its images resized to
image_size * 256 // 224 and centre-cropped; up to 64 pixels (`at_size`) it trains on pad crops of
those evaluation images, the same pixels in both loaders, and above on ImageNet's random resized
crop and a flip drawn from (seed, epoch, index) by `resized_crop_draws`, whose box in the original
image's pixels (`crop_boxes`) is the same in both loaders. The torchvision loader crops the decoded
original with PIL; the gpu loader holds every image decoded once, squashed to a fixed stored side
(`stored_side`), and crops the same box there (torchvision.ops.roi_align), so its crops are the
same region of the same image at the stored resolution. Its evaluation images are PIL's, the same
as the other's.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import signal
import sys
import threading
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from common.config import DATASETS, UsageError
from common.domains import physical_memory
from common.folders import SPLITS, image_folder  # its layout (comparison/verify.py reads it here)
from models.factory import torchvision

PAD = 4  # pixels of zero padding around an image before its random crop
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # an image folder is normalised as ImageNet is
IMAGENET_STD = (0.229, 0.224, 0.225)
# the synthetic set is generated at this side at most, and resized per batch above it
SYNTHETIC_SIDE = 32
# synthetic images made at once: a multiple of 16, so that each piece's noise is drawn as torch
# draws it for the whole set (its normal sampler transforms draws in blocks of 16)
GENERATED_TOGETHER = 1024


@dataclass(frozen=True)
class DatasetInfo:
    """What the model and the loaders need to know of a dataset: its images' shape, its classes, the
    per-channel mean and std (of pixels scaled to [0, 1]) that normalise it, and whether a mirror
    image is still an image of the same class (a flipped digit is not)."""
    channels: int
    size: int  # square images of size x size pixels
    classes: int | None  # None: counted from the folder (imagefolder; dataset_info counts them)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool
    # the training crop --augment auto chooses: pad (CIFAR's pad-and-crop) or resized (ImageNet's
    # random resized crop); an image folder's depends on the image size (at_size)
    crop: str = "pad"
    pad: int = PAD  # pixels of padding around each image before its pad crop


@dataclass(frozen=True)
class Augmentation:
    """How a run augments its training images (--augment, --flip): the random crop, pad (CIFAR's:
    the image padded by DatasetInfo.pad pixels on every side, then cut back to its own size at a
    random place) or resized (ImageNet's: a random 8 % to 100 % of its area, resized to the image
    size), and whether half the images are mirrored left to right. Drawn from (seed, epoch, image
    index): the same in both loaders."""
    crop: str
    flip: bool


DATASET_INFO = {
    "cifar10": DatasetInfo(3, 32, 10, CIFAR10_MEAN, CIFAR10_STD, flip=True),
    "mnist": DatasetInfo(1, 28, 10, (0.1307,), (0.3081,), flip=False),
    # CIFAR-10's shapes and statistics
    "synthetic": DatasetInfo(3, 32, 10, CIFAR10_MEAN, CIFAR10_STD, flip=True),
    "imagefolder": DatasetInfo(3, 224, None, IMAGENET_MEAN, IMAGENET_STD, flip=True,
                               crop="resized"),
}  # one entry per common.config.DATASETS


def _fields(cfg):
    """A config's fields as attributes, from a Config, any object with its fields, or a dict of them
    (the config a results.json holds); a field left out has Config's default."""
    if not isinstance(cfg, dict):
        return cfg
    from common.config import Config, as_today

    return types.SimpleNamespace(**{**{f.name: f.default for f in dataclasses.fields(Config)},
                                    **as_today(cfg)})


def dataset_info(cfg) -> DatasetInfo:
    """The DatasetInfo of the data a run's config (a Config, any object with its fields, or a dict
    of them) trains on: what the model is built for (channels, classes, image size) and how the
    loaders normalise and augment it (--augment's crop, --flip). An image folder's classes are its
    class folders (`image_folder`, listed once per process)."""
    cfg = _fields(cfg)
    size = image_size(cfg)
    info = at_size(DATASET_INFO[cfg.dataset], cfg.dataset, size)
    classes = (len(image_folder(cfg.data_dir).classes) if cfg.dataset == "imagefolder"
               else info.classes)
    crop = cfg.augment if cfg.augment in CROPS else info.crop
    flip = info.flip if cfg.flip is None else cfg.flip
    if cfg.flip is None and cfg.dataset == "imagefolder":  # its flip goes with its crop (at_size)
        flip = crop == "resized"
    return dataclasses.replace(info, classes=classes, crop=crop, flip=flip)


# --augment auto: CIFAR's pad-and-crop for an image folder at this --image_size or less (a random
# resized crop of a small image keeps a few of its pixels), ImageNet's random resized crop above
AUTO_PAD_MAX = 64
CROPS = ("pad", "resized")  # what --augment names besides auto and off


def at_size(info: DatasetInfo, dataset: str, size: int) -> DatasetInfo:
    """A dataset's DatasetInfo at the image size `size`. An image folder is augmented at that
    size: --augment auto pads and crops it up to AUTO_PAD_MAX pixels (by an eighth of its side,
    CIFAR's 4 of 32), unmirrored, and takes mirrored random resized crops above. Small images are
    as often digits, letters, glyphs and icons, which a mirror turns into another class or none,
    as photographs: on 8-pixel digits a PyramidNet-8 trained with mirrors reached 82 %, without
    94 % (BENCHMARKS.md); --flip mirrors them. Photographs, large, are ImageNet's recipe. The other
    datasets keep theirs: pad-4 crops at their own size, resized after (mirrored but for MNIST)."""
    if dataset != "imagefolder":
        return dataclasses.replace(info, size=size)
    small = size <= AUTO_PAD_MAX
    return dataclasses.replace(info, size=size, crop="pad" if small else "resized",
                               flip=not small, pad=max(1, size // 8))


def augmentation(cfg) -> Augmentation | None:
    """The augmentation of a run's training images (None: --augment off): --augment's crop (auto:
    the dataset's at its image size, at_size) and --flip (default: the dataset's, at_size: not for
    mnist, nor for an image folder's pad crops)."""
    if _fields(cfg).augment in ("off", False):
        return None
    info = dataset_info(cfg)
    return Augmentation(info.crop, info.flip)


def explicit_augmentation(cfg):
    """The Config `cfg` with --augment auto and --flip's default made the crop and the flip they
    stand for at its image size: what results.json and a checkpoint record of a run."""
    chosen = augmentation(cfg)
    augment, flip = (chosen.crop, chosen.flip) if chosen else ("off", cfg.flip)
    return dataclasses.replace(cfg, augment=augment, flip=flip)


def describe_augmentation(cfg) -> str:
    """The augmentation a run applies, for its first line: `pad-4 crop and flip`, `random resized
    crop, no flip`, `off`."""
    chosen = augmentation(cfg)
    if chosen is None:
        return "off"
    crop = f"pad-{dataset_info(cfg).pad} crop" if chosen.crop == "pad" else "random resized crop"
    return f"{crop} and flip" if chosen.flip else f"{crop}, no flip"


def image_size(cfg) -> int:
    """The side of the images a run trains on: --image_size, else 224 for
    torchvision's models on synthetic data (the size they are made for), else the
    dataset's own (224 for an image folder)."""
    cfg = _fields(cfg)
    if cfg.image_size:
        return cfg.image_size
    if cfg.dataset == "synthetic" and cfg.model != "pyramidnet":
        return 224
    return DATASET_INFO[cfg.dataset].size


# ---- datasets ----
# .data uint8 (N, H, W, C) or (N, H, W), .targets (ints), .info; [i] is (PIL image, label)

class SyntheticCIFAR(Dataset):
    """CIFAR-10's shapes and dtype, generated in memory from the seed,
    never downloaded, and learnable.

    Each class is a smooth random colour pattern (a 4x4x3 grid upsampled to 32x32); an image is its
    class pattern with random contrast, brightness and pixel noise. The patterns depend only on the
    seed; train and test draw their samples from separate streams.

    At an `image_size` above SYNTHETIC_SIDE (32) the images are still generated at 32 pixels, and
    the loaders resize each batch (after its augmentation) to image_size: memory stays that of the
    32-pixel set (150 MB for 50,000 images, where 224-pixel ones would take 7.5 GB) and the 32-pixel
    set stays the same bits. Below 32 they are generated at image_size.

    The images are made GENERATED_TOGETHER at a time on one thread, from the same draws in the same
    order as all at once and with the same float32 ops: the same bits, without the whole set's
    float32 intermediates (600 MB each for 50,000 images)."""

    def __init__(self, size: int, seed: int, train: bool, transform=None,
                 image_size: int = SYNTHETIC_SIDE):
        self.info = dataclasses.replace(DATASET_INFO["synthetic"], size=image_size)
        classes, channels, side = (self.info.classes, self.info.channels,
                                   min(image_size, SYNTHETIC_SIDE))
        patterns = torch.rand(classes, channels, 4, 4,
                              generator=torch.Generator().manual_seed(seed))
        patterns = torch.nn.functional.interpolate(patterns, size=side, mode="bilinear",
                                                   align_corners=False)
        stream = torch.Generator().manual_seed(seed * 2 + (1 if train else 2))
        labels = torch.randint(classes, (size,), generator=stream)
        contrast = 0.6 + 0.4 * torch.rand(size, 1, 1, 1, generator=stream)
        brightness = 0.2 * torch.rand(size, 1, 1, 1, generator=stream) - 0.1
        self.data = np.empty((size, side, side, channels), dtype=np.uint8)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a piece is too small to share: threads would wait on each other
        try:
            for start in range(0, size, GENERATED_TOGETHER):  # the noise drawn on from the stream
                part = slice(start, min(start + GENERATED_TOGETHER, size))
                noise = torch.randn(part.stop - start, channels, side, side, generator=stream)
                # (pattern - 0.5) * contrast + 0.5 + brightness + 0.4 * noise, op by op in place
                images = patterns[labels[part]].sub_(0.5).mul_(contrast[part]).add_(0.5)
                images.add_(brightness[part]).add_(noise.mul_(0.4))
                images = images.clamp_(0, 1).mul_(255).round_().to(torch.uint8)
                self.data[part] = images.permute(0, 2, 3, 1).numpy()
        finally:
            torch.set_num_threads(threads)
        self.targets = labels.tolist()
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        from PIL import Image

        image = Image.fromarray(self.data[index])
        return (self.transform(image) if self.transform else image), self.targets[index]


def load_datasets(dataset: str, data_dir: str, synthetic_size: int, seed: int,
                  image_size: int | None = None, download: bool = True):
    """(train, test) datasets in torchvision's form, each with its DatasetInfo as `.info`
    (`.info.size`: image_size, default the dataset's own); CIFAR-10 and MNIST are downloaded into
    data_dir when missing, an image folder is read from data_dir/train and data_dir/val (every image
    checked first: `check_images`). CIFAR-10, MNIST and the synthetic set keep their own size: the
    loaders resize their batches to image_size."""
    if dataset not in DATASETS:
        raise UsageError(f"unknown dataset {dataset!r}: use "
                         f"{', '.join(DATASETS[:-1])} or {DATASETS[-1]}")
    torchvision()  # imported first here leaving the environment as it was (models/factory.py)
    size = image_size or DATASET_INFO[dataset].size
    if dataset == "synthetic":
        return (SyntheticCIFAR(synthetic_size, seed, train=True, image_size=size),
                SyntheticCIFAR(synthetic_size // 5, seed, train=False, image_size=size))
    if dataset == "imagefolder":
        return _image_folder_splits(data_dir, size)
    read = {"cifar10": _cifar10, "mnist": _mnist}[dataset]
    splits = (read(data_dir, train=True, download=download),
              read(data_dir, train=False, download=download))
    for split in splits:
        split.info = dataclasses.replace(DATASET_INFO[dataset], size=size)
    return splits


def _cifar10(data_dir: str, train: bool, download: bool):
    from torchvision import datasets
    from torchvision.datasets.utils import check_integrity

    root = Path(data_dir)
    folder = root / datasets.CIFAR10.base_folder
    try:
        return datasets.CIFAR10(str(root), train=train, download=download)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as error:
        reason = " ".join(str(error).split())[:160]
        archive = root / datasets.CIFAR10.filename
        if archive.is_file() and not check_integrity(str(archive), datasets.CIFAR10.tgz_md5):
            raise UsageError(f"CIFAR-10's archive {archive} is damaged (its MD5 is not "
                             "CIFAR-10's: cut short, or another file) and could not be "
                             f"downloaded again ({reason}): delete it, then run again to "
                             f"download it or put an intact copy from {CIFAR10_URL} there, or "
                             "run offline with --dataset synthetic") from None
        # files there, but unreadable or failing their md5
        if folder.is_dir() and any(folder.iterdir()):
            raise UsageError(f"CIFAR-10 in {folder} is corrupt or incomplete ({reason}): delete "
                             "that folder and run again to download it afresh (or put "
                             f"{CIFAR10_URL.rsplit('/', 1)[1]} into {root}/), or run offline "
                             "with --dataset synthetic") from None
        raise UsageError(
            f"CIFAR-10 could not be read from {root} or downloaded ({reason}): put "
            f"{CIFAR10_URL.rsplit('/', 1)[1]} from {CIFAR10_URL} into {root}/ (or its extracted "
            "cifar-10-batches-py/ folder), or run offline with --dataset synthetic") from None


def _mnist(data_dir: str, train: bool, download: bool):
    """torchvision reads <data_dir>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte; the .gz
    files put there are checked against their md5 and unpacked instead of downloaded."""
    from torchvision import datasets

    root = Path(data_dir)
    folder = root / "MNIST" / "raw"  # where datasets.MNIST looks (its raw_folder)
    try:
        dataset, side = (datasets.MNIST(str(root), train=train, download=download),
                         DATASET_INFO["mnist"].size)
        if (tuple(dataset.data.shape[1:]) != (side, side)
                or len(dataset.data) != len(dataset.targets)):  # unchecked
            raise ValueError(f"{len(dataset.targets)} labels for "
                             f"{tuple(dataset.data.shape)} images")
        return dataset
    # the IDX reader meets a cut or foreign file with any of these (its asserts included)
    except (OSError, RuntimeError, ValueError, EOFError, AssertionError, KeyError, TypeError,
            IndexError) as error:
        # a failed download: a line a mirror
        lines = [line for line in str(error).splitlines() if line.strip()]
        # the last mirror's error
        reason = " ".join(lines[-1].split())[:160] if lines else type(error).__name__
        files = ", ".join(name for name, _ in datasets.MNIST.resources)
        # files there, but unreadable or failing their md5
        if folder.is_dir() and any(folder.iterdir()):
            raise UsageError(f"MNIST in {folder} is corrupt or incomplete ({reason}): delete that "
                             f"folder and run again to download it afresh (or put {files} into "
                             f"{folder}/), or run offline with --dataset synthetic") from None
        raise UsageError(f"MNIST could not be read from {root} or downloaded ({reason}): put "
                         f"{files} from {datasets.MNIST.mirrors[0]} into {folder}/, or run offline "
                         "with --dataset synthetic") from None


# ---- an image folder ----
# DIR/train/<class>/* and DIR/val/<class>/*, read by torchvision's ImageFolder

CHECK_THREADS = 16  # files read at once by check_images: the reads wait on the disk, not on a core
TAIL = 4096  # bytes at the end of a PNG or JPEG where its end marker must be


def unreadable(path: str) -> str | None:
    """Why the image file `path` cannot be read (None: it can), found to its end: PIL identifies it
    from its first bytes; a PNG or JPEG, compressed, must end with its end marker (IEND, FFD9),
    which a file cut short lacks, and one that does not is decoded in full, and refused only if PIL
    cannot decode it (a JPEG with data after its end, as some phones write, is read). Every other
    format the loader reads (BMP, PPM, PGM, TIFF, WebP) has no end marker, and is decoded in full:
    for the uncompressed ones, a copy of their bytes."""
    from PIL import Image

    try:
        with Image.open(path) as image:  # reads the header only
            kind = image.format
        with open(path, "rb") as file:
            file.seek(max(0, os.path.getsize(path) - TAIL))
            tail = file.read()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return _reason(error, path)
    marker = {"PNG": b"IEND", "JPEG": b"\xff\xd9"}.get(kind)
    if marker is not None and marker in tail:
        return None
    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return _reason(error, path)
    return None


def _reason(error: Exception, path: str) -> str:
    """PIL's words for why `path` could not be read, without the path (the line names it once)."""
    text = " ".join(str(error).replace(repr(path), "").replace(path, "").split()).strip(" :")
    return text[:160] or type(error).__name__


def check_images(paths: list[str]) -> None:
    """Refuse the first of `paths` (in order) that cannot be read as an image, in one line, before
    anything is written: a file cut short, empty, or not an image. `unreadable` reads two small
    pieces of each PNG or JPEG and decodes the other formats, a few files at a time (they wait on
    the disk, or decode in PIL, which lets go of the GIL)."""
    # a task per 1024 files, not one per file
    parts = [paths[i:i + 1024] for i in range(0, len(paths), 1024)]
    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        checked = pool.map(lambda part: [unreadable(path) for path in part], parts)
        for part, reasons in zip(parts, checked):
            bad = next(((path, why) for path, why in zip(part, reasons) if why), None)
            if bad:
                raise UsageError(f"--dataset imagefolder: {bad[0]} cannot be read as an image "
                                 f"({bad[1]}): replace it with a readable image, or delete it")


def stored_side(size: int) -> int:
    """The side at which the gpu loader stores an image folder's training images: the evaluation's
    resize (image_size * 256 // 224, 256 for 224), where the random resized crops are drawn."""
    return size * 256 // 224


def evaluation_crop(image, size: int):
    """An image folder's evaluation image: the PIL image resized (its shorter side to image_size *
    256 // 224, bilinear with antialiasing) and centre-cropped to size x size."""
    from torchvision.transforms import functional

    return functional.center_crop(functional.resize(image, stored_side(size)), [size, size])


class FolderSplit(Dataset):
    """One split of an image folder (train/ or val/), its images as `image_folder` listed them
    (ImageFolder's classes and order, each file once) and read as torchvision's ImageFolder reads
    them (its default_loader: PIL, converted to RGB): [i] is (PIL RGB image, class index);
    .samples, .targets and .classes as ImageFolder's, .info the run's DatasetInfo."""

    def __init__(self, folder: Path, info: DatasetInfo):
        facts = image_folder(str(folder.parent))
        self.info, self.samples = info, list(facts.samples[folder.name])
        self.targets, self.classes = [target for _, target in self.samples], list(facts.classes)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        from PIL import Image
        from torchvision.datasets.folder import default_loader

        path, target = self.samples[index]
        try:
            return default_loader(path), target
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            raise UnreadableImage(f"{path} cannot be read as an image ({_reason(error, path)}): "
                                  "replace it with a readable image") from None

    def decoded(self, device: torch.device, augment: bool, num_workers: int | None):
        """Every image decoded once into uint8 (N, side, side, 3) on `device`, with the
        originals' (width, height) (N, 2) on the host: for random resized crops (`augment`) each
        image squashed to side = stored_side(image_size) (the crops are drawn there, crop_boxes),
        else its evaluation crop (side = image_size), which pad crops cut. Decoded by DataLoader
        workers, a slice at a time, so the host never holds the whole set."""
        side = stored_side(self.info.size) if augment else self.info.size
        images = torch.empty((len(self), side, side, 3), dtype=torch.uint8, device=device)
        sizes = torch.empty((len(self), 2), dtype=torch.int64)
        workers = default_num_workers() if num_workers is None else num_workers
        decoding = DataLoader(_Decoded(self, side, augment), batch_size=64, num_workers=workers)
        start = 0
        for pixels, originals, errors in decoding:
            bad = next((error for error in errors if error), None)
            if bad:
                raise UsageError(bad)
            images[start:start + len(pixels)] = pixels.to(device)
            sizes[start:start + len(pixels)] = originals
            start += len(pixels)
        return images, sizes


class _Decoded(Dataset):
    """The gpu loader's decoding of a FolderSplit: (uint8 (side, side, 3), (width, height), ""
    or the error's line); an image that cannot be decoded comes back as zeros with its error,
    which the main process raises."""

    def __init__(self, split: FolderSplit, side: int, augment: bool):
        self.split, self.side, self.augment = split, side, augment

    def __len__(self):
        return len(self.split)

    def __getitem__(self, index):
        from PIL import Image

        try:
            image, _ = self.split[index]
        except UnreadableImage as error:
            return np.zeros((self.side, self.side, 3), np.uint8), np.zeros(2, np.int64), \
                f"--dataset imagefolder: {error}, or delete it"
        width, height = image.size
        image = image.resize((self.side, self.side), Image.BILINEAR) if self.augment else \
            evaluation_crop(image, self.side)
        return np.array(image, dtype=np.uint8), np.array([width, height]), ""


def _image_folder_splits(data_dir: str, size: int) -> tuple[FolderSplit, FolderSplit]:
    facts = image_folder(data_dir)
    info = dataclasses.replace(at_size(DATASET_INFO["imagefolder"], "imagefolder", size),
                               classes=len(facts.classes))
    splits = tuple(FolderSplit(Path(data_dir) / split, info) for split in SPLITS)
    for split in splits:
        check_images([path for path, _ in split.samples])
    return splits


# ---- samplers ----

class ShuffleSampler(Sampler[int]):
    """One process's epoch order: a permutation seeded by seed + epoch, exactly DistributedSampler's
    with one replica, so a one-process run of every mode sees the same batches. The loader's
    start_epoch sets its epoch (follow_epoch)."""

    def __init__(self, size: int, shuffle: bool, seed: int):
        self.size, self.shuffle, self.seed, self.epoch = size, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.size))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self):
        return self.size


def follow_epoch(sampler, epoch: int) -> None:
    """A loader's start_epoch: a ShuffleSampler's order is that of the loader's epoch. Any other
    sampler's is its own (a DistributedSampler's: its set_epoch, which the process-group modes call
    themselves)."""
    if isinstance(sampler, ShuffleSampler):
        sampler.set_epoch(epoch)


class EvalShard(Sampler[int]):
    """Every `world_size`-th test index from `rank`: the shards cover the test set exactly once,
    with no padding, so summed over ranks the evaluation is the single-process one."""

    def __init__(self, size: int, rank: int = 0, world_size: int = 1):
        self.indices = range(rank, size, world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


# ---- augmentation: a function of (seed, epoch, image index), the same in both loaders ----

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


# ---- loaders: iterate (images, labels) on the device; start_epoch; len = batches per epoch ----

def make_loader(kind: str, dataset, sampler, batch_size: int, device: torch.device, *, train: bool,
                augment: Augmentation | bool | None, num_workers: int | None, seed: int,
                memory_format=torch.contiguous_format):
    """The training loader drops its last partial batch, so every step has the full global batch
    (and the same shapes, which cuDNN autotuning and torch.compile rely on), and augments its images
    as `augment` says (a run's: `augmentation`; True: the dataset's own at its size, DatasetInfo's
    crop and flip; None or False: not at all); an evaluation loader never augments. Batches come in
    `memory_format`. `num_workers` None: `default_num_workers()`. No loader depends on the rank: the
    sampler gives each rank its share."""
    options = dict(batch_size=batch_size, device=device, augment=augment if train else None,
                   drop_last=train, seed=seed, memory_format=memory_format)
    if kind == "gpu":
        return DeviceLoader(dataset, sampler, num_workers=num_workers, **options)
    if kind == "torchvision":
        return TorchvisionLoader(dataset, sampler, num_workers=num_workers, **options)
    raise UsageError(f"unknown loader {kind!r}: use gpu or torchvision")


# of the device's free memory, the most an image folder's decoded images may take by default
DEVICE_SHARE = 0.5
# why resolve_loader chose what it did, for the run's first line
_loader_notes: dict[tuple, str] = {}


def folder_bytes(cfg) -> int:
    """The bytes the gpu loader holds for an image folder (uint8): its training images at
    stored_side(image_size) for random resized crops (image_size otherwise) and its validation
    images at image_size."""
    images, size = image_folder(cfg.data_dir).images, image_size(cfg)
    chosen = augmentation(cfg)
    train_side = stored_side(size) if chosen and chosen.crop == "resized" else size
    return 3 * (images["train"] * train_side ** 2 + images["val"] * size ** 2)


def resolve_loader(cfg, device: torch.device) -> str:
    """--loader, else the default for this device: torchvision on the CPU; on a GPU the gpu loader,
    except for an image folder whose decoded images would take more than DEVICE_SHARE (half) of the
    memory free on the device now, before the model: the rest is the model's, its activations' and
    the optimizer's. An image folder asked to go on the device (--loader gpu) where it cannot fit
    (all the free memory; the host's, on the CPU) is refused."""
    if cfg.dataset != "imagefolder":
        return cfg.loader or ("gpu" if device.type == "cuda" else "torchvision")
    if cfg.loader == "torchvision" or cfg.loader is None and device.type != "cuda":
        return "torchvision"
    need = folder_bytes(cfg)
    free = (torch.cuda.mem_get_info(device)[0] if device.type == "cuda"
            else physical_memory() or need)
    place = "free on " + str(device) if device.type == "cuda" else "of memory on this machine"
    where = f"{_memory(free)} {place}"
    if cfg.loader == "gpu" and need > free:
        raise UsageError(f"--loader gpu: the image folder's decoded images take {_memory(need)}, "
                         f"more than the {where}: leave out --loader (the torchvision loader reads "
                         "them from disk), or give a smaller --image_size")
    if cfg.loader == "gpu":
        kind, note = "gpu", f"{_memory(need)} of decoded images on {device}"
    elif need <= DEVICE_SHARE * free:
        kind, note = "gpu", f"{_memory(need)} of decoded images, at most half of the {where}"
    else:
        kind = "torchvision"
        note = f"the decoded images would take {_memory(need)}, more than half of the {where}"
    _loader_notes[cfg.data_dir, image_size(cfg), augmentation(cfg), kind] = note
    return kind


def loader_description(cfg) -> str:
    """The loader a run uses, for its first line: `gpu loader`, with resolve_loader's reason for an
    image folder's."""
    note = _loader_notes.get((cfg.data_dir, image_size(cfg), augmentation(cfg), cfg.loader))
    return f"{cfg.loader} loader" + (f" ({note})" if note and cfg.dataset == "imagefolder" else "")


def _memory(size: float) -> str:
    return f"{size / 2**30:,.3g} GiB" if size >= 2**30 else f"{size / 2**20:,.3g} MiB"


def _chosen(augment: Augmentation | bool | None, info: DatasetInfo) -> Augmentation | None:
    """A loader's `augment` as an Augmentation: True is the dataset's own at its size (its
    DatasetInfo's crop and flip), None or False none."""
    if augment is True:
        return Augmentation(info.crop, info.flip)
    return augment or None


# DataLoader workers per training process by default: enough to keep up with CIFAR-sized images
MAX_WORKERS = 4


def default_num_workers() -> int:
    """Workers per training process when --num_workers is not given: the cores this process may use,
    shared among the node's training processes (LOCAL_WORLD_SIZE; WORLD_SIZE on a launch without it,
    which is one node), less one core of each share for the process itself, at most MAX_WORKERS.
    Never above the usable cores, where the DataLoader warns of too many workers. 2 cores: 1 worker
    for one process, none for two."""
    cores, processes = _usable_cores(), _processes_on_this_node()
    return max(0, min(MAX_WORKERS, cores // processes - 1))


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _processes_on_this_node() -> int:
    return max(int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))), 1)


# torch's DataLoader warns of more workers than cores in every process, for every loader
# (twice a run, per rank): the run says it once instead, from its first process, when
# training starts (after every refusal).
warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker processes",
                        category=UserWarning)
_warned: set[str] = set()  # what this process has warned of


def _say_once_if_too_many(num_workers: int) -> None:
    cores, processes = _usable_cores(), _processes_on_this_node()
    if (num_workers * processes <= cores or "workers" in _warned
            or os.environ.get("RANK", "0") != "0"):
        return
    _warned.add("workers")
    print(f"warning: --num_workers {num_workers} in each of {processes} process(es) is more than "
          f"the {cores} usable cores: the workers will compete with training for them; leave "
          "--num_workers out to fit the machine",
          file=sys.stderr, flush=True)


class DeviceLoader:
    """The `gpu` loader: the uint8 dataset is copied to the device once; each batch is one
    gather with the random crop and flip (where the dataset allows one) folded into its
    indices, then a normalisation. No worker processes, no host round trip. Images stored at
    another size than the run's are resized after their crop (`resized`). An image folder is
    decoded once into the device's memory (FolderSplit.decoded, DataLoader workers,
    `num_workers` of them); its training crops are random resized crops of the stored images,
    all of a batch in one torchvision.ops.roi_align."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed,
                 num_workers=None, memory_format=torch.contiguous_format):
        self.sampler, self.batch_size, self.device = sampler, batch_size, device
        self.memory_format = memory_format
        self.augment = augment = _chosen(augment, dataset.info)
        self.drop_last, self.seed = drop_last, seed
        self.epoch, self.skip = 0, 0
        self.size, self.pad = dataset.info.size, dataset.info.pad
        self.crop = augment.crop if augment is not None else None
        # an image folder: decoded once, (width, height) of the originals kept
        if isinstance(dataset, FolderSplit):
            images, self.originals = dataset.decoded(device, self.crop == "resized", num_workers)
        else:
            images = torch.as_tensor(np.asarray(dataset.data)).to(device)
            # (N, H, W, C) uint8; greyscale (N, H, W) gets C = 1
            images = images.reshape(*images.shape[:3], -1)
            # stored at their own size: their random resized crops are drawn there
            self.originals = torch.tensor([[images.shape[2], images.shape[1]]]).expand(len(images),
                                                                                       2)
        self.height, self.width = images.shape[1], images.shape[2]
        pad = self.pad
        self.images = (torch.nn.functional.pad(images, (0, 0, pad, pad, pad, pad))
                       if self.crop == "pad" else images)
        self.labels = torch.as_tensor(dataset.targets, dtype=torch.int64).to(device)
        self.mean = torch.tensor(dataset.info.mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(dataset.info.std, device=device).view(1, -1, 1, 1) * 255

    def start_epoch(self, epoch: int, skip: int = 0) -> None:
        """Iterate epoch `epoch`'s augmentation from its batch `skip` on (a resumed run:
        those were consumed before), in a ShuffleSampler's order of the epoch
        (follow_epoch) or another sampler's."""
        follow_epoch(self.sampler, epoch)
        self.epoch, self.skip = epoch, skip

    def __len__(self):
        size = len(self.sampler)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def __iter__(self):
        # one copy per epoch
        order = torch.tensor(list(self.sampler), dtype=torch.int64).to(self.device)
        pad = self.crop == "pad"
        crop = self._pad_crops if pad else self._resized_crops
        # the epoch's crops and flips of every image, one copy per epoch, gathered by index
        if self.augment:
            draws = self._pad_draws() if pad else self._resized_draws()
        for start in range(self.skip * self.batch_size, len(self) * self.batch_size,
                           self.batch_size):
            index = order[start:start + self.batch_size]
            if self.augment:
                images = crop(index, draws)
            else:
                images = self.images[index].permute(0, 3, 1, 2).contiguous(
                    memory_format=self.memory_format)
            if images.shape[-1] != self.size:  # stored at another size: resized after the crop
                images = resized(images.float(), self.size).contiguous(
                    memory_format=self.memory_format)
            yield images.float().sub_(self.mean).div_(self.std), self.labels[index]

    def _pad_draws(self):
        return tuple(torch.from_numpy(draw).to(self.device) for draw in
                     augmentation_draws(self.seed, self.epoch, len(self.labels), self.augment.flip,
                                        self.pad))

    def _pad_crops(self, index, draws):
        """pad-4 random crops + horizontal flips of the images `index`, as row/column indices into
        the padded images (uint8 NCHW)."""
        top, left, flip = draws
        row_range = torch.arange(self.height, device=self.device)
        col_range = torch.arange(self.width, device=self.device)
        rows = top[index, None] + row_range
        cols = left[index, None] + torch.where(flip[index, None], self.width - 1 - col_range,
                                               col_range)
        images = self.images[index[:, None, None], rows[:, :, None], cols[:, None, :]]
        # NHWC is channels_last
        return images.permute(0, 3, 1, 2).contiguous(memory_format=self.memory_format)

    def _resized_draws(self):
        """The epoch's boxes (x1, y1, x2, y2 in stored pixels) and flips of every
        image: each box crop_boxes's in its original's pixels (the torchvision
        loader's), scaled to the stored side."""
        area, aspect, down, across, mirrored = resized_crop_draws(self.seed, self.epoch,
                                                                  len(self.labels),
                                                                  self.augment.flip)
        widths, heights = self.originals.numpy().T
        top, left, height, width = crop_boxes((area, aspect, down, across), widths, heights)
        across_scale, down_scale = self.width / widths, self.height / heights
        boxes = np.stack([left * across_scale, top * down_scale, (left + width) * across_scale,
                          (top + height) * down_scale], axis=1)
        return (torch.from_numpy(boxes).to(self.device, torch.float32),
                torch.from_numpy(mirrored).to(self.device))

    def _resized_crops(self, index, draws):
        """Random resized crops + horizontal flips of the stored images `index` (float NCHW,
        image_size pixels), cut and resized by roi_align, which averages ceil(box / image_size)
        bilinear samples per pixel each way (antialiased where it shrinks)."""
        from torchvision.ops import roi_align

        boxes, mirrored = draws
        images = self.images[index].permute(0, 3, 1, 2).float()
        batch = torch.arange(len(index), device=self.device, dtype=torch.float32)[:, None]
        crops = roi_align(images, torch.cat([batch, boxes[index]], dim=1), output_size=self.size,
                          spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        crops = torch.where(mirrored[index, None, None, None], crops.flip(-1), crops)
        return crops.contiguous(memory_format=self.memory_format)


class LoaderWorkerDied(RuntimeError):
    """A DataLoader worker process ended (killed by the OOM killer, say):
    the run can stop as if asked to."""


class UnreadableImage(LoaderWorkerDied):
    """An image of an image folder that PIL could not decode while training (one that
    passed check_images): the run stops as for a dead worker. Raised in a DataLoader
    worker, re-raised by the DataLoader in the main process with the worker's traceback,
    of which it keeps its own line."""

    def __init__(self, message: str):
        # re-raised by the DataLoader: the last line is this error's own
        if "Original Traceback" in message:
            message = message.rstrip().splitlines()[-1].split(f"{type(self).__name__}: ", 1)[-1]
        super().__init__(message)


class TorchvisionLoader:
    """The classic path: a DataLoader whose workers decode PIL images and run
    torchvision transforms, pinned memory, persistent workers; batches are copied to the
    device without blocking the host.

    Resuming mid-epoch needs no worker state (torchdata's StatefulDataLoader saves it; not used
    here): the augmentation is a function of (seed, epoch, image index), which the sampler hands to
    the workers with each index, so skipping the consumed batches in the sampler is the whole
    resume, with no extra dependency and the same crops and flips as the gpu loader."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed,
                 num_workers, memory_format=torch.contiguous_format):
        self.num_workers = num_workers = (default_num_workers() if num_workers is None
                                          else num_workers)
        self.sampler, self.batch_size, self.device = sampler, batch_size, device
        self.memory_format = memory_format
        self.indices = _EpochIndices(sampler, batch_size)
        self.batches = len(sampler) // batch_size if drop_last else -(-len(sampler) // batch_size)
        self.loader = DataLoader(
            _Transformed(dataset, seed, _chosen(augment, dataset.info)), batch_size=batch_size,
            sampler=self.indices, num_workers=num_workers, drop_last=drop_last,
            pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
            worker_init_fn=functools.partial(_leave_stopping_to_the_main_process, os.getpid()),
            # draws the workers' base seed: the global RNG is left alone
            generator=torch.Generator().manual_seed(seed))

    def start_epoch(self, epoch: int, skip: int = 0) -> None:
        """As DeviceLoader.start_epoch: the epoch's augmentation from batch `skip` on."""
        follow_epoch(self.sampler, epoch)
        self.indices.start_epoch(epoch, skip)

    def __len__(self):
        # batches in a whole epoch, skipped ones included, as DeviceLoader counts them
        return self.batches

    def __iter__(self):
        from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

        _say_once_if_too_many(self.num_workers)
        try:
            batches = iter(self.loader)
            _defer_worker_failures()
            for images, labels in batches:
                yield (images.to(self.device, non_blocking=True, memory_format=self.memory_format),
                       labels.to(self.device, non_blocking=True))
                # a worker that died during the step just taken: raised here
                _error_if_any_worker_fails()
        except RuntimeError as error:  # the DataLoader's own words for a worker that is gone
            if not str(error).startswith("DataLoader worker (pid"):
                raise
            message = " ".join(str(error).split()).split(". ")[0].rstrip(".")
            raise LoaderWorkerDied(message) from None


def _leave_stopping_to_the_main_process(main_process: int, worker_id: int) -> None:
    """Ctrl-C and a closed terminal signal the whole foreground process group and SLURM every
    process: a worker that ended on SIGINT, SIGHUP, SIGUSR1 or SIGTERM would make the main process
    fail ("DataLoader worker exited unexpectedly") before it wrote its stop checkpoint. So a worker
    ignores them all, except a SIGTERM from its own main process: that is how multiprocessing ends
    the workers when the main process exits (and then waits for them). The main process is named by
    its pid, not as the worker's parent, which under the forkserver and spawn start methods is
    another process. An orphaned worker exits by itself (torch's watchdog, within 5 s)."""
    # the other stop signals (StopSignals)
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(number, signal.SIG_IGN)
    # Linux; elsewhere (macOS) SIGTERM ends a worker as torch lets it
    if hasattr(signal, "sigwaitinfo"):
        # threads started from here on inherit it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(target=_exit_on_the_main_process_sigterm, args=(main_process,),
                         daemon=True).start()


def _exit_on_the_main_process_sigterm(main_process: int) -> None:
    # the sender, which a handler is not told
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != main_process:
        pass
    os._exit(0)  # as torch's own handler does on its main process's SIGTERM


def _defer_worker_failures() -> None:
    """torch's SIGCHLD handler raises a dead worker's error wherever the main thread is, mid-step
    too (with some BatchNorm statistics or parameters updated and others not). Without it
    TorchvisionLoader.__iter__ finds the death when the next batch is asked for (and the DataLoader
    within 5 s while it waits for one), between steps. torch sets the handler once per process, from
    the main thread (and chains to a previous Python handler, which these scripts lack)."""
    from torch.utils.data._utils import signal_handling

    handler = signal.getsignal(signal.SIGCHLD)
    if (getattr(handler, "__module__", None) == signal_handling.__name__
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


class _Transformed(Dataset):
    """The torchvision loader's dataset: item (epoch, index) is image `index` as a PIL image (an
    image folder's: its evaluation crop, but for random resized crops, cut from the original),
    augmented as `augment` says for that epoch: padded, cropped and flipped as
    `augmentation_draws` says, or a random resized crop and flip as `resized_crop_draws` and
    `crop_boxes` say (torchvision's resized_crop, bilinear, antialiased); then ToTensor and
    Normalize. Stored at another size than the run's, resized after the crop as the gpu loader
    resizes (`resized`, then its normalisation). Each worker keeps the draws of the epoch it is in
    (persistent workers hold their own copy of this object)."""

    def __init__(self, dataset, seed: int, augment: Augmentation | None):
        from torchvision import transforms

        self.dataset, self.seed, self.augment, self.info = dataset, seed, augment, dataset.info
        self.folder = isinstance(dataset, FolderSplit)
        normalize = transforms.Normalize(dataset.info.mean, dataset.info.std)
        self.normalise = transforms.Compose([transforms.ToTensor(), normalize])
        # the gpu loader's normalisation
        self.mean = torch.tensor(dataset.info.mean).view(-1, 1, 1) * 255
        self.std = torch.tensor(dataset.info.std).view(-1, 1, 1) * 255
        self.epoch, self.draws = None, None

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        from torchvision.transforms import functional

        epoch, index = item
        image, label = self.dataset[index]
        crop = self.augment.crop if self.augment is not None else None
        if crop and epoch != self.epoch:
            draw = resized_crop_draws if crop == "resized" else functools.partial(
                augmentation_draws, pad=self.info.pad)
            self.epoch, self.draws = epoch, draw(self.seed, epoch, len(self.dataset),
                                                 self.augment.flip)
        if self.folder and crop != "resized":
            image = evaluation_crop(image, self.info.size)
        if crop == "resized":
            image = self._resized_crop(image, index)
        elif crop == "pad":
            top, left, flip = (int(draws[index]) for draws in self.draws)
            side = image.size[0]  # square, stored at its own size
            image = functional.crop(functional.pad(image, self.info.pad), top, left, side, side)
            image = functional.hflip(image) if flip else image
        if image.size[0] == self.info.size:
            return self.normalise(image), label
        # (C, h, w) in 0..255, as the gpu loader holds them
        pixels = functional.pil_to_tensor(image).float()
        return (resized(pixels[None], self.info.size)[0] - self.mean) / self.std, label

    def _resized_crop(self, image, index: int):
        from torchvision.transforms import functional

        area, aspect, down, across, mirrored = (draws[index] for draws in self.draws)
        box = crop_boxes((area, aspect, down, across), *image.size)
        top, left, height, width = (int(value) for value in box)
        size = [self.info.size, self.info.size]
        image = functional.resized_crop(image, top, left, height, width, size, antialias=True)
        return functional.hflip(image) if mirrored else image


class _EpochIndices(Sampler[tuple[int, int]]):
    """A sampler's epoch as (epoch, index) pairs, without its first `skip` batches (a
    resumed run's first epoch): the epoch travels with each index to the workers, whose
    copies of the dataset never see the epoch."""

    def __init__(self, sampler, batch_size: int):
        self.sampler, self.batch_size, self.epoch, self.skip = sampler, batch_size, 0, 0

    def start_epoch(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self):
        indices = iter(self.sampler)
        for _ in range(self.skip * self.batch_size):
            next(indices)
        return ((self.epoch, index) for index in indices)

    def __len__(self):
        return len(self.sampler) - self.skip * self.batch_size
