"""Train PyramidNet on CIFAR-10 with nn.DataParallel: single_gpu/train.py plus the wrapper, nothing else.

    python train.py                                    # every visible GPU, PyramidNet-110 alpha=270, batch 128
    python train.py --gpu_devices 0 1 2 3 --batch_size 512   # four GPUs, 128 images each
    python train.py --dataset synthetic --depth 20 --alpha 24 --epochs 1     # offline; minutes on a CPU
    python train.py --evaluate ../runs/<run>/model.pt  # test loss and accuracy of saved weights

One process drives every GPU: each step, DataParallel copies the weights from the first listed GPU to the others,
splits the global batch across them, runs the replicas in threads and gathers the outputs back on the first GPU.
It runs from this folder or from the repository root (`python data_parallel/train.py`); without a GPU it trains
on the CPU, where DataParallel wraps nothing. `--batch_size` is the global batch, as in every mode.
`python train.py --help` lists every flag.
"""
# ---------------------------------------------------------------------------------------------------- imports
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # so `python train.py` finds common/ and models/

import torch
import torch.nn.functional as F
from torch import nn

from common.checkpoint import (StopSignals, check_fits, ended_line, has_ended, last_checkpoint,
                               restore, resume_checkpoint, save_checkpoint, stopped_line)
from common.config import Config, RunError, UsageError, parse_config, user_errors
from common.data import DATASET_INFO, EvalShard, LoaderWorkerDied, ShuffleSampler, load_datasets, make_loader
from common.devices import cuda_devices, one_process, seed_everything
from common.logger import (Console, RunLogger, load_model_weights, report_test, report_window, resolve_run_dir,
                           speed_line)
from common.metrics import (RunClock, StepTimer, Sums, TrainMeter, check_loss, evaluation_sums,
                            window_sums)
from common.optim import build_optimizer, describe_lr, lr_schedule
from common.performance import (autocast, describe_fast_path, grad_scaler, memory_format, resolve_fast_path,
                                speed_summary)
from common.performance import AutocastForward  # DataParallel's replica threads need autocast inside the forward
from common.telemetry import GpuTelemetry, peak_memory_gb
from models import pyramidnet

MODE = "data_parallel"


# ---------------------------------------------------------------------------------------------------- config
def get_config(argv=None) -> Config:
    return parse_config(Config, argv, description=__doc__)


# ---------------------------------------------------------------------------------------------------- setup
def setup(cfg: Config):
    """The device to train on, and the CUDA ids it uses ([] on the CPU)."""
    one_process(MODE)  # torchrun starting several of it: refused
    gpus = cuda_devices(cfg.gpu_devices, default_all=True)  # DataParallel: every visible GPU unless told
    if cfg.compile and len(gpus) > 1:  # TorchDynamo does not trace the replica threads: nothing would be compiled
        raise UsageError(f"--compile with DataParallel on {len(gpus)} GPUs would compile nothing (TorchDynamo "
                         f"does not trace DataParallel's replica threads): leave it out, or use dist_parallel")
    if gpus:
        torch.cuda.set_device(gpus[0])
    # the batches and the master weights live on the first listed GPU
    return (torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")), gpus


# ---------------------------------------------------------------------------------------------------- data
def get_loaders(cfg: Config, device: torch.device):
    train_set, test_set = load_datasets(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed)
    if cfg.batch_size > len(train_set):
        raise UsageError(f"--batch_size {cfg.batch_size} is larger than the training set ({len(train_set)} "
                         f"images); use a smaller batch")
    kind = cfg.loader or ("gpu" if device.type == "cuda" else "torchvision")
    options = dict(augment=cfg.augment, num_workers=cfg.num_workers, seed=cfg.seed,
                   memory_format=memory_format(cfg))
    train_sampler = ShuffleSampler(len(train_set), cfg.shuffle, cfg.seed)
    train_loader = make_loader(kind, train_set, train_sampler, cfg.batch_size, device, train=True, **options)
    test_loader = make_loader(kind, test_set, EvalShard(len(test_set)), cfg.batch_size, device, train=False,
                              **options)
    return train_loader, test_loader


# ---------------------------------------------------------------------------------------------------- model
def get_model(cfg: Config, device: torch.device, gpus: list[int]):
    """The model to call, and the unwrapped one whose weights are saved and evaluated."""
    data = DATASET_INFO[cfg.dataset]  # the images' channels and the classes
    raw_model = pyramidnet(cfg.depth, cfg.alpha, cfg.block, num_classes=data.classes, in_channels=data.channels,
                           width_multiple=cfg.width_multiple)
    raw_model = raw_model.to(device, memory_format=memory_format(cfg))
    # splits each global batch over the GPUs; each replica's thread enters the run's autocast itself
    model = nn.DataParallel(AutocastForward(raw_model, cfg), device_ids=gpus or None)
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


def log_window(run, epoch: int, index: int) -> Sums:
    """Read the window's totals (one host sync), report them, stop on a NaN loss, and take note of a stop signal."""
    sums = Sums(window_sums(run.meter, run.timer).tolist())
    gpu = run.telemetry.window()
    run.totals += sums
    run.gpu_util += [util for util, _ in gpu.values() if util is not None]
    check_loss(sums, run.meter, run.step, last_checkpoint(run.run_dir))  # before NaNs reach the logs
    report_window(run, epoch, index, sums, gpu)
    run.stop = run.signals.received
    return sums


@torch.no_grad()
def evaluate(cfg: Config, raw_model: torch.nn.Module, loader, device: torch.device) -> tuple[float, float, int]:
    """Test loss and accuracy over every test image exactly once, and how many images that was."""
    raw_model.eval()
    with autocast(cfg, device):
        loss_sum, correct, images = evaluation_sums(raw_model, loader, device).tolist()
    return loss_sum / images, correct / images, int(images)


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
    device, gpus = setup(cfg)
    cfg = resolve_fast_path(cfg, device)  # --amp and --channels_last made explicit for this device
    run_dir = resolve_run_dir(cfg, MODE, len(gpus))
    checkpoint = resume_checkpoint(cfg, run_dir)  # read and checked before anything is written
    if has_ended(checkpoint, cfg):  # an elastic command run again after the end, say: nothing to train or write
        Console(enabled=True, bar=False).line(ended_line(checkpoint, cfg))
        return 0
    seed_everything(cfg.seed)
    train_loader, test_loader = get_loaders(cfg, device)
    model, raw_model = get_model(cfg, device, gpus)
    if cfg.evaluate:
        load_model_weights(raw_model, cfg.evaluate)
    optimizer, scheduler, scaler = get_optimizer(cfg, raw_model, device, len(train_loader))
    check_fits(checkpoint, raw_model, len(train_loader))  # refused before the run folder is claimed
    resumed_at = checkpoint["step"] if checkpoint else None  # where TensorBoard's curves go on
    logger = RunLogger(run_dir, cfg, MODE, world_size=1, resumed_step=resumed_at)
    console = Console(enabled=True, bar=cfg.progress)
    if not gpus:  # said here, after every refusal, so that it never stands between a mistake and its error
        console.warn("no CUDA GPU found: training on the CPU (DataParallel wraps nothing)")
    console.line(f"{MODE}: PyramidNet-{cfg.depth} alpha={cfg.alpha:g} {cfg.block}, {cfg.dataset}, global batch "
                 f"{cfg.batch_size} on {device} ({describe_fast_path(cfg)}); {describe_lr(cfg, len(train_loader))}; "
                 f"logs in {run_dir}")
    run = Run(cfg=cfg, model=model, raw_model=raw_model, train_loader=train_loader, optimizer=optimizer,
              scheduler=scheduler, scaler=scaler, logger=logger, timer=StepTimer(device, cfg.warmup_steps, gpus),
              meter=TrainMeter(device), telemetry=GpuTelemetry(gpus), console=console, signals=StopSignals(),
              run_dir=None if cfg.benchmark else run_dir, clock=RunClock(started))
    if checkpoint:
        restore(checkpoint, run, rank=0)
        console.line(f"resumed at step {run.step} (epoch {run.epoch + 1}, batch {run.batch}) from "
                     f"{checkpoint['file']}")
    epoch_sums, test = Sums(), (None, None, 0)
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
            if not cfg.benchmark:  # --benchmark measures training speed only: no evaluation, no checkpoint
                test = evaluate(cfg, raw_model, test_loader, device)
                report_test(run, epoch, test, epoch_seconds)
                save_checkpoint(run, test_acc=test[1])
            if cfg.reached_max_steps(run.step):
                break
        if run.stop:  # SIGTERM/SIGINT: a checkpoint where every rank stopped, then a clean exit
            path = save_checkpoint(run)
            console.line(stopped_line(run.stop, run.step, path, run_dir))
            return StopSignals.EXIT_CODES[run.stop]
        if cfg.save_model and not cfg.evaluate:
            console.line(f"weights saved to {logger.save_model(raw_model.state_dict())}")
        peaks = peak_memory_gb(gpus)
        summary = {
            **speed_summary(cfg, run.totals, run.timer, device, devices=max(len(gpus), 1)),
            "gpu_util_mean": sum(run.gpu_util) / len(run.gpu_util) if run.gpu_util else None,
            "peak_mem_gb": max(peaks.values(), default=None), "train_loss": epoch_sums.loss,
            "train_acc": epoch_sums.acc, "test_loss": test[0], "test_acc": test[1], "test_images": test[2] or None,
            "epoch_time_s": run.clock.epoch_time(),  # with wall_time_s: over every attempt
            "wall_time_s": run.clock.wall_time(), "steps": run.step}
        path = logger.write_results(summary, run.clock.attempts,
                                    peak_mem_gb_per_gpu={str(i): gb for i, gb in peaks.items()})
        console.line(speed_line(summary))
        console.line(f"results in {path}")
        return 0
    except LoaderWorkerDied as died:  # found between two steps: the run is whole, so it stops as if signalled
        save_checkpoint(run)
        raise RunError(f"{died}; stopped at step {run.step}: {last_checkpoint(run.run_dir)}, continue with "
                       f"--resume auto --run_name {run_dir.name}") from None
    # ------------------------------------------------------------------------------------------------ teardown
    finally:
        run.signals.restore()
        run.telemetry.close()
        logger.close()


if __name__ == "__main__":
    with user_errors():
        sys.exit(main())
