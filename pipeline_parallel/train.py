r"""Train PyramidNet on CIFAR-10 with pipeline parallelism: the model cut into stages, a rank each.

    torchrun --standalone --nproc_per_node 4 train.py -b 512   # 4 GPUs, 16 micro-batches of 32
    torchrun --standalone --nproc_per_node 4 train.py -b 512 --stages 2   # 2 stages x 2 replicas
    python train.py --gpu_devices 0 1    # 2 stages, their workers started as torchrun would
    python train.py --dataset synthetic --synthetic_size 5000 --depth 20 --alpha 24 \
                    --epochs 1 --nproc_per_node 2   # offline: 2 CPU workers, a stage each
    python train.py --schedule gpipe --microbatches 8 --nproc_per_node 2   # the other schedule
    python train.py --evaluate ../runs/<run>/model.pt --nproc_per_node 2   # weights, evaluated

dist_parallel/train.py with torch.distributed.pipelining in place of DDP: each rank holds a stage,
a contiguous run of the model's pieces (PyramidNet's stem, each block, its head) cut where their
FLOPs balance. A step's batch is split into M micro-batches; between ranks cross a micro-batch's
activations, forward, and their gradients, backward. GPipe runs every micro-batch's forward, then
every backward; 1F1B, once the pipeline is full, one of each in turn (so it holds S micro-batches'
activations at most, not M). A replica's first stage alone needs the images, its last the labels.
With more processes than --stages, the pipeline is replicated (a 2-D DeviceMesh, replicas x
stages): each replica takes its share of the batch, as a DDP rank does, and each stage's replicas
average its gradients with DDP. The fenced robustness at the end is dist_parallel's. It runs from
itself, runkit.py and models/pyramidnet.py; your model (an nn.Sequential: its children are the
pieces) goes in get_model, your data in get_datasets. --batch_size is the global batch in every
mode. Read it top to bottom.
"""
# ------------------------------------------------------------------------------------------ imports
import argparse
import contextlib
import datetime
import functools
import gc
import itertools
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
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.flop_counter import FlopCounterMode
from torchvision.transforms import v2 as T

import runkit
from pyramidnet import PyramidNet

MODE = "pipeline_parallel"
REPO = Path(__file__).resolve().parents[1]
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
# the flags that decide what is trained: a checkpoint resumes only under the values it was made with
# (not --epochs: a larger one trains an ended run on, at the rate of the longer schedule; not
# --schedule: it orders the same work, each gradient summed over the micro-batches in their order)
MUST_MATCH = ("model", "depth", "alpha", "block", "dataset", "image_size", "synthetic_size",
              "batch_size", "lr", "lr_warmup_epochs", "momentum", "weight_decay", "nesterov",
              "shuffle", "augment", "flip", "seed", "amp", "data", "microbatches")
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}  # both in torch 2.9's pipelining


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
    add("--schedule", choices=tuple(SCHEDULES), default="1f1b",
        help="gpipe: every micro-batch's forward, then every backward; 1f1b: one of each in turn")
    add("--stages", type=count(2), default=None, help="the pipeline's, a process each (default: "
        "every process): WORLD_SIZE / stages replicas of it, each a share of the batch")
    add("--microbatches", type=count(1), default=None,
        help="a step's batch split into this many (default: the fewest that keep the bubble "
        "under a quarter of the step and split the batch evenly)")
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
        (args.compile, "--compile: not for a pipeline's stages in this version; leave it out"),
        (args.channels_last, "--channels_last: activations cross between stages contiguous "
         "only, in this version; leave it out"),
        (args.amp == "fp16", "--amp fp16: no loss scale the stages share yet (each would skip its "
         "own overflows): give --amp bf16 or off"),
        (args.model != "pyramidnet" and args.model not in torchvision.models.list_models(
            module=torchvision.models), f"--model {args.model} is no torchvision classifier")])
    if args.benchmark:  # the same work every step: synthetic data, or the folder's own images
        args.max_steps = args.warmup_steps + args.benchmark_steps + args.profile_steps
        args.dataset = "imagefolder" if args.dataset == "imagefolder" else "synthetic"
    return args


# -------------------------------------------------------------------------------------------- setup
def setup(args):
    """This process's place in the job (from the environment torchrun sets), its device (a GPU of
    its own, or the CPU) and the process group it joins (a mesh); the fast path's defaults."""
    runkit.check_launch_environment()  # robustness: a launcher's variable that cannot be: a line
    rank = int(os.environ["RANK"])  # this process's place among all the job's processes
    world_size = int(os.environ["WORLD_SIZE"])  # how many processes the job has: stages x replicas
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
    runkit.refuse_if([(world_size < 2, f"WORLD_SIZE={world_size}: a pipeline needs 2 ranks or "
                       "more, a stage each: start 2 or more processes (--nproc_per_node 2)"),
                      (world_size % (args.stages or world_size), f"WORLD_SIZE={world_size} is no "
                       f"multiple of --stages {args.stages}: give a --stages that divides it"),
                      (args.backend == "nccl" and not cuda, "--backend nccl needs GPUs: give "
                       "--backend gloo"),
                      (launched_by_hand(args), "--nproc_per_node and --max_restarts are the self-"
                       "launch's: under torchrun give its own --nproc-per-node, --max-restarts")])
    bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    args.amp = args.amp or ("bf16" if bf16 else "off")  # fp16 needs one loss scale for all stages
    args.channels_last = False  # refused if given: activations cross between stages contiguous
    args.stages = args.stages or world_size  # one replica of the pipeline: a stage a process
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
        # the processes as R replicas of S stages, rank r * S + s: a replica's stages pass the
        # activations along (pp), a stage's replicas average its gradients (dp)
        mesh = init_device_mesh(device.type, (world_size // args.stages, args.stages),
                                mesh_dim_names=("dp", "pp"))
    return device, mesh


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


def get_loaders(args, train_set, test_set, device: torch.device, mesh):
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
    # each replica of the pipeline its DistributedSampler's share, the same on each of its stages;
    # a step's share is then dealt into micro-batches as the sampler deals DDP's ranks (see dealt)
    replica, replicas = mesh["dp"].get_local_rank(), mesh["dp"].size()
    sampler = DistributedSampler(train_set, replicas, replica, shuffle=args.shuffle, seed=args.seed)
    options = dict(num_workers=args.num_workers, pin_memory=device.type == "cuda",
                   worker_init_fn=runkit.leave_stops_to_main)  # a stop signal: the run's to take
    # each stage loads its replica's step: the first feeds its images, the last's loss its labels
    train_loader = DataLoader(train_set, args.batch_size // replicas, sampler=sampler,
                              drop_last=True, **options)
    batch = args.batch_size // args.microbatches // replicas  # a micro-batch's images
    shard = range(replica, len(test_set), replicas)  # a replica's test images: no image twice
    test_loader = DataLoader(test_set, batch, sampler=shard, **options)
    return train_loader, test_loader


def dealt(batch: torch.Tensor, microbatches: int) -> torch.Tensor:
    """A replica's step (images or labels) in M micro-batches as DistributedSampler deals images to
    ranks, the i-th to micro-batch i % M. Replica r of R holds every R-th image of the epoch's
    order from the r-th, so its micro-batch m holds what DDP's rank m * R + r of M * R takes at
    that step (one replica: rank m of M). Each micro-batch's BatchNorm then sees that share alone,
    as the rank's does: DDP's step."""
    return batch.unflatten(0, (-1, microbatches)).transpose(0, 1).flatten(0, 1)


def fewest_microbatches(stages: int, batch: int) -> int:
    """The default --microbatches: the fewest M that divide the batch and keep the bubble under a
    quarter. Each of S stages idles S-1 of a step's M+S-1 micro-batch slots, while the pipeline
    fills and drains (GPipe and 1F1B alike): under 1/4 for M > 3(S-1), so 4 for 2 stages, 10 for
    4 (a smaller batch: an image each)."""
    return next((m for m in range(3 * stages - 2, batch + 1) if batch % m == 0), batch)


def data_defaults(args, train_images: int) -> None:
    """--image_size, --augment auto, --flip and --microbatches made what they stand for with
    these images and this many stages."""
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
    stages, replicas = args.stages, dist.get_world_size() // args.stages
    share = args.batch_size // replicas or 1  # a replica's images a step (none: refused below)
    args.microbatches = args.microbatches or fewest_microbatches(stages, share)
    split = replicas * args.microbatches  # every replica's micro-batches: DDP's ranks
    runkit.refuse_if([(args.batch_size % split, f"--batch_size {args.batch_size} does not split "
                       f"into {args.microbatches} micro-batches{' a replica' * (replicas > 1)}: "
                       f"give a multiple of {split}"),
                      (args.microbatches < stages, f"--microbatches {args.microbatches}: "
                       f"{stages} stages need at least {stages} a step, one for each to work on"),
                      (args.batch_size > train_images, f"--batch_size {args.batch_size} is more "
                       f"than the {train_images} training images: give a smaller one")])


# -------------------------------------------------------------------------------------------- model
def get_model(args, classes: int, device: torch.device, mesh):
    """The schedule that trains this rank's stage, the whole model's forward through the ranks,
    the whole model (the other stages' pieces on the meta device: shapes, no storage), the FLOPs
    of one training image counted on it before the cut, and each stage's pieces and share."""
    channels, size = IMAGES[args.dataset][1], args.image_size
    if args.model == "pyramidnet":
        try:
            raw_model = PyramidNet(args.depth, args.alpha, args.block, classes, channels)
        except ValueError as error:  # a depth neither block can have
            raise runkit.UsageError(f"--depth {args.depth}: {error}") from None
    else:  # a torchvision model, no pretrained weights: nothing is downloaded
        sized = {"image_size": size} if args.model.startswith("vit_") else {}
        raw_model = torchvision.models.get_model(args.model, num_classes=classes, **sized)
    pieces = model_pieces(raw_model)  # every rank built it whole, on the CPU, from the seed
    example = torch.zeros(2, channels, size, size)
    try:  # one forward and backward: a model the images are too small for fails here
        flops = runkit.flops_per_image(raw_model, example)
        costs = piece_flops(pieces, example)  # each piece's work, to balance the stages by
    except RuntimeError as error:  # vgg11's pooling, for one, leaves a 16-pixel image no pixel
        raise runkit.UsageError(f"--model {args.model} cannot take these {size}-pixel images "
                                f"({str(error).splitlines()[0][:120]}): give a larger "
                                "--image_size, or --model pyramidnet") from None
    stages, rank = args.stages, mesh["pp"].get_local_rank()  # rank: its stage in its replica
    runkit.refuse_if([(len(pieces) < stages, f"the model has {len(pieces)} pieces to cut into "
                       f"{stages} stages: give at most --stages {len(pieces)}")])
    # by FLOPs, not by blocks: PyramidNet widens block by block and halves its resolution twice
    # (PyramidNet-110 a=270 in 4 stages of 14 pieces: 14 to 33 % of the work; by FLOPs 24 to 26 %)
    cuts = balanced_cuts(costs, stages)  # stage s holds pieces cuts[s] to cuts[s + 1] - 1
    mine = range(cuts[rank], cuts[rank + 1])
    for index, (_, piece) in enumerate(pieces):  # this rank's pieces on its device; the others'
        piece.to(device if index in mine else "meta")  # shapes only (names kept, storage freed)
    stage = nn.Sequential(*(pieces[index][1] for index in mine))  # what this rank holds
    # what crosses a micro-batch (shape, dtype), measured stage by stage in eval mode (no
    # statistic moves), for PipelineStage's buffers: left to it, torch 2.9 runs each stage on
    # zeros in training mode, and the BatchNorm statistics move
    micro = args.batch_size // args.microbatches // mesh["dp"].size()  # a micro-batch's images
    crossing = [torch.empty(micro, channels, size, size, device="meta")]  # stage s's: crossing[s]
    with torch.no_grad(), torch.autocast(device.type, AMP[args.amp], enabled=args.amp != "off"):
        for s in range(stages):  # on stage s's rank, then sent to every rank
            output = [stage.eval()(torch.zeros_like(crossing[s], device=device)).to("meta")
                      if s == rank else None]
            dist.broadcast_object_list(output, group=mesh["pp"].get_group(), group_src=s)
            crossing.append(output[0].requires_grad_())  # in training, with its gradient
    model = StageToStage(stage.train(), crossing[rank], args.amp, mesh)
    # the stage's replicas average its gradients as DDP's ranks do, over the mesh's dp dimension:
    # the schedule runs each micro-batch under DDP's no_sync, and the last one's backward
    # all-reduces their sum (one replica: a group of one, nothing to average)
    stage = DistributedDataParallel(stage, process_group=mesh["dp"].get_group())
    # robustness: PipelineStage, with torch 2.9's first exchange mended on gloo (see its class)
    pipe = MendedPipelineStage(stage, rank, stages, device, input_args=crossing[rank],
                               output_args=crossing[rank + 1], group=mesh["pp"].get_group())
    # the schedule: each step splits the replica's batch into M micro-batches (along the batch, in
    # order) and runs them through the stages; each one's loss is its mean, as a DDP rank's, and
    # every gradient the R replicas' mean of their M micro-batches' sum, divided by M
    # (scale_grads): DDP's average over M * R ranks
    schedule = SCHEDULES[args.schedule](pipe, args.microbatches, loss_fn=F.cross_entropy)
    shares = [{"first": pieces[start][0], "last": pieces[end - 1][0],
               "flops_share": sum(costs[start:end]) / sum(costs)}
              for start, end in zip(cuts, cuts[1:])]
    return schedule, model, raw_model, flops, shares


def memory_format(args) -> torch.memory_format:
    return torch.channels_last if args.channels_last else torch.contiguous_format


def model_pieces(raw_model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model as a sequence of (name, piece), each piece's output the next one's input: what
    the pipeline cuts. PyramidNet: its stem, each residual block, its head, its own modules (its
    state dict's names); an nn.Sequential: its children. Any other model is refused."""
    if isinstance(raw_model, PyramidNet):
        blocks = [(f"{layer}.{index}", block) for layer in ("layer1", "layer2", "layer3")
                  for index, block in enumerate(getattr(raw_model, layer))]
        stem = nn.Sequential(raw_model.conv1, raw_model.bn1)
        return [("stem", stem), *blocks, ("head", Head(raw_model))]
    if isinstance(raw_model, nn.Sequential):
        return list(raw_model.named_children())
    raise runkit.UsageError(f"{type(raw_model).__name__} is no sequence of pieces to cut into "
                            "stages: give --model pyramidnet, or an nn.Sequential in get_model")


class Head(nn.Module):
    """PyramidNet's last piece, as its forward ends: BatchNorm, ReLU, global average pool, fc."""

    def __init__(self, net: PyramidNet):
        super().__init__()
        self.bn_final, self.fc = net.bn_final, net.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.bn_final(x)).mean((2, 3)))


def piece_flops(pieces: list[tuple[str, nn.Module]], example: torch.Tensor) -> list[int]:
    """Each piece's FLOPs on `example` in turn, forward and backward (the gradient of its input
    too, which its stage sends back, but for the first), in eval mode (no statistic moves)."""
    costs, x = [], example
    for index, (_, piece) in enumerate(pieces):
        with FlopCounterMode(display=False) as counter:
            x = piece.eval()(x.detach().requires_grad_(index > 0))
            x.float().sum().backward()
        piece.train().zero_grad(set_to_none=True)
        costs.append(counter.get_total_flops())
    return costs


def balanced_cuts(costs: list[int], stages: int) -> list[int]:
    """Where to cut pieces of these costs into `stages` contiguous runs so that the costliest run
    costs the least: [0, stage 1's first piece, ..., len(costs)], each first run tried against
    the best cut of the rest (a few hundred pieces, a few stages: at once)."""
    total = [0, *itertools.accumulate(costs)]  # total[i]: what pieces 0 to i - 1 cost

    @functools.cache
    def best(start: int, runs: int) -> tuple[int, tuple[int, ...]]:  # (costliest, runs' ends)
        if runs == 1:
            return total[-1] - total[start], (len(costs),)
        rests = ((end, *best(end, runs - 1)) for end in range(start + 1, len(costs) - runs + 2))
        return min((max(total[end] - total[start], rest), (end, *ends))
                   for end, rest, ends in rests)  # each later run keeps a piece at least

    return [0, *best(0, stages)[1]]


class StageToStage(nn.Module):
    """The whole model's forward through a replica's stages, a batch at a time, no schedule: each
    stage receives its input from the stage before (the first: the images), calls its pieces
    under the run's autocast, sends its output on. The evaluation and PreciseBN call it: the stage
    itself, not DDP's wrapper, so no replica waits on the others' (their shares' batches)."""

    def __init__(self, stage: nn.Module, crossing: torch.Tensor, amp: str, mesh):
        super().__init__()
        self.stage, self.crossing, self.amp = stage, crossing, amp  # crossing: its input's kind
        self.mesh = mesh  # its place: a stage (pp) of a replica (dp)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rank, last = self.mesh["pp"].get_local_rank(), self.mesh["pp"].size() - 1
        x = images
        if rank > 0:  # every stage loads the batch: it knows the size of what it receives
            x = images.new_empty(len(images), *self.crossing.shape[1:], dtype=self.crossing.dtype)
            dist.recv(x, group=self.mesh["pp"].get_group(), group_src=rank - 1)
        with torch.autocast(images.device.type, AMP[self.amp], enabled=self.amp != "off"):
            y = self.stage(x)
        if rank < last:
            dist.send(y.contiguous(), group=self.mesh["pp"].get_group(), group_dst=rank + 1)
        return y


def load_stage(raw_model: nn.Module, state: dict) -> None:
    """The whole model's state dict into this rank's stage; the others' stay on the meta device."""
    own = raw_model.state_dict()  # every key: BatchNorm would fill a missing one in, a real 0
    raw_model.load_state_dict({key: value if value.is_meta else state[key]
                               for key, value in own.items()})


# ---------------------------------------------------------------------------------------- optimizer
# SGD over the whole model: the other stages' parameters, on the meta device, get no gradient and
# SGD skips them; its state dict then numbers every parameter as single_gpu's does
def get_optimizer(args, raw_model: torch.nn.Module, device: torch.device, steps_per_epoch: int):
    """SGD at the rate of the global batch (linear scaling), fused into one kernel on a GPU; the
    rate a function of the step: a linear warm-up, then /10 at 50 % and at 75 % of the epochs;
    fp16's loss scaler (a pass-through in bf16 and fp32)."""
    fused = device.type == "cuda" and not args.deterministic  # --deterministic: for-each, as FSDP
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
    first_stage = run.model.mesh["pp"].get_local_rank() == 0  # of this replica's stages
    last_stage = run.model.mesh["pp"].get_local_rank() == args.stages - 1
    for images, labels in run.timer.timed(epoch_batches(run.train_loader, epoch, progress)):
        images = images.to(run.device, non_blocking=True, memory_format=memory_format(args))
        labels = labels.to(run.device, non_blocking=True)
        images, labels = dealt(images, args.microbatches), dealt(labels, args.microbatches)
        run.optimizer.zero_grad(set_to_none=True)
        losses = []  # the last stage's: each micro-batch's loss
        # every micro-batch forward through the stages and backward: the first stage feeds the
        # images, the last one's loss takes the labels; each stage receives its input from the
        # one before and its output's gradient from the one after
        inputs = (images,) if first_stage else ()
        with torch.autocast(run.device.type, AMP[args.amp], enabled=args.amp != "off"):
            logits = run.schedule.step(*inputs, target=labels if last_stage else None,
                                       losses=losses)
        run.scaler.step(run.optimizer)  # this stage's parameters, with their summed gradients
        run.scaler.update()
        if last_stage:  # the step's sums are the last stage's: its logits, its loss
            loss = torch.stack(losses).mean()  # the micro-batches' mean: DDP's ranks' mean
            run.sums += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels)
                                     .sum(), torch.tensor(len(labels), device=run.device)])
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
def evaluate(args, model: StageToStage, loader: DataLoader, device: torch.device) -> dict:
    """The test loss, accuracy and top-5 accuracy, every test image counted exactly once: each
    replica's test batches through its stages, the last stage's logits against the labels."""
    model.eval()  # each stage its own BatchNorm statistics
    for buffer in model.stage.buffers():  # replica 0's: the saved weights' own
        dist.broadcast(buffer, group=model.mesh["dp"].get_group(), group_src=0)
    last = model.mesh["pp"].get_local_rank() == args.stages - 1
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    for images, labels in loader:
        images = images.to(device, non_blocking=True, memory_format=memory_format(args))
        labels = labels.to(device, non_blocking=True)
        logits = model(images).float()  # the last rank's: the logits; the others', their output
        if not last:
            continue
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels[:, None]
        sums += torch.stack([F.cross_entropy(logits, labels, reduction="sum"), top5[:, 0].sum(),
                             top5.any(dim=1).sum(), torch.tensor(len(labels), device=device)])
    dist.all_reduce(sums)  # the last stages' sums (the others' are zeros): every replica's
    loss, correct, top5_correct, images = sums.tolist()
    return {"test_loss": loss / images, "test_acc": correct / images,
            "test_acc_top5": top5_correct / images, "test_images": int(images)}


def save_checkpoint(run, best: bool = False) -> Path | None:
    """The loop's state as state dicts, the same file in every mode; best.pt beside it when the
    test accuracy is the best so far."""
    rng = [None] * dist.get_world_size()  # every rank's random generators, for a resume
    dist.all_gather_object(rng, runkit.rng_states())
    model, optimizer = gathered_state(run)  # the whole model's, from every stage
    if dist.get_rank() != 0:  # rank 0 writes it
        return None
    path = runkit.save_checkpoint(run.log.run_dir / "checkpoint.pt", {
        "config": vars(run.args), "model": model,
        "optimizer": optimizer, "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(), "progress": run.progress,
        "rng": rng})
    if best:
        runkit.copy_atomically(path, path.with_name("best.pt"))  # a full disk: no half copy
    return path


def gathered_state(run) -> tuple[dict | None, dict | None]:
    """The whole model's state dict and its SGD's on rank 0 (None elsewhere), single_gpu's keys
    and numbers in its order: each stage of replica 0 sends its tensors, those not on the meta
    device (the other replicas hold the same weights and momentum; their BatchNorms' own)."""
    sgd = run.optimizer.state_dict()  # SGD's state: a momentum buffer a parameter
    momentum = {index: state["momentum_buffer"] for index, state in sgd["state"].items()}
    mine = [{key: value.cpu() for key, value in tensors.items() if not value.is_meta}
            for tensors in (run.raw_model.state_dict(), momentum)]
    parts = [None] * run.args.stages if dist.get_rank() == 0 else None
    if run.model.mesh["dp"].get_local_rank() == 0:  # replica 0's, stage by stage: the pieces
        dist.gather_object(mine, parts, group=run.model.mesh["pp"].get_group(), group_dst=0)
    if parts is None:
        return None, None
    weights, momentum = ({key: value for part in parts for key, value in part[i].items()}
                         for i in (0, 1))
    return weights, {"state": {index: {"momentum_buffer": buffer} for index, buffer in
                               momentum.items()}, "param_groups": sgd["param_groups"]}


def restore(run, checkpoint: dict) -> None:
    """Everything of `checkpoint` into the run, which goes on as if never stopped."""
    load_stage(run.raw_model, checkpoint["model"])  # this rank's stage's keys
    with runkit.optimizer_as_built(run.optimizer):  # fused or not, its buffers' strides
        run.optimizer.load_state_dict(checkpoint["optimizer"])  # the others' stay on meta
    run.scheduler.load_state_dict(checkpoint["scheduler"])
    run.scaler.load_state_dict(checkpoint["scaler"])
    run.progress.update(checkpoint["progress"])
    runkit.set_rng_state(checkpoint["rng"][dist.get_rank() % len(checkpoint["rng"])])


# ---------------------------------------------------------------------------------------- main loop
def main(argv=None) -> int:
    started = time.perf_counter()
    args = get_args(argv)
    device, mesh = setup(args)
    is_main = dist.get_rank() == 0  # rank 0 prints and writes the files
    with one_download_a_node():  # robustness: the node's other ranks wait, then read it
        train_set, test_set, classes = get_datasets(args)
    data_defaults(args, len(train_set))
    train_loader, test_loader = get_loaders(args, train_set, test_set, device, mesh)
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
    schedule, model, raw_model, flops, stages = get_model(args, classes, device, mesh)
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
        optimizer=optimizer, scheduler=scheduler, scaler=scaler, stop=None, schedule=schedule,
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
            runkit.load_weights(args.evaluate, functools.partial(load_stage, raw_model))
            test = evaluate(args, model, test_loader, device)
            run.log.line(f"{args.evaluate}: test loss {test['test_loss']:.4f} acc "
                         f"{100 * test['test_acc']:.2f}% ({runkit.images(test['test_images'])})")
            return run.log.results(test, mode=MODE, world_size=dist.get_world_size()) or 0
        pyramidnet = isinstance(raw_model, PyramidNet)  # or yours, put in get_model
        model_name = (f"PyramidNet-{args.depth} a={args.alpha:g}" if pyramidnet else
                      type(raw_model).__name__ if args.model == "pyramidnet" else args.model)
        replicas = mesh["dp"].size()  # of the pipeline, each a share of the batch
        grid = f" a replica: {args.stages} stages x {replicas} replicas" * (replicas > 1)
        cut = ", ".join(f"{s}: {part['first']}" + f"..{part['last']}" * (
            part["first"] != part["last"]) + f" ({100 * part['flops_share']:.0f} %)"
            for s, part in enumerate(stages))
        run.log.line(f"{MODE} on {device}: {model_name} ({runkit.parameter_count(raw_model):,} "
                     f"parameters) at {args.image_size} px, "
                     f"{args.dataset}, {args.augment} crop{' and flip' * args.flip}, batch "
                     f"{args.batch_size} ({len(train_loader)} steps an epoch), amp {args.amp}; "
                     f"stages: {cut}; {args.schedule}, {args.microbatches} micro-batches of "
                     f"{args.batch_size // args.microbatches // replicas}{grid}; logs in "
                     f"{run_dir}")
        for epoch in range(run.progress["epoch"], args.epochs):
            train_one_epoch(run, epoch)
            if run.stop:  # SIGTERM, SIGINT, SIGHUP, SIGUSR1: a checkpoint, then a clean exit
                path = save_checkpoint(run)
                run.log.line(runkit.stopped_line(run.stop, run.progress, len(train_loader), path))
                dist.barrier()  # no rank exits before rank 0 wrote it: a launcher ends the job
                return runkit.StopSignals.CODES[run.stop]
            if not args.benchmark:  # --benchmark measures speed only: no evaluation, no files
                if args.dataset == "imagefolder":  # the statistics of the weights evaluated
                    runkit.precise_batchnorm(model, epoch_batches(train_loader, epoch, {
                        "batch": 0}), device, memory_format(args))
                test = evaluate(args, model, test_loader, device)
                best = run.log.tested(test, run.progress, len(train_loader), args.epochs)
                save_checkpoint(run, best)
            if 0 < args.max_steps <= run.progress["step"]:
                break
        if args.save_model:  # the weights alone, for --evaluate or your own code
            weights, _ = gathered_state(run)  # the whole model's, from every stage
            if is_main:
                torch.save(weights, run_dir / "model.pt")
        summary = runkit.speed_summary(run.log, run.timer, args.batch_size, dist.get_world_size(),
                                       flops,
                                       runkit.peak_tflops(device, args.amp), run.monitor, gpus)
        summary.update(parameters=runkit.parameter_count(raw_model),
                       wall_time_s=time.perf_counter() - started, **run.progress,
                       **run.log.last_test)
        peaks = [None] * dist.get_world_size()  # each rank's GPU's peak memory, by rank
        dist.all_gather_object(peaks, runkit.peak_memory_gb(gpus))
        # a step's idle share in theory, (S-1)/(M+S-1): measured, it is still to come
        bubble = (len(stages) - 1) / (args.microbatches + len(stages) - 1)
        run.log.results(summary, mode=MODE, world_size=dist.get_world_size(), stages=stages,
                        replicas=replicas, bubble_fraction=bubble,
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


# ====================================================================================== robustness
# What keeps a process group sane on bad days, and torch 2.9's pipelining on gloo. Not the
# pipeline's lesson: skip it at first.
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


class MendedPipelineStage(PipelineStage):
    """PipelineStage without the exchange torch 2.9 makes before a schedule's first step on gloo:
    it sends an int64 scalar into a float32 buffer, which NCCL lets pass and gloo aborts the
    process for (8 bytes where 4 were expected); the exchange wakes NCCL's communicators, and
    gloo's need none. torch 2.13 sends a float32 (later versions never call it: a vote instead)."""

    def _get_init_p2p_neighbors_ops(self) -> list[dist.P2POp]:
        ops = super()._get_init_p2p_neighbors_ops()
        return [] if dist.get_backend(self.group) == "gloo" else ops


if __name__ == "__main__":
    with runkit.one_line_errors():
        try:  # convenience: `python train.py` without torchrun starts its workers
            sys.exit(main() if "RANK" in os.environ else launch_workers(get_args()))
        finally:  # always, even after an error: no rank is left holding the group
            gc.collect()  # the model's cycles hold the group: it ends while Python still runs
            if dist.is_initialized():
                dist.destroy_process_group()
