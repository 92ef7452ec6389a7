"""benchmarks/gpu_loader.py on the CPU: the train files' own DataLoaders, their dataset held on the
device, give the same batches bit for bit in the same order (every epoch, every sampler, a resumed
epoch's rest), each crop drawn as runkit.Augmented draws it; and a loader told other transforms
than the train file's refuses to start. On a GPU the same holds within float rounding
(tests/gpu/test_cuda_paths.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchvision.transforms import v2 as T

import runkit
from benchmarks.fast import train_file
from benchmarks.gpu_loader import DeviceLoader, augmented_seed, crop_draws, tensors_of

CPU = torch.device("cpu")
FLAGS = ["--dataset", "synthetic", "--synthetic_size", "200", "--batch_size", "32",
         "--num_workers", "0"]


@pytest.fixture(scope="module")
def single():
    return train_file("single_gpu")


def plain_and_device(single, *flags):
    """single_gpu/train.py's (train, test) DataLoaders for `flags`, and the gpu loader of each, as
    benchmarks/fast.py makes them."""
    args = single.get_args([*FLAGS, *flags])
    train_set, test_set, _ = single.get_datasets(args)
    single.data_defaults(args, len(train_set))
    train, test = single.get_loaders(args, train_set, test_set, CPU)
    side, _, mean, std = single.IMAGES[args.dataset]
    pad = side // 8 if args.augment == "pad" else None
    return (train, test, DeviceLoader(train, CPU, pad=pad, flip=args.flip, mean=mean, std=std),
            DeviceLoader(test, CPU, pad=None, flip=False, mean=mean, std=std))


def same_batches(first, second) -> bool:
    first, second = list(first), list(second)
    return len(first) == len(second) > 0 and all(
        torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(first, second))


@pytest.mark.parametrize("flags", [[], ["--no-flip"], ["--augment", "off"], ["--no_shuffle"]])
def test_the_gpu_loader_gives_the_train_files_batches_bit_for_bit(single, flags):
    """Every epoch's batches, in the epoch's order (the file's own epoch_batches sets it), the
    crops and flips those of runkit.Augmented, the normalisation torchvision's; the test set's."""
    train, test, on_device, test_on_device = plain_and_device(single, *flags)
    assert len(on_device) == len(train) == 200 // 32 and len(test_on_device) == len(test) == 2
    for epoch in (0, 1):  # the two share the sampler: each its epoch's order in turn
        plain = list(single.epoch_batches(train, epoch, {"batch": 0}))
        assert same_batches(plain, single.epoch_batches(on_device, epoch, {"batch": 0})), epoch
    assert same_batches(test, test_on_device)
    images, _ = next(iter(on_device))
    assert images.is_contiguous(memory_format=torch.channels_last)  # gathered NHWC


def test_a_resumed_epoch_gets_the_rest_of_the_same_batches(single):
    train, _, on_device, _ = plain_and_device(single)
    whole = list(single.epoch_batches(train, 3, {"batch": 0}))
    single.epoch_batches(on_device, 3, {"batch": 0})  # as benchmarks/fast.py sets the epoch
    assert same_batches(whole[2:], on_device.from_batch(2))
    assert len(list(on_device)) == len(whole)  # the next iteration starts at the first again


def test_a_distributed_samplers_share_is_its_own(single):
    """dist_parallel's sampler: each rank's share in DistributedSampler's order of the epoch."""
    args = single.get_args(FLAGS)
    train_set, _, _ = single.get_datasets(args)
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToImage(),
                           T.ToDtype(torch.float32, scale=True),
                           T.Normalize((0.5,) * 3, (0.25,) * 3)])
    augmented = runkit.Augmented(train_set, transform, seed=5)
    for rank in (0, 1):
        sampler = DistributedSampler(augmented, num_replicas=2, rank=rank, seed=5)
        plain = DataLoader(augmented, 16, sampler=sampler, drop_last=True)
        on_device = DeviceLoader(plain, CPU, pad=4, flip=True, mean=(0.5,) * 3, std=(0.25,) * 3)
        for epoch in (0, 2):
            sampler.set_epoch(epoch)
            augmented.set_epoch(epoch)
            assert same_batches(plain, on_device), (rank, epoch)


class CifarLike(torch.utils.data.Dataset):
    """What torchvision's CIFAR10 and MNIST hold and give: `data` (NHWC uint8 arrays; NHW uint8
    tensors) and `targets`, each item a PIL image."""

    def __init__(self, data, targets, mode):
        self.data, self.targets, self.mode = data, targets, mode

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        pixels = np.asarray(self.data[index])
        return Image.fromarray(pixels, mode=self.mode), int(self.targets[index])


@pytest.mark.parametrize("channels", [3, 1])
def test_cifar10_and_mnist_as_torchvision_holds_them(channels):
    draws = torch.Generator().manual_seed(0)
    side = 32 if channels == 3 else 28
    shape = (40, side, side, 3) if channels == 3 else (40, side, side)  # CIFAR-10's; MNIST's
    pixels = torch.randint(0, 256, shape, generator=draws, dtype=torch.uint8)
    targets = torch.randint(0, 10, (40,), generator=draws)
    dataset = (CifarLike(pixels.numpy(), targets.tolist(), "RGB") if channels == 3
               else CifarLike(pixels, targets, "L"))
    images, labels = tensors_of(dataset)
    assert images.shape == (40, channels, side, side) and torch.equal(labels, targets)
    mean, std = (0.4,) * channels, (0.3,) * channels
    transform = T.Compose([T.RandomCrop(side, padding=side // 8), T.RandomHorizontalFlip(),
                           T.ToImage(), T.ToDtype(torch.float32, scale=True),
                           T.Normalize(mean, std)])
    plain = DataLoader(runkit.Augmented(dataset, transform, seed=1), 8, drop_last=True)
    on_device = DeviceLoader(plain, CPU, pad=side // 8, flip=True, mean=mean, std=std)
    assert same_batches(plain, on_device)


def test_the_draws_are_torchs_own_for_each_image():
    """runkit.Augmented seeds torch's generator from (seed, epoch, index), then RandomCrop draws
    the top and the left and RandomHorizontalFlip its coin: crop_draws makes those draws for the
    whole dataset at once."""
    top, left, mirrored = crop_draws(7, 3, 2000, 4, flip=True)
    generator = torch.Generator()
    for index in range(2000):
        generator.manual_seed(augmented_seed(7, 3, index))
        drawn = (int(torch.randint(0, 9, (), generator=generator)),
                 int(torch.randint(0, 9, (), generator=generator)),
                 bool(torch.rand(1, generator=generator) < 0.5))
        assert drawn == (top[index], left[index], mirrored[index]), index
    assert 0.4 < mirrored.mean() < 0.6 and set(top) == set(range(9))
    unflipped = crop_draws(7, 3, 2000, 4, flip=False)
    assert np.array_equal(unflipped[0], top) and not unflipped[2].any()
    assert not np.array_equal(crop_draws(7, 4, 2000, 4, True)[0], top)  # another epoch


def test_a_loader_told_other_transforms_refuses_to_start():
    """A train file whose crop differs from what the loader was told (its padding here): refused
    when the loader starts, not trained on quietly."""
    images = torch.randint(0, 256, (20, 3, 32, 32), dtype=torch.uint8)
    dataset = TensorDataset(images, torch.zeros(20, dtype=torch.int64))
    transform = T.Compose([T.RandomCrop(32, padding=4), T.ToImage(),
                           T.ToDtype(torch.float32, scale=True),
                           T.Normalize((0.5,) * 3, (0.2,) * 3)])
    plain = DataLoader(runkit.Augmented(dataset, transform, 0), 4)
    DeviceLoader(plain, CPU, pad=4, flip=False, mean=(0.5,) * 3, std=(0.2,) * 3)
    with pytest.raises(RuntimeError, match="differ from the train file's transforms"):
        DeviceLoader(plain, CPU, pad=2, flip=False, mean=(0.5,) * 3, std=(0.2,) * 3)
