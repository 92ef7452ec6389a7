"""The torchvision loader (--loader torchvision, the default without CUDA): the classic path, a
DataLoader whose worker processes decode PIL images and run torchvision's transforms, the
augmentation drawn from (seed, epoch, image index) as the gpu loader draws it
(common/augmentation.py), pinned batches copied to the device without blocking the host. Its
workers' number, signals and deaths: common/workers.py."""
from __future__ import annotations

import functools
import os

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from common.augmentation import (Augmentation, augmentation_draws, crop_boxes, loader_augmentation,
                                 resized, resized_crop_draws)
from common.folders import FolderSplit, evaluation_crop
from common.samplers import follow_epoch
from common.workers import (LoaderWorkerDied, default_num_workers, defer_worker_failures,
                            leave_stopping_to_the_main_process, say_once_if_too_many,
                            worker_death)


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
            _Transformed(dataset, seed, loader_augmentation(augment, dataset.info)),
            batch_size=batch_size, sampler=self.indices, num_workers=num_workers,
            drop_last=drop_last, pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
            worker_init_fn=functools.partial(leave_stopping_to_the_main_process, os.getpid()),
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

        say_once_if_too_many(self.num_workers)
        batches = None
        try:
            batches = iter(self.loader)
            defer_worker_failures()
            for images, labels in batches:
                yield (images.to(self.device, non_blocking=True, memory_format=self.memory_format),
                       labels.to(self.device, non_blocking=True))
                # a worker that died during the step just taken: raised here
                _error_if_any_worker_fails()
        except LoaderWorkerDied:  # an image a worker could not decode (UnreadableImage)
            raise
        except Exception as error:  # a worker that is gone, whatever the DataLoader raised for it
            death = worker_death(error, self.loader._iterator if batches is None else batches)
            if death is None:
                raise
            raise LoaderWorkerDied(death) from None


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
