r"""The fast path: a mode's own train.py, with the parts that make it faster swapped in, a flag
each. It trains the same model: its parameters, its state_dict and its checkpoints are the plain
train.py's, which loads them (and they its own).

    python benchmarks/fast.py single_gpu --benchmark --batch_size 256    # fast_path.sh's fast row
    python benchmarks/fast.py single_gpu --benchmark --batch_size 256 --align_channels 0
    python benchmarks/fast.py dist_parallel --nproc_per_node 1 --benchmark --batch_size 256
    python benchmarks/fast.py single_gpu --dataset synthetic --synthetic_size 512 --depth 8 \
        --alpha 12 --batch_size 32 --epochs 1 --loader gpu   # offline: 16 steps on a CPU

The mode comes first; every flag but those below is the train.py's (`python <mode>/train.py
--help`). <mode>/train.py is imported by its path, its functions replaced, and its main() run:

- --loader gpu (default with CUDA; torchvision: the train.py's own DataLoader): get_loaders'
  DataLoaders handed to benchmarks/gpu_loader.py, which holds the dataset on the device and gives
  the same batches in the same order, bit for bit on the CPU (each crop drawn from the seed, the
  epoch and the image's index, as runkit.Augmented draws it): no workers, no host round trip.
  The synthetic set, CIFAR-10 and MNIST, at their own size, --augment pad or off (by default, the
  train.py's DataLoader for the rest, said in a line; given, the rest refused).
- --align_channels N (default 8 with CUDA; 0, off, without, under fsdp and with --sync_bn):
  PyramidNet's activations stored at channel counts rounded up to a multiple of N, the extra
  channels zero, the model the paper's (benchmarks/aligned.py).
- The shortcut added in place, always (benchmarks/aligned.py): no padded copy of it.
- --compile_cache DIR (with --compile): inductor's caches (TORCHINDUCTOR_CACHE_DIR) kept in DIR,
  where a later run compiles warm from them; the first line says which.
- --cudnn_benchmark_limit N: the algorithms cuDNN's autotuning tries per convolution (torch's
  default 10; 0: every one).
- --width_multiple N: a different, wider model, each block's width rounded up to a multiple of N.

dist_parallel and fsdp start their workers as their train.py does, each running this file.
results.json's config records these flags beside the train.py's.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path += [str(path) for path in (REPO, REPO / "models") if str(path) not in sys.path]

import torch  # noqa: E402

import runkit  # noqa: E402

MODES = ("single_gpu", "data_parallel", "dist_parallel", "fsdp")
GROUPS = ("dist_parallel", "fsdp")  # a process a GPU, started as their train.py starts them


def get_parser() -> runkit.ArgumentParser:
    parser = runkit.ArgumentParser(description=__doc__, prog="fast.py", usage="fast.py "
                                   "{single_gpu,data_parallel,dist_parallel,fsdp} [these flags] "
                                   "[the mode's train.py flags]")
    add, count = parser.add_argument, runkit.count
    parser.add_argument("mode", choices=MODES, help="the train.py to run: <mode>/train.py")
    add("--loader", choices=("gpu", "torchvision"), help="default: gpu with CUDA")
    add("--align_channels", "--align-channels", type=count(0, 4096),
        help="store channels in multiples of N (default: 8 with CUDA; 0: off)")
    add("--compile_cache", "--compile-cache", metavar="DIR", help="with --compile: inductor's "
        "caches kept here (TORCHINDUCTOR_CACHE_DIR)")
    add("--cudnn_benchmark_limit", "--cudnn-benchmark-limit", type=count(0),
        help="cuDNN's algorithms tried per convolution (torch's default: 10; 0: every one)")
    add("--width_multiple", "--width-multiple", type=count(1, 4096), default=1,
        help="each block's width rounded up to a multiple of N: a wider model")
    return parser


def parse(argv: list[str]) -> tuple[types.SimpleNamespace, list[str]]:
    """(the fast path's flags, the train.py's): the mode first."""
    parser = get_parser()
    if argv and argv[0] not in MODES and not argv[0].startswith("-"):
        parser.error(f"{argv[0]!r} is no mode: give one of {', '.join(MODES)} first")
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        parser.error(f"give the mode first ({', '.join(MODES)}), then the flags")
    options, train_argv = parser.parse_known_args(argv)
    return options, train_argv


def train_file(mode: str) -> types.ModuleType:
    """<mode>/train.py, imported by its path (nothing runs: its main() is called later)."""
    spec = importlib.util.spec_from_file_location(f"{mode}_train", REPO / mode / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve(options, args, cuda: bool) -> None:
    """The fast path's defaults for this run, and what it refuses, in one line."""
    pyramidnet = args.model == "pyramidnet"
    fits = pyramidnet and options.mode != "fsdp" and not getattr(args, "sync_bn", False)
    runkit.refuse_if([
        (options.align_channels and options.align_channels > 1 and options.mode == "fsdp",
         f"--align_channels {options.align_channels}: fsdp shards the paper's shapes; give "
         "--align_channels 0"),
        (options.align_channels and options.align_channels > 1 and getattr(args, "sync_bn", 0),
         f"--align_channels {options.align_channels}: SyncBatchNorm takes the paper's widths; "
         "give --align_channels 0"),
        ((options.align_channels or 0) > 1 and not pyramidnet, f"--align_channels stores "
         f"PyramidNet's channels: leave it out with --model {args.model}"),
        (options.width_multiple > 1 and not pyramidnet, f"--width_multiple widens PyramidNet: "
         f"leave it out with --model {args.model}"),
        (options.compile_cache and not args.compile, "--compile_cache keeps what --compile "
         "compiles: give --compile too")])
    options.chosen = options.loader is not None  # given: refused where the data does not suit it
    options.loader = options.loader or ("gpu" if cuda else "torchvision")
    if options.align_channels is None:
        options.align_channels = 8 if cuda and fits else 0


def compile_cache(folder: str) -> Path:
    """--compile_cache as an absolute folder inductor can use, or a refusal in one line (before
    anything is written)."""
    path = Path(folder).expanduser().absolute()
    parent = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())
    runkit.refuse_if([
        (any(c.isspace() for c in str(path)), f"--compile_cache {path}: inductor's C++ builder "
         "splits its command at spaces; give a folder without one"),
        (path.is_symlink() and not path.exists(), f"--compile_cache {path} is a link to "
         f"{os.readlink(path) if path.is_symlink() else ''}, which is not there; mend or remove "
         "it"),
        (parent.is_symlink() and not parent.exists(), f"--compile_cache: {parent} is a link "
         "that leads nowhere; mend or remove it"),
        (parent.exists() and not parent.is_dir(), f"--compile_cache: {parent} is a file, not a "
         "folder; give a --compile_cache folder"),
        (parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK), f"--compile_cache: "
         f"{parent} cannot be written by this user; give a folder that can")])
    return path


def graph_entries(folder: Path) -> int:
    """The compiled graphs a compile reads in an inductor cache: FX graphs and AOTAutograd's
    entries (a folder of kernels, locks or a temporary file alone is cold)."""
    entries = [*folder.glob("fxgraph/*/*/*"), *folder.glob("aotautograd/*/*")]
    return sum(path.is_file() and not path.name.startswith(".") for path in entries)


def described(options) -> str:
    """The fast path, for the run's first line."""
    parts = [f"the {options.loader} loader",
             f"channels stored in multiples of {options.align_channels}"
             if options.align_channels > 1 else "channels as the paper's",
             "the shortcut added in place"]
    if options.width_multiple > 1:
        parts.append(f"widths in multiples of {options.width_multiple} (a wider model)")
    if options.cudnn_benchmark_limit is not None:
        parts.append(f"cuDNN tries {options.cudnn_benchmark_limit or 'every'} algorithm(s)")
    if options.compile_cache:
        graphs = graph_entries(Path(options.compile_cache))
        parts.append(f"compile cache {options.compile_cache} (" + (
            f"warm, {graphs} compiled graph{'s' * (graphs != 1)})" if graphs else "cold)"))
    return "fast path: " + ", ".join(parts)


class FastPyramidNet(type):
    """What the train file calls as PyramidNet: calling it builds the fast model (`build`), and
    that model is an instance of it (the train file's first line asks whether its model is a
    PyramidNet, to name its depth and alpha)."""

    def __call__(cls, *args, **kwargs):
        return cls.build(*args, **kwargs)

    def __instancecheck__(cls, instance) -> bool:
        from pyramidnet import PyramidNet

        return isinstance(instance, PyramidNet)


def use_fast_path(module: types.ModuleType, options) -> None:
    """The train file's functions replaced by the fast path's (each calls the file's own)."""
    from benchmarks.aligned import (fast_pyramidnet, mask_padded_gradients, paper_optimizer_state,
                                    paper_shapes)
    from benchmarks.gpu_loader import DeviceLoader

    get_args, get_loaders, epoch_batches = module.get_args, module.get_loaders, \
        module.epoch_batches
    get_model, get_optimizer, run_log = module.get_model, module.get_optimizer, runkit.RunLog
    recorded = {name: getattr(options, name) for name in (
        "loader", "align_channels", "compile_cache", "cudnn_benchmark_limit", "width_multiple")}
    paper = {}  # facts of the paper's model, where the model that runs stores more

    def get_args_recorded(argv=None):  # results.json's config and the checkpoint's hold them
        args = get_args(argv)
        vars(args).update(recorded)
        return args

    def get_loaders_on_device(args, train_set, test_set, device):
        train_loader, test_loader = get_loaders(args, train_set, test_set, device)
        if options.loader != "gpu":
            return train_loader, test_loader
        side, _, mean, std = module.IMAGES[args.dataset]
        unsuited = [
            (args.dataset == "imagefolder", "--loader gpu holds the synthetic set, CIFAR-10 and "
             "MNIST: give --loader torchvision for an image folder"),
            (args.image_size != side, f"--loader gpu gives {args.dataset}'s images at their own "
             f"{side} px: give --loader torchvision for --image_size {args.image_size}"),
            (args.augment == "resized", "--loader gpu crops as --augment pad does: give "
             "--loader torchvision for --augment resized")]
        why = next((why for unfit, why in unsuited if unfit), None)
        if why and not options.chosen:  # its default: the train file's own DataLoader then
            args.loader = "torchvision"
            if os.environ.get("RANK", "0") == "0":
                print(f"fast path: the torchvision loader ({why.split(':')[0]})", flush=True)
            return train_loader, test_loader
        runkit.refuse_if([(why, why)])
        pad = side // 8 if args.augment == "pad" else None  # get_loaders' RandomCrop padding
        return (DeviceLoader(train_loader, device, pad=pad, flip=args.flip, mean=mean, std=std),
                DeviceLoader(test_loader, device, pad=None, flip=False, mean=mean, std=std))

    def epoch_batches_on_device(loader, epoch: int, progress: dict):
        if not isinstance(loader, DeviceLoader):
            return epoch_batches(loader, epoch, progress)
        epoch_batches(loader, epoch, {**progress, "batch": 0})  # the file's order and epoch
        return loader.from_batch(progress["batch"])

    def get_model_counted(args, classes: int, device: torch.device):
        model, raw_model, flops = get_model(args, classes, device)
        if paper_shapes(raw_model):  # MFU's FLOPs and the parameters: the paper's model's
            channels, size = module.IMAGES[args.dataset][1], args.image_size
            with torch.device("meta"):
                unaligned = fast_pyramidnet(args.depth, args.alpha, args.block, classes, channels,
                                            width_multiple=options.width_multiple)
            flops = runkit.flops_per_image(unaligned, torch.zeros(2, channels, size, size,
                                                                  device="meta"))
            paper["parameters"] = sum(param.numel() for param in unaligned.parameters())
        return model, raw_model, flops

    def get_optimizer_masked(args, raw_model, device, steps_per_epoch: int):
        optimizer, scheduler, scaler = get_optimizer(args, raw_model, device, steps_per_epoch)
        if paper_shapes(raw_model):
            mask_padded_gradients(raw_model, optimizer)
            paper_optimizer_state(raw_model, optimizer)
        return optimizer, scheduler, scaler

    class PaperRunLog(run_log):
        def results(self, summary: dict, **extra):
            if "parameters" in summary and paper:
                summary = {**summary, "parameters": paper["parameters"]}
            return super().results(summary, **extra)

    view = types.SimpleNamespace(**{name: getattr(runkit, name) for name in dir(runkit)
                                    if not name.startswith("__")})
    view.RunLog = PaperRunLog  # the train file's runkit, its results.json the paper's count
    module.runkit, module.get_args, module.get_loaders = view, get_args_recorded, \
        get_loaders_on_device
    module.epoch_batches, module.get_model, module.get_optimizer = epoch_batches_on_device, \
        get_model_counted, get_optimizer_masked
    module.PyramidNet = FastPyramidNet("PyramidNet", (), {"build": functools.partial(
        fast_pyramidnet, align=options.align_channels, width_multiple=options.width_multiple)})
    if options.width_multiple > 1:  # a checkpoint of another model's widths: refused in one line
        module.MUST_MATCH = (*module.MUST_MATCH, "width_multiple")
    if options.cudnn_benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = options.cudnn_benchmark_limit


def launch_workers(module: types.ModuleType, argv: list[str], args) -> int:
    """The train file's own self-launch (a worker a GPU, as torchrun), each worker running this
    file with these flags."""
    module.__file__ = str(Path(__file__).resolve())  # what its launch_workers starts
    saved, sys.argv = sys.argv, [module.__file__, *argv]
    try:
        return module.launch_workers(args)
    finally:
        sys.argv = saved


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    options, train_argv = parse(argv)
    if options.compile_cache:  # before torchvision's import asks inductor for its folder
        options.compile_cache = str(compile_cache(options.compile_cache))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = options.compile_cache
    module = train_file(options.mode)
    args = module.get_args(train_argv)  # its own refusals, in one line
    resolve(options, args, torch.cuda.is_available())
    if options.mode in GROUPS and "RANK" not in os.environ:
        return launch_workers(module, argv, args)
    use_fast_path(module, options)
    if os.environ.get("RANK", "0") == "0":
        print(described(options), flush=True)
    try:
        return module.main(train_argv)
    finally:  # always, even after an error: no rank is left holding the group
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    with runkit.one_line_errors():
        sys.exit(main())
