"""One frozen dataclass of hyper-parameters; its fields generate the command-line flags of every train.py.

A field's default is the flag's default and its metadata the help text. A bool that defaults to False becomes
`--name`; one that defaults to True becomes `--no_name`; an optional bool (None: the run decides) gets both.
A mode with flags of its own subclasses `Config` inline.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

from models.pyramidnet import BLOCKS as MODEL_BLOCKS, check_arguments

REPO_ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("cifar10", "mnist", "synthetic")  # their shapes and statistics: common/data.py
LOADERS = ("gpu", "torchvision")
AMPS = ("bf16", "fp16", "off")
BASE_BATCH = 128  # --lr is given per this many images of global batch


class UsageError(Exception):
    """A mistake the user can fix: reported as one line, exit status 2, no traceback."""


class RunError(Exception):
    """A run that cannot go on (a loss that turned NaN, a process group that broke): one line, exit status 1."""


def flag(default, help: str, **argparse_kwargs):
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass(frozen=True)
class Config:
    # optimisation
    batch_size: int = flag(128, "GLOBAL batch: images per optimizer step summed over every GPU")
    epochs: int = flag(300, "passes over the training set (the paper's 300)")
    max_steps: int = flag(0, "stop after this many optimizer steps in total; 0 = no limit")
    lr: float = flag(0.1, "learning rate per 128 images of global batch, scaled linearly with --batch_size")
    lr_warmup_epochs: float = flag(5.0, "linear warm-up length when the global batch is above 128 "
                                        "(at most a tenth of the run)")
    momentum: float = flag(0.9, "SGD momentum")
    weight_decay: float = flag(1e-4, "L2 weight decay")
    nesterov: bool = flag(True, "Nesterov momentum (the paper's)")
    # model
    depth: int = flag(110, "PyramidNet depth: 6n+2 (basic) or 9n+2 (bottleneck)")
    alpha: float = flag(270.0, "PyramidNet widening factor: channels added over the whole network")
    block: str = flag("basic", "residual block", choices=tuple(MODEL_BLOCKS))
    width_multiple: int = flag(1, "round every block's width up to a multiple of this (8 suits tensor cores); "
                                  "1 = the paper's widths")
    # data
    dataset: str = flag("cifar10", "cifar10 or mnist (downloaded into --data_dir), or synthetic (CIFAR-10-shaped, "
                                   "generated, offline)", choices=DATASETS)
    data_dir: str = flag(str(REPO_ROOT / "data"), "where datasets are downloaded and read")
    synthetic_size: int = flag(50_000, "training images of --dataset synthetic; the test set is a fifth of it")
    loader: str | None = flag(None, "gpu: dataset held on the device, augmented there (default with CUDA); "
                                    "torchvision: DataLoader workers with PIL transforms (default without)",
                              choices=LOADERS)
    num_workers: int = flag(4, "DataLoader worker processes per training process (torchvision loader)")
    shuffle: bool = flag(True, "reshuffle the training set every epoch")
    augment: bool = flag(True, "pad-4 random crop and horizontal flip of training images (no flip for mnist)")
    # speed
    amp: str | None = flag(None, "autocast precision: bf16 (default on GPUs that have it), fp16 (with loss "
                                 "scaling; the default on older GPUs) or off (fp32; the default on the CPU)",
                           choices=AMPS)
    channels_last: bool | None = flag(None, "NHWC memory format for the model and the batches, which tensor cores "
                                            "prefer (default: on with CUDA, off on the CPU)")
    compile: bool = flag(False, "torch.compile the model; the compile time is reported apart and not timed")
    benchmark: bool = flag(False, "measure speed only: synthetic data, --warmup_steps untimed, then "
                                  "--benchmark_steps timed steps, no evaluation")
    benchmark_steps: int = flag(100, "timed optimizer steps of --benchmark")
    # hardware and reproducibility
    gpu_devices: tuple[int, ...] | None = flag(None, "CUDA device ids to use", nargs="+")
    seed: int = flag(0, "seed of the weights, the epoch order and the augmentation")
    # logging and outputs
    log_dir: str = flag(str(REPO_ROOT / "runs"), "TensorBoard runs go to <log_dir>/<run_name>/")
    run_name: str | None = flag(None, "default: <mode>-<n>gpu-<timestamp>")
    overwrite: bool = flag(False, "replace an existing run folder of the same name")
    log_interval: int = flag(50, "optimizer steps per log window (a log line, TensorBoard points)")
    warmup_steps: int = flag(10, "first optimizer steps left out of the timing (cuDNN autotune, allocator)")
    save_model: bool = flag(False, "write the trained weights to <run folder>/model.pt")
    checkpoint_interval: int = flag(0, "write <run folder>/checkpoint.pt every N optimizer steps as well; 0 = at "
                                       "the end of every epoch only (and when stopped)")
    resume: str | None = flag(None, "continue from a checkpoint.pt (PATH), or from this --run_name's latest one "
                                    "(auto; a fresh start when it has none yet)")
    evaluate: str | None = flag(None, "load weights from PATH, evaluate on the test set, write results, exit")
    progress: bool = flag(True, "a tqdm bar per epoch when stdout is a terminal")

    def __post_init__(self):
        checks = [
            (self.batch_size > 0, f"--batch_size must be a positive number of images, not {self.batch_size}"),
            (self.epochs >= 0, f"--epochs must be 0 or more, not {self.epochs}"),
            (self.max_steps >= 0, f"--max_steps must be 0 (no limit) or more, not {self.max_steps}"),
            (0 < self.lr < math.inf, f"--lr must be a positive number, not {self.lr}"),
            (0 <= self.lr_warmup_epochs < math.inf, "--lr_warmup_epochs must be a number, 0 or more"),
            (math.isfinite(self.momentum) and math.isfinite(self.weight_decay),
             "--momentum and --weight_decay must be finite numbers"),
            (self.synthetic_size >= 5, f"--synthetic_size must be at least 5 images, not {self.synthetic_size}"),
            (self.num_workers >= 0, "--num_workers must be 0 or more"),
            (self.log_interval > 0, "--log_interval must be at least 1"),
            (self.warmup_steps >= 0, "--warmup_steps must be 0 or more"),
            (self.benchmark_steps > 0, "--benchmark_steps must be at least 1"),
            (self.width_multiple >= 1, "--width_multiple must be 1 (the paper's widths) or more"),
            (self.checkpoint_interval >= 0, "--checkpoint_interval must be 0 (once per epoch) or more steps"),
            (not (self.resume and self.overwrite), "--resume continues a run folder and --overwrite deletes it: "
                                                   "give one of them"),
            (not (self.resume and (self.evaluate or self.benchmark)),
             "--resume continues training: leave out --evaluate and --benchmark"),
            (self.resume != "auto" or self.run_name, "--resume auto finds the run by its name: add --run_name "
                                                     "NAME (the same name on every restart)"),
            (not (self.benchmark and self.evaluate), "--benchmark trains and --evaluate does not: give one of them"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        try:
            check_arguments(self.depth, self.alpha, self.block, 10, 3)
        except ValueError as error:
            raise UsageError(f"--depth/--alpha: {error}") from None

    def effective_lr(self) -> float:
        return self.lr * self.batch_size / BASE_BATCH


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; here a mistake is one line that says what to do."""

    def error(self, message):
        raise UsageError(f"{message} (see --help)")


def build_parser(config_class: type[Config], description: str) -> argparse.ArgumentParser:
    parser = _OneLineParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(parser, config_class)
    return parser


def add_flags(parser: argparse.ArgumentParser, config_class: type[Config], skip=(), defaults: bool = True) -> None:
    """One flag per field of `config_class` (except `skip`). With defaults=False a flag that is not given is left
    out of the parsed namespace, so a caller can tell what the user chose (compare.py passes only those on)."""
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        if f.name in skip:
            continue
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        kind = hints[f.name]
        default = f.default if defaults else argparse.SUPPRESS
        if kind is bool:
            name = f"--no_{f.name}" if f.default else f"--{f.name}"
            parser.add_argument(name, dest=f.name, action="store_false" if f.default else "store_true",
                                default=default, help=f"turn off: {help_text}" if f.default else help_text)
            continue
        if kind == bool | None:  # on, off, or None: the run decides (from the device)
            parser.add_argument(f"--{f.name}", dest=f.name, action="store_const", const=True, default=default,
                                help=help_text)
            parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_const", const=False,
                                default=default, help=f"turn --{f.name} off")
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)  # X | None -> X
        if typing.get_origin(base) is tuple:
            base = typing.get_args(base)[0]
        parser.add_argument(f"--{f.name}", type=base, default=default, help=help_text, **meta)


def config_argv(config_class: type[Config], values: dict) -> list[str]:
    """The flags that set `values` (field name -> value) on the command line: the inverse of the parser."""
    hints, argv = typing.get_type_hints(config_class), []
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    for name, value in values.items():
        if hints[name] is bool or hints[name] == bool | None:
            if value is not None and (hints[name] != bool or value != defaults[name]):
                argv.append(f"--{name}" if value else f"--no_{name}")
        elif value is not None:
            argv += [f"--{name}", *map(str, value if isinstance(value, (tuple, list)) else [value])]
    return argv


def parse_config(config_class: type[Config], argv=None, description: str = "") -> Config:
    """Command-line flags -> a validated, frozen config."""
    args = vars(build_parser(config_class, description).parse_args(argv))
    if args["gpu_devices"] is not None:
        args["gpu_devices"] = tuple(args["gpu_devices"])
    name = args["run_name"]
    if name is not None and (not name or "/" in name or name in (".", "..")):
        raise UsageError(f"--run_name must be a plain folder name, not {name!r}")
    cfg = config_class(**args)
    return benchmark_config(cfg) if cfg.benchmark else cfg


def benchmark_config(cfg: Config) -> Config:
    """--benchmark: synthetic data, exactly --warmup_steps + --benchmark_steps optimizer steps, no files but the
    run folder's results.json and TensorBoard events. Enough epochs are allowed to reach the step count."""
    steps = cfg.warmup_steps + cfg.benchmark_steps
    steps_per_epoch = max(cfg.synthetic_size // cfg.batch_size, 1)
    return dataclasses.replace(cfg, dataset="synthetic", max_steps=steps, epochs=-(-steps // steps_per_epoch),
                               save_model=False)


@contextlib.contextmanager
def user_errors():
    """Turn the user's mistakes and Ctrl-C into one line and a non-zero exit instead of a traceback."""
    try:
        yield
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
