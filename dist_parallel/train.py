"""Train PyramidNet on CIFAR-10 with DistributedDataParallel: one process per GPU, on one node or many.

    torchrun --standalone --nproc_per_node 4 train.py --batch_size 512   # the reference launch: 4 GPUs, 128 each
    python train.py --gpu_devices 0 1 2 3 --batch_size 512   # the same, started by torch's elastic launcher
    python train.py --nproc_per_node 2 --dataset synthetic --depth 20 --alpha 24 --epochs 1   # 2 CPU workers
    torchrun --nnodes 2 --node_rank R --nproc_per_node 8 --rdzv_backend c10d \
             --rdzv_endpoint HOST:29500 train.py --batch_size 2048   # on each of two nodes
    RANK=R WORLD_SIZE=2 MASTER_ADDR=HOST MASTER_PORT=29500 python train.py   # by hand, in each shell
    python train.py --evaluate ../runs/<run>/model.pt  # exact test loss and accuracy, any number of processes

single_gpu/train.py plus: a process group (NCCL on GPUs, Gloo on CPUs), a DistributedSampler that gives each rank
its share of every epoch, the DDP wrapper that all-reduces gradients during backward, sums reduced across ranks,
and side effects (prints, TensorBoard, files) on rank 0 only. `--batch_size` is the GLOBAL batch: each of the
world_size processes takes batch_size / world_size. Rank information comes from the environment only.
"""
# ---------------------------------------------------------------------------------------------------- imports
import gc
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # so `python train.py` finds common/ and models/

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from common.checkpoint import (StopSignals, check_fits, ended_line, has_ended, last_checkpoint,
                               restore, resume_checkpoint, save_checkpoint, stopped_line)
from common.config import Config, RunError, UsageError, flag, parse_config, user_errors
from common.data import DATASET_INFO, EvalShard, LoaderWorkerDied, load_datasets, make_loader
from common.devices import seed_everything
from common.distributed import (GroupConfig, by_rank, check_launch, die_with_launcher, evaluate, from_rank0,
                                group_failure, init_group, launched, log_window, node_leader_first, on_every_rank,
                                own_gpu, rank_info, report_stop, self_launch, verify_sync)
from common.logger import Console, RunLogger, load_model_weights, report_test, resolve_run_dir, speed_line
from common.metrics import RunClock, StepTimer, Sums, TrainMeter
from common.optim import build_optimizer, describe_lr, lr_schedule
from common.performance import (autocast, describe_fast_path, grad_scaler, memory_format, resolve_fast_path,
                                speed_summary)
from common.telemetry import GpuTelemetry, peak_memory_gb
from models import pyramidnet

MODE = "dist_parallel"


# ---------------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class DistConfig(GroupConfig):  # the process group's flags (common/distributed.py), and DDP's own
    sync_bn: bool = flag(False, "BatchNorm statistics over the global batch (SyncBatchNorm; GPUs only)")
    bucket_cap_mb: float = flag(25.0, "DDP gradient bucket size: each full bucket is all-reduced while backward "
                                      "goes on", above=0, at_most=8e12)  # its bytes: a 64-bit int


def get_config(argv=None) -> DistConfig:
    return parse_config(DistConfig, argv, description=__doc__)


# ---------------------------------------------------------------------------------------------------- setup
def setup(cfg: DistConfig):
    """Join the process group. The device is this process's GPU (the local_rank-th of --gpu_devices) or the CPU."""
    die_with_launcher()  # a killed torchrun agent takes this worker with it: no orphan trains on in the run folder
    rank, local_rank, world_size = rank_info()  # set by torchrun (or by hand)
    check_launch(cfg, world_size)
    gpus = own_gpu(cfg.gpu_devices, local_rank, cfg.backend)  # one GPU per process (gloo may share one)
    if gpus:
        torch.cuda.set_device(gpus[0])  # before the process group: NCCL binds this process to its GPU
    backend = cfg.backend or ("nccl" if gpus else "gloo")
    init_group(backend, cfg.init_method, rank, world_size, cfg.dist_timeout, gpus)  # one-line errors, timeouts
    return (torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")), gpus


# ---------------------------------------------------------------------------------------------------- data
def get_loaders(cfg: Config, device: torch.device):
    rank, local_rank, world_size = rank_info()
    with node_leader_first(local_rank):  # one download per node
        train_set, test_set = load_datasets(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed)
    if cfg.batch_size > len(train_set):
        raise UsageError(f"--batch_size {cfg.batch_size} is larger than the training set ({len(train_set)} "
                         f"images); use a smaller batch")
    kind = cfg.loader or ("gpu" if device.type == "cuda" else "torchvision")
    options = dict(augment=cfg.augment, num_workers=cfg.num_workers, seed=cfg.seed,
                   memory_format=memory_format(cfg))
    per_rank_batch = -(-cfg.batch_size // world_size)  # the global batch split evenly (rounded up by evaluation)
    train_sampler = DistributedSampler(train_set, world_size, rank, shuffle=cfg.shuffle, seed=cfg.seed)
    train_loader = make_loader(kind, train_set, train_sampler, per_rank_batch, device, train=True, **options)
    test_shard = EvalShard(len(test_set), rank, world_size)  # every test image on exactly one rank, no padding
    test_loader = make_loader(kind, test_set, test_shard, per_rank_batch, device, train=False, **options)
    return train_loader, test_loader


# ---------------------------------------------------------------------------------------------------- model
def get_model(cfg: DistConfig, device: torch.device):
    """The model to call, and the unwrapped one whose weights are saved and evaluated."""
    data = DATASET_INFO[cfg.dataset]  # the images' channels and the classes
    raw_model = pyramidnet(cfg.depth, cfg.alpha, cfg.block, num_classes=data.classes, in_channels=data.channels,
                           width_multiple=cfg.width_multiple)
    raw_model = raw_model.to(device, memory_format=memory_format(cfg))
    if cfg.sync_bn:  # BatchNorm statistics over the global batch: an all-reduce in every BN layer's forward
        raw_model = nn.SyncBatchNorm.convert_sync_batchnorm(raw_model)
    # DDP broadcasts rank 0's weights now, then all-reduces (averages) gradients in buckets during backward
    # gradient_as_bucket_view: gradients live in the buckets (no copy); static_graph: the same parameters are used
    # every step, so DDP can skip its per-step search for unused ones (left off under torch.compile's own DDP path)
    model = DDP(raw_model, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=True, static_graph=not cfg.compile)
    if cfg.compile:  # compiled in the first step; raw_model (evaluation, saving) stays eager
        model = torch.compile(model)
    return model, raw_model


# ---------------------------------------------------------------------------------------------------- optimizer
def get_optimizer(cfg: Config, raw_model: torch.nn.Module, device: torch.device, steps_per_epoch: int):
    """SGD, its learning-rate schedule, and fp16's loss scaler (a pass-through in bf16 and fp32)."""
    optimizer = build_optimizer(raw_model, cfg, device)
    return optimizer, lr_schedule(optimizer, cfg, steps_per_epoch), grad_scaler(cfg, device)


# ---------------------------------------------------------------------------------------------------- train / evaluate
def train_one_epoch(run, epoch: int) -> Sums:
    """One pass over the training set (the rest of it, when resumed mid-epoch), or up to --max_steps, or until a
    stop signal; a host sync only at the end of each log window and at checkpoints."""
    cfg, model, loader = run.cfg, run.model, run.train_loader
    model.train()
    skip = run.batch if epoch == run.epoch else 0  # batches a resumed epoch had already trained on
    run.epoch, run.batch = epoch, skip
    loader.set_epoch(epoch, skip)
    if not skip:  # a resumed epoch goes on from the log windows its checkpoint had counted
        run.epoch_sums = Sums()
    run.console.start(len(loader) - skip, f"Epoch {epoch + 1}/{cfg.epochs}")
    for index, (images, labels) in enumerate(run.timer.timed(loader), start=skip + 1):
        with autocast(cfg, images.device):  # bf16/fp16 where it is safe, fp32 elsewhere (or fp32 throughout)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()  # with fp16 the loss is scaled up so small gradients do not underflow
        run.scaler.step(run.optimizer)  # unscales first, and skips the step if a gradient overflowed
        run.scaler.update()
        run.scheduler.step()
        run.meter.update(loss, logits, labels)
        run.timer.step_done()
        run.step, run.batch = run.step + 1, index
        run.console.update()
        last = index == len(loader) or cfg.reached_max_steps(run.step)
        if index % cfg.log_interval == 0 or last:
            run.epoch_sums += log_window(run, epoch, index)
        if last or run.stop:
            break
        if cfg.checkpoint_interval and run.step % cfg.checkpoint_interval == 0:
            save_checkpoint(run)
    run.console.close()
    return run.epoch_sums


# ---------------------------------------------------------------------------------------------------- main loop
@dataclass
class Run:
    """What the loop carries from step to step, and what a checkpoint saves of it."""
    cfg: Config
    model: torch.nn.Module
    raw_model: torch.nn.Module
    train_loader: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    logger: RunLogger
    timer: StepTimer
    meter: TrainMeter
    telemetry: GpuTelemetry
    console: Console
    signals: StopSignals
    run_dir: Path | None  # where checkpoints go (None: this process writes none)
    clock: RunClock  # the run's wall time and epoch times, over the attempts it is made of
    step: int = 0  # optimizer steps so far
    epoch: int = 0  # the epoch being trained (or to train next)
    batch: int = 0  # batches of that epoch done
    best_acc: float = -1.0  # the best test accuracy so far
    stop: str | None = None  # the signal that asked the run to stop
    totals: Sums = field(default_factory=Sums)  # every log window of the run
    epoch_sums: Sums = field(default_factory=Sums)  # the log windows of the epoch under way
    gpu_util: list = field(default_factory=list)  # every window's utilisation of every GPU


def main(argv=None) -> int:
    started = time.perf_counter()
    cfg = get_config(argv)
    if not launched():  # `python train.py`: start the workers as torchrun would
        return self_launch(cfg, __file__, argv, MODE)
    device, gpus = setup(cfg)
    cfg = resolve_fast_path(cfg, device)  # --amp and --channels_last made explicit for this device
    is_main = dist.get_rank() == 0  # only rank 0 prints and writes: the others get a silent console and logger
    run_dir = resolve_run_dir(cfg, MODE, dist.get_world_size()) if is_main else None
    checkpoint = from_rank0(lambda: resume_checkpoint(cfg, run_dir))  # rank 0 reads it, every rank gets it
    if has_ended(checkpoint, cfg):  # an elastic command run again after the end, say: nothing to train or write
        Console(is_main, bar=False).line(ended_line(checkpoint, cfg))
        return 0
    seed_everything(cfg.seed)
    train_loader, test_loader = get_loaders(cfg, device)
    model, raw_model = get_model(cfg, device)
    if cfg.evaluate:
        load_model_weights(raw_model, cfg.evaluate)
    optimizer, scheduler, scaler = get_optimizer(cfg, raw_model, device, len(train_loader))
    check_fits(checkpoint, raw_model, len(train_loader))  # refused before the run folder is claimed
    resumed_at = checkpoint["step"] if checkpoint else None  # where TensorBoard's curves go on
    logger = on_every_rank(lambda: RunLogger(run_dir, cfg, MODE, dist.get_world_size(), resumed_at))
    console = Console(is_main, bar=cfg.progress)
    if not gpus:  # said here, after every refusal, so that it never stands between a mistake and its error
        console.warn("no CUDA GPU found: training on the CPU")
    console.line(f"{MODE}: PyramidNet-{cfg.depth} alpha={cfg.alpha:g} {cfg.block}, {cfg.dataset}, global batch "
                 f"{cfg.batch_size} = {dist.get_world_size()} x {cfg.batch_size // dist.get_world_size()} over "
                 f"{dist.get_backend()} ({describe_fast_path(cfg)}); {describe_lr(cfg, len(train_loader))}; "
                 f"logs in {run_dir}")
    run = Run(cfg=cfg, model=model, raw_model=raw_model, train_loader=train_loader, optimizer=optimizer,
              scheduler=scheduler, scaler=scaler, logger=logger, timer=StepTimer(device, cfg.warmup_steps, gpus),
              meter=TrainMeter(device), telemetry=GpuTelemetry(gpus), console=console, signals=StopSignals(),
              run_dir=None if cfg.benchmark else run_dir, clock=RunClock(started))
    if checkpoint:
        restore(checkpoint, run, rank=dist.get_rank())  # the same weights and position on every rank
        console.line(f"resumed at step {run.step} (epoch {run.epoch + 1}, batch {run.batch}) from "
                     f"{checkpoint['file']}")
    epoch_sums, test = Sums(), (None, None, 0)
    sync = {"params_in_sync": None, "buffers_max_abs_diff": None}  # checked after training
    try:
        if cfg.evaluate:
            test = evaluate(cfg, raw_model, test_loader, device)
            console.line(f"{cfg.evaluate}: test loss {test[0]:.4f} acc {100 * test[1]:.2f}% ({test[2]} images)")
        for epoch in range(run.epoch, 0 if cfg.evaluate else cfg.epochs):
            run.clock.start_epoch()
            epoch_sums = train_one_epoch(run, epoch)
            if run.stop:  # the stop checkpoint keeps the epoch's time so far, ended or not
                break
            epoch_seconds = run.clock.end_epoch()  # with the time earlier attempts spent on it
            if cfg.verify_sync or epoch + 1 == cfg.epochs or cfg.reached_max_steps(run.step):  # before evaluate()
                sync = verify_sync(raw_model, cfg.sync_bn, is_main)  # aligns the buffers: ranks must agree
            if not cfg.benchmark:  # --benchmark measures training speed only: no evaluation, no checkpoint
                test = evaluate(cfg, raw_model, test_loader, device)
                report_test(run, epoch, test, epoch_seconds)
                save_checkpoint(run, test_acc=test[1])
            if cfg.reached_max_steps(run.step):
                break
        if run.stop:  # SIGTERM/SIGINT: a checkpoint where every rank stopped, then a clean exit
            path = save_checkpoint(run)
            dist.barrier()  # no rank exits before rank 0 has written it: a launcher may kill the job at the first exit
            console.line(stopped_line(run.stop, run.step, path, run_dir))
            report_stop(run.step, path)  # to the self-launch, if that started this worker: it stopped cleanly
            return StopSignals.EXIT_CODES.get(run.stop, 1)  # a signal to another rank: 1
        if cfg.save_model and not cfg.evaluate:
            console.line(f"weights saved to {logger.save_model(raw_model.state_dict())}")
        peaks = by_rank(peak_memory_gb(gpus))  # each rank's GPU, keyed by rank
        summary = {
            **speed_summary(cfg, run.totals, run.timer, device, devices=dist.get_world_size()),
            "gpu_util_mean": sum(run.gpu_util) / len(run.gpu_util) if run.gpu_util else None,
            "peak_mem_gb": max(peaks.values(), default=None), "train_loss": epoch_sums.loss,
            "train_acc": epoch_sums.acc, "test_loss": test[0], "test_acc": test[1], "test_images": test[2] or None,
            "epoch_time_s": run.clock.epoch_time(),  # with wall_time_s: over every attempt
            "wall_time_s": run.clock.wall_time(), "steps": run.step,
            "params_in_sync": sync["params_in_sync"], "buffers_max_abs_diff": sync["buffers_max_abs_diff"]}
        path = logger.write_results(summary, run.clock.attempts,
                                    peak_mem_gb_per_gpu={str(i): gb for i, gb in peaks.items()})
        console.line(speed_line(summary))
        console.line(f"results in {path}")
        return 0
    except LoaderWorkerDied as died:  # the other ranks cannot stop with this one in mid-window: no checkpoint
        raise RunError(f"rank {dist.get_rank()}: {died} at step {run.step}; {last_checkpoint(run.run_dir)}") from None
    except RuntimeError as error:  # a collective whose peer died or stalled: one line naming this rank and step
        failure = group_failure(error, dist.get_rank(), run.step + 1)
        if failure is None:
            raise
        raise failure from None
    # ------------------------------------------------------------------------------------------------ teardown
    finally:
        run.signals.restore()
        run.telemetry.close()
        logger.close()


if __name__ == "__main__":
    with user_errors():
        try:
            sys.exit(main())
        finally:
            if dist.is_initialized():
                gc.collect()  # free DDP's reducer first: alive, it keeps the group's threads past the exit
                dist.destroy_process_group()  # always, even after an error, so no rank is left holding the group
