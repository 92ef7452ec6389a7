"""Datasets, samplers and the two loaders: the one data path every mode shares.

Both loaders draw indices from a torch Sampler, so the epoch order depends only on the seed and the epoch:
`ShuffleSampler` (one process) gives exactly the order of `DistributedSampler` with one replica, and each mode
calls `set_epoch` every epoch. Batches come out on the device, normalised, as (float images NCHW, int64 labels).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from common.config import DATASETS, UsageError

PAD = 4  # pixels of zero padding around an image before its random crop
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"


@dataclass(frozen=True)
class DatasetInfo:
    """What the model and the loaders need to know of a dataset: its images' shape, its classes, the per-channel
    mean and std (of pixels scaled to [0, 1]) that normalise it, and whether a mirror image is still an image of
    the same class (a flipped digit is not)."""
    channels: int
    size: int  # square images of size x size pixels
    classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool


DATASET_INFO = {
    "cifar10": DatasetInfo(3, 32, 10, CIFAR10_MEAN, CIFAR10_STD, flip=True),
    "mnist": DatasetInfo(1, 28, 10, (0.1307,), (0.3081,), flip=False),
    "synthetic": DatasetInfo(3, 32, 10, CIFAR10_MEAN, CIFAR10_STD, flip=True),  # CIFAR-10's shapes and statistics
}  # one entry per common.config.DATASETS


# ---- datasets: .data uint8 (N, H, W, C) or (N, H, W), .targets (ints), .info, .transform (PIL in) ----

class SyntheticCIFAR(Dataset):
    """CIFAR-10's shapes and dtype, generated in memory from the seed, never downloaded, and learnable.

    Each class is a smooth random colour pattern (a 4x4x3 grid upsampled to 32x32); an image is its class pattern
    with random contrast, brightness and pixel noise. The patterns depend only on the seed; train and test draw
    their samples from separate streams.
    """

    info = DATASET_INFO["synthetic"]

    def __init__(self, size: int, seed: int, train: bool, transform=None):
        classes, channels, side = self.info.classes, self.info.channels, self.info.size
        patterns = torch.rand(classes, channels, 4, 4, generator=torch.Generator().manual_seed(seed))
        patterns = torch.nn.functional.interpolate(patterns, size=side, mode="bilinear", align_corners=False)
        stream = torch.Generator().manual_seed(seed * 2 + (1 if train else 2))
        labels = torch.randint(classes, (size,), generator=stream)
        contrast = 0.6 + 0.4 * torch.rand(size, 1, 1, 1, generator=stream)
        brightness = 0.2 * torch.rand(size, 1, 1, 1, generator=stream) - 0.1
        noise = 0.4 * torch.randn(size, channels, side, side, generator=stream)
        images = (patterns[labels] - 0.5) * contrast + 0.5 + brightness + noise
        self.data = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
        self.targets = labels.tolist()
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        from PIL import Image

        image = Image.fromarray(self.data[index])
        return (self.transform(image) if self.transform else image), self.targets[index]


def load_datasets(dataset: str, data_dir: str, synthetic_size: int, seed: int, download: bool = True):
    """(train, test) datasets in torchvision's form, each with its DatasetInfo as `.info`; CIFAR-10 and MNIST are
    downloaded into data_dir when missing."""
    if dataset == "synthetic":
        return (SyntheticCIFAR(synthetic_size, seed, train=True),
                SyntheticCIFAR(synthetic_size // 5, seed, train=False))
    read = {"cifar10": _cifar10, "mnist": _mnist}.get(dataset)
    if read is None:
        raise UsageError(f"unknown dataset {dataset!r}: use {', '.join(DATASETS[:-1])} or {DATASETS[-1]}")
    splits = read(data_dir, train=True, download=download), read(data_dir, train=False, download=download)
    for split in splits:
        split.info = DATASET_INFO[dataset]
    return splits


def _cifar10(data_dir: str, train: bool, download: bool):
    from torchvision import datasets

    root = Path(data_dir)
    folder = root / datasets.CIFAR10.base_folder
    try:
        return datasets.CIFAR10(str(root), train=train, download=download)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as error:
        reason = " ".join(str(error).split())[:160]
        if folder.is_dir() and any(folder.iterdir()):  # files there, but unreadable or failing their md5
            raise UsageError(f"CIFAR-10 in {folder} is corrupt or incomplete ({reason}): delete that folder and "
                             f"run again to download it afresh (or put {CIFAR10_URL.rsplit('/', 1)[1]} into "
                             f"{root}/), or run offline with --dataset synthetic") from None
        raise UsageError(
            f"CIFAR-10 could not be read from {root} or downloaded ({reason}): put {CIFAR10_URL.rsplit('/', 1)[1]} "
            f"from {CIFAR10_URL} into {root}/ (or its extracted cifar-10-batches-py/ folder), "
            f"or run offline with --dataset synthetic") from None


def _mnist(data_dir: str, train: bool, download: bool):
    """torchvision reads <data_dir>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte; the .gz files put there
    are checked against their md5 and unpacked instead of downloaded."""
    from torchvision import datasets

    root = Path(data_dir)
    folder = root / "MNIST" / "raw"  # where datasets.MNIST looks (its raw_folder)
    try:
        dataset, side = datasets.MNIST(str(root), train=train, download=download), DATASET_INFO["mnist"].size
        if tuple(dataset.data.shape[1:]) != (side, side) or len(dataset.data) != len(dataset.targets):  # unchecked
            raise ValueError(f"{len(dataset.targets)} labels for {tuple(dataset.data.shape)} images")
        return dataset
    # the IDX reader meets a cut or foreign file with any of these (its asserts included)
    except (OSError, RuntimeError, ValueError, EOFError, AssertionError, KeyError, TypeError, IndexError) as error:
        lines = [line for line in str(error).splitlines() if line.strip()]  # a failed download: a line a mirror
        reason = " ".join(lines[-1].split())[:160] if lines else type(error).__name__  # the last mirror's error
        files = ", ".join(name for name, _ in datasets.MNIST.resources)
        if folder.is_dir() and any(folder.iterdir()):  # files there, but unreadable or failing their md5
            raise UsageError(f"MNIST in {folder} is corrupt or incomplete ({reason}): delete that folder and run "
                             f"again to download it afresh (or put {files} into {folder}/), or run offline with "
                             f"--dataset synthetic") from None
        raise UsageError(f"MNIST could not be read from {root} or downloaded ({reason}): put {files} from "
                         f"{datasets.MNIST.mirrors[0]} into {folder}/, or run offline with --dataset synthetic") \
            from None


# ---- samplers ----

class ShuffleSampler(Sampler[int]):
    """One process's epoch order: a permutation seeded by seed + epoch, exactly DistributedSampler's with one
    replica, so a one-process run of every mode sees the same batches."""

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


class EvalShard(Sampler[int]):
    """Every `world_size`-th test index from `rank`: the shards cover the test set exactly once, with no padding,
    so summed over ranks the evaluation is the single-process one."""

    def __init__(self, size: int, rank: int = 0, world_size: int = 1):
        self.indices = range(rank, size, world_size)

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


# ---- loaders: iterate (images, labels) on the device; set_epoch; len = batches per epoch ----

def make_loader(kind: str, dataset, sampler, batch_size: int, device: torch.device, *, train: bool, augment: bool,
                num_workers: int, seed: int, rank: int = 0, memory_format=torch.contiguous_format):
    """The training loader drops its last partial batch, so every step has the full global batch (and the same
    shapes, which cuDNN autotuning and torch.compile rely on). Batches come in `memory_format`."""
    options = dict(batch_size=batch_size, device=device, augment=train and augment, drop_last=train,
                   seed=seed, rank=rank, memory_format=memory_format)
    if kind == "gpu":
        return DeviceLoader(dataset, sampler, **options)
    if kind == "torchvision":
        return TorchvisionLoader(dataset, sampler, num_workers=num_workers, **options)
    raise UsageError(f"unknown loader {kind!r}: use gpu or torchvision")


def _augmentation_seed(seed: int, epoch: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


class DeviceLoader:
    """The `gpu` loader: the uint8 dataset is copied to the device once; each batch is one gather with the random
    crop and flip (where the dataset allows one) folded into its indices, then a normalisation. No worker
    processes, no host round trip."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed, rank,
                 memory_format=torch.contiguous_format):
        self.sampler, self.batch_size, self.device, self.memory_format = sampler, batch_size, device, memory_format
        self.augment, self.drop_last, self.seed, self.rank, self.epoch, self.skip = augment, drop_last, seed, rank, 0, 0
        images = torch.as_tensor(np.asarray(dataset.data)).to(device)
        images = images.reshape(*images.shape[:3], -1)  # (N, H, W, C) uint8; greyscale (N, H, W) gets C = 1
        self.height, self.width, self.flip = images.shape[1], images.shape[2], dataset.info.flip
        self.images = torch.nn.functional.pad(images, (0, 0, PAD, PAD, PAD, PAD)) if augment else images
        self.labels = torch.as_tensor(dataset.targets, dtype=torch.int64).to(device)
        self.mean = torch.tensor(dataset.info.mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(dataset.info.std, device=device).view(1, -1, 1, 1) * 255
        self.generator = torch.Generator(device=device)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Iterate epoch `epoch` from its batch `skip` on (a resumed run: those were consumed before)."""
        self.epoch, self.skip = epoch, skip
        self.sampler.set_epoch(epoch)

    def __len__(self):
        size = len(self.sampler)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def _crop_and_flip(self, n: int):
        top, left = torch.randint(0, 2 * PAD + 1, (2, n, 1), device=self.device, generator=self.generator)
        if not self.flip:  # a mirrored digit is no digit: such datasets are never flipped
            return top, left, None
        flip = torch.rand(n, 1, device=self.device, generator=self.generator) < 0.5
        return top, left, flip

    def __iter__(self):
        self.generator.manual_seed(_augmentation_seed(self.seed, self.epoch, self.rank))
        row_range = torch.arange(self.height, device=self.device)
        col_range = torch.arange(self.width, device=self.device)
        order = torch.tensor(list(self.sampler), dtype=torch.int64).to(self.device)  # one copy per epoch
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = order[start:start + self.batch_size]
            if start < self.skip * self.batch_size:  # consumed before a resume: its random draws, no batch
                if self.augment:
                    self._crop_and_flip(index.shape[0])
                continue
            if self.augment:  # pad-4 random crop + horizontal flip, as row/column indices into the padded images
                top, left, flip = self._crop_and_flip(index.shape[0])
                rows = top + row_range
                cols = left + (col_range if flip is None else torch.where(flip, self.width - 1 - col_range, col_range))
                images = self.images[index[:, None, None], rows[:, :, None], cols[:, None, :]]
            else:
                images = self.images[index]
            images = images.permute(0, 3, 1, 2).contiguous(memory_format=self.memory_format)  # NHWC is channels_last
            yield images.float().sub_(self.mean).div_(self.std), self.labels[index]


class TorchvisionLoader:
    """The classic path: a DataLoader whose workers decode PIL images and run torchvision transforms, pinned
    memory, persistent workers; batches are copied to the device without blocking the host."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed, rank, num_workers,
                 memory_format=torch.contiguous_format):
        from torchvision import transforms

        info = dataset.info
        steps = [transforms.RandomCrop(info.size, padding=PAD)] if augment else []
        steps += [transforms.RandomHorizontalFlip()] if augment and info.flip else []  # never a mirrored digit
        dataset.transform = transforms.Compose(
            steps + [transforms.ToTensor(), transforms.Normalize(info.mean, info.std)])
        self.sampler, self.device, self.memory_format = _Skipping(sampler, batch_size), device, memory_format
        self.batches = len(sampler) // batch_size if drop_last else -(-len(sampler) // batch_size)
        self.loader = DataLoader(
            dataset, batch_size=batch_size, sampler=self.sampler, num_workers=num_workers, drop_last=drop_last,
            pin_memory=device.type == "cuda", persistent_workers=num_workers > 0,
            generator=torch.Generator().manual_seed(_augmentation_seed(seed, 0, rank)))

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip)

    def __len__(self):  # batches in a whole epoch, skipped ones included, as DeviceLoader counts them
        return self.batches

    def __iter__(self):
        for images, labels in self.loader:
            yield (images.to(self.device, non_blocking=True, memory_format=self.memory_format),
                   labels.to(self.device, non_blocking=True))


class _Skipping(Sampler[int]):
    """A sampler's epoch without its first `skip` batches, for a resumed run's first epoch."""

    def __init__(self, sampler, batch_size: int):
        self.sampler, self.batch_size, self.skip = sampler, batch_size, 0

    def set_epoch(self, epoch: int, skip: int) -> None:
        self.sampler.set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        indices = iter(self.sampler)
        for _ in range(self.skip * self.batch_size):
            next(indices)
        return indices

    def __len__(self):
        return len(self.sampler) - self.skip * self.batch_size
