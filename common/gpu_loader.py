"""The gpu loader (--loader gpu, the default with CUDA): the uint8 dataset held on the device, each
batch one gather with its random crop and flip folded into the indices, then a normalisation; no
worker processes, no host round trip. An image folder is decoded once into the device's memory
(`decoded`, by DataLoader workers), squashed to a fixed stored side for its random resized crops,
which torchvision.ops.roi_align cuts (common/augmentation.py: how they match the torchvision
loader's)."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from common.augmentation import (augmentation_draws, crop_boxes, loader_augmentation, resized,
                                 resized_crop_draws)
from common.errors import RunError, UsageError
from common.folders import FolderSplit, evaluation_crop, stored_side
from common.samplers import follow_epoch
from common.workers import UnreadableImage, default_num_workers, worker_death


class DeviceLoader:
    """The `gpu` loader: the uint8 dataset is copied to the device once; each batch is one
    gather with the random crop and flip (where the dataset allows one) folded into its
    indices, then a normalisation. No worker processes, no host round trip. Images stored at
    another size than the run's are resized after their crop (`resized`). An image folder is
    decoded once into the device's memory (`decoded`, by `num_workers` DataLoader workers); its
    training crops are random resized crops of the stored images, all of a batch in one
    torchvision.ops.roi_align."""

    def __init__(self, dataset, sampler, *, batch_size, device, augment, drop_last, seed,
                 num_workers=None, memory_format=torch.contiguous_format):
        self.sampler, self.batch_size, self.device = sampler, batch_size, device
        self.memory_format = memory_format
        self.augment = augment = loader_augmentation(augment, dataset.info)
        self.drop_last, self.seed = drop_last, seed
        self.epoch, self.skip = 0, 0
        self.size, self.pad = dataset.info.size, dataset.info.pad
        self.crop = augment.crop if augment is not None else None
        # an image folder: decoded once, (width, height) of the originals kept
        if isinstance(dataset, FolderSplit):
            images, self.originals = decoded(dataset, device, self.crop == "resized",
                                             num_workers)
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


def decoded(split: FolderSplit, device: torch.device, augment: bool, num_workers: int | None):
    """Every image of the image folder's split `split` decoded once into uint8 (N, side, side, 3)
    on `device`, with the originals' (width, height) (N, 2) on the host: for random resized crops
    (`augment`) each image squashed to side = stored_side(image_size) (the crops are drawn there,
    crop_boxes), else its evaluation crop (side = image_size), which pad crops cut. Decoded by
    DataLoader workers, a slice at a time, so the host never holds the whole set; a worker that dies
    meanwhile ends the run in one line (RunError)."""
    side = stored_side(split.info.size) if augment else split.info.size
    images = torch.empty((len(split), side, side, 3), dtype=torch.uint8, device=device)
    sizes = torch.empty((len(split), 2), dtype=torch.int64)
    workers = default_num_workers() if num_workers is None else num_workers
    # its own generator: a DataLoader draws its workers' base seed from the global RNG otherwise,
    # and the model built after the data would start from other weights than with the
    # torchvision loader on the same --seed (decoding draws nothing at random)
    decoding = DataLoader(_Decoded(split, side, augment), batch_size=64, num_workers=workers,
                          generator=torch.Generator())
    start, batches = 0, None
    try:
        batches = iter(decoding)
        for pixels, originals, errors in batches:
            bad = next((error for error in errors if error), None)
            if bad:
                raise UsageError(bad)
            images[start:start + len(pixels)] = pixels.to(device)
            sizes[start:start + len(pixels)] = originals
            start += len(pixels)
    except UsageError:
        raise
    except Exception as error:  # a worker that is gone, whatever the DataLoader raised for it
        death = worker_death(error, batches)
        if death is None:
            raise
        raise RunError(f"--dataset imagefolder: {death} while decoding the images: run it again, "
                       "with a smaller --num_workers if the machine ran out of memory") from None
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
