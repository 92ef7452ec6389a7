"""The data path: the synthetic set and CIFAR-10 reading (common/data.py; CIFAR-10 on a fixture in
the real format), samplers (common/samplers.py), the two loaders and their workers
(common/loaders.py, gpu_loader.py, torchvision_loader.py, workers.py)."""
from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import pickle
import signal
import subprocess
import tarfile
import time
import urllib.error
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torchvision.datasets
import torchvision.datasets.cifar
import torchvision.datasets.utils
from torch.utils.data import DistributedSampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from common import workers
from common.augmentation import augmentation_draws
from common.config import UsageError
from common.data import CIFAR10_MEAN, CIFAR10_STD, DATASET_INFO, SyntheticCIFAR, load_datasets
from common.gpu_loader import DeviceLoader
from common.loaders import make_loader
from common.samplers import EvalShard, ShuffleSampler
from common.torchvision_loader import TorchvisionLoader
from common.workers import LoaderWorkerDied, default_num_workers

from conftest import at_epoch

CPU = torch.device("cpu")
MEAN = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1) * 255
STD = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1) * 255



def random_dataset(n: int, seed: int = 0) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    return SimpleNamespace(data=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                           targets=rng.integers(0, 10, n).tolist(), info=DATASET_INFO["cifar10"])


def coordinate_dataset(n: int) -> SimpleNamespace:
    """Pixel (r, c) of image i is (r + 1, c + 1, i + 1): never 0, so zero padding is told apart, and
    every crop and flip of every image is unique."""
    assert n < 255
    data = np.zeros((n, 32, 32, 3), dtype=np.uint8)
    data[..., 0] = np.arange(1, 33)[None, :, None]
    data[..., 1] = np.arange(1, 33)[None, None, :]
    data[..., 2] = np.arange(1, n + 1)[:, None, None]
    return SimpleNamespace(data=data, targets=[(3 * i) % 10 for i in range(n)],
                           info=DATASET_INFO["cifar10"])


def unnormalise(images: torch.Tensor) -> np.ndarray:
    """Loader output (N, 3, H, W) float back to uint8-valued (N, H, W, 3) integers."""
    pixels = (images * STD + MEAN).round()
    assert (pixels - (images * STD + MEAN)).abs().max() < 1e-2
    return pixels.to(torch.int64).permute(0, 2, 3, 1).numpy()


def normalised(data: np.ndarray) -> torch.Tensor:
    return (torch.as_tensor(data).permute(0, 3, 1, 2).float() - MEAN) / STD


def collect(loader):
    batches = list(loader)
    return (batches, torch.cat([images for images, _ in batches]),
            torch.cat([labels for _, labels in batches]))


# ----------------------------------------------------------------------------------- synthetic data

def test_synthetic_shapes_dtype_and_classes():
    dataset = SyntheticCIFAR(500, seed=0, train=True)
    assert isinstance(dataset.data, np.ndarray)
    assert dataset.data.shape == (500, 32, 32, 3) and dataset.data.dtype == np.uint8
    assert len(dataset) == 500 and len(dataset.targets) == 500
    assert all(type(t) is int for t in dataset.targets)
    assert set(dataset.targets) == set(range(10))
    # the full range is used (noise is clamped)
    assert dataset.data.min() == 0 and dataset.data.max() == 255
    image, label = dataset[3]
    assert image.size == (32, 32) and image.mode == "RGB" and label == dataset.targets[3]
    assert np.array_equal(np.asarray(image), dataset.data[3])


def test_load_datasets_synthetic_sizes(tmp_path):
    missing = tmp_path / "nothing-here"
    for size, test_size in [(100, 20), (101, 20), (9, 1), (5, 1)]:
        train, test = load_datasets("synthetic", str(missing), size, 0)
        assert (len(train), len(test)) == (size, test_size)
        assert test.data.shape == (test_size, 32, 32, 3)
    assert not missing.exists()  # nothing is downloaded or written


def test_synthetic_depends_only_on_the_seed():
    a_train, a_test = load_datasets("synthetic", "", 60, 1)
    b_train, b_test = load_datasets("synthetic", "", 60, 1)
    assert np.array_equal(a_train.data, b_train.data) and a_train.targets == b_train.targets
    assert np.array_equal(a_test.data, b_test.data) and a_test.targets == b_test.targets
    c_train, c_test = load_datasets("synthetic", "", 60, 2)
    assert not np.array_equal(a_train.data, c_train.data) and a_train.targets != c_train.targets
    assert not np.array_equal(a_test.data, c_test.data)
    # train and test come from different streams: not the same images (compare equal sizes)
    train, test = SyntheticCIFAR(60, 1, train=True), SyntheticCIFAR(60, 1, train=False)
    assert not np.array_equal(train.data, test.data) and train.targets != test.targets
    assert not any(np.array_equal(image, a_train.data[0]) for image in test.data)
    # load_datasets' test set is the train=False stream, not a prefix of the training stream
    assert np.array_equal(a_test.data, SyntheticCIFAR(12, 1, train=False).data)
    assert a_test.targets != a_train.targets[:12]


def made_at_once(size: int, seed: int, train: bool, side: int = 32):
    """The synthetic set's definition, all images at once: (images NHWC uint8, labels)."""
    patterns = torch.nn.functional.interpolate(
        torch.rand(10, 3, 4, 4, generator=torch.Generator().manual_seed(seed)), size=side,
        mode="bilinear", align_corners=False)
    stream = torch.Generator().manual_seed(seed * 2 + (1 if train else 2))
    labels = torch.randint(10, (size,), generator=stream)
    contrast = 0.6 + 0.4 * torch.rand(size, 1, 1, 1, generator=stream)
    brightness = 0.2 * torch.rand(size, 1, 1, 1, generator=stream) - 0.1
    noise = 0.4 * torch.randn(size, 3, side, side, generator=stream)
    images = (patterns[labels] - 0.5) * contrast + 0.5 + brightness + noise
    return ((images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy(),
            labels.tolist())


@pytest.mark.parametrize("size, seed, train, side", [
    (1, 0, True, 32), (2100, 1, True, 32), (1030, 5, False, 7), (1500, 2, True, 10)])
def test_the_synthetic_set_is_made_in_pieces_with_the_bits_of_all_at_once(monkeypatch, size, seed,
                                                                           train, side):
    """SyntheticCIFAR makes 1,024 images at a time (never the whole set's float32 noise at once:
    600 MB for 50,000 images) with the bits of its definition made all at once: the same draws
    from the same stream, in the same order (sizes and sides whose pieces' noise is no multiple of
    the normal sampler's blocks of 16 values included), the same float32 ops."""
    import common.data

    noise_drawn, randn = [], torch.randn
    monkeypatch.setattr(common.data.torch, "randn",
                        lambda *shape, **kw: noise_drawn.append(shape[0]) or randn(*shape, **kw))
    dataset = SyntheticCIFAR(size, seed, train=train, image_size=side)
    monkeypatch.undo()
    images, labels = made_at_once(size, seed, train, min(side, 32))
    assert np.array_equal(dataset.data, images) and dataset.targets == labels
    assert dataset.data.flags["C_CONTIGUOUS"] and dataset.data.dtype == np.uint8
    assert sum(noise_drawn) == size and max(noise_drawn) <= 1024


def test_synthetic_is_learnable_and_test_matches_train():
    train, test = SyntheticCIFAR(500, 0, train=True), SyntheticCIFAR(100, 0, train=False)
    x, y = train.data.reshape(500, -1).astype(np.float64), np.array(train.targets)
    means = np.stack([x[y == c].mean(axis=0) for c in range(10)])
    xt = test.data.reshape(100, -1).astype(np.float64)
    predicted = ((xt[:, None] - means[None]) ** 2).sum(-1).argmin(1)
    # same class patterns in train and test
    assert (predicted == np.array(test.targets)).mean() > 0.9


def test_unknown_dataset():
    with pytest.raises(UsageError, match="cifar10, mnist, synthetic or imagefolder"):
        load_datasets("imagenet", "", 10, 0)


# ----------------------------------------------------------------------------------------- samplers

@pytest.mark.parametrize("size", [1, 10, 37])
@pytest.mark.parametrize("seed", [0, 7])
def test_shuffle_sampler_is_distributed_sampler_with_one_replica(size, seed):
    ours = ShuffleSampler(size, shuffle=True, seed=seed)
    theirs = DistributedSampler(range(size), num_replicas=1, rank=0, shuffle=True, seed=seed)
    assert len(ours) == len(theirs) == size
    for epoch in [0, 1, 2, 5]:
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        order = list(ours)
        assert order == list(theirs)
        assert sorted(order) == list(range(size))
        assert list(ours) == order  # iterating again repeats the epoch


def test_shuffle_sampler_orders_differ_between_epochs_and_seeds():
    sampler = ShuffleSampler(50, shuffle=True, seed=0)
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert orders[0] != list(range(50))
    other = ShuffleSampler(50, shuffle=True, seed=1)
    assert list(other) != orders[0]


def test_no_shuffle_is_range_order_every_epoch():
    sampler = ShuffleSampler(13, shuffle=False, seed=5)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert list(sampler) == list(range(13))
    assert len(sampler) == 13


@pytest.mark.parametrize("size", [1, 2, 10, 409])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_eval_shards_cover_every_index_once(size, world_size):
    shards = [list(EvalShard(size, rank, world_size)) for rank in range(world_size)]
    # no padding, no duplicates
    assert sorted(i for shard in shards for i in shard) == list(range(size))
    assert sum(len(EvalShard(size, rank, world_size)) for rank in range(world_size)) == size
    assert [len(EvalShard(size, rank, world_size)) for rank in range(world_size)] == \
        [len(s) for s in shards]
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert list(EvalShard(size)) == list(range(size))


# ------------------------------------------------------------------------------------------ loaders

@pytest.mark.parametrize("train", [True, False])
def test_device_loader_matches_torchvision_loader_without_augmentation(train):
    dataset = SyntheticCIFAR(50, seed=0, train=True)
    batches = {}
    for kind in ("gpu", "torchvision"):
        sampler = ShuffleSampler(50, shuffle=True, seed=3) if train else EvalShard(50)
        loader = make_loader(kind, dataset, sampler, 16, CPU, train=train, augment=False,
                             num_workers=0, seed=3)
        assert isinstance(loader, DeviceLoader if kind == "gpu" else TorchvisionLoader)
        batches[kind] = []
        for epoch in (0, 1):
            at_epoch(loader, epoch)
            batches[kind].append(list(loader))
    assert len(batches["gpu"][0]) == len(batches["torchvision"][0]) == (3 if train else 4)
    for ours, theirs in zip(sum(batches["gpu"], []), sum(batches["torchvision"], [])):
        assert ours[0].dtype == theirs[0].dtype == torch.float32
        assert ours[1].dtype == theirs[1].dtype == torch.int64
        assert ours[0].shape == theirs[0].shape and ours[0].shape[1:] == (3, 32, 32)
        torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=0)
        assert torch.equal(ours[1], theirs[1])
    if train:  # a new epoch, a new order
        assert not torch.equal(batches["gpu"][0][0][1], batches["gpu"][1][0][1]) or \
            not torch.equal(batches["gpu"][0][0][0], batches["gpu"][1][0][0])


def test_device_loader_drops_the_last_partial_batch_only_in_training():
    dataset = random_dataset(50)
    train = make_loader("gpu", dataset, ShuffleSampler(50, True, 0), 16, CPU, train=True,
                        augment=True, num_workers=0, seed=0)
    test = make_loader("gpu", dataset, EvalShard(50), 16, CPU, train=False, augment=True,
                       num_workers=0, seed=0)
    assert len(train) == 50 // 16 == 3
    train_batches = list(train)
    assert len(train_batches) == 3 and all(images.shape[0] == 16 for images, _ in train_batches)
    assert len(test) == 4
    test_batches, images, labels = collect(test)
    assert [b[0].shape[0] for b in test_batches] == [16, 16, 16, 2]
    # evaluation is never augmented (even with augment=True) and covers
    # every image once, in shard order
    assert np.array_equal(unnormalise(images), dataset.data.astype(np.int64))
    torch.testing.assert_close(images, normalised(dataset.data))
    assert labels.tolist() == dataset.targets
    exact = make_loader("gpu", dataset, EvalShard(48), 16, CPU, train=True, augment=False,
                        num_workers=0, seed=0)
    assert len(exact) == 3 and len(list(exact)) == 3


def test_device_loader_labels_follow_the_sampler():
    dataset = random_dataset(40, seed=1)
    sampler = ShuffleSampler(40, shuffle=True, seed=9)
    loader = make_loader("gpu", dataset, sampler, 8, CPU, train=True, augment=False, num_workers=0,
                         seed=9)
    for epoch in (0, 4):
        at_epoch(loader, epoch)
        order = list(sampler)
        _, images, labels = collect(loader)
        assert labels.tolist() == [dataset.targets[i] for i in order]
        assert np.array_equal(unnormalise(images), dataset.data[order].astype(np.int64))


def augmented_epoch(dataset, seed=0, epoch=0, batch=32, sampler_seed=0, shuffle=True):
    sampler = ShuffleSampler(len(dataset.targets), shuffle=shuffle, seed=sampler_seed)
    loader = make_loader("gpu", dataset, sampler, batch, CPU, train=True, augment=True,
                         num_workers=0, seed=seed)
    at_epoch(loader, epoch)
    return collect(loader)[1:]


def test_augmentation_is_reproducible():
    dataset = random_dataset(64, seed=2)
    images, labels = augmented_epoch(dataset, seed=1, epoch=2)
    again, again_labels = augmented_epoch(dataset, seed=1, epoch=2)
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    # iterating the same loader twice in one epoch also repeats it
    sampler = ShuffleSampler(64, True, 0)
    loader = make_loader("gpu", dataset, sampler, 32, CPU, train=True, augment=True, num_workers=0,
                         seed=1)
    at_epoch(loader, 2)
    assert torch.equal(collect(loader)[1], collect(loader)[1])
    # another epoch or seed: other crops, even in the same order (no
    # shuffling: only the augmentation differs)
    reference = augmented_epoch(dataset, seed=1, epoch=2, shuffle=False)
    assert torch.equal(reference[1], torch.tensor(dataset.targets))
    for other in (dict(seed=1, epoch=3), dict(seed=2, epoch=2)):
        ordered = augmented_epoch(dataset, **other, shuffle=False)
        assert torch.equal(ordered[1], reference[1])
        assert not torch.equal(ordered[0], reference[0])


def find_crop(image: np.ndarray, padded: np.ndarray):
    """The (top, left, flipped) of every pad-4 crop of `padded` equal to `image`."""
    found = []
    for top in range(9):
        for left in range(9):
            crop = padded[top:top + 32, left:left + 32]
            for flipped in (False, True):
                if np.array_equal(image, crop[:, ::-1] if flipped else crop):
                    found.append((top, left, flipped))
    return found


def test_augmentation_is_a_pad4_crop_and_an_optional_flip():
    dataset = coordinate_dataset(200)
    padded = np.pad(dataset.data.astype(np.int64), ((0, 0), (4, 4), (4, 4), (0, 0)))
    offsets, flips, seen = set(), set(), []
    for epoch in (0, 1):
        images, labels = augmented_epoch(dataset, seed=0, epoch=epoch, batch=50)
        pixels = unnormalise(images)
        assert pixels.shape == (200, 32, 32, 3)
        sampler = ShuffleSampler(200, True, 0)
        sampler.set_epoch(epoch)
        order = list(sampler)
        for position, image in enumerate(pixels):
            # the centre pixel is never padding (offsets are at most 4)
            index = int(image[16, 16, 2]) - 1
            assert index == order[position]
            assert labels[position].item() == dataset.targets[index]
            matches = find_crop(image, padded[index])
            assert len(matches) == 1, f"image {position} is no crop/flip of image {index}"
            top, left, flipped = matches[0]
            offsets.add((top, left))
            flips.add(flipped)
            seen.append(flipped)
    assert flips == {False, True}
    assert 0.3 < np.mean(seen) < 0.7  # flips are about half
    assert ({top for top, _ in offsets} == set(range(9))
            and {left for _, left in offsets} == set(range(9)))
    assert len(offsets) > 60  # top and left drawn independently: ~80 of the 81 pairs in 400 draws


def test_device_loader_without_augmentation_keeps_images_unpadded():
    dataset = coordinate_dataset(20)
    loader = DeviceLoader(dataset, EvalShard(20), batch_size=20, device=CPU, augment=False,
                          drop_last=False, seed=0)
    assert loader.images.shape == (20, 32, 32, 3)
    images, labels = next(iter(loader))
    assert np.array_equal(unnormalise(images), dataset.data.astype(np.int64))
    augmented = DeviceLoader(dataset, EvalShard(20), batch_size=20, device=CPU, augment=True,
                             drop_last=False, seed=0)
    assert augmented.images.shape == (20, 40, 40, 3)


def test_torchvision_loader_augments_and_leaves_the_dataset_alone():
    dataset = SyntheticCIFAR(40, seed=0, train=True)
    loader = make_loader("torchvision", dataset, ShuffleSampler(40, True, 0), 16, CPU, train=True,
                         augment=True, num_workers=0, seed=0)
    # the loader transforms the PIL images dataset[i] gives
    assert dataset.transform is None and len(loader) == 2
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(16, 3, 32, 32)] * 2
    plain = normalised(dataset.data[list(ShuffleSampler(40, True, 0))[:32]])
    assert not torch.allclose(torch.cat([b[0] for b in batches]), plain)  # cropped/flipped


def test_augmentation_draws_depend_on_the_seed_and_the_epoch_only():
    top, left, flip = augmentation_draws(3, 1, 1000, flip=True)
    assert top.shape == left.shape == flip.shape == (1000,) and flip.dtype == bool
    assert set(top) == set(left) == set(range(9)) and 0.4 < flip.mean() < 0.6
    assert all(np.array_equal(a, b)
               for a, b in zip((top, left, flip), augmentation_draws(3, 1, 1000, flip=True)))
    # a dataset never mirrored: the same crops, no flip
    never = augmentation_draws(3, 1, 1000, flip=False)
    assert np.array_equal(never[0], top) and np.array_equal(never[1], left) and not never[2].any()
    for seed, epoch in ((3, 2), (4, 1)):
        assert (augmentation_draws(seed, epoch, 1000, flip=True)[0] != top).mean() > 0.8


class PixelRamp:
    """One 16x16 image holding every pixel value 0..255 once, in every channel, with the
    real dataset interface (its info's size 16: the loaders resize an image stored at
    another size than the run's)."""

    def __init__(self, name: str):
        self.info = dataclasses.replace(DATASET_INFO[name], size=16)
        ramp = np.arange(256, dtype=np.uint8).reshape(1, 16, 16)
        self.data = ramp if self.info.channels == 1 else np.repeat(ramp[..., None],
                                                                   self.info.channels, axis=3)
        self.targets = [0]

    def __len__(self):
        return 1

    def __getitem__(self, index):
        from PIL import Image

        return Image.fromarray(self.data[index]), self.targets[index]


ROUNDING = 2 ** -22  # the most the two loaders' normalised pixels differ by, measured below


@pytest.mark.parametrize("name", ["cifar10", "mnist"])
def test_the_loaders_normalisations_differ_by_a_float32_rounding(name):
    """Every pixel value of every channel, normalised by each loader: the gpu loader computes (x -
    255 mean) / (255 std), torchvision's ToTensor + Normalize (x / 255 - mean) / std. Measured: they
    differ by at most 2**-22, one float32 ulp of the largest normalised values (|x| in [2, 4))."""
    dataset = PixelRamp(name)
    ours, theirs = (next(iter(make_loader(kind, dataset, EvalShard(1), 1, CPU, train=False,
                                          augment=False, num_workers=0, seed=0)))[0]
                    for kind in ("gpu", "torchvision"))
    assert ours.shape == theirs.shape == (1, dataset.info.channels, 16, 16)
    assert 2 <= ours.abs().max() < 4 and 0 < (ours - theirs).abs().max() <= ROUNDING


def by_index(loader, sampler, epoch: int) -> dict[int, torch.Tensor]:
    """Epoch `epoch` of `loader` as {dataset index: augmented image} (the
    loader follows `sampler`'s order)."""
    at_epoch(loader, epoch)
    return dict(zip(list(sampler), torch.cat([images for images, _ in loader])))


# more than 2 cores: fine
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_an_image_is_augmented_alike_whatever_the_loader_workers_or_processes():
    """Image i in epoch e gets one crop and flip: from either loader (up to ROUNDING), with
    0 or 3 DataLoader workers (persistent: their copies of the dataset never see
    set_epoch), from one process or from two DistributedSampler shards with half the batch
    each. Another epoch, other crops."""
    dataset = SyntheticCIFAR(48, seed=0, train=True)

    def loader(kind, sampler, batch, workers=0):
        return make_loader(kind, dataset, sampler, batch, CPU, train=True, augment=True,
                           num_workers=workers, seed=5)

    one = ShuffleSampler(48, True, 5)
    shards = [DistributedSampler(dataset, 2, rank, shuffle=True, seed=5) for rank in (0, 1)]
    gpu, classic = loader("gpu", one, 8), loader("torchvision", one, 8)
    classic_workers = loader("torchvision", one, 8, workers=3)
    epochs = []
    for epoch in (0, 1):
        reference = by_index(gpu, one, epoch)
        assert sorted(reference) == list(range(48))
        images = by_index(classic, one, epoch)
        assert all(torch.equal(a, b)
                   for a, b in zip(images.values(), by_index(classic_workers, one, epoch).values()))
        assert images.keys() == reference.keys()
        assert max((images[i] - reference[i]).abs().max() for i in reference) <= ROUNDING
        for kind, whole in (("gpu", reference), ("torchvision", images)):
            sharded = {}
            for shard in shards:
                sharded.update(by_index(loader(kind, shard, 4), shard, epoch))
            assert sharded.keys() == whole.keys() and all(torch.equal(sharded[i],
                                                                      whole[i]) for i in whole)
        epochs.append(reference)
    assert sum(not torch.equal(epochs[0][i], epochs[1][i]) for i in range(48)) > 40


@pytest.mark.parametrize("cores, processes, workers", [
    (1, 1, 0), (2, 1, 1), (2, 2, 0), (3, 2, 0), (4, 2, 1), (16, 1, 4), (16, 8, 1), (64, 8, 4),
    (64, 64, 0)])
def test_default_worker_count_shares_the_cores(monkeypatch, cores, processes, workers):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    assert default_num_workers() == workers
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", str(processes))  # a launch without LOCAL_WORLD_SIZE: one node
    assert default_num_workers() == workers


def test_default_worker_count_draws_no_dataloader_warning(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loader = make_loader("torchvision", random_dataset(4), EvalShard(4), 2, CPU, train=False,
                         augment=False, num_workers=None, seed=0)
    assert loader.loader.num_workers == \
        default_num_workers() == min(len(os.sched_getaffinity(0)) - 1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # what the DataLoader runs when it starts its workers
        loader.loader.check_worker_number_rationality()
        for cores in range(1, 9):  # nor on any other machine
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: set(range(cores)))
            loader.loader.num_workers = default_num_workers()
            loader.loader.check_worker_number_rationality()


def test_too_many_workers_are_warned_of_once_per_run_when_training_starts(monkeypatch, capsys):
    """More workers than cores, asked for: one line from the first process when the first batch is
    asked for (after every refusal), instead of torch's warning per loader and per rank."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(workers, "_warned", set())
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    loaders = [make_loader("torchvision", SyntheticCIFAR(8, seed=0, train=False), EvalShard(8), 4,
                           CPU, train=False, augment=False, num_workers=2, seed=0)
               for _ in range(2)]
    assert capsys.readouterr().err == ""  # nothing yet: a refusal may still come
    for loader in loaders:
        collect(loader)
    lines = capsys.readouterr().err.splitlines()
    assert (len(lines) == 1 and lines[0].startswith("warning: --num_workers 2")
            and "more than the 1 usable core:" in lines[0] and "(es)" not in lines[0])
    monkeypatch.setattr(workers, "_warned", set())
    monkeypatch.setenv("RANK", "1")  # every other rank is silent
    collect(loaders[0])
    assert capsys.readouterr().err == ""


def new_workers(before: set) -> list:
    """The DataLoader worker processes started since `before`
    (multiprocessing.active_children())."""
    return [process for process in multiprocessing.active_children() if process not in before]


def test_workers_ignore_sigint_and_sigterm_but_their_main_process_sigterm():
    """Ctrl-C reaches every process of the terminal's foreground group and SLURM signals
    every process: the workers leave the stop to the main process and go on, and the
    epoch comes out whole. The main process's own SIGTERM (multiprocessing's, as the
    interpreter exits) still ends them."""
    dataset = SyntheticCIFAR(64, seed=0, train=True)
    expected = [images for images, _ in make_loader("torchvision", dataset,
                                                    ShuffleSampler(64, True, 0), 8, CPU, train=True,
                                                    augment=True, num_workers=0, seed=0)]
    loader = make_loader("torchvision", dataset, ShuffleSampler(64, True, 0), 8, CPU, train=True,
                         augment=True, num_workers=2, seed=0)
    before = set(multiprocessing.active_children())
    batches = iter(loader)
    received = [next(batches)[0], next(batches)[0]]  # a batch from each worker: both have started
    workers = new_workers(before)
    assert len(workers) == 2
    pids = [str(worker.pid) for worker in workers]
    # from another process, as a terminal or SLURM sends them
    subprocess.run(["kill", "-INT", *pids], check=True)
    subprocess.run(["kill", "-TERM", *pids], check=True)
    time.sleep(0.2)
    received += [images for images, _ in batches]
    assert len(received) == 8 and all(torch.equal(a, b) for a, b in zip(received, expected))
    assert all(worker.is_alive() for worker in workers)
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(5)
        assert worker.exitcode == 0


def dead_not_reaped(pid: int) -> None:
    """Wait until `pid`, a child of this process, has ended and can be waited for, leaving it
    unreaped (waitid's WNOWAIT): as torch's own check finds a dead worker. A zombie in /proc is not
    yet that: the worker's other threads may still be ending, its sockets open."""
    deadline = time.monotonic() + 60  # only a hang reaches it
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"worker {pid} never ended"
        time.sleep(0.01)


def started_worker(loader):
    """An iterator of the torchvision loader `loader` after its first batch, and one of its two
    workers."""
    before = set(multiprocessing.active_children())
    batches = iter(loader)
    next(batches)
    return batches, new_workers(before)[0]


def test_a_killed_worker_is_reported_between_steps_as_loader_worker_died(monkeypatch):
    """A worker killed (SIGKILL, as the OOM killer does) while the main process computes a
    step: nothing is raised in the step (torch's own SIGCHLD handler would have by now); asking
    for the next batch raises LoaderWorkerDied, with one line, before the DataLoader waits for a
    batch (and finds the death at its status check, 5 s later)."""
    dataset = SyntheticCIFAR(64, seed=0, train=True)
    loader = make_loader("torchvision", dataset, ShuffleSampler(64, True, 0), 8, CPU, train=True,
                         augment=True, num_workers=2, seed=0)
    batches, worker = started_worker(loader)
    os.kill(worker.pid, signal.SIGKILL)
    dead_not_reaped(worker.pid)
    fetches, fetch = [], _MultiProcessingDataLoaderIter._try_get_data
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_try_get_data",
                        lambda self, *args: fetches.append(args) or fetch(self, *args))
    # not pytest.raises: its reference cycle would keep the loader,
    # whose late shutdown then waits 5 s
    try:
        next(batches)
        pytest.fail("no LoaderWorkerDied")
    except LoaderWorkerDied as error:
        assert fetches == []  # found between the steps: the DataLoader was not asked
        assert str(error) == f"DataLoader worker (pid {worker.pid}) is killed by signal: Killed"
        assert isinstance(error, RuntimeError)


@pytest.mark.parametrize("raised", [ConnectionResetError(104, "Connection reset by peer"),
                                    ConnectionRefusedError(111, "Connection refused"), EOFError()],
                         ids=lambda error: type(error).__name__)
def test_a_worker_killed_as_its_batch_is_fetched_is_reported_as_loader_worker_died(monkeypatch,
                                                                                   raised):
    """The OOM killer ends a worker at any moment. Killed as the main process fetches a batch the
    worker sent (the file descriptor of its shared memory, from the worker's resource sharer), the
    DataLoader raises what the broken connection gave, before the worker can be seen dead: a
    ConnectionResetError out of multiprocessing.connection, as a loaded machine showed. The same
    one line all the same."""
    dataset = SyntheticCIFAR(64, seed=0, train=True)
    loader = make_loader("torchvision", dataset, ShuffleSampler(64, True, 0), 8, CPU, train=True,
                         augment=True, num_workers=2, seed=0)
    batches, worker = started_worker(loader)

    def killed_while_fetching(self, *args):
        os.kill(worker.pid, signal.SIGKILL)
        raise raised

    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_try_get_data", killed_while_fetching)
    try:
        for _ in batches:  # a batch received already, out of order, may come first
            pass
        pytest.fail("no LoaderWorkerDied")
    except LoaderWorkerDied as error:
        assert str(error) == f"DataLoader worker (pid {worker.pid}) is killed by signal: Killed"


def test_an_error_while_every_worker_lives_is_its_own(monkeypatch):
    """The same error with no worker dead is not called a death: it comes out as it was raised,
    once the workers have been given torch's status interval to be found ended (0.2 s here)."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    dataset = SyntheticCIFAR(64, seed=0, train=True)
    loader = make_loader("torchvision", dataset, ShuffleSampler(64, True, 0), 8, CPU, train=True,
                         augment=True, num_workers=2, seed=0)
    batches, worker = started_worker(loader)

    def reset(self, *args):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_try_get_data", reset)
    try:
        for _ in batches:
            pass
        pytest.fail("no ConnectionResetError")
    except ConnectionResetError as error:
        assert error.errno == 104 and not isinstance(error, LoaderWorkerDied)
    assert worker.is_alive()


def test_unknown_loader():
    with pytest.raises(UsageError, match="gpu or torchvision"):
        make_loader("dali", random_dataset(4), EvalShard(4), 2, CPU, train=True, augment=False,
                    num_workers=0, seed=0)


# ----------------------------------------------------------------------------------- CIFAR-10 files

LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck"]


def write_cifar10(root, per_batch: int = 4, test_size: int = 6, seed: int = 0) -> dict:
    """cifar-10-batches-py/ as in cifar-10-python.tar.gz: pickled dicts with data uint8 (n, 3072)
    (the 1024 red, then green, then blue values of a row-major 32x32 image), labels, batch_label,
    filenames; batches.meta with label_names. The originals were pickled by Python 2, whose str keys
    torchvision's reader (pickle.load with encoding="latin1") sees as str: "data", "labels". Returns
    the arrays written and every file's md5."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {}

    def batch(name, n, label):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        entry = {"batch_label": label, "labels": labels, "data": data,
                 "filenames": [f"{name}_{i}.png" for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        written[name] = (data, labels)

    for k in range(1, 6):
        batch(f"data_batch_{k}", per_batch, f"training batch {k} of 5")
    batch("test_batch", test_size, "testing batch 1 of 1")
    meta = {"num_cases_per_batch": per_batch, "label_names": LABEL_NAMES, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    written["md5"] = {path.name: md5(path) for path in folder.iterdir()}
    return written


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def use_checksums(monkeypatch, checksums: dict) -> None:
    """torchvision checks every file against the real CIFAR-10's md5s: give it the fixture's
    instead, so the integrity check still runs."""
    cifar = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cifar, "train_list",
                        [[f"data_batch_{k}", checksums[f"data_batch_{k}"]] for k in range(1, 6)])
    monkeypatch.setattr(cifar, "test_list", [["test_batch", checksums["test_batch"]]])
    monkeypatch.setattr(cifar, "meta", {"filename": "batches.meta", "key": "label_names",
                                        "md5": checksums["batches.meta"]})


def test_cifar10_is_read_from_its_python_batches(tmp_path, monkeypatch, offline):
    written = write_cifar10(tmp_path)
    use_checksums(monkeypatch, written["md5"])

    def no_download(*args, **kwargs):
        raise AssertionError("CIFAR-10 is present and intact: nothing may be downloaded")

    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", no_download)
    train, test = load_datasets("cifar10", str(tmp_path), 0, 0)
    assert len(train) == 20 and len(test) == 6
    assert train.data.shape == (20, 32, 32, 3) and train.data.dtype == np.uint8
    assert train.classes == LABEL_NAMES and train.info == test.info == DATASET_INFO["cifar10"]
    train_rows = np.concatenate([written[f"data_batch_{k}"][0] for k in range(1, 6)])
    train_labels = sum((written[f"data_batch_{k}"][1] for k in range(1, 6)), [])
    assert train.targets == train_labels and test.targets == written["test_batch"][1]
    for dataset, rows in ((train, train_rows), (test, written["test_batch"][0])):
        for i in (0, 5, len(rows) - 1):
            chw = rows[i].reshape(3, 32, 32)
            assert np.array_equal(dataset.data[i], chw.transpose(1, 2, 0))
            # green of row 2, column 7
            assert dataset.data[i][2, 7, 1] == rows[i][1024 + 2 * 32 + 7]
    # the loaders read it like the synthetic set
    loader = make_loader("gpu", test, EvalShard(6), 6, CPU, train=False, augment=False,
                         num_workers=0, seed=0)
    images, labels = next(iter(loader))
    assert np.array_equal(unnormalise(images), test.data.astype(np.int64))
    assert labels.tolist() == written["test_batch"][1]
    classic = make_loader("torchvision", test, EvalShard(6), 6, CPU, train=False, augment=False,
                          num_workers=0, seed=0)
    classic_images, classic_labels = next(iter(classic))
    torch.testing.assert_close(classic_images, images, atol=1e-5, rtol=0)
    assert torch.equal(classic_labels, labels)
    # nothing downloaded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-batches-py"]


def test_cifar10_archive_put_in_the_folder_is_extracted_offline(tmp_path, monkeypatch, offline):
    """The error message says: put cifar-10-python.tar.gz into the data folder.
    That works without a network."""
    source = tmp_path / "source"
    written = write_cifar10(source)
    use_checksums(monkeypatch, written["md5"])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = data_dir / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", md5(archive))
    train, test = load_datasets("cifar10", str(data_dir), 0, 0)
    assert len(train) == 20 and len(test) == 6
    assert train.targets[:4] == written["data_batch_1"][1]
    assert (data_dir / "cifar-10-batches-py" / "test_batch").is_file()


def assert_one_line_usage_error(error: UsageError, folder) -> None:
    message = str(error)
    assert "\n" not in message
    assert str(folder) in message
    assert "cifar-10-python.tar.gz" in message
    assert "--dataset synthetic" in message


def test_missing_cifar10_and_failed_download_is_a_usage_error(tmp_path, monkeypatch):
    def fail(self):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", fail)
    folder = tmp_path / "data"
    with pytest.raises(UsageError) as error:
        load_datasets("cifar10", str(folder), 0, 0)
    assert_one_line_usage_error(error.value, folder)
    assert "name resolution" in str(error.value)  # the reason is kept


def test_missing_cifar10_without_download_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as error:
        load_datasets("cifar10", str(tmp_path), 0, 0, download=False)
    assert_one_line_usage_error(error.value, tmp_path)


def test_failed_download_through_torchvision_is_a_usage_error(tmp_path, monkeypatch, offline):
    """The whole torchvision download path, with the network calls failing as they do offline."""
    with pytest.raises(UsageError) as error:
        load_datasets("cifar10", str(tmp_path), 0, 0)
    assert_one_line_usage_error(error.value, tmp_path)


@pytest.mark.parametrize("keep", [0, 1, 100, 0.5])
def test_truncated_cifar10_file_is_a_usage_error(tmp_path, monkeypatch, keep):
    written = write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    raw = path.read_bytes()
    path.write_bytes(raw[:int(keep * len(raw)) if isinstance(keep, float) else keep])
    # the md5 passes; the pickle is cut
    use_checksums(monkeypatch, {**written["md5"], "data_batch_1": md5(path)})
    with pytest.raises(UsageError) as error:
        load_datasets("cifar10", str(tmp_path), 0, 0)
    assert_one_line_usage_error(error.value, tmp_path)


def test_corrupt_file_with_a_wrong_checksum_is_downloaded_again(tmp_path, monkeypatch, offline):
    written = write_cifar10(tmp_path)
    use_checksums(monkeypatch, written["md5"])
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    path.write_bytes(path.read_bytes()[:-10])
    attempts = []
    real_download = torchvision.datasets.cifar.download_and_extract_archive

    def counting(*args, **kwargs):
        attempts.append(args)
        return real_download(*args, **kwargs)

    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", counting)
    with pytest.raises(UsageError) as error:
        load_datasets("cifar10", str(tmp_path), 0, 0)
    # the md5 check failed, so torchvision tried to fetch the archive, which failed offline
    assert attempts
    assert_one_line_usage_error(error.value, tmp_path)
