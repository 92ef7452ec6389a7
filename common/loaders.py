"""The loader a run trains and evaluates with, chosen and built. The data path every mode shares is
a dataset (common/data.py), a sampler (common/samplers.py, or torch's DistributedSampler) and
a loader: the gpu loader (common/gpu_loader.py: the dataset held on the device) or the torchvision
loader (common/torchvision_loader.py: DataLoader workers). A loader iterates (images, labels) on the
device, has `start_epoch`, and its len is its batches in an epoch.

Both loaders draw indices from a torch Sampler, so the epoch order depends only on the seed and the
epoch: `ShuffleSampler` (one process) gives exactly the order of `DistributedSampler` with one
replica. Every mode calls the loader's `start_epoch` each epoch (the epoch's augmentation, a
ShuffleSampler's order, and where a resumed epoch goes on); the process-group modes call their
DistributedSampler's `set_epoch` before it, as DDP needs. Batches come out on the device,
normalised, as (float images NCHW, int64 labels), augmented alike by both loaders
(common/augmentation.py)."""
from __future__ import annotations

import torch

from common.augmentation import Augmentation, augmentation
from common.data import image_size
from common.domains import physical_memory
from common.errors import UsageError
from common.folders import image_folder, stored_side
from common.gpu_loader import DeviceLoader
from common.torchvision_loader import TorchvisionLoader


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
