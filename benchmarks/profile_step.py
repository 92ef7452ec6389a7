"""Where a training step's time goes: torch.profiler over a few single_gpu steps, grouped into convolutions,
BatchNorm, element-wise work and the rest, plus the top operators; the convolutions split by pass (fprop, dgrad,
wgrad: by cuDNN's kernel names on a GPU; forward and backward on the CPU) and by the resolution of their input
(the stage); each category's achieved TFLOP/s or GB/s; and the step against the roofline of the model
(benchmarks/roofline.py: its layer shapes at the GPU's peak FLOP/s and memory bandwidth).

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
from common.performance import autocast, memory_format, model_on_meta, peak_tflops, resolve_fast_path
from benchmarks.roofline import bandwidth_tbs, roofline, step_ops
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
    with profile(activities=activities, record_shapes=True) as prof:  # shapes: each convolution's stage
        for _ in range(cfg.steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    operators, kernels = device_times(prof.key_averages(), cuda, cfg.steps)
    report = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
              "config": {"depth": cfg.depth, "alpha": cfg.alpha, "block": cfg.block,
                         "batch_size": cfg.batch_size, "width_multiple": cfg.width_multiple,
                         "align_channels": cfg.align_channels, "amp": cfg.amp,
                         "channels_last": cfg.channels_last, "compile": cfg.compile},
              **breakdown(operators, kernels, cfg.top)}
    report["conv_passes"] = conv_passes(prof.events(), cuda, cfg.steps)
    ops = step_ops(model_on_meta(cfg), cfg.batch_size, (data.channels, data.size, data.size), data.classes,
                   torch.float32 if cfg.amp == "off" else torch.bfloat16)
    report["achieved"] = achieved(report, ops)
    peak = peak_tflops(device, cfg.amp) if cuda else None
    bandwidth = bandwidth_tbs(report["device"]) if cuda else None
    report["roofline"] = None
    if peak is not None and bandwidth is not None:
        bound = roofline(ops, cfg.batch_size, peak, bandwidth)
        measured = report["kernel_seconds"]
        report["roofline"] = {**{k: v for k, v in bound.items() if k != "categories"},
                              "op_by_op_share": bound["op_by_op_s"] / measured,
                              "fused_share": bound["fused_s"] / measured}
    return report


def conv_pass(kernel: str, backward: bool) -> str:
    """Which pass a convolution kernel computes, by its name: cuDNN's and CUTLASS's say dgrad or wgrad; a
    layout kernel reshapes; any other kernel of a forward operator is fprop, of a backward one unnamed."""
    lowered = kernel.lower()
    if is_conv_layout(lowered):
        return "layout"
    for name in ("dgrad", "wgrad"):
        if name in lowered:
            return name
    return "backward (unnamed)" if backward else "fprop"


def conv_passes(events, cuda: bool, steps: int) -> dict:
    """Convolution time per step, in ms, by pass and by the resolution of the convolution's input ("32x32": the
    stem and stage 1, with stage 2's first, strided, convolution; "16x16"; "8x8"). On a GPU from each
    convolution operator's kernels, named by pass; on the CPU from the operators' self time, forward or
    backward (dgrad and wgrad are one operator there)."""
    table: dict[str, dict[str, float]] = {}
    for event in events:
        if event.device_type != DeviceType.CPU or "convolution" not in event.name:
            continue
        backward = "backward" in event.name
        shapes = [shape for shape in (event.input_shapes or []) if len(shape) == 4]
        activation = shapes[1] if backward and len(shapes) > 1 else shapes[0] if shapes else None
        stage = f"{activation[2]}x{activation[3]}" if activation else "?"
        if cuda:
            times = [(conv_pass(kernel.name, backward), kernel.duration) for kernel in event.kernels]
        else:
            times = [("backward" if backward else "fprop", event.self_cpu_time_total)]
        for kind, microseconds in times:
            row = table.setdefault(kind, {})
            row[stage] = row.get(stage, 0.0) + microseconds / 1e3 / steps
    return table


def achieved(report: dict, ops) -> dict:
    """Each category's achieved rate: the model's real FLOPs (its convolutions and classifier) over the
    convolution time, in TFLOP/s, and BatchNorm's and the element-wise work's minimum bytes over their time, in
    GB/s; then each convolution pass's TFLOP/s (on a GPU: fprop and wgrad do the forward's FLOPs, dgrad the
    forward's less the stem's, which needs no input gradient)."""
    shares = report["kernel_shares"] or report["shares"]
    seconds = report["kernel_seconds"] or report["step_seconds"]
    flops = {"convolution": sum(op.flops for op in ops if op.category in ("convolution", "classifier"))}
    moved = {kind: sum(op.bytes for op in ops if op.category == kind) for kind in ("batchnorm", "elementwise")}
    rates = {"convolution_tflops": flops["convolution"] / (shares["convolution"] * seconds) / 1e12}
    rates.update({f"{kind}_gbs": moved[kind] / (shares[kind] * seconds) / 1e9 if shares[kind] else None
                  for kind in moved})
    forward = [op for op in ops if op.name == "convolution"]
    fprop = sum(op.flops for op in forward)
    stem = forward[0].flops if forward else 0
    passes = report["conv_passes"]
    for kind, work in (("fprop", fprop), ("dgrad", fprop - stem), ("wgrad", fprop)):
        ms = sum(passes.get(kind, {}).values())
        rates[f"{kind}_tflops"] = work / (ms / 1e3) / 1e12 if ms and report["kernel_shares"] else None
    return rates


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
    lines += pass_lines(report.get("conv_passes") or {})
    rates = report.get("achieved") or {}
    if rates:
        def rate(key, unit):
            return f"{rates[key]:.1f} {unit}" if rates.get(key) is not None else "-"

        lines.append(f"  achieved: convolution {rate('convolution_tflops', 'TFLOP/s')} (fprop "
                     f"{rate('fprop_tflops', 'TFLOP/s')}, dgrad {rate('dgrad_tflops', 'TFLOP/s')}, wgrad "
                     f"{rate('wgrad_tflops', 'TFLOP/s')}); batchnorm {rate('batchnorm_gbs', 'GB/s')}; "
                     f"elementwise {rate('elementwise_gbs', 'GB/s')}")
    bound = report.get("roofline")
    if bound:
        lines.append(f"  roofline ({bound['peak_tflops']:g} TFLOP/s, {bound['bandwidth_tbs']:g} TB/s): "
                     f"{1e3 * bound['op_by_op_s']:.2f} ms op by op ({bound['op_by_op_images_per_sec']:.0f} "
                     f"images/s), {1e3 * bound['fused_s']:.2f} ms fused ({bound['fused_images_per_sec']:.0f}); "
                     f"this step is at {100 * bound['op_by_op_share']:.1f} % of the op-by-op roofline and "
                     f"{100 * bound['fused_share']:.1f} % of the fused one")
    elif "roofline" in report:
        lines.append("  roofline: needs a GPU of known peak FLOP/s and bandwidth")
    for row in report["top"]:
        lines.append(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {row['category']:<11} {row['op']}")
    if report["top_kernels"]:
        lines.append("top kernels:")
    for row in report["top_kernels"]:
        label = "conv layout" if row["conv_layout"] else row["category"]
        lines.append(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {label:<11} {row['kernel'][:110]}")
    return lines


def pass_lines(passes: dict) -> list[str]:
    """The convolutions' ms per step as a table: a row per pass, a column per input resolution."""
    if not passes:
        return []
    stages = sorted({stage for row in passes.values() for stage in row}, key=lambda s: (s == "?", -int(
        s.split("x")[0]) if s != "?" else 0))
    lines = ["  convolution ms per step by pass and input resolution: " + ", ".join(stages)]
    for kind, row in passes.items():
        cells = "  ".join(f"{row.get(stage, 0.0):8.3f}" for stage in stages)
        lines.append(f"    {kind:<19}{cells}   total {sum(row.values()):.3f}")
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
