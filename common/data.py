"""The datasets a run can train on, and what the model and the loaders must know of each: its
DatasetInfo (the images' shape, the classes, the statistics that normalise them, the crop and flip
that suit them), a run's at its image size (`dataset_info`, `image_size`), and the datasets
themselves in torchvision's form (`load_datasets`): the synthetic set generated in memory, CIFAR-10
and MNIST read by torchvision (downloaded when missing), and an image folder's two splits
(common/folders.py)."""
from __future__ import annotations

import dataclasses
import pickle
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from common.config import DATASETS
from common.errors import UsageError
from common.folders import SPLITS, FolderSplit, check_images, image_folder
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


DATASET_INFO = {
    "cifar10": DatasetInfo(3, 32, 10, CIFAR10_MEAN, CIFAR10_STD, flip=True),
    "mnist": DatasetInfo(1, 28, 10, (0.1307,), (0.3081,), flip=False),
    # CIFAR-10's shapes and statistics
    "synthetic": DatasetInfo(3, 32, 10, CIFAR10_MEAN, CIFAR10_STD, flip=True),
    "imagefolder": DatasetInfo(3, 224, None, IMAGENET_MEAN, IMAGENET_STD, flip=True,
                               crop="resized"),
}  # one entry per common.config.DATASETS


def config_fields(cfg):
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
    cfg = config_fields(cfg)
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


def image_size(cfg) -> int:
    """The side of the images a run trains on: --image_size, else 224 for
    torchvision's models on synthetic data (the size they are made for), else the
    dataset's own (224 for an image folder)."""
    cfg = config_fields(cfg)
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


def _image_folder_splits(data_dir: str, size: int) -> tuple[FolderSplit, FolderSplit]:
    facts = image_folder(data_dir)
    info = dataclasses.replace(at_size(DATASET_INFO["imagefolder"], "imagefolder", size),
                               classes=len(facts.classes))
    splits = tuple(FolderSplit(Path(data_dir) / split, info) for split in SPLITS)
    for split in splits:
        check_images([path for path, _ in split.samples])
    return splits
