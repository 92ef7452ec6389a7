r"""Train PyramidNet on CIFAR-10 fully sharded (FSDP2): a process a GPU, each holding 1/N of it.

    torchrun --standalone --nproc_per_node 4 train.py -b 512   # 4 GPUs, 128 images each a step
    python train.py --gpu_devices 0 1    # a worker a GPU, started as torchrun --standalone would
    python train.py --dataset synthetic --synthetic_size 5000 --depth 20 --alpha 24 \
                    --epochs 1 --nproc_per_node 2   # offline: 2 CPU workers
    python train.py --evaluate ../runs/<run>/model.pt   # the test loss and accuracy of weights
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_id JOB --rdzv_backend c10d \
             --rdzv_endpoint HOST:29500 train.py -b 2048   # on each of two nodes

dist_parallel/train.py with FSDP2's fully_shard in place of DDP: the model sharded on the meta
device, then filled from rank 0; each residual block's weights all-gathered just before it runs,
freed after, its gradients reduce-scattered: per GPU 1/N of the weights, gradients and momentum,
for 1.5x DDP's traffic. What keeps a group sane on bad days is fenced at the end, as there.
It runs from itself and two files, runkit.py (checkpoints, stop signals, the run log, the step
timer) and models/pyramidnet.py: copied side by side into another project, the three run as
they are; put your model in get_model and your data in get_datasets. Without a GPU it trains on
the CPU. --batch_size is the global batch in every mode. Read it top to bottom.
"""
# ------------------------------------------------------------------------------------------ imports
import argparse
import contextlib
import datetime
import gc
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

# runkit.py and pyramidnet.py: in a copy, those beside this file (found first); else the repo's
sys.path.extend(str(Path(__file__).resolve().parents[1] / folder) for folder in ("", "models"))

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchvision.transforms import v2 as T

import runkit
from pyramidnet import PyramidNet

MODE = "fsdp"
WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on the CPU
REPO = Path(__file__).resolve().parents[1]
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
# the flags that decide what is trained: a checkpoint resumes only under the values it was made with
# (not --epochs: a larger one trains an ended run on, at the rate of the longer schedule)
MUST_MATCH = ("model", "depth", "alpha", "block", "dataset", "image_size", "synthetic_size",
              "batch_size", "lr", "lr_warmup_epochs", "momentum", "weight_decay", "nesterov",
              "shuffle", "augment", "flip", "seed", "amp", "data")  # --epochs may grow


# ------------------------------------------------------------------------------------------- config
def get_args(argv=None) -> argparse.Namespace:
    """Every flag, with the spellings people type as aliases (hyphens, the ImageNet example's
    short forms); a mistake is one line."""
    parser = runkit.ArgumentParser(description=__doc__)
    add, count, number = parser.add_argument, runkit.count, runkit.number
    add("-b", "--batch_size", "--batch-size", type=count(1), help="GLOBAL batch (default: 128)")
    add("--epochs", type=count(0), default=300)
    add("--max_steps", "--max-steps", type=count(0), default=0, help="at most (0: no limit)")
    add("--lr", type=number(above=0), default=0.1, help="per 128 images of the global batch")
    add("--lr_warmup_epochs", "--lr-warmup-epochs", type=number(least=0), default=5.0)
    add("--momentum", type=number(least=0, below=1), default=0.9)
    add("--weight_decay", "--weight-decay", "--wd", type=number(least=0), default=1e-4)
    add("--no_nesterov", "--no-nesterov", dest="nesterov", action="store_false")
    add("-a", "--model", "--arch", default="pyramidnet", help="or torchvision's")
    add("--depth", type=count(1), default=110, help="PyramidNet's: 6n+2 (9n+2: bottleneck)")
    add("--alpha", type=number(above=0), default=270.0, help="PyramidNet's widening")
    add("--block", choices=("basic", "bottleneck"), default="basic")
    add("--dataset", choices=("cifar10", "mnist", "synthetic", "imagefolder"), default="cifar10")
    add("--data_dir", "--data-dir", default=str(REPO / "data"), help="imagefolder: train/, val/")
    add("--image_size", "--image-size", type=count(8, 4096), help="default: the dataset's")
    add("--synthetic_size", "--synthetic-size", type=count(5), default=50_000)
    add("-j", "--num_workers", "--num-workers", "--workers", type=count(0))
    add("--no_shuffle", "--no-shuffle", dest="shuffle", action="store_false")
    add("--augment", choices=("auto", "pad", "resized", "off"), default="auto")
    add("--flip", action=argparse.BooleanOptionalAction, help="default: not for digits, icons")
    add("--amp", choices=tuple(AMP), help="default: bf16 on a GPU, off on the CPU")
    add("--channels_last", "--channels-last", action=argparse.BooleanOptionalAction)
    add("--compile", action="store_true", help="torch.compile (its first steps: not timed)")
    add("--compile_mode", "--compile-mode", default="default",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"))
    add("--benchmark", action="store_true", help="speed only: --benchmark_steps timed steps")
    add("--benchmark_steps", "--benchmark-steps", type=count(1), default=100)
    add("--gpu_devices", "--gpu-devices", type=count(0), nargs="+", help="CUDA ids")
    add("--seed", type=count(0, 2**32 - 1), default=0)
    add("--deterministic", action="store_true", help="the same bits every run, slower")
    add("--log_dir", "--log-dir", default=str(REPO / "runs"))
    add("--run_name", "--run-name", help="default: <mode>-<n>gpu-<time>-<pid>")
    add("--overwrite", action="store_true", help="empty the run folder of this name first")
    add("-p", "--log_interval", "--log-interval", "--print-freq", type=count(1), default=50)
    add("--warmup_steps", "--warmup-steps", type=count(0), default=10, help="not timed")
    add("--profile_steps", "--profile-steps", type=count(0), default=0, help="torch.profiler's")
    add("--memory_snapshot", "--memory-snapshot", type=count(0), default=0, help="steps; GPUs")
    add("--save_model", "--save-model", action="store_true", help="<run folder>/model.pt")
    add("--checkpoint_interval", "--checkpoint-interval", type=count(0), default=0)
    add("--resume", help="a checkpoint.pt, or auto: this --run_name's, if any")
    add("-e", "--evaluate", metavar="PATH", help="evaluate these weights, then exit")
    add("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl with CUDA")
    add("--reshard_after_forward", "--reshard-after-forward", default=True,
        action=argparse.BooleanOptionalAction, help="free each block's gathered weights after its "
        "forward, gathered again for backward (ZeRO-3-like); off: kept (ZeRO-2-like)")
    add("--dist_timeout", "--dist-timeout", type=number(above=0), default=600.0,
        help="seconds a collective waits for the other ranks before the run ends")
    add("--nproc_per_node", "--nproc-per-node", type=count(1), default=None,
        help="without torchrun: the workers to start (default: one a GPU)")
    add("--max_restarts", "--max-restarts", type=count(0), default=0,
        help="without torchrun: the times to restart the workers after a failure")
    args = parser.parse_args(argv)
    runkit.refuse_if([
        (args.resume and args.overwrite, "--resume continues a run and --overwrite empties it"),
        (args.resume == "auto" and not args.run_name, "--resume auto needs --run_name NAME"),
        (args.evaluate and (args.resume or args.benchmark or args.memory_snapshot or
                            args.profile_steps), "--evaluate trains nothing: leave out --resume, "
         "--benchmark, --memory_snapshot and --profile_steps"),
        (args.augment == "off" and args.flip, "--flip mirrors training images and --augment off "
         "trains on them as they are: give one of them"),
        (args.compile_mode != "default" and not args.compile, "--compile_mode needs --compile"),
        (args.model != "pyramidnet" and args.model not in torchvision.models.list_models(
            module=torchvision.models), f"--model {args.model} is no torchvision classifier")])
    if args.benchmark:  # the same work every step: synthetic data, or the folder's own images
        args.max_steps = args.warmup_steps + args.benchmark_steps + args.profile_steps
        args.dataset = "imagefolder" if args.dataset == "imagefolder" else "synthetic"
    return args


# -------------------------------------------------------------------------------------------- setup
def setup(args) -> torch.device:
    """This process's place in the job (from the environment torchrun sets), its device (a GPU of
    its own, or the CPU) and the process group it joins; the fast path's defaults for it."""
    runkit.check_launch_environment()  # robustness: a launcher's variable that cannot be: a line
    rank = int(os.environ["RANK"])  # this process's place among all the job's processes
    world_size = int(os.environ["WORLD_SIZE"])  # how many processes the job has
    gpus = args.gpu_devices or list(range(torch.cuda.device_count()))  # this node's GPUs
    local_rank = int(os.environ.get("LOCAL_RANK", rank % max(len(gpus), 1)))  # a pod: RANK % GPUs
    if gpus and local_rank >= len(gpus):  # robustness: more processes than GPUs, in one line
        raise runkit.UsageError(f"LOCAL_RANK={local_rank} has no GPU of its own ({len(gpus)} on "
                                "this node): start at most one process a GPU", rank_specific=True)
    device = runkit.cuda_device(gpus[local_rank] if gpus else 0)  # the CPU without CUDA
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)  # a GPU a process, before the group: NCCL binds to it
    # robustness: a launch that cannot work, refused in one line before the group forms
    runkit.refuse_if([(args.backend == "nccl" and not cuda, "--backend nccl "
                       "needs GPUs: give --backend gloo"), (args.compile_mode in (
                       "reduce-overhead", "max-autotune"), "CUDA graphs cannot keep FSDP2's "
                       "gathered weights: give --compile_mode default or ...-no-cudagraphs"),
                      (launched_by_hand(args), "--nproc_per_node and --max_restarts are the self-"
                       "launch's: under torchrun give its own --nproc-per-node, --max-restarts")])
    bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    args.amp = args.amp or ("bf16" if bf16 else "fp16" if cuda else "off")
    args.channels_last = cuda if args.channels_last is None else args.channels_last
    torch.backends.cudnn.benchmark = cuda and not args.deterministic  # the fastest per shape
    if cuda:  # TF32 matrix products, as convolutions have (torch 2.9 warns of it on the CPU)
        torch.set_float32_matmul_precision("high")
    if args.deterministic:  # deterministic kernels only (an error where there is none)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    runkit.refuse_if([(args.memory_snapshot and not cuda, "--memory_snapshot needs a GPU"),
                      (args.amp == "bf16" and cuda and not bf16, f"{device} has no bf16")])
    # every refusal made: the group forms (a rank that refused after it broke the others' join)
    timeout = datetime.timedelta(seconds=args.dist_timeout)  # a collective's wait for the others
    with runkit.group_failure_in_one_line():  # robustness: a rendezvous that cannot succeed
        store = store_of_this_attempt(rank, world_size, timeout)  # robustness: after a restart
        dist.init_process_group(args.backend or ("nccl" if cuda else "gloo"), rank=rank,
                                world_size=world_size, device_id=device if cuda else None,
                                timeout=timeout, store=store)
    return device


# --------------------------------------------------------------------------------------------- data
# each dataset's images: their side, their channels, the mean and std that normalise them
IMAGES = {"cifar10": (32, 3, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
          "synthetic": (32, 3, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
          "mnist": (28, 1, (0.1307,), (0.3081,)),
          "imagefolder": (None, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def get_datasets(args):
    """(train, test) datasets of (image, label), untransformed, and the number of classes:
    CIFAR-10 or MNIST (downloaded into --data_dir), your images, or generated ones."""
    root = Path(args.data_dir)
    if args.dataset == "synthetic":  # offline: each class a pattern, each image that pattern noisy
        train = TensorDataset(*runkit.synthetic_images(args.synthetic_size, args.seed, "train"))
        test = TensorDataset(*runkit.synthetic_images(args.synthetic_size // 5, args.seed, "test"))
        return train, test, 10
    if args.dataset == "imagefolder":
        args.data = runkit.check_image_folder(root)  # its refusals; what a resume compares
        train = torchvision.datasets.ImageFolder(root / "train")
        return train, torchvision.datasets.ImageFolder(root / "val"), len(train.classes)
    kind = torchvision.datasets.CIFAR10 if args.dataset == "cifar10" else torchvision.datasets.MNIST
    # kind(root, train=..., download=True), or what to put where in one line (offline, damaged)
    return runkit.downloaded(kind, root, True), runkit.downloaded(kind, root, False), 10


def get_loaders(args, train_set, test_set, device: torch.device):
    """DataLoaders of augmented, normalised batches: the training set reshuffled every epoch from
    --seed, the last partial batch dropped so that every step has the whole batch; every test
    image counted once."""
    side, _, mean, std = IMAGES[args.dataset]
    size, tensor = args.image_size, [T.ToImage(), T.ToDtype(torch.float32, scale=True),
                                     T.Normalize(mean, std)]
    if args.dataset == "imagefolder":  # as ImageNet is evaluated: resized, then its centre
        test = [T.Resize(size * 256 // 224), T.CenterCrop(size)]
        pad = [*test, T.RandomCrop(size, padding=size // 8)]  # small images: CIFAR's crop of it
    else:  # CIFAR-10, MNIST, the synthetic set: cropped at their own side, then resized
        test = [] if size == side else [T.Resize(size)]
        pad = [T.RandomCrop(side, padding=side // 8), *test]
    crop = {"pad": pad, "resized": [T.RandomResizedCrop(size)], "off": test}[args.augment]
    flip = [T.RandomHorizontalFlip()] if args.flip else []
    train_set = runkit.Augmented(train_set, T.Compose([*crop, *flip, *tensor]), args.seed)
    test_set = runkit.Augmented(test_set, T.Compose([*test, *tensor]), args.seed)
    sampler = DistributedSampler(train_set, shuffle=args.shuffle, seed=args.seed)  # rank's share
    options = dict(num_workers=args.num_workers, pin_memory=device.type == "cuda",
                   worker_init_fn=runkit.leave_stops_to_main)  # a stop signal: the run's to take
    batch = args.batch_size // dist.get_world_size()  # the global batch, split over the ranks
    train_loader = DataLoader(train_set, batch, sampler=sampler, drop_last=True, **options)
    shard = range(dist.get_rank(), len(test_set), dist.get_world_size())  # no image twice
    test_loader = DataLoader(test_set, batch, sampler=shard, **options)
    return train_loader, test_loader


def data_defaults(args, train_images: int) -> None:
    """--image_size, --augment auto and --flip made what they stand for with these images."""
    side = IMAGES[args.dataset][0]
    native = args.model == "pyramidnet" and args.dataset != "imagefolder"  # 32 px, not 224
    args.image_size = args.image_size or (side if native else 224)
    if args.augment == "auto":  # a random resized crop of a small image keeps a few pixels
        large = args.dataset == "imagefolder" and args.image_size > 64
        args.augment = "resized" if large else "pad"
    if args.flip is None:  # small images are digits and icons as often as photographs
        args.flip = args.dataset != "mnist" and (args.dataset != "imagefolder" or
                                                 args.augment == "resized")
    args.flip = args.flip and args.augment != "off"
    args.num_workers = runkit.workers(args.num_workers)  # a share of this node's cores
    given, args.batch_size = args.batch_size, args.batch_size or 128
    while not given and args.dataset == "imagefolder" and train_images < 4 * args.batch_size > 4:
        args.batch_size //= 2  # a small folder: the default halved until an epoch has 4 steps
    runkit.refuse_if([(args.batch_size % dist.get_world_size(), f"--batch_size {args.batch_size} "
                       f"does not split over {dist.get_world_size()} processes: give a multiple"),
                      (args.batch_size > train_images, f"--batch_size {args.batch_size} is more "
                       f"than the {train_images} training images: give a smaller one")])


# -------------------------------------------------------------------------------------------- model
def get_model(args, classes: int, device: torch.device):
    """The model to call, the unwrapped one whose weights are saved and evaluated, and the FLOPs
    of one training image, counted on it."""
    channels, size = IMAGES[args.dataset][1], args.image_size
    with torch.device("cpu" if dist.get_rank() == 0 else "meta"):  # meta: shapes, no memory
        if args.model == "pyramidnet":
            try:
                raw_model = PyramidNet(args.depth, args.alpha, args.block, classes, channels)
            except ValueError as error:  # a depth neither block can have
                raise runkit.UsageError(f"--depth {args.depth}: {error}") from None
        else:  # a torchvision model, no pretrained weights: nothing is downloaded
            sized = {"image_size": size} if args.model.startswith("vit_") else {}
            raw_model = torchvision.models.get_model(args.model, num_classes=classes, **sized)
    whole = raw_model.state_dict() if dist.get_rank() == 0 else {}  # rank 0: single_gpu's draws
    raw_model = raw_model.to(torch.device("meta"))  # every rank: shapes only, until sharded
    example = torch.zeros(2, channels, size, size, device="meta")
    try:  # one forward and backward: a model the images are too small for fails here
        flops = runkit.flops_per_image(raw_model, example)
    except RuntimeError as error:  # vgg11's pooling, for one, leaves a 16-pixel image no pixel
        raise runkit.UsageError(f"--model {args.model} cannot take these {size}-pixel images "
                                f"({str(error).splitlines()[0][:120]}): give a larger "
                                "--image_size, or --model pyramidnet") from None
    # a unit a repeated block (a residual block, a transformer layer): its weights all-gathered
    # just before it runs, freed after; the root unit holds the rest (stem, classifier)
    for block in repeated_blocks(raw_model):
        fully_shard(block, reshard_after_forward=args.reshard_after_forward)
    fully_shard(raw_model, reshard_after_forward=args.reshard_after_forward)
    raw_model.to_empty(device=device)  # each rank allocates its own slices, not yet filled
    set_model_state_dict(raw_model, whole, options=StateDictOptions(  # each rank keeps its
        full_state_dict=True, broadcast_from_rank0=True))  # slice of rank 0's tensors
    model = raw_model  # sharded in place: the same module
    if args.compile:  # compiled at the first step; raw_model (evaluation, saving) stays eager
        # TorchDynamo does not trace FSDP2's hooks: a graph a block, each its own width
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        model = torch.compile(model, mode=args.compile_mode, dynamic=False)
    return model, raw_model, flops


def memory_format(args) -> torch.memory_format:
    return torch.channels_last if args.channels_last else torch.contiguous_format


# ---------------------------------------------------------------------------------------- optimizer
def get_optimizer(args, raw_model: torch.nn.Module, device: torch.device, steps_per_epoch: int):
    """SGD at the rate of the global batch (linear scaling), fused into one kernel on a GPU; the
    rate a function of the step: a linear warm-up, then /10 at 50 % and at 75 % of the epochs;
    fp16's loss scaler (a pass-through in bf16 and fp32)."""
    fused = False  # no sharding rule for fused SGD's kernel: the for-each form, on DTensors
    optimizer = torch.optim.SGD(raw_model.parameters(), lr=args.lr * args.batch_size / 128,
                                momentum=args.momentum, weight_decay=args.weight_decay,
                                nesterov=args.nesterov, fused=fused or None)
    for param in raw_model.parameters():  # the zeros SGD's first step makes, made now: fused SGD
        optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)  # would skip them
    warmup, run = round(args.lr_warmup_epochs * steps_per_epoch), args.epochs * steps_per_epoch
    # the rate needs steps, not epochs: a small folder's at least 50, and at most a third of the run
    folder = args.dataset == "imagefolder"
    warmup = min(max(warmup, 50), run // 3) if folder else min(warmup, run // 10)

    def rate(step: int) -> float:  # the base rate's factor at optimizer step `step` (from 0)
        epoch = step // steps_per_epoch
        warm = (step + 1) / warmup if step < warmup else 1.0
        return warm * 0.1 ** ((epoch >= 0.5 * args.epochs) + (epoch >= 0.75 * args.epochs))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    return optimizer, scheduler, torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")


# --------------------------------------------------------------------------------- train / evaluate
def train_one_epoch(run, epoch: int) -> None:
    """One pass over the training set (what a resumed epoch has left of it), up to --max_steps, or
    to the window where a stop signal is seen; the host syncs only at a window's end."""
    args, progress = run.args, run.progress
    if 0 < args.max_steps <= progress["step"]:  # resumed at --max_steps: only its evaluation left
        return
    if epoch != progress["epoch"]:  # a new epoch, from its first batch
        progress.update(epoch=epoch, batch=0)
    run.model.train()
    for images, labels in run.timer.timed(epoch_batches(run.train_loader, epoch, progress)):
        images = images.to(run.device, non_blocking=True, memory_format=memory_format(args))
        labels = labels.to(run.device, non_blocking=True)
        with torch.autocast(run.device.type, AMP[args.amp], enabled=args.amp != "off"):
            logits = run.model(images)
            loss = F.cross_entropy(logits, labels)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()  # fp16: scaled up so that small gradients survive
        run.scaler.step(run.optimizer)  # unscaled first; skipped if a gradient overflowed
        run.scaler.update()
        run.sums += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels).sum(),
                                 torch.tensor(len(labels), device=run.device)])  # no sync
        run.timer.step_done()
        progress["step"] += 1
        progress["batch"] += 1
        last = progress["batch"] == len(run.train_loader) or 0 < args.max_steps <= progress["step"]
        due = args.checkpoint_interval and progress["step"] % args.checkpoint_interval == 0
        if progress["step"] % args.log_interval == 0 or last or due:  # a checkpoint ends a window
            log_window(run, epoch)  # train/lr: the rate this step trained with
        run.scheduler.step()  # the next step's rate
        if last or run.stop:
            return
        if due:
            save_checkpoint(run)


def epoch_batches(loader: DataLoader, epoch: int, progress: dict):
    """The epoch's batches in its order (from the seed and the epoch) and crops, less those that a
    resumed epoch had trained on."""
    loader.sampler.set_epoch(epoch)  # this epoch's shuffle, the same on every rank
    loader.dataset.set_epoch(epoch)
    if not progress["batch"]:
        return loader
    rest = list(loader.sampler)[progress["batch"] * loader.batch_size:]  # a sampler: any list
    return DataLoader(loader.dataset, loader.batch_size, sampler=rest, drop_last=True,
                      num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                      worker_init_fn=loader.worker_init_fn)


def log_window(run, epoch: int) -> None:
    """Read the window's sums (one host sync), report them, take note of a stop signal."""
    # robustness: this rank's stop vote travels with the window's sums
    sums = torch.cat([run.sums, run.sums.new_tensor(run.timer.window() + vote(run.signals))])
    dist.all_reduce(sums)  # every rank's sums added up, and its stop vote (robustness)
    sums[3:6] /= dist.get_world_size()  # every rank timed the same steps: their mean
    run.sums.zero_()
    gpus = {f"gpu/{i}/util_pct": util for i, (util, _) in run.monitor.window().items()}
    where = f"Epoch {epoch + 1}/{run.args.epochs} [{run.progress['batch']}/{len(run.train_loader)}]"
    run.log.window(run.progress["step"], epoch, sums.tolist(), run.args.batch_size, where,
                   **{"train/lr": run.scheduler.get_last_lr()[0], **gpus})
    run.stop = agreed(sums[6:].tolist())  # robustness: a signal to any rank stops every rank


@torch.no_grad()
def evaluate(args, raw_model: torch.nn.Module, loader: DataLoader, device: torch.device) -> dict:
    """The test loss, accuracy and top-5 accuracy, every test image counted exactly once."""
    raw_model.eval()
    for buffer in raw_model.buffers():  # rank 0's BatchNorm statistics: the saved weights' own
        dist.broadcast(buffer, src=0)
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    for images, labels in as_many_batches(loader, device):  # every rank gathers each unit
        images = images.to(device, non_blocking=True, memory_format=memory_format(args))
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, AMP[args.amp], enabled=args.amp != "off"):
            logits = raw_model(images).float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels[:, None]
        sums += torch.stack([F.cross_entropy(logits, labels, reduction="sum"), top5[:, 0].sum(),
                             top5.any(dim=1).sum(), torch.tensor(len(labels), device=device)])
    for module in raw_model.modules():  # no backward follows to free the gathered weights
        if isinstance(module, FSDPModule):
            module.reshard()
    dist.all_reduce(sums)  # each rank evaluated its shard: every test image counted once
    loss, correct, top5_correct, images = sums.tolist()
    return {"test_loss": loss / images, "test_acc": correct / images,
            "test_acc_top5": top5_correct / images, "test_images": int(images)}


def save_checkpoint(run, best: bool = False) -> Path | None:
    """The loop's state as state dicts, the same file in every mode; best.pt beside it when the
    test accuracy is the best so far."""
    model = get_model_state_dict(run.raw_model, options=WHOLE)  # gathered: every rank takes
    optimizer = get_optimizer_state_dict(run.raw_model, run.optimizer, options=WHOLE)  # part
    rng = [None] * dist.get_world_size()  # every rank's random generators, for a resume
    dist.all_gather_object(rng, runkit.rng_states())
    if dist.get_rank() != 0:  # rank 0 writes it
        return None
    path = runkit.save_checkpoint(run.log.run_dir / "checkpoint.pt", {
        "config": vars(run.args), "model": model,
        "optimizer": by_position(optimizer, run.raw_model), "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(), "progress": run.progress,
        "rng": rng})
    if best:
        runkit.copy_atomically(path, path.with_name("best.pt"))  # a full disk: no half copy
    return path


def restore(run, checkpoint: dict) -> None:
    """Everything of `checkpoint` into the run, which goes on as if never stopped."""
    set_model_state_dict(run.raw_model, checkpoint["model"], options=WHOLE)  # each its slice
    with runkit.optimizer_as_built(run.optimizer):  # fused or not, its buffers' strides
        set_optimizer_state_dict(run.raw_model, run.optimizer, by_name(checkpoint["optimizer"],
                                                                     run.raw_model), options=WHOLE)
    run.scheduler.load_state_dict(checkpoint["scheduler"])
    run.scaler.load_state_dict(checkpoint["scaler"])
    run.progress.update(checkpoint["progress"])
    runkit.set_rng_state(checkpoint["rng"][dist.get_rank() % len(checkpoint["rng"])])


# ---------------------------------------------------------------------------------------- main loop
def main(argv=None) -> int:
    started = time.perf_counter()
    args = get_args(argv)
    device = setup(args)
    is_main = dist.get_rank() == 0  # rank 0 prints and writes the files
    with one_download_a_node():  # robustness: the node's other ranks wait, then read it
        train_set, test_set, classes = get_datasets(args)
    data_defaults(args, len(train_set))
    train_loader, test_loader = get_loaders(args, train_set, test_set, device)
    args.epochs = math.ceil(args.max_steps / len(train_loader)) if args.benchmark else args.epochs
    gpus = dist.get_world_size() * (device.type == "cuda")
    names = [args.run_name or runkit.default_run_name(MODE, gpus)]
    dist.broadcast_object_list(names, src=0)  # rank 0's: each rank's default has its own pid
    folder = Path(args.log_dir) / names[0]
    checkpoint = on_rank_0(runkit.checkpoint_to_resume, args.resume, folder, vars(args),
                           MUST_MATCH)  # robustness: rank 0 reads it; its refusal ends every rank
    if runkit.has_ended(checkpoint, args.epochs, args.max_steps):  # run again after its end
        return 0
    torch.manual_seed(args.seed)  # the same weights in every mode
    model, raw_model, flops = get_model(args, classes, device)
    optimizer, scheduler, scaler = get_optimizer(args, raw_model, device, len(train_loader))
    # robustness: rank 0 claims the folder; its refusal ends every rank
    run_dir = on_rank_0(runkit.claim_run_folder, folder, args.resume, args.overwrite)
    gpus = [device.index] if device.type == "cuda" else []
    last = min(args.epochs * len(train_loader), args.max_steps or math.inf)  # the run's last step
    # the run's last --profile_steps, after the timed ones
    trace = folder / f"trace_rank{dist.get_rank()}.json"
    profile = (last - args.profile_steps + 1, last, trace) if args.profile_steps else None
    snapshot = (args.memory_snapshot, folder / "memory_snapshot.pickle") if is_main else None
    run = SimpleNamespace(  # what the loop carries from step to step; a checkpoint keeps progress
        args=args, device=device, model=model, raw_model=raw_model, train_loader=train_loader,
        optimizer=optimizer, scheduler=scheduler, scaler=scaler, stop=None,
        log=runkit.RunLog(run_dir if is_main else None, vars(args), checkpoint),
        timer=runkit.StepTimer(device, args.warmup_steps, checkpoint and checkpoint["progress"][
            "step"] or 0, profile, snapshot if args.memory_snapshot else None),
        monitor=runkit.GpuMonitor(gpus), signals=runkit.StopSignals(),
        sums=torch.zeros(3, dtype=torch.float64, device=device),  # the window's, on the device
        progress=dict(epoch=0, batch=0, step=0, best_acc=None, best_epoch=None, tested_step=None))
    try:
        if device.type == "cpu":  # said once the refusals are behind: a refusal is its line alone
            run.log.warn("no CUDA GPU found: running on the CPU")
        if checkpoint is not None:
            restore(run, checkpoint)
            run.log.line(runkit.resumed_line(checkpoint, args.epochs))
        if args.evaluate:  # saved weights, evaluated alone; a signal ends it: nothing to keep
            run.signals.at_once = ("the evaluation unfinished, no results; run it again with "
                                   "--overwrite") if is_main else ""
            runkit.load_weights(args.evaluate, lambda state: set_model_state_dict(
                raw_model, state, options=WHOLE))  # each rank its slice
            test = evaluate(args, raw_model, test_loader, device)
            run.log.line(f"{args.evaluate}: test loss {test['test_loss']:.4f} acc "
                         f"{100 * test['test_acc']:.2f}% ({runkit.images(test['test_images'])})")
            return run.log.results(test, mode=MODE, world_size=dist.get_world_size()) or 0
        pyramidnet = isinstance(raw_model, PyramidNet)  # or yours, put in get_model
        model_name = (f"PyramidNet-{args.depth} a={args.alpha:g}" if pyramidnet else
                      type(raw_model).__name__ if args.model == "pyramidnet" else args.model)
        run.log.line(f"{MODE} on {device}: {model_name} ({runkit.parameter_count(raw_model):,} "
                     f"parameters) at {args.image_size} px, "
                     f"{args.dataset}, {args.augment} crop{' and flip' * args.flip}, batch "
                     f"{args.batch_size} ({len(train_loader)} steps an epoch), amp {args.amp}; "
                     f"logs in {run_dir}")
        for epoch in range(run.progress["epoch"], args.epochs):
            train_one_epoch(run, epoch)
            if run.stop:  # SIGTERM, SIGINT, SIGHUP, SIGUSR1: a checkpoint, then a clean exit
                path = save_checkpoint(run)
                run.log.line(runkit.stopped_line(run.stop, run.progress, len(train_loader), path))
                dist.barrier()  # no rank exits before rank 0 wrote it: a launcher ends the job
                return runkit.StopSignals.CODES[run.stop]
            if not args.benchmark:  # --benchmark measures speed only: no evaluation, no files
                if args.dataset == "imagefolder":  # the statistics of the weights evaluated
                    runkit.precise_batchnorm(raw_model, epoch_batches(train_loader, epoch, {
                        "batch": 0}), device, memory_format(args))
                test = evaluate(args, raw_model, test_loader, device)
                best = run.log.tested(test, run.progress, len(train_loader), args.epochs)
                save_checkpoint(run, best)
            if 0 < args.max_steps <= run.progress["step"]:
                break
        if args.save_model and is_main:  # the weights alone, for --evaluate or your own code
            torch.save(raw_model.state_dict(), run_dir / "model.pt")
        summary = runkit.speed_summary(run.log, run.timer, args.batch_size, dist.get_world_size(),
                                       flops,
                                       runkit.peak_tflops(device, args.amp), run.monitor, gpus)
        summary.update(parameters=runkit.parameter_count(raw_model),
                       wall_time_s=time.perf_counter() - started, **run.progress,
                       **run.log.last_test)
        peaks = [None] * dist.get_world_size()  # each rank's GPU's peak memory, by rank
        dist.all_gather_object(peaks, runkit.peak_memory_gb(gpus))
        # telemetry: whether the ranks ended with rank 0's weights, in results.json
        run.log.results(summary, mode=MODE, world_size=dist.get_world_size(), **in_sync(raw_model),
                        peak_mem_gb_per_gpu={r: p for r, own in enumerate(peaks)
                                             for p in own.values()})
        return 0
    # ------------------------------------------------------------------------------------- teardown
    except (RuntimeError, dist.DistError) as error:  # robustness: a peer that died, in one line
        runkit.raise_group_failure(error, run.progress["step"])
        raise
    finally:
        run.signals.restore()
        run.timer.close()
        run.monitor.close()
        run.log.close()


def repeated_blocks(model: torch.nn.Module) -> list:
    """The blocks FSDP shards one at a time: the children of Sequentials and ModuleLists that hold
    weights, inside no other such, whose class another shares (residual blocks, ViT's layers)."""
    lists = (torch.nn.Sequential, torch.nn.ModuleList)
    children = [child for module in model.modules() if isinstance(module, lists) for child in
                module.children() if not isinstance(child, lists) and list(child.parameters())]
    inner = {sub for child in children for sub in list(child.modules())[1:]}  # inside a child
    outer = [child for child in children if child not in inner]  # those inside no other
    return [child for child in outer if [type(c) for c in outer].count(type(child)) > 1]


def as_many_batches(loader: DataLoader, device: torch.device):
    """The loader's batches, then empty ones until this rank ran as many forward passes as the
    rank with the most (the shards differ by an image): each pass gathers from every rank."""
    most = torch.tensor([len(loader)], device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    for images, labels in loader:
        yield images, labels
    for _ in range(int(most) - len(loader)):
        yield images[:0], labels[:0]


def by_position(state: dict, model: torch.nn.Module) -> dict:
    """The optimizer's whole state keyed by each parameter's position, as optimizer.state_dict()
    keys it, the checkpoint every mode writes, from DCP's keys (the parameter's name); or back."""
    names = [name for name, _ in model.named_parameters()]
    other = {**dict(enumerate(names)), **{name: i for i, name in enumerate(names)}}
    return {"state": {other[key]: value for key, value in state["state"].items()},
            "param_groups": [{**group, "params": [other[key] for key in group["params"]]}
                             for group in state["param_groups"]]}


by_name = by_position  # the same swap: a checkpoint's positions back to DCP's names


# ====================================================================================== robustness
# What keeps a process group sane on bad days, and checks it. Not FSDP's lesson: skip it at first.
def vote(signals: runkit.StopSignals) -> list[float]:  # 1 for the signal this rank received
    return [float(signals.received == name) for name in signals.NAMES.values()]


def agreed(votes) -> str | None:  # from the votes summed over the ranks: every rank stops for it
    return next((name for name, n in zip(runkit.StopSignals.NAMES.values(), votes) if n), None)


def store_of_this_attempt(rank: int, world_size: int, timeout) -> dist.Store | None:
    """torchrun's store (its agent's, or rank 0's) outlives a restart of the workers, the dead
    group's keys with it: each attempt's keys of its own. None outside torchrun."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return None
    agents = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent serves it
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=rank == 0 and not agents, timeout=timeout)
    return dist.PrefixStore(f"attempt_{attempt}", store)


def on_rank_0(read, *args):
    """read(*args) on rank 0 alone, its result every rank's; its refusal, said once, ends all."""
    result = [None, None]  # what it read, or why it refused
    if dist.get_rank() == 0:
        try:
            result[0] = read(*args)
        except runkit.UsageError as refusal:
            result[1] = str(refusal)
    dist.broadcast_object_list(result, src=0)
    if result[1] is not None:
        raise runkit.UsageError(result[1]) if dist.get_rank() == 0 else SystemExit(2)
    return result[0]


@contextlib.contextmanager
def one_download_a_node():
    """The body on each node's first rank (a download), then on its others, which find its files."""
    first = os.environ.get("LOCAL_RANK", "0") == "0"
    if not first:
        dist.barrier()
    yield
    if first:  # the barrier the others wait at
        dist.barrier()


def launched_by_hand(args) -> bool:
    """Whether --nproc_per_node or --max_restarts reached a worker the self-launch did not start."""
    given = args.nproc_per_node is not None or args.max_restarts > 0
    return given and "PYTORCH_MULTIGPU_SELF_LAUNCH" not in os.environ


def launch_workers(args, command: list[str] | None = None) -> int:
    """convenience: `python train.py` without torchrun starts a worker a GPU (--nproc_per_node CPU
    workers without one) as `torchrun --standalone` would; their exit status is its own."""
    from torch.distributed.elastic.multiprocessing import SignalException, errors
    from torch.distributed.run import get_args_parser, run

    nodes = os.environ.get("PET_NNODES", "1")  # torchrun's --nnodes, from a cluster's operator
    gpus = len(args.gpu_devices or range(torch.cuda.device_count()))
    nproc = args.nproc_per_node or gpus or 1
    runkit.refuse_if([(nodes not in ("1", "1:1"), f"PET_NNODES={nodes}: `python train.py` starts "
                       "the workers of one node; on several, run torchrun on each node"),
                      ("WORLD_SIZE" in os.environ, "WORLD_SIZE is set and RANK is not: set both "
                       "(a launcher's worker), or neither for `python train.py` to start its own"),
                      (gpus and nproc > gpus, f"--nproc_per_node {nproc}: this node has {gpus} "
                       f"GPU{'s' * (gpus != 1)}; one a process")])
    os.environ.setdefault("OMP_NUM_THREADS", str(max((os.cpu_count() or 1) // nproc, 1)))
    os.environ["PYTORCH_MULTIGPU_SELF_LAUNCH"] = "1"  # its workers may take these two flags
    # a pod's PET_* (its operator's torchrun flags, PET_STANDALONE="") out of torchrun's defaults
    pods = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("PET_")}
    launch = get_args_parser().parse_args([
        "--standalone", f"--nproc_per_node={nproc}", f"--max-restarts={args.max_restarts}",
        *(command or [__file__, *sys.argv[1:]])])
    os.environ.update(pods)  # the workers inherit them
    launch.signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # passed on (torch 2.10+)
    try:
        run(launch)
    except SignalException as stop:  # passed on to the workers, which stopped with a checkpoint
        return 128 + stop.sigval
    except errors.ChildFailedError as failed:  # torchrun's agent has said how each worker ended
        return max(failure.exitcode for failure in failed.failures.values())
    return 0


@torch.no_grad()
def in_sync(raw_model: torch.nn.Module) -> dict:
    """telemetry: the weights are rank 0's by construction; how far the BatchNorm statistics are."""
    far = torch.zeros(2, dtype=torch.float64, device=next(raw_model.parameters()).device)
    for i, tensors in enumerate(([], raw_model.buffers())):  # the weights: sliced, not compared
        mine = torch.cat([far.new_zeros(1), *(tensor.double().flatten() for tensor in tensors)])
        rank_0 = mine.clone()
        dist.broadcast(rank_0, src=0)
        far[i] = (mine - rank_0).abs().max()
    dist.all_reduce(far, op=dist.ReduceOp.MAX)
    return {"params_in_sync": far[0].item() == 0, "buffers_max_abs_diff": far[1].item()}


if __name__ == "__main__":
    with runkit.one_line_errors():
        try:  # convenience: `python train.py` without torchrun starts its workers
            sys.exit(main() if "RANK" in os.environ else launch_workers(get_args()))
        finally:  # always, even after an error: no rank is left holding the group
            gc.collect()  # the model's cycles hold the group: it ends while Python still runs
            if dist.is_initialized():
                dist.destroy_process_group()
