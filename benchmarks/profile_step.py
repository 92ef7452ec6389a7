"""Where a training step's time goes: torch.profiler over a few single_gpu steps, grouped into
convolutions, BatchNorm, element-wise work and the rest, plus the top operators; the convolutions
split by pass and by the resolution of their input (the stage); on a GPU each category's achieved
TFLOP/s or GB/s, and the step against the roofline of the model (benchmarks/roofline.py: its layer
shapes at the GPU's peak FLOP/s and memory bandwidth).

    python benchmarks/profile_step.py --batch_size 256                     # the fast path
    python benchmarks/profile_step.py --batch_size 256 --width_multiple 8  # tensor-core widths
    python benchmarks/profile_step.py --depth 8 --alpha 12 --batch_size 32 --steps 3  # on a CPU

It takes every single_gpu/train.py flag (model, --amp, --channels_last, --compile, ...) and
benchmarks/fast.py's --align_channels, --width_multiple and --cudnn_benchmark_limit, and builds the
model and optimizer with single_gpu/train.py's own functions, the fast path swapped in as fast.py
swaps it (channels stored in multiples of 8 on a GPU by default); the batches are synthetic and stay
on the device. Times are the operators' self time on the device (on the CPU without one), so nested
operators are not counted twice; on a GPU the kernels are split the same way and the top ones
listed, with the share of cuDNN's layout/padding kernels. On a GPU a convolution kernel goes to the
pass of the operator that launched it (forward: fprop; backward: dgrad or wgrad by its name, a
kernel named fprop being dgrad), and the backward kernels no name places (split-K reductions) are
printed as unattributed; on the CPU the passes are forward and backward, and no rates are printed
(a CPU has no peak in the tables). A step replayed as CUDA graphs (--compile_mode reduce-overhead
or max-autotune) is refused: its kernels have no operators above them to split by.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path += [str(path) for path in (REPO, REPO / "models") if str(path) not in sys.path]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import runkit  # noqa: E402
from benchmarks import fast  # noqa: E402
from benchmarks.roofline import (BOUNDS, bandwidth_tbs, bound_lines, model_of,  # noqa: E402
                                 peak_tflops, roofline, step_ops)

# What operators and kernels compute, not which library ran them: cuDNN runs BatchNorm as well as
# convolutions (aten::cudnn_batch_norm, bn_fw_tr_1C11_kernel_NCHW), so "cudnn" alone names no
# category. Checked in this order: BatchNorm's names are the most specific, convolution names can
# hold element-wise words ("nhwcAddPaddingKernel", "addmm"), and element-wise words are the loosest.
# Names are lowercased first; backward names carry the same words.
CONV_LAYOUT = r"addpadding|removepadding|nchwtonhwc|nhwctonchw|tensortransform|converttensor"
CATEGORIES = {
    # aten::*batch_norm*, cuDNN's bn_*, MIOpenBatchNorm*
    "batchnorm": re.compile(r"batch_?norm|bn_fw|bn_bw"),
    # convolutions and matrix products: operators, GEMM and implicit-GEMM kernels
    "convolution": re.compile(
        r"conv(?!ert)|gemm|gemv|fprop|dgrad|wgrad|winograd|fft\dd|splitkreduce|[sh]\d*cudnn|"
        r"(?<![a-z])(add|b|baddb)?mm(?![a-z])|matmul|(?<![a-z])linear|" + CONV_LAYOUT),
    # memory-bound work: arithmetic, copies, fills, pooling, the loss, the optimizer
    "elementwise": re.compile(
        r"add|mul|div|sub|neg|sqrt|where|relu|threshold|clamp|copy|fill|zero|memset|memcpy|pad|"
        r"cat|elementwise|reduce|mean|sum|pool|softmax|nll|cross_entropy|foreach|multi_tensor|sgd|"
        r"(?<![a-z])amp_"),
}
KINDS = ("convolution", "batchnorm", "elementwise", "other")  # as reported
# cuDNN's layout kernels reshape a convolution's tensors for the tensor cores (NCHW to NHWC and
# back, channels padded to a multiple of 8, tensorTransformGeneric, convertTensor), launched inside
# the convolution operators. They are counted in convolution, where the operators' self time puts
# them anyway, so operator and kernel shares agree; but their share gets a line of its own, because
# it is what --channels_last and --width_multiple 8 remove (17.7 ms of a 75.7 ms bf16 step of
# PyramidNet-110 alpha 270 on an H100, gone with --width_multiple 8): a cost of the shapes, not of
# the arithmetic. "Memset (Device)" stays element-wise although cuDNN launches most memsets inside
# the convolutions (zeroed workspaces, about 4% of an H100 step): a kernel's name does not say who
# launched it, and that is the gap left between the operator and kernel splits.
LAYOUT_HINT = ("cuDNN reshaping inputs for tensor cores; --channels_last and "
               "--width_multiple 8 avoid it")


GRAPHED = ("reduce-overhead", "max-autotune")  # torch.compile's modes that replay CUDA graphs


def get_parser() -> runkit.ArgumentParser:
    """This script's own flags and fast.py's; the rest are single_gpu/train.py's."""
    parser = runkit.ArgumentParser(description=__doc__, prog="profile_step.py")
    add, count = parser.add_argument, runkit.count
    add("--steps", type=count(1), default=5,
        help="profiled steps, after --warmup_steps unprofiled ones")
    add("--top", type=count(1), default=15, help="operators listed by self time")
    add("--out", help="also write the breakdown as JSON to this file")
    add("--align_channels", "--align-channels", type=count(0, 4096),
        help="benchmarks/fast.py's (default: 8 on a GPU; 0: off)")
    add("--width_multiple", "--width-multiple", type=count(1, 4096), default=1,
        help="benchmarks/fast.py's: a wider model")
    add("--cudnn_benchmark_limit", "--cudnn-benchmark-limit", type=count(0),
        help="benchmarks/fast.py's")
    return parser


def writable_file(value: str) -> str | None:
    """Why `value` is no file this run can write when it ends (None: it is): checked before the
    profile, not after it."""
    path = Path(value)
    folder = path.absolute().parent
    if path.is_dir():
        return "a file's path (this one is a folder)"
    if not folder.is_dir():
        return f"a file in a folder that exists ({folder} does not)"
    if not os.access(folder, os.W_OK) or path.exists() and not os.access(path, os.W_OK):
        return "a file this user can write"
    return None


def parse(argv) -> tuple[SimpleNamespace, object, object]:
    """(this script's flags, single_gpu/train.py's module, its flags), refused in one line."""
    options, train_argv = get_parser().parse_known_args(argv)
    single = fast.train_file("single_gpu")
    args = single.get_args(train_argv)
    wrong = writable_file(options.out) if options.out is not None else None
    runkit.refuse_if([
        (args.profile_steps, f"--profile_steps is train.py's: here give --steps "
         f"{args.profile_steps}"),
        (args.compile and args.compile_mode in GRAPHED, f"--compile_mode {args.compile_mode} "
         "replays the step as CUDA graphs, whose kernels have no operators to split them by: "
         "profile --compile_mode default or max-autotune-no-cudagraphs"),
        (wrong, f"--out {options.out}: give {wrong}"),
        (args.dataset == "imagefolder", "profile_step.py profiles batches of 32-pixel images: "
         "leave out --dataset imagefolder")])
    return options, single, args


def category(name: str) -> str:
    """The category of an operator or kernel name (see CATEGORIES), "other" when none matches."""
    lowered = name.lower()
    return next((kind for kind, pattern in CATEGORIES.items() if pattern.search(lowered)), "other")


def is_conv_layout(name: str) -> bool:
    """Whether a kernel is cuDNN reshaping a convolution's tensors rather than computing it."""
    return re.search(CONV_LAYOUT, name.lower()) is not None


def profile_steps(options, single, args) -> dict:
    device = single.setup(args)
    fast_options = SimpleNamespace(mode="single_gpu", loader="torchvision", compile_cache=None,
                                   align_channels=options.align_channels,
                                   width_multiple=options.width_multiple,
                                   cudnn_benchmark_limit=options.cudnn_benchmark_limit)
    fast.resolve(fast_options, args, device.type == "cuda")
    fast.use_fast_path(single, fast_options)  # the model fast.py trains
    single.data_defaults(args, args.batch_size)
    channels, size, classes = single.IMAGES[args.dataset][1], args.image_size, 10
    torch.manual_seed(args.seed)
    model, raw_model, _ = single.get_model(args, classes, device)
    optimizer, _, scaler = single.get_optimizer(args, raw_model, device, steps_per_epoch=1)
    images = torch.randn(args.batch_size, channels, size, size, device=device)
    images = images.contiguous(memory_format=single.memory_format(args))
    labels = torch.randint(0, classes, (args.batch_size,), device=device)

    def step():
        with torch.autocast(device.type, single.AMP[args.amp], enabled=args.amp != "off"):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    model.train()
    for _ in range(max(args.warmup_steps, 1)):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    else:  # Kineto's own lines (its stages; an ERROR that no GPU answers) say nothing of a CPU
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above its highest level (USDT, 5)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:  # shapes: the stages
        for _ in range(options.steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    operators, kernels = device_times(prof.key_averages(), cuda, options.steps)
    report = {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "torch": torch.__version__,
              "config": {"depth": args.depth, "alpha": args.alpha, "block": args.block,
                         "batch_size": args.batch_size, "width_multiple": options.width_multiple,
                         "align_channels": fast_options.align_channels, "amp": args.amp,
                         "channels_last": args.channels_last, "compile": args.compile},
              **breakdown(operators, kernels, options.top)}
    report["conv_passes"] = conv_passes(prof.events(), cuda, options.steps)
    report["achieved"] = report["roofline"] = None  # a GPU's only: a CPU's are no measure of one
    if cuda:
        model = model_of(args.depth, args.alpha, args.block, fast_options.align_channels,
                         options.width_multiple)
        ops = step_ops(model, args.batch_size, (channels, size, size), classes,
                       torch.float32 if args.amp == "off" else torch.bfloat16)
        report["achieved"] = achieved(report, ops)
        report["roofline"] = against_roofline(report, ops, peak_tflops(report["device"],
                                                                       args.amp))
    return report


def against_roofline(report: dict, ops, peak: float | None) -> dict | None:
    """The model's roofline on the report's GPU (None where its peak or bandwidth is unknown) and
    the share of each bound the measured kernel time reaches (`<bound>_share`: the bound's time
    over the kernels')."""
    bandwidth = bandwidth_tbs(report["device"])
    if peak is None or bandwidth is None:
        return None
    bound = roofline(ops, report["config"]["batch_size"], peak, bandwidth)
    shares = {f"{key}_share": bound[f"{key}_s"] / report["kernel_seconds"] for key in BOUNDS}
    return {**{k: v for k, v in bound.items() if k != "categories"}, **shares}


# The operators a convolution kernel is launched under: aten's convolutions (cuDNN's, MIOpen's,
# mkldnn's, the slow ones), forward or backward.
CONV_BACKWARD_OP = re.compile(r"^aten::\w*conv\w*backward")
CONV_OP = re.compile(r"^aten::\w*conv")
UNATTRIBUTED = "unattributed"


def conv_parent(event) -> tuple[str, object] | None:
    """("backward", that operator) where `event` (a CPU operator) is or runs inside a convolution's
    backward operator, else ("forward", the outermost convolution operator it is or runs inside),
    else None."""
    forward = None
    while event is not None:
        if CONV_BACKWARD_OP.search(event.name):
            return "backward", event
        if CONV_OP.search(event.name):
            forward = event
        event = event.cpu_parent
    return ("forward", forward) if forward is not None else None


def conv_pass(kernel: str, parent: str | None) -> str:
    """Which pass a convolution kernel computes, given the pass of the operator it was launched
    under ("forward", "backward"; None: no operator). A layout kernel reshapes; in the forward any
    other kernel is fprop. In the backward cuDNN's and CUTLASS's names say dgrad or wgrad, and a
    kernel named fprop computes the input's gradient (a stride-1 dgrad is a convolution of the
    gradient with the flipped weights, which cuDNN often runs with its fprop kernels; a weight
    gradient is not). Any other backward kernel, split-K reductions among them, and a convolution
    kernel without an operator is unattributed: in no single pass's rate."""
    lowered = kernel.lower()
    if is_conv_layout(lowered):
        return "layout"
    if parent == "forward":
        return "fprop"
    if parent == "backward":
        for name in ("dgrad", "wgrad"):
            if name in lowered:
                return name
        return "dgrad" if "fprop" in lowered else UNATTRIBUTED
    return UNATTRIBUTED


def stage_of(op, backward: bool) -> str:
    """The resolution of a convolution's input, from its operator's shapes ("?" where none)."""
    shapes = [shape for shape in (op.input_shapes or []) if len(shape) == 4]
    activation = shapes[1] if backward and len(shapes) > 1 else shapes[0] if shapes else None
    return f"{activation[2]}x{activation[3]}" if activation else "?"


def conv_passes(events, cuda: bool, steps: int) -> dict:
    """Convolution time per step, in ms, by pass and by the resolution of the convolution's input
    ("32x32": the stem and stage 1, with stage 2's first, strided, convolution; "16x16"; "8x8").
    On a GPU from every kernel launched under a convolution operator (conv_pass), and the kernels
    that the profiler tied to no operator and whose names say convolution (unattributed; the row
    is there, if empty, on every GPU); on the CPU from the operators' self time, forward or
    backward (dgrad and wgrad are one operator there)."""
    table: dict[str, dict[str, float]] = {}

    def add(kind: str, stage: str, microseconds: float) -> None:
        row = table.setdefault(kind, {})
        row[stage] = row.get(stage, 0.0) + microseconds / 1e3 / steps

    operators = [event for event in events if event.device_type == DeviceType.CPU]
    for event in operators:
        if not cuda:
            if "convolution" in event.name:
                backward = "backward" in event.name
                add("backward" if backward else "fprop", stage_of(event, backward),
                    event.self_cpu_time_total)
            continue
        found = conv_parent(event) if event.kernels else None
        if found is not None:
            parent, op = found
            for kernel in event.kernels:
                add(conv_pass(kernel.name, parent), stage_of(op, parent == "backward"),
                    kernel.duration)
    if cuda:
        table.setdefault(UNATTRIBUTED, {})
        # as torch ties kernels to operators: by the correlation id of the operator's launch
        launched = {event.id for event in operators if not event.linked_correlation_id}
        for event in events:
            if (event.device_type == DeviceType.CUDA and not event.is_user_annotation
                    and event.linked_correlation_id not in launched
                    and category(event.name) == "convolution"):
                add(UNATTRIBUTED, "?", event.time_range.elapsed_us())
    return table


def achieved(report: dict, ops) -> dict:
    """Each category's achieved rate, on a GPU: the model's real FLOPs (its convolutions and
    classifier) over the convolution time, in TFLOP/s, and BatchNorm's and the element-wise work's
    minimum bytes over their time, in GB/s; then the convolutions' TFLOP/s by pass: fprop and wgrad
    do the forward's FLOPs, dgrad the forward's less the stem's (which needs no input gradient),
    and the backward both over every backward kernel, the unattributed ones included. dgrad's and
    wgrad's own rates leave the unattributed time out: while there is some they are upper bounds
    (`passes_upper_bounds`)."""
    shares = report["kernel_shares"]
    seconds = report["kernel_seconds"]
    flops = sum(op.flops for op in ops if op.category in ("convolution", "classifier"))
    moved = {kind: sum(op.bytes for op in ops if op.category == kind)
             for kind in ("batchnorm", "elementwise")}
    rates = {"convolution_tflops": flops / (shares["convolution"] * seconds) / 1e12}
    rates.update({f"{kind}_gbs": moved[kind] / (shares[kind] * seconds) / 1e9 if shares[kind]
                  else None for kind in moved})
    forward = [op for op in ops if op.name == "convolution"]
    fprop = sum(op.flops for op in forward)
    stem = forward[0].flops if forward else 0
    passes = report["conv_passes"]
    ms = {kind: sum(passes.get(kind, {}).values())
          for kind in ("fprop", "dgrad", "wgrad", UNATTRIBUTED)}
    ms["backward"] = ms["dgrad"] + ms["wgrad"] + ms[UNATTRIBUTED]
    work = {"fprop": fprop, "dgrad": fprop - stem, "wgrad": fprop, "backward": 2 * fprop - stem}
    for kind in ("fprop", "backward", "dgrad", "wgrad"):
        rates[f"{kind}_tflops"] = work[kind] / (ms[kind] / 1e3) / 1e12 if ms[kind] else None
    rates["unattributed_ms"] = ms[UNATTRIBUTED]
    rates["passes_upper_bounds"] = ms[UNATTRIBUTED] > 0
    return rates


def device_times(events, cuda: bool, steps: int) -> tuple[list[tuple[str, float]],
                                                          list[tuple[str, float]]]:
    """Operators' and kernels' (name, seconds per step) from key_averages(). Operators count their
    self time, so nested ones are not counted twice. GPU user annotations (record_function ranges
    such as the optimizer's, drawn on the GPU timeline) are no kernels: they span kernels already
    counted, and torch's own table leaves them out too."""
    # microseconds over every step
    self_time = "self_device_time_total" if cuda else "self_cpu_time_total"
    operators = [(e.key, getattr(e, self_time)) for e in events if e.device_type == DeviceType.CPU]
    kernels = [(e.key, e.self_device_time_total) for e in events
               if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    return per_step(operators, steps), per_step(kernels, steps)


def per_step(times: list[tuple[str, float]], steps: int) -> list[tuple[str, float]]:
    """(name, total microseconds) -> (name, seconds per step), largest first, zeros dropped."""
    return sorted(((name, us / 1e6 / steps) for name, us in times if us > 0),
                  key=lambda item: -item[1])


def breakdown(operators: list[tuple[str, float]], kernels: list[tuple[str, float]],
              top: int) -> dict:
    """The report's figures from (name, seconds per step), largest first. Operators and
    kernels are split alike, so the two views check each other; kernels alone show the
    layout/padding that cuDNN adds inside a convolution. Without kernels (on the CPU) the
    kernel figures are None and the list is empty."""
    step_seconds = sum(seconds for _, seconds in operators)
    kernel_seconds = sum(seconds for _, seconds in kernels)
    layout_seconds = sum(seconds for name, seconds in kernels if is_conv_layout(name))
    return {"step_seconds": step_seconds, "shares": shares(operators),
            "kernel_seconds": kernel_seconds if kernels else None,
            "kernel_shares": shares(kernels) if kernels else None,
            "conv_layout_share": layout_seconds / kernel_seconds if kernels else None,
            "top": [{"op": name, "ms_per_step": 1e3 * s, "share": s / step_seconds,
                     "category": category(name)}
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
    """The printed report: the split by operators, then by kernels with the
    layout/padding line, then the tops."""
    def split(parts):
        return ", ".join(f"{kind} {100 * share:.1f}%" for kind, share in parts.items())

    lines = [f"{report['device']}, batch {report['config']['batch_size']}: "
             f"{1e3 * report['step_seconds']:.2f} ms of operator self time per step",
             f"  operators: {split(report['shares'])}"]
    if report["kernel_shares"] is not None:
        lines += [f"  kernels:   {split(report['kernel_shares'])} of "
                  f"{1e3 * report['kernel_seconds']:.2f} ms",
                  f"  conv layout/padding kernels: {100 * report['conv_layout_share']:.1f}% of "
                  f"kernel time, in convolution ({LAYOUT_HINT})"]
    lines += pass_lines(report.get("conv_passes") or {})
    rates = report.get("achieved")
    if rates:
        def rate(key, unit):
            value = rates.get(key)
            return "-" if value is None else f"{value:.1f} {unit}".rstrip()

        most = "at most " if rates["passes_upper_bounds"] else ""
        lines += [f"  achieved: convolution {rate('convolution_tflops', 'TFLOP/s')}; batchnorm "
                  f"{rate('batchnorm_gbs', 'GB/s')}; elementwise {rate('elementwise_gbs', 'GB/s')}",
                  f"  convolution by pass: fprop {rate('fprop_tflops', 'TFLOP/s')}, backward "
                  f"{rate('backward_tflops', 'TFLOP/s')} (dgrad {most}{rate('dgrad_tflops', '')}, "
                  f"wgrad {most}{rate('wgrad_tflops', '')})",
                  f"  unattributed convolution kernels: {rates['unattributed_ms']:.3f} ms per step "
                  f"(backward kernels named neither dgrad nor wgrad, such as split-K reductions, "
                  f"and kernels under no operator): in the backward's rate only"]
    elif report["kernel_shares"] is None:
        lines.append("  no rates on the CPU: achieved rates and the roofline are a GPU's "
                     "(benchmarks/roofline.py needs none)")
    bound = report.get("roofline")
    if bound:
        lines.append(f"  roofline ({bound['peak_tflops']:g} TFLOP/s, {bound['bandwidth_tbs']:g} "
                     f"TB/s, {bound['kernel_us']:g} us a kernel; benchmarks/roofline.py), and this "
                     f"step's kernel time against each bound:")
        lines += [f"    {line}: {100 * bound[f'{key}_share']:.1f} %"
                  for key, line in zip(BOUNDS, bound_lines(bound))]
    elif report["kernel_shares"] is not None:
        lines.append("  roofline: needs a GPU of known peak FLOP/s and bandwidth")
    for row in report["top"]:
        lines.append(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  "
                     f"{row['category']:<11} {row['op']}")
    if report["top_kernels"]:
        lines.append("top kernels:")
    for row in report["top_kernels"]:
        label = "conv layout" if row["conv_layout"] else row["category"]
        lines.append(f"  {row['ms_per_step']:9.3f} ms {100 * row['share']:5.1f}%  {label:<11} "
                     f"{row['kernel'][:110]}")
    return lines


def pass_lines(passes: dict) -> list[str]:
    """The convolutions' ms per step as a table: a row per pass, a column per input resolution."""
    if not passes:
        return []
    stages = sorted({stage for row in passes.values() for stage in row},
                    key=lambda s: (s == "?", -int(s.split("x")[0]) if s != "?" else 0))
    lines = ["  convolution ms per step by pass and input resolution: " + ", ".join(stages)]
    for kind, row in passes.items():
        cells = "  ".join(f"{row.get(stage, 0.0):8.3f}" for stage in stages)
        lines.append(f"    {kind:<19}{cells}   total {sum(row.values()):.3f}")
    return lines


def main(argv=None) -> None:
    options, single, args = parse(sys.argv[1:] if argv is None else [str(a) for a in argv])
    report = profile_steps(options, single, args)
    print("\n".join(summary(report)))
    if options.out:
        Path(options.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    with runkit.one_line_errors():
        main()
