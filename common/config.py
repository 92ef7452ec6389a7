"""One frozen dataclass of hyper-parameters; its fields generate the command-line flags of every
train.py (common/command_line.py). A field's default is the flag's default, its metadata the help
text and the domain (`flag`). A mode with flags of its own subclasses `Config` inline.

Every value is checked where it is parsed, before anything starts: each field against its own domain
(common/domains.py, check_domains), then the rules between fields (Config.__post_init__). A value
outside is refused in one line that names the flag, the value and what to give instead.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from common.command_line import _OneLineParser, add_flags, build_parser
from common.compiling import compile_cache_refusal
from common.domains import (INT_MAX, check_domains, gib, physical_memory,
                            worker_processes_refusal)
# every module may import the two errors from here too (RunError is handed on)
from common.errors import RunError, UsageError  # noqa: F401
from common.folders import image_folder, image_folder_refusal
from common.launch_env import processes_on_this_node
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
AUGMENTS = ("auto", "pad", "resized", "off")  # --augment (common/augmentation.py)
# The weights are float32 in every mode (autocast computes in bf16/fp16 but keeps them so): SGD
# hands the learning rate and the weight decay to its kernels as scalars of the weights' dtype, and
# a larger one cannot be converted.
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
# torch.finfo(torch.float32).tiny: below it a rate loses its precision
FLOAT32_TINY = 1.1754943508222875e-38


def flag(default, help: str, *, at_least=None, above=None, at_most=None, below=None, check=None,
         **argparse_kwargs):
    """A field of a config dataclass: its default, its --help text, its domain and argparse's extras
    (nargs, choices). The domain is what check_domains enforces. A bool's is its type, a choice's
    its `choices`; a number's is its bounds (at_least, above, at_most, below; always finite, and an
    int at most INT_MAX); a string's is `check`: a name from CHECKS (common/domains.py) or a
    function of the value that returns None, or what to give instead. An optional field (`X |
    None`) also takes None, and a tuple's bounds or check hold for each item."""
    given = dict(at_least=at_least, above=above, at_most=at_most, below=below, check=check)
    domain = {name: value for name, value in given.items() if value is not None}
    return field(default=default, metadata={"help": help, "domain": domain, **argparse_kwargs})


@dataclass(frozen=True)
class Config:
    # optimisation
    batch_size: int = flag(128, "GLOBAL batch: images per optimizer step summed over every GPU "
                                "(unless given, an image folder's is halved until an epoch has "
                                "4 steps)", at_least=1)
    epochs: int = flag(300, "passes over the training set (the paper's 300)", at_least=0)
    max_steps: int = flag(0, "stop after this many optimizer steps in total; 0 = no limit",
                          at_least=0)
    lr: float = flag(0.1, "learning rate per 128 images of global batch, scaled "
                          "linearly with --batch_size", above=0)
    # x steps: a float
    lr_warmup_epochs: float = flag(5.0, "epochs of the linear warm-up of the rate at the start, "
                                        "at every batch size (at most a tenth of the run; for "
                                        "imagefolder at least 50 steps and at most a third of "
                                        "the run; 0: none)", at_least=0, at_most=1e9)
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
                               at_least=5, check="synthetic_images")
    loader: str | None = flag(None, "gpu: dataset held on the device, augmented there (default "
                                    "with CUDA; for imagefolder where its decoded images take at "
                                    "most half the GPU's free memory); torchvision: DataLoader "
                                    "workers with PIL transforms (default without)",
                              choices=LOADERS)
    num_workers: int | None = flag(None, "DataLoader worker processes per training process "
                                         "(torchvision loader); default: what fits this "
                                         "machine: the usable cores shared among the "
                                         "node's training processes, one of each share "
                                         "left to the process, at most 4; refused past 4 a "
                                         "usable core, or what the memory holds",
                                   at_least=0)  # and what the machine holds: workers_refusal
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
            (not (self.augment == "off" and self.flip),
             "--flip mirrors training images and --augment off trains on the evaluation images as "
             "they are: give one of them"),
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
        refusal = workers_refusal(self, processes_on_this_node())  # before any worker forks
        if refusal:
            raise UsageError(refusal)
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
                             f"least {gib(weights)}, more than this machine's {gib(memory)} of "
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


def workers_refusal(cfg: Config, processes: int) -> str | None:
    """--num_workers past what this machine can hold with `processes` training processes on this
    node (common/domains.py, worker_processes_refusal), or None (its default fits by itself). Each
    worker prepares batches of the process's share of --batch_size: float32 images of 3 channels at
    the run's side, at most: --image_size, else 32 for CIFAR-10, MNIST (28) and PyramidNet's
    synthetic images, else 224 (an image folder's, a torchvision model's: common/data.py)."""
    if cfg.num_workers is None:
        return None
    small = cfg.dataset in ("cifar10", "mnist") or (cfg.dataset == "synthetic"
                                                     and cfg.model == PYRAMIDNET)
    side, batch = cfg.image_size or (32 if small else 224), -(-cfg.batch_size // processes)
    return worker_processes_refusal(cfg.num_workers, processes, batch * 3 * side * side * 4)


# the flags of every mode with a process group: dist_parallel's and fsdp's
@dataclass(frozen=True)
class GroupConfig(Config):
    backend: str | None = flag(None, "nccl (default with CUDA) or gloo", choices=("nccl", "gloo"))
    init_method: str = flag("env://", "rendezvous: env:// (MASTER_ADDR/PORT), tcp://HOST:PORT or "
                                      "file:///PATH", check="rendezvous")
    verify_sync: bool = flag(False, "check every epoch, not only at the end, that all "
                                    "ranks hold the same weights")
    nproc_per_node: int | None = flag(None, "without torchrun: workers to start "
                                            "(default: one per GPU); under torchrun, give "
                                            "torchrun's own", at_least=1)
    dist_timeout: float = flag(600.0, "seconds a collective (or joining the group) may wait "
                                      "for the other ranks before the run ends with an "
                                      "error instead of hanging", above=0, at_most=1e9)
    max_restarts: int = flag(0, "started without torchrun: restart the workers up to N "
                                "times after a failure (with --resume auto they continue "
                                "from the last checkpoint); under torchrun, give torchrun's "
                                "own", at_least=0)


def as_today(config: dict) -> dict:
    """A config a run wrote (a checkpoint's, a results.json's) in today's flags: a flag added since
    at the value that ran then (LATER_FLAGS; --flip: on but for mnist, off without augmentation),
    and --augment's on and off of before as the crop it meant (an image folder's random resized
    crop, the others' pad crop)."""
    config = {**LATER_FLAGS, **config}
    config.setdefault("flip", config.get("dataset") != "mnist")
    if config.get("augment") in ("off", False):
        config["flip"] = False  # what ran: without augmentation nothing was mirrored
    if isinstance(config.get("augment"), bool):
        crop = "resized" if config.get("dataset") == "imagefolder" else "pad"
        config["augment"] = crop if config["augment"] else "off"
    return config


def parse_config(config_class: type[Config], argv=None, description: str = "") -> Config:
    """Command-line flags -> a validated, frozen config; an image folder's batch fitted to it
    (folder_batch) unless --batch_size is given."""
    parser = build_parser(config_class, description)
    args = vars(parser.parse_args(argv))
    if args["gpu_devices"] is not None:
        args["gpu_devices"] = tuple(args["gpu_devices"])
    with parser.spelled_as_typed():  # a refusal names the flags as the user typed them
        cfg = config_class(**args)  # checks every value (check_domains and __post_init__)
        if not (cfg.benchmark or cfg.dataset == "imagefolder"):
            return cfg
        given = _OneLineParser()  # the flags given: those parsed without defaults
        add_flags(given, config_class, defaults=False)
        given = vars(given.parse_args(argv))
        if cfg.dataset == "imagefolder":
            cfg = fit_batch(cfg, given=given.get("batch_size"))
        return benchmark_config(cfg, "synthetic_size" not in given) if cfg.benchmark else cfg


# An image folder of fewer training images than this many default batches trains, unless
# --batch_size is given, on the default batch halved until an epoch has this many steps
FOLDER_STEPS = 4
# (data_dir, batch) -> (the default batch, the training images) it was fitted from and to: the
# run's first line says so
_fitted: dict[tuple[str, int], tuple[int, int]] = {}


def folder_batch(batch_size: int, train_images: int) -> int:
    """The global batch an image folder of `train_images` training images trains on when
    --batch_size is not given: the default, halved until an epoch has FOLDER_STEPS steps or
    more (120 images: 16, 7 steps an epoch). A batch larger than the folder would be refused; one
    step an epoch, or two, leaves most steps of a short run to the warm-up and drops up to half the
    images from every epoch (the last partial batch)."""
    while batch_size > 1 and train_images < FOLDER_STEPS * batch_size:
        batch_size //= 2
    return batch_size


def fit_batch(cfg: Config, given: int | None) -> Config:
    """`cfg` with its batch fitted to its image folder (folder_batch), unless --batch_size was
    `given`; an explicit batch larger than the folder is refused where the data is read
    (common/rules.py, per_process_batch)."""
    images = image_folder(cfg.data_dir).images["train"]
    if given is not None:
        _fitted.pop((cfg.data_dir, given), None)
        return cfg
    batch = folder_batch(cfg.batch_size, images)
    if batch == cfg.batch_size:
        return cfg
    _fitted[cfg.data_dir, batch] = (cfg.batch_size, images)
    return dataclasses.replace(cfg, batch_size=batch)


def batch_note(cfg) -> str:
    """Why the run's batch is what it is, when it was fitted to its image folder (fit_batch), for
    its first line: `; the default batch 128 halved to 16 for the 120 training images (7 steps an
    epoch; --batch_size sets it)`; else nothing."""
    fitted = _fitted.get((cfg.data_dir, cfg.batch_size)) if cfg.dataset == "imagefolder" else None
    if fitted is None:
        return ""
    default, images = fitted
    return (f"; the default batch {default} halved to {cfg.batch_size} for the {images} training "
            f"images ({images // cfg.batch_size} steps an epoch; --batch_size sets it)")


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
