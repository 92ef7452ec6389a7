"""The gpu loader: a train.py's own DataLoader, its dataset held on the device, each batch one
gather with its random crop and flip folded into the indices, then the normalisation. No worker
processes, no host round trip.

    loader = DeviceLoader(train_loader, device, pad=4, flip=True, mean=MEAN, std=STD)

It takes the train file's DataLoader as it is (its sampler, batch size and drop_last; its
runkit.Augmented dataset, whose seed and epoch it reads) and gives its batches: the same images,
bit for bit on the CPU, in the same order. runkit.Augmented crops image i of epoch e under
torch's generator seeded from (seed, e, i), drawing RandomCrop's top and left, then
RandomHorizontalFlip's coin; `crop_draws` makes the same draws for the whole dataset at once
(torch's Mersenne Twister, its first three outputs, in numpy), and checks itself against the
Augmented dataset's own images when it starts. A resumed epoch's batches are the rest of the same
epoch (`from_batch`). It holds the datasets that are tensors already: the synthetic set, CIFAR-10
and MNIST, augmented with --augment pad or off at their own size; for the rest (an image folder,
--augment resized, another --image_size) use the torchvision loader.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


class DeviceLoader:
    """`loader`'s batches from the device: its dataset (a runkit.Augmented of a tensor dataset)
    copied there once as uint8, padded by `pad` pixels for its random crops (None: no crop),
    mirrored at random where `flip`, normalised by `mean` and `std` as torchvision's
    ToDtype(scale=True) and Normalize compute it. Iterate it as the DataLoader: `len`, `sampler`,
    `dataset`, `batch_size` as the DataLoader's."""

    def __init__(self, loader: DataLoader, device: torch.device, *, pad: int | None, flip: bool,
                 mean, std):
        self.sampler, self.batch_size, self.drop_last = loader.sampler, loader.batch_size, \
            loader.drop_last
        self.dataset, self.device, self.pad, self.flip = loader.dataset, device, pad, flip
        self.num_workers, self.pin_memory = 0, False  # a DataLoader of the same, made from it
        images, labels = tensors_of(self.dataset.dataset)
        self.height, self.width = images.shape[2:]
        images = images.permute(0, 2, 3, 1)  # NHWC: a gather of it, permuted, is channels_last
        if pad:
            images = torch.nn.functional.pad(images, (0, 0, pad, pad, pad, pad))
        self.images, self.labels = images.to(device).contiguous(), labels.to(device)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.skip, self.draws, self.ahead = 0, {}, ThreadPoolExecutor(1)
        self.check()

    def __len__(self) -> int:
        size = len(self.sampler)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def from_batch(self, skip: int) -> DeviceLoader:
        """The next iteration from the epoch's batch `skip` on: a resumed epoch's rest."""
        self.skip = skip
        return self

    def __iter__(self):
        epoch, skip = self.dataset.epoch, self.skip
        self.skip = 0
        order = torch.tensor(list(self.sampler), dtype=torch.int64)[skip * self.batch_size:]
        order = order.to(self.device)
        draws = self.epoch_draws(epoch)
        self.epoch_draws(epoch + 1, ahead=True)  # the next epoch's, while this one trains
        for start in range(0, len(self) * self.batch_size - skip * self.batch_size,
                           self.batch_size):
            index = order[start:start + self.batch_size]
            yield self.batch(index, draws), self.labels[index]

    def epoch_draws(self, epoch: int, ahead: bool = False):
        """Epoch `epoch`'s crops and flips of every image, on the device (None: no crop); `ahead`:
        drawn in a thread meanwhile (numpy leaves the interpreter to the training loop)."""
        if self.pad is None:
            return None
        if epoch not in self.draws:
            size, seed, pad, flip = len(self.labels), self.dataset.seed, self.pad, self.flip
            self.draws[epoch] = self.ahead.submit(crop_draws, seed, epoch, size, pad, flip)
        if ahead:
            return None
        for earlier in [key for key in self.draws if key < epoch]:
            del self.draws[earlier]
        top, left, mirrored = self.draws[epoch].result()
        return (torch.from_numpy(top).to(self.device), torch.from_numpy(left).to(self.device),
                torch.from_numpy(mirrored).to(self.device))

    def batch(self, index: torch.Tensor, draws) -> torch.Tensor:
        """The images `index`: cropped and flipped by `draws`, normalised, channels_last."""
        if draws is None:
            images = self.images[index]
        else:
            top, left, mirrored = draws
            rows = top[index, None] + torch.arange(self.height, device=self.device)
            across = torch.arange(self.width, device=self.device)
            cols = left[index, None] + torch.where(mirrored[index, None], self.width - 1 - across,
                                                   across)
            images = self.images[index[:, None, None], rows[:, :, None], cols[:, None, :]]
        images = images.permute(0, 3, 1, 2).to(torch.float32)  # as ToDtype(scale=True), Normalize
        return images.mul_(1.0 / 255).sub_(self.mean).div_(self.std)

    def check(self, count: int = 4) -> None:
        """The first images of epoch 0 as the Augmented dataset itself makes them, or a
        RuntimeError: a train file whose transforms differ from what this loader was told."""
        epoch, self.dataset.epoch = self.dataset.epoch, 0
        try:
            index = torch.arange(min(count, len(self.labels)), device=self.device)
            ours = self.batch(index, self.epoch_draws(0)).cpu()
            theirs = torch.stack([torch.as_tensor(self.dataset[i][0]) for i in range(len(index))])
        finally:
            self.dataset.epoch = epoch
        if not torch.allclose(ours, theirs.as_subclass(torch.Tensor), rtol=0, atol=1e-5):
            raise RuntimeError("the gpu loader's images differ from the train file's transforms "
                               "(benchmarks/gpu_loader.py): use --loader torchvision")


def tensors_of(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images (N, C, H, W), int64 labels (N,)) of a TensorDataset of uint8 images (the
    synthetic set), or of a torchvision dataset holding `data` and `targets` (CIFAR-10: NHWC arrays;
    MNIST: NHW tensors)."""
    if isinstance(dataset, TensorDataset):
        images, labels = dataset.tensors[:2]
    else:
        images, labels = torch.as_tensor(np.asarray(dataset.data)), dataset.targets
        images = images[:, None] if images.ndim == 3 else images.permute(0, 3, 1, 2)
    return images.to(torch.uint8), torch.as_tensor(labels, dtype=torch.int64)


# ----------------------------------------------------------------- runkit.Augmented's draws at once
def crop_draws(seed: int, epoch: int, size: int, pad: int, flip: bool):
    """(top, left, mirrored) of each of `size` images in epoch `epoch`: what RandomCrop(side,
    padding=pad) and RandomHorizontalFlip draw for image i under runkit.Augmented's generator of
    (seed, epoch, i): torch.randint(0, 2 * pad + 1) twice, then torch.rand(1) < 0.5 (never without
    `flip`). Torch's CPU generator is the Mersenne Twister seeded with the seed's low 32 bits; a
    randint of a range under 2**28 is its 32-bit output modulo the range, a float32 rand its low 24
    bits over 2**24 (torch/include/ATen/core/MT19937RNGEngine.h, DistributionsHelper.h)."""
    seeds = np.array([augmented_seed(seed, epoch, index) & 0xFFFFFFFF for index in range(size)],
                     dtype=np.uint64)
    first = twister_outputs(seeds, 3 if flip else 2)
    top, left = (first[k] % np.uint64(2 * pad + 1) for k in (0, 1))
    mirrored = (first[2] & 0xFFFFFF) < 2 ** 23 if flip else np.zeros(size, dtype=bool)
    return top.astype(np.int64), left.astype(np.int64), mirrored


def augmented_seed(seed: int, epoch: int, index: int) -> int:
    """The seed runkit.Augmented gives torch before it transforms image `index` of `epoch`."""
    key = f"{seed}/{epoch}/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "big")


def twister_outputs(seeds: np.ndarray, count: int) -> list[np.ndarray]:
    """The first `count` (at most 227) 32-bit outputs of an MT19937 seeded with each of `seeds`
    (32-bit, in uint64): init_genrand, the twist of the first words, the tempering."""
    mask = np.uint64(0xFFFFFFFF)
    state = [seeds & mask]
    for j in range(1, 397 + count + 1):  # word k's twist reads words k, k + 1 and k + 397
        previous = state[-1]
        state.append((np.uint64(1812433253) * (previous ^ (previous >> np.uint64(30)))
                      + np.uint64(j)) & mask)
    outputs = []
    for k in range(count):
        mixed = (state[k] & np.uint64(0x80000000)) | (state[k + 1] & np.uint64(0x7FFFFFFF))
        word = state[k + 397] ^ (mixed >> np.uint64(1)) ^ np.where(
            state[k + 1] & np.uint64(1), np.uint64(0x9908B0DF), np.uint64(0))
        word ^= word >> np.uint64(11)
        word ^= (word << np.uint64(7)) & np.uint64(0x9D2C5680)
        word ^= (word << np.uint64(15)) & np.uint64(0xEFC60000)
        word ^= word >> np.uint64(18)
        outputs.append(word & mask)
    return outputs
