"""The order of an epoch's images: `ShuffleSampler`, one process's order of each training epoch
(exactly DistributedSampler's with one replica, so that one-process runs of every mode see the same
batches), `follow_epoch`, which a loader's start_epoch calls, and `EvalShard`, each rank's share of
the test set, every image counted once."""
from __future__ import annotations

import torch
from torch.utils.data import Sampler


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
