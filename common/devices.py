"""Which devices a run uses, and seeding."""
from __future__ import annotations

import os
import random

import numpy as np
import torch

from common.config import UsageError


def cuda_devices(requested, *, default_all: bool, shared: bool = False,
                 sharing_hint: str = "") -> list[int]:
    """The CUDA device ids to use, checked; [] on a machine without CUDA (the caller then runs on
    the CPU). Without --gpu_devices: every visible GPU if `default_all`, else GPU 0. With `shared`,
    a GPU may be listed more than once (several gloo ranks on one GPU)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested is None:
        return list(range(count)) if default_all else [0][:count]
    repeated = sorted({i for i in requested if list(requested).count(i) > 1})
    if repeated and not shared:
        raise UsageError(f"--gpu_devices lists GPU {repeated[0]} more than once; list each "
                         f"GPU once{sharing_hint}")
    missing = [i for i in requested if not 0 <= i < count]
    if missing:
        seen = (f"GPUs 0-{count - 1} are visible" if count > 1 else "only GPU 0 is visible"
                if count else "this machine has no CUDA GPU")
        hint = "list only visible ids" if count else "leave out --gpu_devices to run on the CPU"
        raise UsageError(f"--gpu_devices: there is no GPU {missing[0]} ({seen}); {hint}")
    return list(requested)


def one_process(mode: str) -> None:
    """single_gpu and data_parallel train in one process. Started by torchrun as
    several, each would train the whole model alone on the same GPU: refused, in one
    line that the first process says."""
    processes = os.environ.get("WORLD_SIZE", "1")
    # torch's launcher started this process
    if "TORCHELASTIC_RUN_ID" in os.environ and processes != "1":
        raise UsageError(f"{mode}/train.py trains in one process and torchrun started "
                         f"{processes}: run it with python, or use dist_parallel/train.py under "
                         "torchrun for one process per GPU")


def seed_everything(seed: int) -> None:
    """Same seed, same initial weights in every mode (DDP also broadcasts
    rank 0's weights at wrap time)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too
