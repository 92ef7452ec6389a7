"""The fast path, the same in every mode: mixed precision, memory format, backend switches, and the figures that
say how close a run comes to the hardware (FLOPs per image, model FLOPs utilisation).

`--amp` and `--channels_last` default to what suits the device: bf16 autocast and NHWC tensors on a GPU (fp16 with
a GradScaler where bf16 is missing), fp32 NCHW on the CPU. `resolve_fast_path` turns those defaults into explicit
values before anything is built, so results.json records what actually ran.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from common.config import Config, UsageError
from common.data import DATASET_INFO
from models import pyramidnet

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Dense (no sparsity) peak tensor throughput in TFLOP/s, per GPU, by the dtype a run computes in. A run with
# --amp off computes its convolutions in TF32 (cuDNN's default, kept here). GeForce figures are those with FP32
# accumulation, which autocast uses. The first key found in the device name wins, so the specific names come first.
# Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM, PCIe and NVL columns); NVIDIA H200 datasheet; NVIDIA A100
# datasheet; NVIDIA L40S datasheet; NVIDIA Ada GPU architecture whitepaper, appendix A (RTX 4090); NVIDIA Ampere
# GA102 GPU architecture whitepaper, appendix A (RTX 3090). Datasheets quote "with sparsity": halved here.
GPU_PEAK_TFLOPS = {
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM5
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},  # SXM4 and PCIe, 40 and 80 GB
    "L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
}


def resolve_fast_path(cfg: Config, device: torch.device) -> Config:
    """The config with --amp and --channels_last made explicit for `device` and checked against it; on a GPU,
    cuDNN autotuning and TF32 matrix products switched on."""
    cuda = device.type == "cuda"
    bf16_ok = not cuda or torch.cuda.is_bf16_supported(including_emulation=False)
    amp = cfg.amp or ("off" if not cuda else "bf16" if bf16_ok else "fp16")
    if amp == "bf16" and not bf16_ok:
        raise UsageError(f"{torch.cuda.get_device_name(device)} has no bf16 tensor cores: use --amp fp16 or off")
    channels_last = cuda if cfg.channels_last is None else cfg.channels_last
    if cuda:
        torch.backends.cudnn.benchmark = True  # the fastest algorithm per shape; shapes are fixed (drop_last)
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 matrix products, as convolutions by default
    return dataclasses.replace(cfg, amp=amp, channels_last=channels_last)


def memory_format(cfg: Config) -> torch.memory_format:
    return torch.channels_last if cfg.channels_last else torch.contiguous_format


def autocast(cfg: Config, device: torch.device):
    """The forward pass's precision: a torch.autocast region, or nothing with --amp off."""
    if cfg.amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPES[cfg.amp])


def grad_scaler(cfg: Config, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling for fp16, whose small range underflows gradients; a pass-through for bf16 and fp32."""
    return torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")


def flops_per_image(cfg: Config) -> int:
    """Forward plus backward FLOPs of one training image, counted by torch.utils.flop_counter on a copy of the model
    built on the meta device (no memory, no compute, the real model untouched). Convolutions and the classifier
    are counted (2 FLOPs per multiply-add); BatchNorm, ReLU and additions are not, as in the usual MFU convention."""
    from torch.utils.flop_counter import FlopCounterMode

    batch, data = 2, DATASET_INFO[cfg.dataset]  # the images' shape and the classes of the data trained on
    with torch.device("meta"):
        model = pyramidnet(cfg.depth, cfg.alpha, cfg.block, num_classes=data.classes, in_channels=data.channels,
                           width_multiple=cfg.width_multiple)
        images = torch.empty(batch, data.channels, data.size, data.size)
        labels = torch.zeros(batch, dtype=torch.int64)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(images), labels).backward()
    return counter.get_total_flops() // batch


def peak_tflops(device: torch.device, amp: str) -> float | None:
    """The GPU's dense peak for the dtype in use, or None on the CPU and on GPUs missing from the table."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    dtype = amp if amp != "off" else ("tf32" if torch.backends.cudnn.allow_tf32 else "fp32")
    return next((peaks[dtype] for key, peaks in GPU_PEAK_TFLOPS.items() if key in name), None)


def mfu(images_per_sec_per_gpu: float | None, flops: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the model's useful FLOPs per second on one GPU over that GPU's peak."""
    if images_per_sec_per_gpu is None or peak is None:
        return None
    return images_per_sec_per_gpu * flops / (peak * 1e12)


def speed_summary(cfg: Config, totals, timer, device: torch.device, devices: int) -> dict:
    """The run's speed figures for results.json, from its timed log windows (`totals`, a Sums) and its step timer.
    `devices` is how many GPUs (or CPUs) the global batch is split over."""
    rate = totals.images_per_sec(cfg.batch_size)
    per_device = rate / devices if rate is not None else None
    flops = flops_per_image(cfg)
    p50, p90 = timer.percentiles()
    first = timer.first_step_seconds
    return {
        "images_per_sec": rate, "images_per_sec_per_gpu": per_device, "batch_time_p50": p50, "batch_time_p90": p90,
        "data_wait_frac": totals.data_frac, "flops_per_image": flops,
        "mfu": mfu(per_device, flops, peak_tflops(device, cfg.amp)), "first_step_s": first,
        "compile_time_s": first - (p50 or 0.0) if cfg.compile and first is not None else None}


def describe_fast_path(cfg: Config) -> str:
    """`amp bf16, channels_last, compiled` for the run's first line."""
    parts = [f"amp {cfg.amp}" if cfg.amp != "off" else "fp32", "channels_last" if cfg.channels_last else "NCHW"]
    return ", ".join(parts + (["compiled"] if cfg.compile else []))
