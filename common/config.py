"""One frozen dataclass of hyper-parameters; its fields generate the
command-line flags of every train.py.

A field's default is the flag's default and its metadata the help text and the domain. A bool that
defaults to False becomes `--name`; one that defaults to True becomes `--no_name`, its help naming
what it turns off ("turn off the paper's Nesterov momentum (on by default)"); an optional bool
(None: the run decides) gets both. A mode with flags of its own subclasses `Config` inline. --help
prints the script's docstring as written (HelpFormatter).

Every value is checked where it is parsed, before anything starts: each field against its own domain
(check_domains, which any frozen config dataclass can call from __post_init__), then the rules
between fields (Config.__post_init__). A value outside is refused in one line that names the flag,
the value and what to give instead.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import functools
import hashlib
import math
import operator
import os
import shlex
import sys
import tempfile
import types
import typing
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import RunError, UsageError  # every module may import them from here too
from common.folders import image_folder, image_folder_refusal
from models.factory import PYRAMIDNET, unknown_model
from models.pyramidnet import BLOCKS as MODEL_BLOCKS, check_arguments, parameters_at_least

REPO_ROOT = Path(__file__).resolve().parents[1]
# their shapes and statistics: common/data.py
DATASETS = ("cifar10", "mnist", "synthetic", "imagefolder")
LOADERS = ("gpu", "torchvision")
AMPS = ("bf16", "fp16", "off")
# torch.compile's
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
BASE_BATCH = 128  # --lr is given per this many images of global batch
# The flags that decide the model's parameters: its names and shapes (--dataset: its input
# channels and classes). Weights load only into a model built with the same ones; --align_channels
# stores them padded, the same model.
MODEL_FLAGS = ("model", "depth", "alpha", "block", "width_multiple", "dataset", "image_size")
# The model flags added after runs had been written: a config without one was written with its
# default.
LATER_FLAGS = {"model": "pyramidnet", "image_size": None}
AUGMENTS = ("auto", "pad", "resized", "off")  # --augment (common/data.py: at_size, augmentation)
INT_MAX = 2**63 - 1  # torch's largest integer: a count above it reaches no tensor and no C++ call
# The weights are float32 in every mode (autocast computes in bf16/fp16 but keeps them so): SGD
# hands the learning rate and the weight decay to its kernels as scalars of the weights' dtype, and
# a larger one cannot be converted.
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
# torch.finfo(torch.float32).tiny: below it a rate loses its precision
FLOAT32_TINY = 1.1754943508222875e-38
# SyntheticCIFAR keeps its images as bytes, 3 x 32 x 32 each (it makes them a few at a time,
# common/data.py): a lower bound of the memory --synthetic_size asks for.
SYNTHETIC_BYTES_PER_IMAGE = 3 * 32 * 32
# the kernel's own views: nothing can be created there, not even by root
PSEUDO_FILESYSTEMS = ("/proc", "/sys")


def _path_limit(name: str, default: int) -> int:
    try:
        return os.pathconf("/", name)
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no such limit
        return default


NAME_MAX, PATH_MAX = _path_limit("PC_NAME_MAX", 255), _path_limit("PC_PATH_MAX", 4096)  # bytes


def flag(default, help: str, *, at_least=None, above=None, at_most=None, below=None, check=None,
         **argparse_kwargs):
    """A field of a config dataclass: its default, its --help text, its domain and argparse's extras
    (nargs, choices). The domain is what check_domains enforces. A bool's is its type, a choice's
    its `choices`; a number's is its bounds (at_least, above, at_most, below; always finite, and an
    int at most INT_MAX); a string's is `check`: a name from CHECKS or a function of the value that
    returns None, or what to give instead. An optional field (`X | None`) also takes None, and a
    tuple's bounds or check hold for each item."""
    given = dict(at_least=at_least, above=above, at_most=at_most, below=below, check=check)
    domain = {name: value for name, value in given.items() if value is not None}
    return field(default=default, metadata={"help": help, "domain": domain, **argparse_kwargs})


# ------------------------------------------------------------------------------------------ domains
BOUNDS = {"at_least": ("at least", operator.ge), "above": ("above", operator.gt),
          "at_most": ("at most", operator.le), "below": ("below", operator.lt)}


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say):
    what no allocation can exceed."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _shown(value) -> str:
    """A value as the error line shows it: numbers as typed, text quoted (an
    empty one visible), long ones cut."""
    text = (repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float)
            else str(value))
    return text if len(text) <= 80 else f"{text[:60]}... ({len(str(value))} characters)"


def _gib(size: float) -> str:
    return f"{size / 2**30:,.3g} GiB" if math.isfinite(size) else "more GiB than a float counts"


def _path(value: str, room: int = 0) -> str | None:
    """What is wrong with `value` as a path, leaving `room` bytes under
    PATH_MAX for what goes below it."""
    if not value:
        return "a path, not empty (. is the current folder)"
    if "\0" in value:
        return "a path without a NUL character"
    try:
        names = [os.fsencode(name) for name in value.split("/")]
        length = len(os.fsencode(os.path.abspath(value)))
    except UnicodeEncodeError:
        return "a path the file system can encode"
    if any(len(name) > NAME_MAX for name in names):
        return f"a path whose every name is at most {NAME_MAX} bytes"
    if length + room > PATH_MAX:
        return f"a path of at most {PATH_MAX - room} bytes once made absolute"
    return None


def _folder(value: str) -> str | None:
    """A folder a run writes into: room below it for a run folder and a file in
    it, and no kernel file system."""
    wrong = _path(value, room=2 * (NAME_MAX + 1))
    if wrong:
        return wrong
    real = os.path.realpath(value)
    if any(real == root or real.startswith(root + "/") for root in PSEUDO_FILESYSTEMS):
        return (f"a folder outside {' and '.join(PSEUDO_FILESYSTEMS)} (the kernel's, where "
                "nothing can be written)")
    return None


def _file_or_auto(value: str) -> str | None:
    wrong = None if value == "auto" else _path(value)
    return wrong and f"auto, or {wrong}"


# Unicode's control characters (newline, tab, NUL, escape...) and line separators
CONTROL = ("Cc", "Zl", "Zp")


def _folder_name(value: str) -> str | None:
    """One name in a folder, as --run_name is: the run folder's own. Neither a path separator (/,
    nor Windows' \\, which a copy of the runs to Windows would split on) nor a control character (a
    newline, a tab, an escape): the name is printed in messages and in the commands they give to
    paste, each of which must stay one line."""
    plain = (value not in ("", ".", "..")
             and not any(separator in value for separator in ("/", "\\")))
    if not plain:
        return "a plain folder name (not empty, . or .., without / or \\)"
    control = next((character for character in value if unicodedata.category(character) in CONTROL),
                   None)
    if control is not None:
        return f"a folder name without control characters (this one has {control!r})"
    try:
        size = len(os.fsencode(value))
    except UnicodeEncodeError:
        return "a folder name the file system can store"
    return (None if size <= NAME_MAX
            else f"a folder name of at most {NAME_MAX} bytes (this one has {size})")


def _rendezvous(value: str) -> str | None:
    """torch's three rendezvous: env:// (MASTER_ADDR/PORT from the environment),
    tcp://HOST:PORT, file:///PATH."""
    scheme, separator, rest = value.partition("://")
    host, _, port = rest.partition("?")[0].rpartition(":")
    valid = {"env": bool(separator) and (not rest or rest.startswith("?")),
             "tcp": bool(host) and port.isdigit() and 0 < int(port) < 65536,
             "file": rest.startswith("/") and not _path(rest)}
    return None if valid.get(scheme) else "env://, tcp://HOST:PORT or file:///ABSOLUTE/PATH"


def _synthetic_images(size: int) -> str | None:
    memory = physical_memory()
    if memory is None or size * SYNTHETIC_BYTES_PER_IMAGE <= memory:
        return None
    return (f"at most {memory // SYNTHETIC_BYTES_PER_IMAGE} images on this machine "
            f"(generating them takes {SYNTHETIC_BYTES_PER_IMAGE // 1024} KiB each; it has "
            f"{_gib(memory)} of memory)")


# a DataLoader worker's own memory at the least (measured: 10 MiB, forked, idle)
WORKER_BYTES = 10 * 2**20


def _worker_processes(count: int) -> str | None:
    """DataLoader workers are processes: no more than the machine's
    memory and process limit can hold."""
    import resource

    memory = physical_memory()
    limits = [resource.getrlimit(resource.RLIMIT_NPROC)[0]]
    limits += [memory // WORKER_BYTES] if memory is not None else []
    most = min(limit for limit in limits if limit != resource.RLIM_INFINITY) if limits else None
    if most is None or count <= most:
        return None
    return f"at most {most} worker processes on this machine (each is a process of at least 10 MiB)"


def compile_cache_folder(cfg) -> str:
    """Where torch.compile's caches go: --compile_cache, else the TORCHINDUCTOR_CACHE_DIR the user
    set, else <log_dir>/.compile_cache."""
    return (cfg.compile_cache or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            or str(Path(cfg.log_dir) / ".compile_cache"))


def splits_apart(path: str) -> bool:
    """Whether `path` would not reach the C++ compiler whole. Inductor's C++ builder
    (torch/_inductor/cpp_builder.py, CppBuilder) writes the source and output files, which lie in
    the compile cache, into its command line unquoted (only -I and -L paths are quoted) and splits
    that line with shlex.split: a space, tab, quote or backslash in the path cuts it in two ("g++:
    fatal error: input file '/a' is the same as output file"; an odd quote makes shlex raise)."""
    try:
        return shlex.split(path) != [path]
    except ValueError:  # "No closing quotation"
        return True


def compile_cache_alias(folder: str) -> Path:
    """A path without spaces that leads to the compile cache `folder` (whose own path
    splits apart): a symbolic link in this user's own folder of the temporary folder,
    named after the cache's real path."""
    real = os.path.realpath(folder)
    name = hashlib.sha256(os.fsencode(real)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pytorch-multigpu-{os.getuid()}" / name


def _first_existing(path: Path) -> Path:
    while not (path.exists() or path.is_symlink()) and path != path.parent:
        path = path.parent
    return path


def compile_cache_refusal(cfg) -> str | None:
    """Why the compile cache cannot be used, in one line (None when it can), checked before anything
    is written: a file, a symbolic link that leads nowhere, a folder that cannot be written
    (read-only, not this user's), or a path the C++ compiler cannot be given that no alias can stand
    in for. Said with where the path came from."""
    folder = Path(compile_cache_folder(cfg))
    give = "give a --compile_cache folder"
    if cfg.compile_cache:
        name = f"--compile_cache {folder}"
    elif os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        name = f"the compile cache {folder} (from TORCHINDUCTOR_CACHE_DIR)"
    else:
        name = f"the compile cache {folder} (--compile_cache's default, under --log_dir)"
        give = "give a --log_dir or --compile_cache folder"
    existing = _first_existing(folder)
    if existing.is_symlink() and not existing.exists():
        where = "" if existing == folder else f": {existing}"
        return (f"{name}{where} is a symbolic link to {os.readlink(existing)}, which does not "
                "exist: create that folder, or give another --compile_cache")
    if not existing.is_dir():
        where = "" if existing == folder else f": {existing}"
        return f"{name}{where} is a file, not a folder: {give}"
    # the kernel's answer: a read-only mount, permissions
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "cannot be written by this user"
        return f"{name}: {existing} {why}: {give} that can be written"
    if not splits_apart(os.path.abspath(folder)):
        return None
    alias = compile_cache_alias(str(folder))  # where a link will stand in for it
    if splits_apart(str(alias)):
        return (f"{name} has a space (or a quote or backslash) in its path, which inductor's C++ "
                f"builder cuts apart, and so does the temporary folder {alias.parent.parent} that "
                "would hold a link to it: give a --compile_cache path without them")
    links = alias.parent
    if (links.is_symlink()
            or links.exists() and (not links.is_dir() or links.stat().st_uid != os.getuid())):
        return (f"{name} has a space in its path, and {links}, where a link without one would "
                "stand in for it, is not a folder of this user's: remove it, or give a "
                "--compile_cache path without spaces")
    if not os.access(_first_existing(links), os.W_OK | os.X_OK):
        return (f"{name} has a space in its path, and {links.parent}, where a link "
                "without one would stand in for it, cannot be written: give a "
                "--compile_cache path without spaces")
    return None


CHECKS = {"folder": _folder, "file": _path, "file_or_auto": _file_or_auto, "name": _folder_name,
          "rendezvous": _rendezvous}


def _number(value, kind: type, domain: dict) -> str | None:
    """What to give instead of `value`, a number of type `kind` (int or
    float) with the bounds in `domain`."""
    noun = "a whole number" if kind is int else "a finite number"
    if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
        return noun
    bounds = [(word, holds, domain[name]) for name, (word, holds) in BOUNDS.items()
              if name in domain]
    if (isinstance(value, float) and not math.isfinite(value)
            or not all(holds(value, b) for _, holds, b in bounds)):
        limits = " and ".join(f"{word} {_shown(bound)}" for word, _, bound in bounds)
        return f"{noun} {limits}".rstrip()
    if kind is int and value > INT_MAX:
        return f"a whole number at most {INT_MAX} (2**63 - 1, torch's largest)"
    return None


def _outside(value, kind: type, domain: dict, choices) -> str | None:
    """None when `value` (of a field, or an item of a tuple field, of type `kind`) lies in its
    domain, else what to give instead."""
    if kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if choices is not None:
        return None if value in choices else f"one of {', '.join(map(str, choices))}"
    if kind in (int, float):
        wanted = _number(value, kind, domain)
    else:
        wanted = (None if isinstance(value, kind) else "text" if kind is str
                  else f"a {kind.__name__}")
    check = domain.get("check")
    if wanted is None and check is not None:
        wanted = (CHECKS[check] if isinstance(check, str) else check)(value)
    return wanted


@functools.cache
def _typed_fields(config_class: type) -> tuple:
    """(field, X, whether None is allowed, whether a tuple of X) for
    every field of `config_class`."""
    hints, typed = typing.get_type_hints(config_class), []
    for f in dataclasses.fields(config_class):
        hint = hints[f.name]
        optional = (typing.get_origin(hint) in (typing.Union, types.UnionType)
                    and type(None) in typing.get_args(hint))
        # X | None -> X
        kind = next(k for k in typing.get_args(hint) if k is not type(None)) if optional else hint
        many = typing.get_origin(kind) is tuple
        typed.append((f, typing.get_args(kind)[0] if many else kind, optional, many))
    return tuple(typed)


def _domain(f: dataclasses.Field) -> dict:
    """The field's domain, as its flag(...) gives it."""
    return f.metadata.get("domain", {})


def missing_domains(config_class: type) -> list[str]:
    """The fields of `config_class` that have no domain (see flag): a mistake the tests refuse."""
    return [f.name for f, kind, _, _ in _typed_fields(config_class)
            if kind is not bool and "choices" not in f.metadata and not _domain(f)]


def check_domains(config) -> None:
    """Refuse the first field of the frozen config dataclass `config` whose value lies outside its
    domain (see flag), in one line that names its flag, the value and what to give instead. Any
    config dataclass calls it first thing in __post_init__."""
    for f, kind, optional, many in _typed_fields(type(config)):
        value = getattr(config, f.name)
        if value is None and optional:
            continue
        if many and not (isinstance(value, tuple) and value):
            raise UsageError(f"--{f.name} must be one or more values, not {_shown(value)}")
        domain = _domain(f)
        for item in value if many else (value,):
            if many and item is None and optional:
                continue  # an item None: the run's default (compare.py's --amp)
            wanted = _outside(item, kind, domain, f.metadata.get("choices"))
            if wanted:
                raise UsageError(f"--{f.name} must be {wanted}, not {_shown(item)}")


@dataclass(frozen=True)
class Config:
    # optimisation
    batch_size: int = flag(128, "GLOBAL batch: images per optimizer step summed over every GPU",
                           at_least=1)
    epochs: int = flag(300, "passes over the training set (the paper's 300)", at_least=0)
    max_steps: int = flag(0, "stop after this many optimizer steps in total; 0 = no limit",
                          at_least=0)
    lr: float = flag(0.1, "learning rate per 128 images of global batch, scaled "
                          "linearly with --batch_size", above=0)
    # x steps: a float
    lr_warmup_epochs: float = flag(5.0, "epochs of the linear warm-up of the rate at the start, "
                                        "at every batch size (at most a tenth of the run; 0: "
                                        "none)", at_least=0, at_most=1e9)
    # 1 and more: steps that never shrink
    momentum: float = flag(0.9, "SGD momentum", at_least=0, below=1)
    weight_decay: float = flag(1e-4, "L2 weight decay", at_least=0, at_most=FLOAT32_MAX)
    nesterov: bool = flag(True, "the paper's Nesterov momentum")
    # model
    model: str = flag(PYRAMIDNET, "pyramidnet (the paper's CIFAR model, shaped by the "
                                  "four flags below) or any classification model "
                                  "torchvision lists (resnet50, vit_b_16, ...), built "
                                  "without pretrained weights", check=unknown_model)
    # its form: __post_init__
    depth: int = flag(110, "PyramidNet depth: 6n+2 (basic) or 9n+2 (bottleneck)", at_least=1)
    alpha: float = flag(270.0, "PyramidNet widening factor: channels added over the whole network",
                        above=0)
    block: str = flag("basic", "residual block", choices=tuple(MODEL_BLOCKS))
    width_multiple: int = flag(1, "round every block's width up to a multiple of this (8 suits "
                                  "tensor cores); 1 = the paper's widths", at_least=1)
    # data
    dataset: str = flag("cifar10", "cifar10 or mnist (downloaded into --data_dir), synthetic "
                                   "(CIFAR-10-shaped, generated, offline), or imagefolder (your "
                                   "images: --data_dir/train/<class>/* and "
                                   "--data_dir/val/<class>/*)", choices=DATASETS)
    data_dir: str = flag(str(REPO_ROOT / "data"), "where datasets are downloaded and read; for "
                                                  "imagefolder, the folder that holds train/ and "
                                                  "val/", check="folder")
    image_size: int | None = flag(None, "side of the square images the model takes (default: 224 "
                                        "for --dataset imagefolder and for torchvision models on "
                                        "synthetic data; else the dataset's own, 32, or 28 for "
                                        "mnist); cifar10, mnist and synthetic are resized to it "
                                        "after their augmentation", at_least=8, at_most=4096)
    synthetic_size: int = flag(50_000, "training images of --dataset synthetic; the test set is a "
                                       "fifth of it; unless given, --benchmark takes only the "
                                       "images its steps draw (their steps x --batch_size)",
                               at_least=5, check=_synthetic_images)
    loader: str | None = flag(None, "gpu: dataset held on the device, augmented there (default "
                                    "with CUDA; for imagefolder where its decoded images take at "
                                    "most half the GPU's free memory); torchvision: DataLoader "
                                    "workers with PIL transforms (default without)",
                              choices=LOADERS)
    num_workers: int | None = flag(None, "DataLoader worker processes per training process "
                                         "(torchvision loader); default: what fits this "
                                         "machine: the usable cores shared among the "
                                         "node's training processes, one of each share "
                                         "left to the process, at most 4",
                                   at_least=0, check=_worker_processes)
    shuffle: bool = flag(True, "reshuffling the training set every epoch")
    augment: str = flag("auto", "the training images' random crop: pad (CIFAR's: the image padded "
                                "by an eighth of its side, 4 pixels at 32, and cut back at a "
                                "random place; for images of up to about 64 pixels), resized "
                                "(ImageNet's: 8 %% to 100 %% of the area, resized to "
                                "--image_size; for photographs of about 100 pixels and more), "
                                "off (train on the evaluation images), or auto: pad for cifar10, "
                                "mnist and synthetic, and for imagefolder at an --image_size of "
                                "64 or less, else resized", choices=AUGMENTS, no_flag="off")
    flip: bool | None = flag(None, "mirror half the training images left to right (default: on, "
                                   "except for mnist and for imagefolder's pad crops: small "
                                   "images are often digits, letters or icons, which a mirror "
                                   "changes; give --flip for photographs)")
    # speed
    amp: str | None = flag(None, "autocast precision: bf16 (default on GPUs that have it), fp16 "
                                 "(with loss scaling; the default on older GPUs) or off (fp32; "
                                 "the default on the CPU)",
                           choices=AMPS)
    channels_last: bool | None = flag(None, "NHWC memory format for the model and the "
                                            "batches, which tensor cores prefer (default: on "
                                            "with CUDA, off on the CPU)")
    align_channels: int | None = flag(None, "store every activation, and the weights that touch "
                                            "it, at a channel count rounded up to a multiple of "
                                            "N, the extra channels exactly zero, so that "
                                            "convolutions get tensor-core shapes: the same "
                                            "model, parameters and checkpoints (default: 8 with "
                                            "CUDA, 0 = off on the CPU)", at_least=0, at_most=256)
    compile: bool = flag(False, "torch.compile the model; the compile time is "
                                "reported apart and not timed")
    compile_mode: str | None = flag(None, "with --compile, torch.compile's mode: default (the "
                                          "default); reduce-overhead (CUDA graphs of the step's "
                                          "forward and backward); max-autotune-no-cudagraphs; "
                                          "max-autotune (CUDA graphs too)",
                                    choices=COMPILE_MODES)
    compile_cache: str | None = flag(None, "folder of torch.compile's caches (inductor's FX "
                                           "graphs, AOTAutograd's, Triton's kernels), kept between "
                                           "runs so that the next run on this machine compiles in "
                                           "seconds (default: TORCHINDUCTOR_CACHE_DIR if set, else "
                                           "<log_dir>/.compile_cache)",
                                     check="folder")
    cudnn_benchmark_limit: int | None = flag(None, "cuDNN algorithms that autotuning tries per "
                                                   "convolution (torch's default: 10; 0: every "
                                                   "one)", at_least=0, at_most=10**6)
    benchmark: bool = flag(False, "measure speed only: synthetic data (an image folder's own "
                                  "images, through the loader a training run uses, with "
                                  "--dataset imagefolder), --warmup_steps untimed, then "
                                  "--benchmark_steps timed steps (then --profile_steps "
                                  "profiled ones), no evaluation")
    benchmark_steps: int = flag(100, "timed optimizer steps of --benchmark", at_least=1)
    # hardware and reproducibility
    gpu_devices: tuple[int, ...] | None = flag(None, "CUDA device ids to use (default: GPU 0 for "
                                                     "single_gpu, every visible GPU for the other "
                                                     "modes)", nargs="+", at_least=0)
    seed: int = flag(0, "seed of the weights, the epoch order and the augmentation",
                     at_least=0, at_most=2**32 - 1)  # numpy's seeds
    deterministic: bool = flag(False, "torch.use_deterministic_algorithms and cuDNN's "
                                      "deterministic mode (cudnn.benchmark off): "
                                      "bitwise-reproducible runs, slower")
    # logging and outputs
    log_dir: str = flag(str(REPO_ROOT / "runs"), "TensorBoard runs go to <log_dir>/<run_name>/",
                        check="folder")
    run_name: str | None = flag(None, "default: <mode>-<n>gpu-<timestamp>", check="name")
    overwrite: bool = flag(False, "replace an existing run folder of the same name")
    log_interval: int = flag(50, "optimizer steps per log window (a log line, TensorBoard points)",
                             at_least=1)
    warmup_steps: int = flag(10, "first optimizer steps left out of the timing (cuDNN autotune, "
                                 "allocator)", at_least=0)
    profile_steps: int = flag(0, "record the run's last N optimizer steps with torch.profiler, "
                                 "after the timed ones and never among them (--benchmark adds "
                                 "them to its steps): each rank's trace goes to <run "
                                 "folder>/trace_rank<r>.json, and results.json splits each "
                                 "rank's step into compute, communication (hidden and "
                                 "exposed), data, optimizer and the rest; 0 = off", at_least=0)
    memory_snapshot: int = flag(0, "GPUs: record the CUDA allocator's history (every allocation "
                                   "and free, with its stack) over the first N optimizer steps "
                                   "into <run folder>/memory_snapshot.pickle, for "
                                   "pytorch.org/memory_viz (rank 0's GPU; the recorded steps run "
                                   "slower: keep N within --warmup_steps); 0 = off",
                                at_least=0)
    save_model: bool = flag(False, "write the trained weights to <run folder>/model.pt")
    checkpoint_interval: int = flag(0, "write <run folder>/checkpoint.pt every N "
                                       "optimizer steps as well; 0 = at the end of every "
                                       "epoch only (and when stopped)", at_least=0)
    resume: str | None = flag(None, "continue from a checkpoint.pt (PATH), or from this "
                                    "--run_name's latest one (auto; a fresh start when it has none "
                                    "yet)", check="file_or_auto")
    evaluate: str | None = flag(None, "load weights from PATH, evaluate on the test set, write "
                                      "results, exit", check="file")
    progress: bool = flag(True, "the tqdm bar of each epoch (shown when stdout is a terminal)")

    def __post_init__(self):
        """Each field against its domain, then the rules between fields."""
        check_domains(self)
        lr = self.effective_lr()
        checks = [
            (self.momentum > 0 or not self.nesterov,
             f"--momentum {self.momentum:g} with Nesterov momentum (the default): give --momentum "
             "above 0, or add --no_nesterov"),
            (FLOAT32_TINY <= lr <= FLOAT32_MAX,
             f"--lr {self.lr:g} at --batch_size {self.batch_size} is a learning rate of {lr:g} "
             f"(x batch / {BASE_BATCH}), {'more' if lr > 1 else 'less'} than the float32 weights' "
             f"updates can hold: give a {'smaller' if lr > 1 else 'larger'} --lr"),
            (not (self.resume and self.overwrite),
             "--resume continues a run folder and --overwrite deletes it: give one of them"),
            (not (self.resume and (self.evaluate or self.benchmark)),
             "--resume continues training: leave out --evaluate and --benchmark"),
            (self.resume != "auto" or self.run_name,
             "--resume auto finds the run by its name: add --run_name NAME (the same name on every "
             "restart)"),
            (not (self.benchmark and self.evaluate),
             "--benchmark trains and --evaluate does not: give one of them"),
            (not (self.profile_steps and self.evaluate),
             "--profile_steps records training steps and --evaluate trains none: give one of them"),
            (not (self.memory_snapshot and self.evaluate),
             "--memory_snapshot records training steps and --evaluate trains none: give one of "
             "them"),
            # a flag that would be ignored is refused
            *[(self.compile or getattr(self, name) is None,
               f"--{name} {getattr(self, name)} does nothing without --compile: give --compile "
               f"too, or leave out --{name}")
              for name in ("compile_mode", "compile_cache")],
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        refusal = compile_cache_refusal(self) if self.compile else None
        if refusal:
            raise UsageError(refusal)
        # its layout and classes, listed once per process (no image is read)
        if self.dataset == "imagefolder":
            refusal = image_folder_refusal(self.data_dir)
            if refusal:
                raise UsageError(refusal)
        # a torchvision model: its own shape, checked on its images at the start
        if self.model != PYRAMIDNET:
            return
        try:
            check_arguments(self.depth, self.alpha, self.block, 10, 3)
        except ValueError as error:
            raise UsageError(f"--depth/--alpha: {error}") from None
        # float32
        weights = 4 * parameters_at_least(self.depth, self.alpha, self.block, self.width_multiple)
        # the model is built in the host's memory before any device sees it
        memory = physical_memory()
        if memory is not None and weights > memory:
            raise UsageError(f"--depth {self.depth} --alpha {self.alpha:g} --block {self.block} "
                             f"--width_multiple {self.width_multiple}: the weights alone take at "
                             f"least {_gib(weights)}, more than this machine's {_gib(memory)} of "
                             "memory; give a smaller --depth, --alpha or --width_multiple")

    def effective_lr(self) -> float:
        return self.lr * self.batch_size / BASE_BATCH

    def last_step(self, steps_per_epoch: int) -> int:
        """The optimizer step the run ends with, unless it is stopped: its last epoch's last,
        or --max_steps if that comes first."""
        steps = self.epochs * steps_per_epoch
        return min(steps, self.max_steps) if self.max_steps > 0 else steps

    def reached_max_steps(self, step: int) -> bool:
        """--max_steps is a ceiling: a run at or past it trains no further
        (resumed with a lower one, too)."""
        return 0 < self.max_steps <= step


# the flags of every mode with a process group: dist_parallel's and fsdp's
@dataclass(frozen=True)
class GroupConfig(Config):
    backend: str | None = flag(None, "nccl (default with CUDA) or gloo", choices=("nccl", "gloo"))
    init_method: str = flag("env://", "rendezvous: env:// (MASTER_ADDR/PORT), tcp://HOST:PORT or "
                                      "file:///PATH", check="rendezvous")
    verify_sync: bool = flag(False, "check every epoch, not only at the end, that all "
                                    "ranks hold the same weights")
    nproc_per_node: int | None = flag(None, "without torchrun: workers to start "
                                            "(default: one per GPU)", at_least=1)
    dist_timeout: float = flag(600.0, "seconds a collective (or joining the group) may wait "
                                      "for the other ranks before the run ends with an "
                                      "error instead of hanging", above=0, at_most=1e9)
    max_restarts: int = flag(0, "started without torchrun: restart the workers up to N "
                                "times after a failure (with --resume auto they continue "
                                "from the last checkpoint)", at_least=0)


# The short forms of PyTorch's ImageNet example (pytorch/examples, imagenet/main.py) whose flag
# means the same here, so that its commands paste: -b the global batch (its total batch of a
# node), -j the loader's worker processes (here each training process's), -a the model by
# torchvision's name (its --arch), -p the steps between two log lines (its --print-freq), -e an
# evaluation only (here of the weights whose path follows it; its -e evaluates the --resume
# checkpoint).
SHORT_FLAGS = {"batch_size": "-b", "num_workers": "-j", "model": "-a", "log_interval": "-p",
               "evaluate": "-e"}


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; here a mistake is one line that says what to do.
    Every long flag is also accepted with hyphens for its underscores (`--batch-size`,
    `--no-nesterov`), as PyTorch's ImageNet example and timm write them; --help shows the
    underscores only."""

    def parse_known_args(self, args=None, namespace=None):
        given = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.with_underscores(given), namespace)

    def with_underscores(self, args: list) -> list:
        """`args` with each hyphenated long flag written as the parser knows it (`--batch-size 64`
        and `--batch-size=64` as `--batch_size`), up to a lone `--`. A flag whose underscored form
        names no flag (nor the start of one, which argparse takes for it) is left as it was typed,
        so that an error names it as the user wrote it."""
        known = list(self._option_string_actions)
        written = []
        for index, arg in enumerate(args):
            if arg == "--":
                return written + list(args[index:])
            name, equals, value = arg.partition("=") if isinstance(arg, str) else ("", "", "")
            if name.startswith("--") and "-" in name[2:]:
                underscored = "--" + name[2:].replace("-", "_")
                if any(option.startswith(underscored) for option in known):
                    arg = underscored + equals + value
            written.append(arg)
        return written

    def error(self, message):
        if message.endswith("expected one argument"):  # argparse takes -1e-4 or -inf for a flag
            message += " (a value that starts with - goes after =, as in --flag=-value)"
        raise UsageError(f"{message} (see --help)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help as a reader takes it: the script's docstring as it is written (its command lines one a
    line, not run together into a paragraph), and after each flag its default where that says
    something: `(default: 128)`, an on/off flag's as words (`(on by default)`), none for a default
    of None (the run decides, and the flag's help says how)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (off by default)"
        if isinstance(action, argparse._StoreFalseAction):
            return f"{text} (on by default)"
        if action.default is None or isinstance(action, argparse._StoreConstAction):
            return text
        # as it is typed: `on off`, not `('on', 'off')`
        if isinstance(action.default, (tuple, list)):
            return f"{text} (default: {' '.join(map(str, action.default))})"
        return super()._get_help_string(action)


def build_parser(config_class: type[Config], description: str) -> argparse.ArgumentParser:
    parser = _OneLineParser(description=description, formatter_class=HelpFormatter)
    add_flags(parser, config_class)
    return parser


def add_flags(parser: argparse.ArgumentParser, config_class: type[Config], skip=(),
              defaults: bool = True) -> None:
    """One flag per field of `config_class` (except `skip`). With defaults=False a flag that is
    not given is left out of the parsed namespace, so a caller can tell what the user chose
    (compare.py passes only those on)."""
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        if f.name in skip:
            continue
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        meta.pop("domain", None)  # checked by the config itself (check_domains)
        kind = hints[f.name]
        default = f.default if defaults else argparse.SUPPRESS
        short = [SHORT_FLAGS[f.name]] if f.name in SHORT_FLAGS else []  # -b, as ImageNet's
        # a choice with a value that turns it off: --no_<name> stands for --<name> <that value>
        off = meta.pop("no_flag", None)
        if kind is bool:
            name = f"--no_{f.name}" if f.default else f"--{f.name}"
            parser.add_argument(name, *short, dest=f.name,
                                action="store_false" if f.default else "store_true",
                                default=default,
                                help=f"turn off {help_text}" if f.default else help_text)
            continue
        if kind == bool | None:  # on, off, or None: the run decides (from the device)
            parser.add_argument(f"--{f.name}", *short, dest=f.name, action="store_const",
                                const=True, default=default, help=help_text)
            parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_const", const=False,
                                default=default, help=f"turn --{f.name} off")
            continue
        # X | None -> X
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        if typing.get_origin(base) is tuple:
            base = typing.get_args(base)[0]
        parser.add_argument(f"--{f.name}", *short, type=base, default=default, help=help_text,
                            **meta)
        if off is not None:
            parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_const", const=off,
                                default=default, help=f"the same as --{f.name} {off}")


def as_today(config: dict) -> dict:
    """A config a run wrote (a checkpoint's, a results.json's) in today's flags: a flag added since
    at the value that ran then (LATER_FLAGS; --flip: on but for mnist), and --augment's on and off
    of before as the crop it meant (an image folder's random resized crop, the others' pad
    crop)."""
    config = {**LATER_FLAGS, **config}
    config.setdefault("flip", config.get("dataset") != "mnist")
    if isinstance(config.get("augment"), bool):
        crop = "resized" if config.get("dataset") == "imagefolder" else "pad"
        config["augment"] = crop if config["augment"] else "off"
    return config


def config_argv(config_class: type[Config], values: dict) -> list[str]:
    """The flags that set `values` (field name -> value) on the command line: the inverse of the
    parser."""
    hints, argv = typing.get_type_hints(config_class), []
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    for name, value in values.items():
        if hints[name] is bool or hints[name] == bool | None:
            if value is not None and (hints[name] is not bool or value != defaults[name]):
                argv.append(f"--{name}" if value else f"--no_{name}")
        elif value is not None:
            argv += [f"--{name}", *map(str, value if isinstance(value, (tuple, list)) else [value])]
    return argv


def parse_config(config_class: type[Config], argv=None, description: str = "") -> Config:
    """Command-line flags -> a validated, frozen config."""
    args = vars(build_parser(config_class, description).parse_args(argv))
    if args["gpu_devices"] is not None:
        args["gpu_devices"] = tuple(args["gpu_devices"])
    cfg = config_class(**args)  # checks every value (check_domains and __post_init__)
    if not cfg.benchmark:
        return cfg
    given = _OneLineParser()  # the flags given: those parsed without defaults
    add_flags(given, config_class, defaults=False)
    return benchmark_config(cfg, "synthetic_size" not in vars(given.parse_args(argv)))


def benchmark_config(cfg: Config, sized: bool = False) -> Config:
    """--benchmark: synthetic data, or an image folder's own images (read, decoded and augmented
    as a training run reads them, so that the data wait is the user's), exactly --warmup_steps +
    --benchmark_steps + --profile_steps optimizer steps (the profiled ones last, untimed), no files
    but the run folder's results.json and TensorBoard events. Enough epochs are allowed to reach
    the step count. `sized` (no --synthetic_size given): a synthetic set holds only the images
    those steps draw, one epoch of them (at most --synthetic_size's default), which is the run
    with that --synthetic_size: making 50,000 images for 80 steps of 256 took longer than the
    steps."""
    steps = cfg.warmup_steps + cfg.benchmark_steps + cfg.profile_steps
    if steps > INT_MAX:
        profiled = f" and --profile_steps {cfg.profile_steps}" if cfg.profile_steps else ""
        raise UsageError(f"--warmup_steps {cfg.warmup_steps} plus --benchmark_steps "
                         f"{cfg.benchmark_steps}{profiled} is more steps than torch counts "
                         f"({INT_MAX}): give fewer")
    folder = cfg.dataset == "imagefolder"
    images = image_folder(cfg.data_dir).images["train"] if folder else cfg.synthetic_size
    if sized and not folder:  # at least the flag's least (5: a test set of one image)
        images = min(images, max(steps * cfg.batch_size, 5))
    steps_per_epoch = max(images // cfg.batch_size, 1)
    synthetic_size = cfg.synthetic_size if folder else images
    return dataclasses.replace(cfg, dataset="imagefolder" if folder else "synthetic",
                               synthetic_size=synthetic_size, max_steps=steps,
                               epochs=-(-steps // steps_per_epoch), save_model=False)


def says_group_errors() -> bool:
    """Whether this process prints a mistake that every process of its launch meets. A worker
    started by torch's launcher (torchrun, or a train.py starting its own workers) prints it
    if it is its node's first process (LOCAL_RANK 0): once per node, where each node may meet
    a mistake of its own (a file missing there). Every other process prints it: it was
    started by hand, in a shell of its own, whatever RANK or LOCAL_RANK its environment
    happens to hold (inside a job, say)."""
    # torch's agent sets it in every worker
    started_by_launcher = "TORCHELASTIC_RUN_ID" in os.environ
    return not started_by_launcher or os.environ.get("LOCAL_RANK", "0") == "0"


# What a file system refuses for reasons a user can fix, each with what is wrong where the
# system's own words do not say it, and what to give instead: it is full, read-only, not
# theirs, failing, or the path is wrong.
FILE_SYSTEM_ERRORS = {
    errno.ENOSPC: ("", "free some space there, or give a folder on another disk"),
    errno.EDQUOT: ("", "free some of your quota there, or give a folder on another disk"),
    errno.EFBIG: ("the file system there takes no file this large",
                  "give a folder on another file system"),
    errno.EROFS: ("", "give a folder on a file system that can be written"),
    errno.EACCES: ("this user may not read or write there",
                   "give a path this user can use, or change its permissions"),
    errno.EPERM: ("this user may not read or write there",
                  "give a path this user can use, or change its permissions"),
    errno.EIO: ("the disk or the network file system failed",
                "check it, or give a folder on another disk"),
    errno.ELOOP: ("a symbolic link on the path leads round in a loop",
                  "mend the link, or give a path without it"),
    errno.ENOTDIR: ("a part of the path that must be a folder is a file",
                    "give a path whose every part but the last is a folder"),
    errno.EISDIR: ("a folder stands where a file is to be read or written",
                   "move that folder away, or give the path of a file"),
    errno.ENAMETOOLONG: ("", f"give a shorter path (at most {NAME_MAX} bytes a name, "
                             f"{PATH_MAX} in all)"),
}


def file_system_problem(error: OSError) -> str | None:
    """What is wrong and what to give, for a file-system failure a user can fix (without the path),
    or None for other OS errors, which are bugs or the network's and keep their traceback."""
    if error.errno not in FILE_SYSTEM_ERRORS:
        return None
    why, advice = FILE_SYSTEM_ERRORS[error.errno]
    said = error.strerror or os.strerror(error.errno)
    return f"{said} ({why}): {advice}" if why else f"{said}: {advice}"


def file_system_error(error: OSError) -> str | None:
    """The one line for a file-system failure, naming the path where the
    error does (file_system_problem)."""
    problem = file_system_problem(error)
    if problem is None:
        return None
    return f"{error.filename}: {problem}" if error.filename else problem


@contextlib.contextmanager
def user_errors():
    """Turn the user's mistakes, a file system that refuses a write, and Ctrl-C into one line
    and a non-zero exit instead of a traceback. A usage error every process meets is said once
    per node (says_group_errors); one that only this process meets (`rank_specific`) is said by
    it; every process still exits 2."""
    try:
        yield
    except UsageError as error:
        if error.rank_specific or says_group_errors():
            print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as error:
        line = file_system_error(error)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
