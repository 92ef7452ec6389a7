"""The fast path, the same in every mode: mixed precision, memory format, backend switches, and the
figures that say how close a run comes to the hardware (FLOPs per image, model FLOPs utilisation).

`--amp` and `--channels_last` default to what suits the device: bf16 autocast and NHWC tensors
on a GPU (fp16 with a GradScaler where bf16 is missing), fp32 NCHW on the CPU.
`resolve_fast_path` turns those defaults into explicit values before anything is built, so
results.json records what actually ran.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re

import torch

from common.augmentation import explicit_augmentation
from common.compiling import compile_cache_folder, graph_entries, inductor_cache_path
from common.config import Config, UsageError
from common.data import dataset_info
from common.loaders import loader_description, resolve_loader
from common.rules import alignment_refusal, memory_snapshot_refusal
from models import PYRAMIDNET, build_model, model_refusal, on_meta

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# Dense (no sparsity) peak tensor throughput in TFLOP/s, per GPU, by the dtype a run computes in.
# A run with --amp off computes its convolutions in TF32 (cuDNN's default, kept here). GeForce
# figures are those with FP32 accumulation, which autocast uses. A key matches whole words of
# torch.cuda.get_device_name() in any case ("H200" is not in "GH200"; "H100 PCIe" is in "H100
# PCIE"); the first key found wins, so the specific names come first. A key whose value is None
# names a GPU that a shorter key would take for another: "NVIDIA GeForce RTX 3090 Ti" and "RTX
# 4090 D" (other SM counts) and "RTX 4090 Laptop GPU" (another chip) are not the cards below.
# Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM, PCIe and NVL columns); NVIDIA H200
# datasheet; NVIDIA GH200 Grace Hopper Superchip datasheet (its GPU: H100/H200 SXM-class peaks);
# NVIDIA A100 datasheet; NVIDIA L40S datasheet; NVIDIA Ada GPU architecture whitepaper, appendix A
# (RTX 4090); NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A (RTX 3090). Datasheets
# quote "with sparsity": halved here. And, each from the vendor's page or datasheet:
#   B200: HGX B200, https://www.nvidia.com/en-us/data-center/hgx/ (8 GPUs: FP16/BF16 36 PFLOPS,
#     TF32 18 PFLOPS with sparsity, FP32 600 TFLOPS; per GPU, halved)
#   GB200: GB200 NVL72, https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (its column for one
#     Blackwell GPU: FP16/BF16 5 PFLOPS, TF32 2.5 PFLOPS with sparsity, halved; FP32 80 TFLOPS)
#   L4: https://www.nvidia.com/en-us/data-center/l4/ (its datasheet: FP16/BF16 242, TF32 120 with
#     sparsity, FP32 30.3 TFLOPS)
#   A10: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf
#     (BF16/FP16 125, TF32 62.5 dense, FP32 31.2 TFLOPS)
#   V100: https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
#     (tensor 112 PCIe, 125 SXM2, 130 V100S; FP32 14, 15.7, 16.4 TFLOPS; no sparsity). Volta has
#     no bf16 (--amp bf16 is refused there: None) and no TF32: --amp off computes in fp32.
GPU_PEAK_TFLOPS = {
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # SXM5: "NVIDIA H100 80GB HBM3"
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM
    # Grace Hopper: "NVIDIA GH200 480GB"
    "GH200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    # SXM4 and PCIe, 40 and 80 GB
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    # Blackwell: "NVIDIA B200" (HGX, 1,000 W); "NVIDIA GB200" (Grace Blackwell, 1,200 W)
    "GB200": {"bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp32": 75.0},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},  # not "L40S", nor "L40"
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},  # not "A100", nor "A10G"
    # "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB", "Tesla V100-SXM2-16GB"; the FHHL card
    # (150 W) has clocks of its own
    "V100-PCIE": {"bf16": None, "fp16": 112.0, "tf32": 14.0, "fp32": 14.0},
    "V100S": {"bf16": None, "fp16": 130.0, "tf32": 16.4, "fp32": 16.4},
    "V100-FHHL": None,
    "V100": {"bf16": None, "fp16": 125.0, "tf32": 15.7, "fp32": 15.7},
    "RTX 4090 D": None, "RTX 4090 Laptop": None,
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090 Ti": None,
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
}
MIG_NOTE = "MIG slice: a fraction of the chip, whose peak is not known"


def resolve_fast_path(cfg: Config, device: torch.device) -> Config:
    """The config with --amp and --channels_last made explicit for `device` and checked against it;
    on a GPU, cuDNN autotuning (unless --deterministic) and TF32 matrix products switched on."""
    cuda = device.type == "cuda"
    bf16_ok = not cuda or torch.cuda.is_bf16_supported(including_emulation=False)
    amp = cfg.amp or ("off" if not cuda else "bf16" if bf16_ok else "fp16")
    if amp == "bf16" and not bf16_ok:
        raise UsageError(f"{torch.cuda.get_device_name(device)} has no bf16 tensor "
                         "cores: use --amp fp16 or off")
    channels_last = cuda if cfg.channels_last is None else cfg.channels_last
    # dist_parallel's: SyncBatchNorm takes the paper's widths only
    sync_bn = getattr(cfg, "sync_bn", False)
    pyramid = cfg.model == PYRAMIDNET  # the aligned storage is PyramidNet's (models/aligned.py)
    align = (cfg.align_channels if cfg.align_channels is not None else 8
             if cuda and pyramid and not sync_bn else 0)
    refusal = alignment_refusal(sync_bn, align) or model_refusal(cfg, dataset_info(cfg))
    if align > 1 and not pyramid:
        refusal = (f"--align_channels {align} stores PyramidNet's channels padded; --model "
                   f"{cfg.model} keeps its own: leave out --align_channels")
    if cfg.memory_snapshot and not cuda:  # no CUDA allocator to record
        refusal = memory_snapshot_refusal(cfg.memory_snapshot)
    if refusal is not None:
        raise UsageError(refusal)
    if cuda:
        # the fastest algorithm per shape (drop_last fixes them)
        torch.backends.cudnn.benchmark = not cfg.deterministic
        if cfg.cudnn_benchmark_limit is not None:
            torch.backends.cudnn.benchmark_limit = cfg.cudnn_benchmark_limit
        # TF32 for fp32 matrix products, as convolutions by default
        torch.set_float32_matmul_precision("high")
    # the same bits on every run: deterministic kernels only, an error where none exists
    if cfg.deterministic:
        # read when cuBLAS starts: no matmul ran yet
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
    # inductor reads TORCHINDUCTOR_CACHE_DIR when it compiles: the FX-graph, AOTAutograd and Triton
    # caches go there. --compile_cache sets it; else a folder the user gave it is kept, else
    # <log_dir>/.compile_cache (a path with a space goes through a link without one, made when the
    # run starts: common/compiling.py)
    cache = compile_cache_folder(cfg)
    if cfg.compile:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_path(cache)
    # --loader, else gpu where the data fits on the device (common/loaders.py)
    loader = resolve_loader(cfg, device)
    # --augment auto and --flip made the crop and the flip they stand for at this image size
    cfg = explicit_augmentation(cfg)
    return dataclasses.replace(cfg, amp=amp, channels_last=channels_last, align_channels=align,
                               loader=loader,
                               compile_cache=cache if cfg.compile else cfg.compile_cache,
                               compile_mode=cfg.compile_mode or "default" if cfg.compile else None)


def memory_format(cfg: Config) -> torch.memory_format:
    return torch.channels_last if cfg.channels_last else torch.contiguous_format


def autocast(cfg: Config, device: torch.device):
    """The forward pass's precision: a torch.autocast region, or nothing with --amp off."""
    if cfg.amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPES[cfg.amp])


class AutocastForward(torch.nn.Module):
    """`module` whose forward runs under the run's autocast, for a forward that runs in a
    thread of its own. Autocast's state is thread-local, and nn.DataParallel runs each replica
    in a new thread under `torch.autocast(device_type, enabled=...)`, passing on/off but not
    the dtype: the replicas would compute in CUDA's default, fp16, with no loss scaling, while
    the run asked for bf16. Autocast inside the replicated forward is the pattern of PyTorch's
    AMP notes ("DataParallel in a single process"). It holds no weights of its own: `module` is
    still the one saved and evaluated."""

    def __init__(self, module: torch.nn.Module, cfg: Config):
        super().__init__()
        self.module, self.cfg = module, cfg

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with autocast(self.cfg, images.device):
            return self.module(images)


def grad_scaler(cfg: Config, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling for fp16, whose small range underflows gradients; a
    pass-through for bf16 and fp32."""
    return torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")


def model_on_meta(cfg) -> torch.nn.Module:
    """The model a run trains (a Config, or anything with its fields), as its paper or torchvision
    defines it (PyramidNet's real widths, whatever --align_channels stores), built on the meta
    device: shapes without memory, for counting its parameters, FLOPs and bytes."""
    paper = dataclasses.replace(cfg, align_channels=0) if dataclasses.is_dataclass(cfg) else cfg
    return on_meta(lambda: build_model(paper, dataset_info(cfg)))


def parameter_count(cfg) -> int:
    """The parameters of the model a run trains (PyramidNet's paper count,
    whatever --align_channels stores)."""
    return sum(param.numel() for param in model_on_meta(cfg).parameters())


def flops_per_image(cfg) -> int:
    """Forward plus backward FLOPs of one training image, counted by torch.utils.flop_counter on a
    copy of the model built on the meta device (no memory, no compute, the real model untouched).
    Convolutions, matrix products and attention are counted (2 FLOPs per multiply-add);
    normalisation, activations and additions are not, as in the usual MFU convention."""
    from torch.utils.flop_counter import FlopCounterMode

    batch, data = 2, dataset_info(cfg)  # the images' shape and the classes of the data trained on
    model = model_on_meta(cfg)
    with torch.device("meta"):
        images = torch.empty(batch, data.channels, data.size, data.size)
        labels = torch.zeros(batch, dtype=torch.int64)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model.train()(images), labels).backward()
    return counter.get_total_flops() // batch


def by_gpu_name(table: dict, name: str):
    """The first entry of `table` (keyed by GPU names, most specific first) whose key is in `name`
    as whole words, in any case; None when none is, or when the first that is holds None (a GPU the
    table leaves out on purpose)."""
    # whole words: "H200" not in "GH200"
    words = lambda key: rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])"  # noqa: E731
    return next((value for key, value in table.items()
                 if re.search(words(key), name, re.IGNORECASE)), None)


def table_peaks(name: str) -> dict[str, float] | None:
    """The GPU_PEAK_TFLOPS entry of the GPU called `name`."""
    return by_gpu_name(GPU_PEAK_TFLOPS, name)


def is_mig(device: torch.device) -> bool:
    """Whether `device` is a MIG instance: its name says "MIG" ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"),
    or, where a driver leaves the name alone, its UUID starts with "MIG-"."""
    if re.search(r"\bMIG\b", torch.cuda.get_device_name(device)):
        return True
    return str(torch.cuda.get_device_properties(device).uuid).startswith("MIG-")


def no_peak_reason(device: torch.device) -> str | None:
    """Why `device` has no peak to compute MFU against, for results.json; None when it has one."""
    if device.type != "cuda":
        return "CPU: MFU is measured against a GPU's peak"
    if is_mig(device):
        # the table holds whole chips; a slice has a share of the SMs, not a known share of peak
        return MIG_NOTE
    name = torch.cuda.get_device_name(device)
    return None if table_peaks(name) is not None else f"GPU not in the peak table: {name}"


def peak_tflops(device: torch.device, amp: str) -> float | None:
    """The GPU's dense peak for the dtype in use, or None where no_peak_reason gives a reason."""
    if no_peak_reason(device):
        return None
    dtype = amp if amp != "off" else ("tf32" if torch.backends.cudnn.allow_tf32 else "fp32")
    return table_peaks(torch.cuda.get_device_name(device))[dtype]


def mfu(images_per_sec_per_gpu: float | None, flops: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the model's useful FLOPs per second on
    one GPU over that GPU's peak."""
    if images_per_sec_per_gpu is None or peak is None:
        return None
    return images_per_sec_per_gpu * flops / (peak * 1e12)


def window_mfu(images_per_sec: float | None, gpus: int, flops: int | None,
               peak: float | None) -> float | None:
    """A log window's MFU, as mfu computes results.json's for the run: the window's global
    images/s shared by the `gpus` GPUs that train the global batch, times the FLOPs of one
    training image (forward and backward: flops_per_image), over one GPU's dense peak in TFLOP/s
    (`peak`). None without a rate or a peak."""
    if images_per_sec is None or peak is None:
        return None
    return mfu(images_per_sec / gpus, flops, peak)


def speed_summary(cfg: Config, totals, timer, device: torch.device, devices: int,
                  compile_waits: dict | None = None, flops: int | None = None) -> dict:
    """The run's speed figures for results.json, from its timed log windows (`totals`, a Sums) and
    its step timer. `devices` is how many GPUs (or CPUs) the global batch is split over. `mfu_note`
    says why MFU is None. `compile_time_s`: this process's time compiling and recording CUDA graphs,
    from torch's compile callbacks (the timer's CompileClock; common/compiling.py says what is in it
    and what is not), None when the run is not compiled (0.0: this process had nothing to compile).
    `compile_wait_s`: the longest any rank waited for its node's first rank to compile a graph it
    then read from the cache (`compile_waits`, by rank), not compile time; None outside a compiled
    process group. `flops`: flops_per_image(cfg), where the caller counted it already (a count of
    the full model takes seconds)."""
    rate = totals.images_per_sec(cfg.batch_size)
    per_device = rate / devices if rate is not None else None
    flops = flops_per_image(cfg) if flops is None else flops
    p50, p90 = timer.percentiles()
    first = timer.first_step_seconds
    utilisation = mfu(per_device, flops, peak_tflops(device, cfg.amp))
    waits = [wait for wait in (compile_waits or {}).values() if wait is not None]
    compiling = getattr(timer, "compiling", None)
    return {
        "images_per_sec": rate, "images_per_sec_per_gpu": per_device, "batch_time_p50": p50,
        "batch_time_p90": p90, "data_wait_frac": totals.data_frac, "flops_per_image": flops,
        "parameters": parameter_count(cfg), "mfu": utilisation, "first_step_s": first,
        "compile_time_s": compiling.seconds if compiling is not None else None,
        "compile_wait_s": max(waits) if waits else None,
        "mfu_note": None if utilisation is not None else no_peak_reason(device) or "no timed steps"}


def describe_fast_path(cfg: Config) -> str:
    """`amp bf16, channels_last, gpu loader, compiled` for the run's first line."""
    parts = [f"amp {cfg.amp}" if cfg.amp != "off" else "fp32",
             "channels_last" if cfg.channels_last else "NCHW"]
    parts += ["channels stored in multiples of "
              f"{cfg.align_channels}"] if (cfg.align_channels or 0) > 1 else []
    parts += [loader_description(cfg)] if cfg.loader else []
    return ", ".join(parts + ([f"compiled ({compile_state(cfg)})"] if cfg.compile else []))


def compile_state(cfg: Config) -> str:
    """torch.compile's mode, and whether its cache folder holds compiled graphs of the kinds a
    compile reads ("warm": inductor's FX graphs or AOTAutograd's, common/compiling.py GRAPH_ENTRIES;
    this run reads those it shares with them, all of its own if the same model and mode filled it)
    or none ("cold", even with other files in it: kernels alone, locks, an empty tree)."""
    entries = graph_entries(cfg.compile_cache)
    mode = "" if cfg.compile_mode in (None, "default") else f"{cfg.compile_mode}, "
    state = f"warm, {entries} compiled graph{'s' * (entries != 1)}" if entries else "cold"
    return f"{mode}cache {state}: {cfg.compile_cache}"
