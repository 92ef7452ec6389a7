"""The rules every launch keeps, in one place: what is refused before a run starts, and how
the global batch splits over the processes. Each train.py applies them to itself, and
compare.py to every run of its matrix before it starts any, so that the matrix never starts a
run that would refuse to train."""
from __future__ import annotations

import torch.distributed as dist

from common.config import UsageError

# torch.compile's modes that capture CUDA graphs: reduce-overhead, and max-autotune (inductor's
# triton.cudagraphs is on in both; torch._inductor.list_mode_options)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# The first gradient bucket of a DDP model compiled by TorchDynamo: DDPOptimizer
# (torch/_dynamo/backends/distributed.py) is built with first_bucket_cap = this and
# bucket_bytes_cap = DDP's bucket_bytes_cap, which is int(bucket_cap_mb * 2**20), and asserts
# "First bucket should be smaller/equal to other buckets" when the first is the larger
# (torch/_dynamo/convert_frame.py builds it for every DDP model compiled with optimize_ddp on, the
# default, whatever the mode and the number of processes).
FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES  # 1 MiB


def launch_refusal(mode: str, processes: int, *, cuda: bool, batch_size: int,
                   backend: str | None = None, sync_bn: bool = False, compile: bool = False,
                   evaluate: bool = False, align_channels: int | None = None,
                   compile_mode: str | None = None,
                   bucket_cap_mb: float | None = None, memory_snapshot: int = 0) -> str | None:
    """Why `mode` over `processes` (GPUs, for data_parallel) cannot run on this machine
    (`cuda`: it has CUDA GPUs), in one line; None when it can. An evaluation trains nothing:
    any batch suits any number of them."""
    refusal = machine_refusal(cuda, (backend,), sync_bn, memory_snapshot=memory_snapshot)
    if refusal is not None:
        return refusal
    refusal = alignment_refusal(sync_bn, align_channels)
    if refusal is not None:
        return refusal
    if mode == "data_parallel" and compile and processes > 1:
        return compiled_replicas_refusal(processes)
    refusal = compile_refusal(mode, compile, compile_mode, bucket_cap_mb)
    if refusal is not None:
        return refusal
    if mode != "single_gpu" and batch_size % processes and not evaluate:
        unit = "GPUs" if mode == "data_parallel" else "processes"
        return uneven_batch_refusal(batch_size, processes, unit)
    return None


def compiled_replicas_refusal(gpus: int) -> str:
    """Why --compile cannot run data_parallel on several GPUs: it compiles what does not run."""
    return (f"--compile with data_parallel on {gpus} GPUs would compile nothing (TorchDynamo does "
            f"not trace DataParallel's replica threads): leave out --compile, or use dist_parallel")


def uneven_batch_refusal(batch_size: int, parts: int, unit: str) -> str:
    """Why a global --batch_size cannot train over `parts` GPUs or processes (`unit`)."""
    return (f"--batch_size {batch_size} does not divide over {parts} {unit}: the global batch is "
            f"split evenly, so give a multiple of {parts}")


def compile_refusal(mode: str, compile: bool, compile_mode: str | None,
                    bucket_cap_mb: float | None = None) -> str | None:
    """Why torch.compile cannot run `mode` this way, in one line; None when it can. FSDP2's hooks
    are not traced and every unshard allocates the gathered parameters anew, so CUDA graphs of its
    step would be recorded again on every step, or fail (pytorch/pytorch#127225). Compiled DDP
    asserts where DDP's buckets are smaller than its first one (FIRST_BUCKET_BYTES)."""
    if not compile:
        return None
    if mode == "fsdp" and compile_mode in CUDA_GRAPH_MODES:
        return (f"--compile_mode {compile_mode} captures CUDA graphs, which FSDP2 cannot keep (its "
                "unsharded parameters are allocated anew every step; pytorch/pytorch#127225): give "
                "--compile_mode default or max-autotune-no-cudagraphs")
    if mode == "dist_parallel" and bucket_cap_mb is not None and \
            int(bucket_cap_mb * 2**20) < FIRST_BUCKET_BYTES:
        return (f"--bucket_cap_mb {bucket_cap_mb:g} with --compile: compiled DDP needs buckets at "
                f"least as large as its first one ({FIRST_BUCKET_BYTES / 2**20:g} MiB; torch's "
                "DDPOptimizer asserts otherwise): give --bucket_cap_mb "
                f"{FIRST_BUCKET_BYTES / 2**20:g} or more")
    return None


def machine_refusal(cuda: bool, backends=(), sync_bn: bool = False,
                    flag: str = "--backend", memory_snapshot: int = 0) -> str | None:
    """Why this machine (`cuda`: it has CUDA GPUs) cannot run any of `backends`, SyncBatchNorm or
    a --memory_snapshot; None when it can. `flag` names the backends as the user gave them."""
    if "nccl" in backends and not cuda:
        return f"{flag} nccl needs CUDA GPUs and this machine has none: use {flag} gloo on CPUs"
    if sync_bn and not cuda:
        return "SyncBatchNorm (--sync_bn) needs GPUs: PyTorch's SyncBatchNorm refuses CPU modules"
    if memory_snapshot and not cuda:
        return memory_snapshot_refusal(memory_snapshot)
    return None


def memory_snapshot_refusal(steps: int) -> str:
    """Why --memory_snapshot cannot run here: there is no CUDA allocator to record."""
    return (f"--memory_snapshot {steps} records the CUDA caching allocator's history, and this "
            "run has no CUDA GPU: leave out --memory_snapshot, or run it on a GPU")


def alignment_refusal(sync_bn: bool, align_channels: int | None) -> str | None:
    """Why SyncBatchNorm cannot run with the channels stored aligned: it replaces the aligned
    BatchNorm with one of the paper's width."""
    if sync_bn and (align_channels or 0) > 1:
        return (f"--sync_bn with --align_channels {align_channels}: SyncBatchNorm takes the "
                "paper's channel counts only; give --align_channels 0")
    return None


def refuse_launch(mode: str, processes: int, **settings) -> None:
    """`launch_refusal` as the one-line error of a train.py."""
    refusal = launch_refusal(mode, processes, **settings)
    if refusal is not None:
        raise UsageError(refusal)


def per_process_batch(batch_size: int, processes: int, train_images: int) -> int:
    """Each process's share of the global --batch_size, which must fit in the training set. A
    training batch divides evenly (refused at launch otherwise); an evaluation's share is rounded
    up, so that every test image still has a place."""
    if batch_size > train_images:
        raise UsageError(f"--batch_size {batch_size} is larger than the training set "
                         f"({train_images} images); use a smaller batch")
    return -(-batch_size // processes)
