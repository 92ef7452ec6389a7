"""Datasets, samplers and the two loaders: the one data path every mode shares.

Both loaders draw indices from a torch Sampler, so the epoch order depends only on the seed and the epoch:
`ShuffleSampler` (one process) gives exactly the order of `DistributedSampler` with one replica, and each mode
calls the sampler's `set_epoch` every epoch, then the loader's `start_epoch` (the epoch's augmentation, and where a
resumed epoch goes on). Batches come out on the device, normalised, as (float images NCHW, int64 labels).

The augmentation (pad-4 random crop, horizontal flip) is a function of (seed, epoch, image index), drawn for the
whole dataset at once by `augmentation_draws`: an image is cropped and flipped alike in an epoch whatever the
loader, the number of DataLoader workers or processes, or a resume in between. The two loaders' batches then
differ only in the rounding of the normalisation, by at most one float32 ulp (2**-22 for values in [2, 4)).
"""
from __future__ import annotations

import functools
import os
import pickle
import signal
import sys
import threading
import warnings
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


# ---- datasets: .data uint8 (N, H, W, C) or (N, H, W), .targets (ints), .info; [i] is (PIL image, label) ----

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

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


# ---- augmentation: a function of (seed, epoch, image index), the same in both loaders ----

def augmentation_draws(seed: int, epoch: int, size: int, flip: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top, left, flip) of every image of a `size`-image dataset in epoch `epoch`: the offsets of its crop (of the
    image's own size) from the image padded by PAD on every side, and whether the crop is mirrored (never where
    `flip` is False). Indexed by the dataset index: neither the loader, the worker, the rank nor a resume enters."""
    rng = np.random.default_rng([seed, epoch])
    top, left = rng.integers(0, 2 * PAD + 1, (2, size))
    mirrored = rng.random(size) < 0.5 if flip else np.zeros(size, dtype=bool)
    return top, left, mirrored


# ---- loaders: iterate (images, labels) on the device; start_epoch; len = batches per epoch ----

def make_loader(kind: str, dataset, sampler, batch_size: int, device: torch.device, *, train: bool, augment: bool,
                num_workers: int | None, seed: int, memory_format=torch.contiguous_format):
    """The training loader drops its last partial batch, so every step has the full global batch (and the same
    shapes, which cuDNN autotuning and torch.compile rely on). Batches come in `memory_format`. `num_workers` None:
    `default_num_workers()`. No loader depends on the rank: the sampler gives each rank its share."""
    options = dict(batch_size=batch_size, device=device, augment=train and augment, drop_last=train,
                   seed=seed, memory_format=memory_format)
    if kind == "gpu":
        return DeviceLoader(dataset, sampler, **options)
    if kind == "torchvision":
        return TorchvisionLoader(dataset, sampler, num_workers=num_workers, **options)
    raise UsageError(f"unknown loader {kind!r}: use gpu or torchvision")


MAX_WORKERS = 4  # DataLoader workers per training process by default: enough to keep up with CIFAR-sized images


def default_num_workers() -> int:
    """Workers per training process when --num_workers is not given: the cores this process may use, shared among
    the node's training processes (LOCAL_WORLD_SIZE; WORLD_SIZE on a launch without it, which is one node), less
    one core of each share for the process itself, at most MAX_WORKERS. Never above the usable cores, where the
    DataLoader warns of too many workers. 2 cores: 1 worker for one process, none for two."""
    cores, processes = _usable_cores(), _processes_on_this_node()
    return max(0, min(MAX_WORKERS, cores // processes - 1))


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _processes_on_this_node() -> int:
    return max(int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))), 1)


# torch's DataLoader warns of more workers than cores in every process, for every loader (twice a run, per rank):
# the run says it once instead, from its first process, when training starts (after every refusal).
warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker processes", category=UserWarning)
_warned: set[str] = set()  # what this process has warned of


def _say_once_if_too_many(num_workers: int) -> None:
    cores, processes = _usable_cores(), _processes_on_this_node()
    if num_workers * processes <= cores or "workers" in _warned or os.environ.get("RANK", "0") != "0":
        return
    _warned.add("workers")
    print(f"warning: --num_workers {num_workers} in each of {processes} process(es) is more than the {cores} usable "
          f"cores: the workers will compete with training for them; leave --num_workers out to fit the machine",
          file=sys.stderr, flush=True)


class DeviceLoader:
    """The `gpu` loader: the uint8 dataset is copied to the device once; each batch is one gather with the random
    crop and flip (where the dataset allows one) folded into its indices, then a normalisation. No worker
    processes, no host round trip."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed,
                 memory_format=torch.contiguous_format):
        self.sampler, self.batch_size, self.device, self.memory_format = sampler, batch_size, device, memory_format
        self.augment, self.drop_last, self.seed, self.epoch, self.skip = augment, drop_last, seed, 0, 0
        images = torch.as_tensor(np.asarray(dataset.data)).to(device)
        images = images.reshape(*images.shape[:3], -1)  # (N, H, W, C) uint8; greyscale (N, H, W) gets C = 1
        self.height, self.width, self.flip = images.shape[1], images.shape[2], dataset.info.flip
        self.images = torch.nn.functional.pad(images, (0, 0, PAD, PAD, PAD, PAD)) if augment else images
        self.labels = torch.as_tensor(dataset.targets, dtype=torch.int64).to(device)
        self.mean = torch.tensor(dataset.info.mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(dataset.info.std, device=device).view(1, -1, 1, 1) * 255

    def start_epoch(self, epoch: int, skip: int = 0) -> None:
        """Iterate epoch `epoch`'s augmentation from its batch `skip` on (a resumed run: those were consumed
        before). The sampler's order of the epoch is the sampler's own: the loop calls its set_epoch."""
        self.epoch, self.skip = epoch, skip

    def __len__(self):
        size = len(self.sampler)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def __iter__(self):
        row_range = torch.arange(self.height, device=self.device)
        col_range = torch.arange(self.width, device=self.device)
        order = torch.tensor(list(self.sampler), dtype=torch.int64).to(self.device)  # one copy per epoch
        if self.augment:  # the epoch's crops and flips of every image, one copy per epoch, gathered by index
            top, left, flip = (torch.from_numpy(draws).to(self.device) for draws in
                               augmentation_draws(self.seed, self.epoch, len(self.labels), self.flip))
        for start in range(self.skip * self.batch_size, len(self) * self.batch_size, self.batch_size):
            index = order[start:start + self.batch_size]
            if self.augment:  # pad-4 random crop + horizontal flip, as row/column indices into the padded images
                rows = top[index, None] + row_range
                cols = left[index, None] + torch.where(flip[index, None], self.width - 1 - col_range, col_range)
                images = self.images[index[:, None, None], rows[:, :, None], cols[:, None, :]]
            else:
                images = self.images[index]
            images = images.permute(0, 3, 1, 2).contiguous(memory_format=self.memory_format)  # NHWC is channels_last
            yield images.float().sub_(self.mean).div_(self.std), self.labels[index]


class LoaderWorkerDied(RuntimeError):
    """A DataLoader worker process ended (killed by the OOM killer, say): the run can stop as if asked to."""


class TorchvisionLoader:
    """The classic path: a DataLoader whose workers decode PIL images and run torchvision transforms, pinned
    memory, persistent workers; batches are copied to the device without blocking the host.

    Resuming mid-epoch needs no worker state (torchdata's StatefulDataLoader saves it; not used here): the
    augmentation is a function of (seed, epoch, image index), which the sampler hands to the workers with each
    index, so skipping the consumed batches in the sampler is the whole resume, with no extra dependency and the
    same crops and flips as the gpu loader."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed, num_workers,
                 memory_format=torch.contiguous_format):
        self.num_workers = num_workers = default_num_workers() if num_workers is None else num_workers
        self.sampler, self.batch_size, self.device, self.memory_format = sampler, batch_size, device, memory_format
        self.indices = _EpochIndices(sampler, batch_size)
        self.batches = len(sampler) // batch_size if drop_last else -(-len(sampler) // batch_size)
        self.loader = DataLoader(
            _Transformed(dataset, seed, augment), batch_size=batch_size, sampler=self.indices,
            num_workers=num_workers, drop_last=drop_last, pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
            worker_init_fn=functools.partial(_leave_stopping_to_the_main_process, os.getpid()),
            generator=torch.Generator().manual_seed(seed))  # draws the workers' base seed: the global RNG is left alone

    def start_epoch(self, epoch: int, skip: int = 0) -> None:
        """As DeviceLoader.start_epoch: the epoch's augmentation from its batch `skip` on."""
        self.indices.start_epoch(epoch, skip)

    def __len__(self):  # batches in a whole epoch, skipped ones included, as DeviceLoader counts them
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
                _error_if_any_worker_fails()  # a worker that died during the step just taken: raised here
        except RuntimeError as error:  # the DataLoader's own words for a worker that is gone
            if not str(error).startswith("DataLoader worker (pid"):
                raise
            raise LoaderWorkerDied(" ".join(str(error).split()).split(". ")[0].rstrip(".")) from None


def _leave_stopping_to_the_main_process(main_process: int, worker_id: int) -> None:
    """Ctrl-C and a closed terminal signal the whole foreground process group and SLURM every process: a worker
    that ended on SIGINT, SIGHUP, SIGUSR1 or SIGTERM would make the main process fail ("DataLoader worker exited
    unexpectedly") before it wrote its stop checkpoint. So a worker ignores them all, except a SIGTERM from its own
    main process: that is how multiprocessing ends the workers when the main process exits (and then waits for
    them). The main process is named by its pid, not as the worker's parent, which under the forkserver and spawn
    start methods is another process. An orphaned worker exits by itself (torch's watchdog, within 5 s)."""
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):  # the other stop signals (StopSignals)
        signal.signal(number, signal.SIG_IGN)
    if hasattr(signal, "sigwaitinfo"):  # Linux; elsewhere (macOS) SIGTERM ends a worker as torch lets it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started from here on inherit it
        threading.Thread(target=_exit_on_the_main_process_sigterm, args=(main_process,), daemon=True).start()


def _exit_on_the_main_process_sigterm(main_process: int) -> None:
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != main_process:  # the sender, which a handler is not told
        pass
    os._exit(0)  # as torch's own handler does on its main process's SIGTERM


def _defer_worker_failures() -> None:
    """torch's SIGCHLD handler raises a dead worker's error wherever the main thread is, mid-step too (with some
    BatchNorm statistics or parameters updated and others not). Without it TorchvisionLoader.__iter__ finds the
    death when the next batch is asked for (and the DataLoader within 5 s while it waits for one), between steps.
    torch sets the handler once per process, from the main thread (and chains to a previous Python handler, which
    these scripts lack)."""
    from torch.utils.data._utils import signal_handling

    handler = signal.getsignal(signal.SIGCHLD)
    if getattr(handler, "__module__", None) == signal_handling.__name__ and threading.current_thread() is \
            threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


class _Transformed(Dataset):
    """The torchvision loader's dataset: item (epoch, index) is image `index` as a PIL image, padded, cropped and
    flipped as `augmentation_draws` says for that epoch, then ToTensor and Normalize. Each worker keeps the draws
    of the epoch it is in (persistent workers hold their own copy of this object)."""

    def __init__(self, dataset, seed: int, augment: bool):
        from torchvision import transforms

        self.dataset, self.seed, self.augment, self.info = dataset, seed, augment, dataset.info
        self.normalise = transforms.Compose([transforms.ToTensor(), transforms.Normalize(dataset.info.mean,
                                                                                         dataset.info.std)])
        self.epoch, self.draws = None, None

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        from torchvision.transforms import functional

        epoch, index = item
        image, label = self.dataset[index]
        if self.augment:
            if epoch != self.epoch:
                self.epoch, self.draws = epoch, augmentation_draws(self.seed, epoch, len(self.dataset), self.info.flip)
            top, left, flip = (int(draws[index]) for draws in self.draws)
            image = functional.crop(functional.pad(image, PAD), top, left, self.info.size, self.info.size)
            image = functional.hflip(image) if flip else image
        return self.normalise(image), label


class _EpochIndices(Sampler[tuple[int, int]]):
    """A sampler's epoch as (epoch, index) pairs, without its first `skip` batches (a resumed run's first epoch):
    the epoch travels with each index to the workers, whose copies of the dataset never see the epoch."""

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
