"""A roofline of one training step of the model, from its layer shapes: what a GPU could do at best.

    python benchmarks/roofline.py            # PyramidNet-110 alpha=270, batch 256, bf16, H100 SXM
    python benchmarks/roofline.py --gpu "NVIDIA H200" --width_multiple 8
    python benchmarks/roofline.py --peak_tflops 500 --bandwidth_tbs 2 --depth 56 --alpha 84

Every operator of the forward pass, the loss and the backward pass is recorded once on the meta
device (shapes only: no memory, no compute) with its FLOPs (torch.utils.flop_counter's formulas:
convolutions and matrix products), the fewest bytes it must move (each input read once and each
output written once, at the dtype the step computes in) and the kernels an eager step launches for
it on a GPU: one per operator, two per training BatchNorm forward and backward (statistics, then
normalising; the reductions, then the input gradient), one per gradient a convolution's backward
computes, none for an allocation. Then the SGD update (parameter, gradient and momentum in fp32, one
kernel). Each bound is a time per step that nothing beats under its assumptions, every operator at
the GPU's dense peak FLOP/s or its memory bandwidth, whichever takes longer:

- op by op, no kernel cost: every operator's bound added up, each in one pass, as eager runs them;
- op by op + per-kernel floor: the same plus --kernel_us for every kernel (a stated cost, not
  measured here: launching a kernel, filling the GPU, draining it; eager PyTorch's host spends more
  per operator);
- fused as training BatchNorm allows: a BatchNorm needs its batch statistics before it can
  normalise, so it cannot fuse with what produces its input: forward, its input is read twice
  (statistics, then normalising) and its output written; backward, the gradient and the saved input
  are read twice and the input gradient written. Each residual sum is written, forward and backward.
  The convolutions, the classifier and the update move what they move op by op; ReLU, padding,
  pooling and the loss run inside those passes, free. Plus --kernel_us for each of its kernels (the
  convolutions', two per BatchNorm, the update's). Every pass streams its tensors through memory (no
  reuse in L2 between kernels); normalising inside the next convolution's operand load is not
  assumed;
- ideal fusion, no kernel cost: only the convolutions, the classifier and the update move bytes, as
  if every BatchNorm, ReLU, addition and shortcut ran inside the convolutions' prologues and
  epilogues. Training BatchNorm rules that out: the limit of fusion, not a reachable figure.

All four run the convolutions at the GPU's dense peak, of which measured convolutions reach a
fraction (BENCHMARKS.md). A measured step is "x % of a bound": the bound's time over the measured
time. --align_channels N bounds the padded shapes an aligned run
computes (a little more work than the paper's widths, the default).
"""
from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from benchmarks/ as well

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from common.config import AMPS, Config, UsageError, flag
from common.domains import check_domains
from common.performance import MIG_NOTE, by_gpu_name, table_peaks
from models.pyramidnet import check_arguments

# Memory bandwidth in TB/s, matched by name as GPU_PEAK_TFLOPS is (whole words; the first key found
# wins, so the specific names come first; a key whose value is None names a GPU that a shorter key
# would take for another). The names are those torch.cuda.get_device_name() reports (NVIDIA's driver
# list of supported chips); a name that says too little is left out ("NVIDIA H100": not the 80 GB
# SXM5, whose name says HBM3).
# Sources: NVIDIA H100 datasheet (SXM 3.35, PCIe 2.0, NVL 3.9); NVIDIA H200 datasheet (SXM and NVL
# 4.8); NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3: 4.0; 144 GB HBM3e: 4.9; "480GB"
# and "120GB" name the Grace memory of HBM3 parts); NVIDIA A100 datasheets (40 GB SXM4 and PCIe
# 1.555, 80 GB SXM4 2.039, 80 GB PCIe 1.935); NVIDIA L40S datasheet (0.864); NVIDIA Ada and Ampere
# GA102 whitepapers (RTX 4090 1.008, RTX 3090 0.936); the pages and datasheets of
# common/performance.py's peak table for B200 (HGX B200: 64 TB/s over 8 GPUs), GB200 (NVL72: 576
# TB/s over 72), L4 (0.3), A10 (0.6) and V100 (PCIe and SXM2 0.9, V100S 1.134).
GPU_BANDWIDTH_TBS = {
    "H100 PCIe": 2.0, "H100 NVL": 3.9, "H100 80GB HBM3": 3.35,  # the last: SXM5
    "H200 NVL": 4.8, "H200": 4.8,  # SXM
    "GH200 144G HBM3e": 4.9, "GH200 480GB": 4.0, "GH200 120GB": 4.0,
    "A100-SXM4-40GB": 1.555, "A100-PCIE-40GB": 1.555,
    "A100-SXM4-80GB": 2.039, "A100 80GB PCIe": 1.935,
    "L40S": 0.864,
    "RTX 4090 D": None, "RTX 4090 Laptop": None, "RTX 4090": 1.008,  # D, laptop: other chips
    "RTX 3090 Ti": None, "RTX 3090": 0.936,
    "GB200": 8.0, "B200": 8.0, "L4": 0.3, "A10": 0.6,
    "V100S": 1.134, "V100-FHHL": None, "V100": 0.9,
}
DEFAULT_GPU = "NVIDIA H100 80GB HBM3"  # the H100 SXM the suite was measured on
KERNEL_US = 2.0  # the default cost of one kernel beyond its work, in microseconds
CATEGORIES = {  # by operator name, first match
    "convolution": re.compile(r"convolution"),
    "batchnorm": re.compile(r"batch_norm"),
    "classifier": re.compile(r"\b(addmm|mm)\b"),
    "elementwise": re.compile(
        r"relu|threshold|add|mul|pad|avg_pool|mean|sum|div|copy|fill|where|sub|clone"),
}
FUSED = ("convolution", "classifier", "update")  # what an ideal fusion still runs on its own
# no kernel, no bytes
ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
# of activations (4-D): a block's output, forward, and its input's gradient, backward
RESIDUAL_SUMS = ("add", "add_")


@dataclass
class Op:
    """One operator of a step: its FLOPs, its fewest bytes and its kernels as an eager step runs it,
    and its bytes and kernels in a step fused as training BatchNorm allows (None: as eager for the
    convolutions, the classifier and the update, nothing for the rest)."""
    name: str
    category: str
    flops: int
    bytes: int
    kernels: int = 1
    fused_bytes: int | None = None
    fused_kernels: int | None = None

    def __post_init__(self):
        kept = self.category in FUSED
        if self.fused_bytes is None:
            self.fused_bytes = self.bytes if kept else 0
        if self.fused_kernels is None:
            self.fused_kernels = self.kernels if kept else 0


def _size(tensor) -> int:
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


class _Recorder(TorchDispatchMode):
    """Every operator dispatched while active, as an Op. Views move nothing; an in-place operator
    writes the tensor it read, counted once as written."""

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write
                           for r in returns):
            return out  # a view
        packet = func.overloadpacket
        name = packet.__name__
        if name in ALLOCATIONS:
            self.ops.append(Op(name, "other", 0, 0, kernels=0))
            return out
        flops = 0
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        read = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        written = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        in_place = {id(t) for t in written}
        moved = sum(_size(t) for t in read if id(t) not in in_place)
        moved += sum(_size(t) for t in written)
        category = next((kind for kind, pattern in CATEGORIES.items() if pattern.search(name)),
                        "other")
        kernels = 2 if category == "batchnorm" else 1
        if name == "convolution_backward":
            kernels = len(written)  # dgrad and wgrad (the stem's: wgrad only)
        op = Op(name, category, int(flops), int(moved), kernels)
        if category == "batchnorm":  # the statistics' pass reads the activations once more
            again = args[:2] if "backward" in name else args[:1]  # (gradient, saved input); input
            op.fused_bytes, op.fused_kernels = moved + sum(_size(t) for t in again), 2
        elif name in RESIDUAL_SUMS and written and written[0].dim() == 4:
            # written by the pass of a BatchNorm beside it, which also reads the shortcut: over
            # forward and backward the sums' writes move what those reads do (a block's input
            # and output once each)
            op.fused_bytes, op.fused_kernels = _size(written[0]), 0
        self.ops.append(op)
        return out


def step_ops(model: torch.nn.Module, batch: int, image_shape: tuple[int, int, int], classes: int,
             dtype: torch.dtype = torch.bfloat16) -> list[Op]:
    """The operators of one training step of `model` (built on the meta device) at `batch` images
    in `dtype`, then the SGD update of its parameters in fp32 (read parameter, gradient and
    momentum; write parameter and momentum: nesterov's extra read of the momentum stays in
    cache)."""
    model = model.to(device="meta", dtype=dtype)
    images = torch.empty(batch, *image_shape, device="meta", dtype=dtype)
    labels = torch.zeros(batch, dtype=torch.int64, device="meta")
    recorder = _Recorder()
    with recorder:
        F.cross_entropy(model(images), labels).backward()
    parameters = sum(p.numel() for p in model.parameters())
    return [*recorder.ops, Op("sgd", "update", 2 * parameters, 5 * 4 * parameters)]


BOUNDS = {  # key -> what the printed tables call it
    "op_by_op": "op by op, no kernel cost",
    "eager": "op by op + per-kernel floor",
    "training_fused": "fused as training BatchNorm allows",
    "fused": "ideal fusion, no kernel cost",
}


def roofline(ops: list[Op], batch: int, peak_tflops: float, bandwidth_tbs: float,
             kernel_us: float = KERNEL_US) -> dict:
    """The four bounds (BOUNDS) of a step of `ops` on a GPU of `peak_tflops` and `bandwidth_tbs`,
    at `kernel_us` microseconds a kernel: for each, seconds per step (`<key>_s`) and images/s; the
    kernels of an eager and of a fused step, the per-kernel floor, and each category's figures."""
    kernel_s = kernel_us * 1e-6

    def seconds(flops: int, moved: int) -> float:
        return max(flops / (peak_tflops * 1e12), moved / (bandwidth_tbs * 1e12))

    categories = {}
    for op in ops:
        entry = categories.setdefault(op.category, dict.fromkeys(
            ("seconds", "flops", "bytes", "kernels", "fused_bytes", "fused_kernels",
             "training_fused_s"), 0))
        entry["seconds"] += seconds(op.flops, op.bytes)
        entry["training_fused_s"] += seconds(op.flops, op.fused_bytes)
        entry["training_fused_s"] += op.fused_kernels * kernel_s
        for key in ("flops", "bytes", "kernels", "fused_bytes", "fused_kernels"):
            entry[key] += getattr(op, key)
    for entry in categories.values():
        entry["eager_s"] = entry["seconds"] + entry["kernels"] * kernel_s
    kernels = sum(op.kernels for op in ops)
    times = {"op_by_op": sum(seconds(op.flops, op.bytes) for op in ops),
             "training_fused": sum(entry["training_fused_s"] for entry in categories.values()),
             "fused": sum(seconds(op.flops, op.bytes) for op in ops if op.category in FUSED)}
    times["eager"] = times["op_by_op"] + kernels * kernel_s
    bound = {"batch": batch, "peak_tflops": peak_tflops, "bandwidth_tbs": bandwidth_tbs,
             "kernel_us": kernel_us,
             "flops": sum(op.flops for op in ops), "bytes": sum(op.bytes for op in ops),
             "kernels": kernels, "kernel_floor_s": kernels * kernel_s,
             "fused_kernels": sum(op.fused_kernels for op in ops),
             "fused_bytes": sum(op.fused_bytes for op in ops)}
    for key in BOUNDS:
        bound.update({f"{key}_s": times[key], f"{key}_images_per_sec": batch / times[key]})
    return {**bound, "categories": categories}


def bandwidth_tbs(name: str) -> float | None:
    """The memory bandwidth of the GPU called `name`, or None where the table has none."""
    return by_gpu_name(GPU_BANDWIDTH_TBS, name)


def share_of_roofline(measured_images_per_sec: float, bound: dict) -> dict:
    """The measured rate as a share of each bound: 'x % of the roofline'."""
    return {key: measured_images_per_sec / bound[f"{key}_images_per_sec"] for key in BOUNDS}


def bound_lines(bound: dict) -> list[str]:
    """The four bounds, one line each with its label: ms per step and images/s."""
    each = f"{bound['kernel_us']:g} us"

    def label(key: str) -> str:
        if key == "eager":
            return (f"{BOUNDS[key]} ({bound['kernels']:,} kernels x {each} = "
                    f"{1e3 * bound['kernel_floor_s']:.2f} ms)")
        if key == "training_fused":
            return f"{BOUNDS[key]} (+ {bound['fused_kernels']:,} kernels x {each})"
        return BOUNDS[key]

    return [f"{label(key):<62} {1e3 * bound[f'{key}_s']:7.2f} ms "
            f"{bound[f'{key}_images_per_sec']:8,.0f} images/s" for key in BOUNDS]


# ------------------------------------------------------------------------------------ the command
def _train_flag(name: str, default=None, help: str | None = None):
    """train.py's flag `name` (its help and domain), with another default or help where given."""
    field = next(f for f in dataclasses.fields(Config) if f.name == name)
    extras = {key: value for key, value in field.metadata.items() if key not in ("help", "domain")}
    return flag(field.default if default is None else default, help or field.metadata["help"],
                **field.metadata["domain"], **extras)


def _gpu_name(value: str) -> str | None:
    return None if value.strip() else "a GPU's name"


@dataclass(frozen=True)
class RooflineConfig:
    depth: int = _train_flag("depth")
    alpha: float = _train_flag("alpha")
    block: str = _train_flag("block")
    width_multiple: int = _train_flag("width_multiple")
    align_channels: int = flag(0, "bound a run that stores every activation at a channel count "
                                  "rounded up to a multiple of N (train.py's --align_channels, 8 "
                                  "by default on GPUs); 0 = the paper's widths, the work itself",
                               at_least=0, at_most=256)
    batch_size: int = _train_flag("batch_size", 256, "images per step (fast_path.sh's batch)")
    amp: str = flag("bf16", "the precision a run computes in: bf16 or fp16 (2-byte tensors at the "
                            "dtype's peak) or off (fp32 tensors at the TF32 peak)", choices=AMPS)
    gpu: str = flag(DEFAULT_GPU, "the GPU as torch.cuda.get_device_name() names it ('NVIDIA H200', "
                                 "'NVIDIA A100-SXM4-40GB', 'NVIDIA GH200 144G HBM3e'): its peak "
                                 "and bandwidth from the tables", check=_gpu_name)
    peak_tflops: float | None = flag(None, "dense peak TFLOP/s for --amp's dtype, in place of the "
                                           "GPU's", above=0, at_most=1e9)
    bandwidth_tbs: float | None = flag(None, "memory bandwidth in TB/s, in place of the GPU's",
                                       above=0, at_most=1e9)
    kernel_us: float = flag(KERNEL_US, "cost of one kernel beyond its work, in microseconds "
                                       "(launch, ramp-up, drain): the per-kernel floor",
                            at_least=0, at_most=1e6)

    def __post_init__(self):
        check_domains(self)
        try:
            check_arguments(self.depth, self.alpha, self.block, 10, 3)
        except ValueError as error:
            raise UsageError(f"--depth/--alpha: {error}") from None
        self.rates()  # a GPU of unknown figures is refused here, before anything is recorded

    def rates(self) -> tuple[float, float]:
        """(peak TFLOP/s, TB/s): the flags', else the GPU's from the tables; a UsageError where
        either is missing."""
        given = self.peak_tflops is not None and self.bandwidth_tbs is not None
        if re.search(r"\bMIG\b", self.gpu) and not given:
            raise UsageError(f"--gpu {self.gpu!r} is a {MIG_NOTE}: give --peak_tflops and "
                             f"--bandwidth_tbs")
        peaks = table_peaks(self.gpu)
        table_peak = peaks[self.amp if self.amp != "off" else "tf32"] if peaks else None
        peak = self.peak_tflops or table_peak
        bandwidth = self.bandwidth_tbs or bandwidth_tbs(self.gpu)
        missing = {name: what for name, what, value in (("peak_tflops", "peak FLOP/s", peak),
                                                        ("bandwidth_tbs", "bandwidth", bandwidth))
                   if value is None}
        if missing:
            raise UsageError(f"--gpu {self.gpu!r} has no {' or '.join(missing.values())} in the "
                             f"tables (benchmarks/roofline.py, common/performance.py): give "
                             f"{' and '.join('--' + name for name in missing)}, or a GPU they list")
        return peak, bandwidth


def main(argv=None) -> None:
    from common.command_line import build_parser
    from models import pyramidnet

    cfg = RooflineConfig(**vars(build_parser(RooflineConfig, __doc__).parse_args(argv)))
    peak, bandwidth = cfg.rates()
    with torch.device("meta"):
        model = pyramidnet(cfg.depth, cfg.alpha, cfg.block, width_multiple=cfg.width_multiple,
                           align_channels=cfg.align_channels)
    dtype = torch.float32 if cfg.amp == "off" else torch.bfloat16
    ops = step_ops(model, cfg.batch_size, (3, 32, 32), 10, dtype)
    bound = roofline(ops, cfg.batch_size, peak, bandwidth, cfg.kernel_us)
    widths = (f"stored in multiples of {cfg.align_channels}" if cfg.align_channels > 1
              else "the paper's widths")
    rates = [f"{peak:g} TFLOP/s" + (" (given)" if cfg.peak_tflops else ""),
             f"{bandwidth:g} TB/s" + (" (given)" if cfg.bandwidth_tbs else "")]
    precision = cfg.amp if cfg.amp != "off" else "fp32"
    print(f"PyramidNet-{cfg.depth} alpha={cfg.alpha:g} {cfg.block}, {widths}, width multiple "
          f"{cfg.width_multiple}; batch {cfg.batch_size}, {precision}")
    print(f"{cfg.gpu if not (cfg.peak_tflops and cfg.bandwidth_tbs) else 'a GPU'}: "
          f"{', '.join(rates)}; {bound['flops'] / 1e12:.2f} TFLOP and {bound['bytes'] / 1e9:.2f} "
          f"GB a step op by op")
    print("\n".join(bound_lines(bound)))
    print(f"{'by category':<12}{'op by op ms':>12}{'+ kernels':>10}{'kernels':>8}{'fused ms':>10}"
          f"{'its kernels':>12}{'GB op by op':>12}{'GB fused':>10}")
    for name, entry in bound["categories"].items():
        print(f"{name:<12}{1e3 * entry['seconds']:12.2f}{1e3 * entry['eager_s']:10.2f}"
              f"{entry['kernels']:8,}{1e3 * entry['training_fused_s']:10.2f}"
              f"{entry['fused_kernels']:12,}{entry['bytes'] / 1e9:12.2f}"
              f"{entry['fused_bytes'] / 1e9:10.2f}")


if __name__ == "__main__":
    from common.errors import user_errors

    with user_errors():
        main()
