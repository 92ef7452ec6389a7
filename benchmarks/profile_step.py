"""Where a training step's time goes: torch.profiler over a few single_gpu steps, grouped into convolutions,
BatchNorm, element-wise work and the rest, plus the top operators.

    python benchmarks/profile_step.py --batch_size 256                       # the default model, the fast path
    python benchmarks/profile_step.py --batch_size 256 --width_multiple 8    # widths rounded for tensor cores
    python benchmarks/profile_step.py --depth 8 --alpha 12 --batch_size 32 --steps 3 --out profile.json  # CPU

It takes every train.py flag (model, --amp, --channels_last, --compile, ...) and builds the model and optimizer
with single_gpu/train.py's own functions; the batches are synthetic and stay on the device. Times are the
operators' self time on the device (on the CPU without one), so nested operators are not counted twice; on a GPU the
kernels are split the same way and the top ones listed, with the share of cuDNN's layout/padding kernels.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from common.config import Config, flag, parse_config, user_errors
from common.data import DATASET_INFO
from common.devices import seed_everything
from common.performance import autocast, memory_format, resolve_fast_path
from single_gpu.train import get_model, get_optimizer, setup

# What operators and kernels compute, not which library ran them: cuDNN runs BatchNorm as well as convolutions
# (aten::cudnn_batch_norm, bn_fw_tr_1C11_kernel_NCHW), so "cudnn" alone names no category. Checked in this order:
# BatchNorm's names are the most specific, convolution names can hold element-wise words ("nhwcAddPaddingKernel",
# "addmm"), and element-wise words are the loosest. Names are lowercased first; backward names carry the same words.
CONV_LAYOUT = r"addpadding|removepadding|nchwtonhwc|nhwctonchw|tensortransform|converttensor"
CATEGORIES = {
    "batchnorm": re.compile(r"batch_?norm|bn_fw|bn_bw"),  # aten::*batch_norm*, cuDNN's bn_*, MIOpenBatchNorm*
    "convolution": re.compile(  # convolutions and matrix products: operators, GEMM and implicit-GEMM kernels
        r"conv(?!ert)|gemm|gemv|fprop|dgrad|wgrad|winograd|fft\dd|splitkreduce|[sh]\d*cudnn|"
        r"(?<![a-z])(add|b|baddb)?mm(?![a-z])|matmul|(?<![a-z])linear|" + CONV_LAYOUT),
    "elementwise": re.compile(  # memory-bound work: arithmetic, copies, fills, pooling, the loss, the optimizer
        r"add|mul|div|sub|neg|sqrt|where|relu|threshold|clamp|copy|fill|zero|memset|memcpy|pad|cat|elementwise|"
        r"reduce|mean|sum|pool|softmax|nll|cross_entropy|foreach|multi_tensor|sgd|(?<![a-z])amp_"),
}
KINDS = ("convolution", "batchnorm", "elementwise", "other")  # as reported
# cuDNN's layout kernels reshape a convolution's tensors for the tensor cores (NCHW to NHWC and back, channels padded
# to a multiple of 8, tensorTransformGeneric, convertTensor), launched inside the convolution operators.
# They are counted in convolution, where the operators' self time puts them anyway, so operator and kernel shares
# agree; but their share gets a line of its own, because it is what --channels_last and --width_multiple 8 remove
# (17.7 ms of a 75.7 ms bf16 step of PyramidNet-110 alpha 270 on an H100, gone with --width_multiple 8): a cost of
# the shapes, not of the arithmetic. "Memset (Device)" stays element-wise although cuDNN launches most memsets inside
# the convolutions (zeroed workspaces, about 4% of an H100 step): a kernel's name does not say who launched it, and
# that is the gap left between the operator and kernel splits.
LAYOUT_HINT = "cuDNN reshaping inputs for tensor cores; --channels_last and --width_multiple 8 avoid it"


@dataclass(frozen=True)
class ProfileConfig(Config):
    steps: int = flag(5, "profiled steps, after --warmup_steps unprofiled ones", at_least=1)
    top: int = flag(15, "operators listed by self time", at_least=1)
    out: str | None = flag(None, "also write the breakdown as JSON to this file", check="file")


def category(name: str) -> str:
    """The category of an operator or kernel name (see CATEGORIES), "other" when none matches."""
    lowered = name.lower()
    return next((kind for kind, pattern in CATEGORIES.items() if pattern.search(lowered)), "other")


def is_conv_layout(name: str) -> bool:
    """Whether a kernel is cuDNN reshaping a convolution's tensors rather than computing it."""
    return re.search(CONV_LAYOUT, name.lower()) is not None


def profile_steps(cfg: ProfileConfig) -> dict:
    device, _ = setup(cfg)
    cfg = resolve_fast_path(cfg, device)
    seed_everything(cfg.seed)
    model, raw_model = get_model(cfg, device)
    optimizer, _, scaler = get_optimizer(cfg, raw_model, device, steps_per_epoch=1)
    data = DATASET_INFO[cfg.dataset]  # random images of the shape the model was built for
    images = torch.randn(cfg.batch_size, data.channels, data.size, data.size, device=device)
    images = images.contiguous(memory_format=memory_format(cfg))
    labels = torch.randint(0, data.classes, (cfg.batch_size,), device=device)

    def step():
        with autocast(cfg, device):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    model.train()
    for _ in range(max(cfg.warmup_steps, 1)):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(cfg.steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    operators, kernels = device_times(prof.key_averages(), cuda, cfg.steps)
    return {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
            "config": {"depth": cfg.depth, "alpha": cfg.alpha, "block": cfg.block, "batch_size": cfg.batch_size,
                       "width_multiple": cfg.width_multiple, "amp": cfg.amp, "channels_last": cfg.channels_last,
                       "compile": cfg.compile},
            **breakdown(operators, kernels, cfg.top)}


def device_times(events, cuda: bool, steps: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Operators' and kernels' (name, seconds per step) from key_averages(). Operators count their self time, so
    nested ones are not counted twice. GPU user annotations (record_function ranges such as the optimizer's, drawn on
    the GPU timeline) are no kernels: they span kernels already counted, and torch's own table leaves them out too."""
    self_time = "self_device_time_total" if cuda else "self_cpu_time_total"  # microseconds over every step
    operators = [(e.key, getattr(e, self_time)) for e in events if e.device_type == DeviceType.CPU]
    kernels = [(e.key, e.self_device_time_total) for e in events
               if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    return per_step(operators, steps), per_step(kernels, steps)


def per_step(times: list[tuple[str, float]], steps: int) -> list[tuple[str, float]]:
    """(name, total microseconds) -> (name, seconds per step), largest first, zeros dropped."""
    return sorted(((name, us / 1e6 / steps) for name, us in times if us > 0), key=lambda item: -item[1])


def breakdown(operators: list[tuple[str, float]], kernels: list[tuple[str, float]], top: int) -> dict:
    """The report's figures from (name, seconds per step), largest first. Operators and kernels are split alike, so
    the two views check each other; kernels alone show the layout/padding that cuDNN adds inside a convolution.
    Without kernels (on the CPU) the kernel figures are None and the list is empty."""
    step_seconds = sum(seconds for _, seconds in operators)
    kernel_seconds = sum(seconds for _, seconds in kernels)
    layout_seconds = sum(seconds for name, seconds in kernels if is_conv_layout(name))
    return {"step_seconds": step_seconds, "shares": shares(operators),
            "kernel_seconds": kernel_seconds if kernels else None,
            "kernel_shares": shares(kernels) if kernels else None,
            "conv_layout_share": layout_seconds / kernel_seconds if kernels else None,
            "top": [{"op": name, "ms_per_step": 1e3 * s, "share": s / step_seconds, "category": category(name)}
                    for name, s in operators[:top]],
            "top_kernels": [{"kernel": name, "ms_per_step": 1e3 * s, "share": s / kernel_seconds,
                             "category": category(name), "conv_layout": is_conv_layout(name)}
                            for name, s in kernels[:top]]}


def shares(times: list[tuple[str, float]]) -> dict[str, float]:
    """Each category's part of the total time, every category present so that reports line up."""
    total = sum(seconds for _, seconds in times)
    parts = dict.fromkeys(KINDS, 0.0)
    for name, seconds in times:
        parts[category(name)] += seconds / total
    return parts


def summary(report: dict) -> list[str]:
    """The printed report: the split by operators, then by kernels with the layout/padding line, then the tops."""
    def split(parts):
        return ", ".join(f"{kind} {100 * share:.1f}%" for kind, share in parts.items())

    lines = [f"{report['device']}, batch {report['config']['batch_size']}: {1e3 * report['step_seconds']:.2f} ms of "
             f"operator self time per step",
             f"  operators: {split(report['shares'])}"]
    if report["kernel_shares"] is not None:
        lines += [f"  kernels:   {split(report['kernel_shares'])} of {1e3 * report['kernel_seconds']:.2f} ms",
                  f"  conv layout/padding kernels: {100 * report['conv_layout_share']:.1f}% of kernel time, in "
                  f"convolution ({LAYOUT_HINT})"]
    for row in report["top"]:
        lines.append(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {row['category']:<11} {row['op']}")
    if report["top_kernels"]:
        lines.append("top kernels:")
    for row in report["top_kernels"]:
        label = "conv layout" if row["conv_layout"] else row["category"]
        lines.append(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {label:<11} {row['kernel'][:110]}")
    return lines


def main(argv=None) -> None:
    cfg = parse_config(ProfileConfig, argv, description=__doc__)
    report = profile_steps(cfg)
    print("\n".join(summary(report)))
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    with user_errors():
        main()
