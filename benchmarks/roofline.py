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

import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # run from benchmarks/ as well
sys.path += [str(path) for path in (REPO, REPO / "models") if str(path) not in sys.path]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402

import runkit  # noqa: E402
from benchmarks.aligned import fast_pyramidnet  # noqa: E402
from pyramidnet import PyramidNet  # noqa: E402

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
# runkit.py's peak table for B200 (HGX B200: 64 TB/s over 8 GPUs), GB200 (NVL72: 576
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
    """The memory bandwidth of the GPU called `name`, or None where the table has none: the first
    key (most specific first) whose words are in the name as whole words, in any case; a key of
    None names a GPU the table leaves out on purpose."""
    return next((value for key, value in GPU_BANDWIDTH_TBS.items()
                 if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])", name, re.I)), None)


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
def peak_tflops(gpu: str, amp: str) -> float | None:
    """The dense peak TFLOP/s of the GPU called `gpu` for `amp` from runkit's table (bf16 and fp16
    at its 16-bit peak; off: TF32, which the convolutions compute fp32 in, half of that on every
    GPU the table holds), matched as runkit matches a device's name; None where it has none."""
    words = gpu.replace("-", " ").split()
    peaks = next((peaks for key, peaks in runkit.PEAK_TFLOPS.items()
                  if all(word in words for word in key.split())), None)
    return None if peaks is None else peaks[0] / (2 if amp == "off" else 1)


def model_of(depth: int, alpha: float, block: str = "basic", align: int = 0,
             width_multiple: int = 1, in_place: bool = True) -> torch.nn.Module:
    """The PyramidNet a run trains, on the meta device: the fast path's (benchmarks/aligned.py,
    its shortcut in place) or the plain train.py's (models/pyramidnet.py)."""
    with torch.device("meta"):
        if in_place or align > 1 or width_multiple > 1:
            return fast_pyramidnet(depth, alpha, block, align=align,
                                   width_multiple=width_multiple)
        return PyramidNet(depth, alpha, block)


def bound_of_run(config: dict, gpu: str) -> dict | None:
    """The bounds of a run's own model at its precision and batch, from its results.json config
    (the fast path's flags, where benchmarks/fast.py ran it), on the GPU called `gpu`; None where
    the tables have no peak or bandwidth for it."""
    peak, bandwidth = peak_tflops(gpu, config["amp"]), bandwidth_tbs(gpu)
    if not (peak and bandwidth):
        return None
    model = model_of(config["depth"], config["alpha"], config["block"],
                     config.get("align_channels") or 0, config.get("width_multiple") or 1,
                     in_place="loader" in config)
    dtype = torch.float32 if config["amp"] == "off" else torch.bfloat16
    ops = step_ops(model, config["batch_size"], (3, 32, 32), 10, dtype)
    return roofline(ops, config["batch_size"], peak, bandwidth)


def get_parser() -> runkit.ArgumentParser:
    parser = runkit.ArgumentParser(description=__doc__, prog="roofline.py")
    add, count, number = parser.add_argument, runkit.count, runkit.number
    add("--depth", type=count(1), default=110, help="PyramidNet's: 6n+2 (9n+2: bottleneck)")
    add("--alpha", type=number(above=0), default=270.0, help="PyramidNet's widening")
    add("--block", choices=("basic", "bottleneck"), default="basic")
    add("--width_multiple", "--width-multiple", type=count(1, 4096), default=1,
        help="each block's width rounded up to a multiple of N (benchmarks/fast.py's): a wider "
             "model")
    add("--align_channels", "--align-channels", type=count(0, 256), default=0,
        help="bound a run that stores every activation at a channel count rounded up to a "
             "multiple of N (benchmarks/fast.py's, 8 by default on GPUs); 0: the paper's widths, "
             "the work itself")
    add("-b", "--batch_size", "--batch-size", type=count(1), default=256,
        help="images per step (fast_path.sh's batch)")
    add("--amp", choices=("bf16", "fp16", "off"), default="bf16",
        help="the precision a run computes in: bf16 or fp16 (2-byte tensors at the dtype's peak) "
             "or off (fp32 tensors at the TF32 peak)")
    add("--gpu", default=DEFAULT_GPU, help="the GPU as torch.cuda.get_device_name() names it "
        "('NVIDIA H200', 'NVIDIA A100-SXM4-40GB', 'NVIDIA GH200 144G HBM3e'): its peak and "
        "bandwidth from the tables")
    add("--peak_tflops", "--peak-tflops", type=number(above=0, below=1e9),
        help="dense peak TFLOP/s for --amp's dtype, in place of the GPU's")
    add("--bandwidth_tbs", "--bandwidth-tbs", type=number(above=0, below=1e9),
        help="memory bandwidth in TB/s, in place of the GPU's")
    add("--kernel_us", "--kernel-us", type=number(least=0, below=1e6), default=KERNEL_US,
        help="cost of one kernel beyond its work, in microseconds (launch, ramp-up, drain): the "
             "per-kernel floor")
    return parser


def rates(args) -> tuple[float, float]:
    """(peak TFLOP/s, TB/s): the flags', else the GPU's from the tables; a refusal in one line
    where either is missing."""
    given = args.peak_tflops is not None and args.bandwidth_tbs is not None
    runkit.refuse_if([(not args.gpu.strip(), "--gpu: give a GPU's name"),
                      ("MIG" in args.gpu.replace("-", " ").split() and not given,
                       f"--gpu {args.gpu!r} is a MIG slice, a fraction of the chip, whose peak is "
                       "not known: give --peak_tflops and --bandwidth_tbs")])
    peak = args.peak_tflops or peak_tflops(args.gpu, args.amp)
    bandwidth = args.bandwidth_tbs or bandwidth_tbs(args.gpu)
    missing = {name: what for name, what, value in (("peak_tflops", "peak FLOP/s", peak),
                                                    ("bandwidth_tbs", "bandwidth", bandwidth))
               if value is None}
    runkit.refuse_if([(missing, f"--gpu {args.gpu!r} has no {' or '.join(missing.values())} in "
                       f"the tables (benchmarks/roofline.py, runkit.py): give "
                       f"{' and '.join('--' + name for name in missing)}, or a GPU they list")])
    return peak, bandwidth


def main(argv=None) -> None:
    args = get_parser().parse_args(argv)
    try:
        model = model_of(args.depth, args.alpha, args.block, args.align_channels,
                         args.width_multiple)
    except ValueError as error:  # a depth neither block can have
        raise runkit.UsageError(f"--depth/--alpha: {error}") from None
    peak, bandwidth = rates(args)
    dtype = torch.float32 if args.amp == "off" else torch.bfloat16
    ops = step_ops(model, args.batch_size, (3, 32, 32), 10, dtype)
    bound = roofline(ops, args.batch_size, peak, bandwidth, args.kernel_us)
    widths = (f"stored in multiples of {args.align_channels}" if args.align_channels > 1
              else "the paper's widths")
    given = [f"{peak:g} TFLOP/s" + (" (given)" if args.peak_tflops else ""),
             f"{bandwidth:g} TB/s" + (" (given)" if args.bandwidth_tbs else "")]
    precision = args.amp if args.amp != "off" else "fp32"
    print(f"PyramidNet-{args.depth} alpha={args.alpha:g} {args.block}, {widths}, width multiple "
          f"{args.width_multiple}; batch {args.batch_size}, {precision}")
    print(f"{args.gpu if not (args.peak_tflops and args.bandwidth_tbs) else 'a GPU'}: "
          f"{', '.join(given)}; {bound['flops'] / 1e12:.2f} TFLOP and {bound['bytes'] / 1e9:.2f} "
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
    with runkit.one_line_errors():
        main()
