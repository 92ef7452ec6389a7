r"""Train PyramidNet on CIFAR-10 on one GPU: the reference loop that every other mode changes.

    python train.py                      # CIFAR-10 on GPU 0, PyramidNet-110 alpha=270, batch 128
    python train.py --gpu_devices 3      # on GPU 3
    python train.py --dataset synthetic --synthetic_size 5000 --depth 20 --alpha 24 \
                    --epochs 1   # offline: 5,000 generated images, 1-3 minutes on a CPU
    python train.py --evaluate ../runs/<run>/model.pt   # test loss and accuracy of saved weights

It runs from this folder or from the repository root (`python single_gpu/train.py`); without a GPU
it trains on the CPU. `--batch_size` is the global batch, as in every mode. `python train.py --help`
lists every flag. Read it in order: setup, data, model, optimizer, the loop (`train_one_epoch`),
then `main`: prepare, train, finish.
"""
# ------------------------------------------------------------------------------------------ imports
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python train.py` finds common/

import torch
import torch.nn.functional as F

from common.augmentation import augmentation
from common.checkpoint import (StopSignals, check_fits, ended_line, has_ended, last_checkpoint_note,
                               resume_checkpoint, stopped_line, until_stopped)
from common.checkpoint import continue_flags  # the flags that continue a stopped run, quoted
from common.config import Config, parse_config
from common.data import dataset_info, image_size, load_datasets
from common.devices import seed_everything
from common.devices import cuda_devices, one_process  # one process, and the GPUs it drives
from common.errors import RunError, UsageError, user_errors
from common.loaders import make_loader
from common.logger import Console, RunLogger, load_model_weights, resolve_run_dir, start_line
from common.loop import Run, save_checkpoint
from common.metrics import Sums, evaluation_sums, fresh_batchnorm_statistics, window_sums
from common.optim import build_optimizer, lr_schedule
from common.performance import autocast, grad_scaler, memory_format, resolve_fast_path
from common.rules import per_process_batch
from common.samplers import EvalShard
from common.samplers import ShuffleSampler  # one process's order of every epoch
from common.workers import LoaderWorkerDied
from models import build_model

MODE = "single_gpu"


# ------------------------------------------------------------------------------------------- config
def get_config(argv=None) -> Config:
    return parse_config(Config, argv, description=__doc__)


# -------------------------------------------------------------------------------------------- setup
def setup(cfg: Config):
    """The device to train on, and the CUDA ids it uses ([] on the CPU)."""
    one_process(MODE)  # torchrun starting several of it: refused
    if cfg.gpu_devices and len(set(cfg.gpu_devices)) > 1:
        raise UsageError("single_gpu trains on one GPU: for several use data_parallel/train.py or "
                         "dist_parallel/train.py")
    gpus = cuda_devices(cfg.gpu_devices, default_all=False)
    if gpus:
        torch.cuda.set_device(gpus[0])
    device = torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")
    return device, gpus


# --------------------------------------------------------------------------------------------- data
def get_loaders(cfg: Config, device: torch.device):
    train_set, test_set = load_datasets(cfg.dataset, cfg.data_dir, cfg.synthetic_size,
                                        cfg.seed, image_size(cfg))
    batch = per_process_batch(cfg.batch_size, 1, len(train_set))  # one process: the whole batch
    kind = cfg.loader  # gpu, or torchvision: resolve_fast_path chose it for this device
    options = dict(augment=augmentation(cfg), num_workers=cfg.num_workers, seed=cfg.seed,
                   memory_format=memory_format(cfg))
    train_sampler = ShuffleSampler(len(train_set), cfg.shuffle, cfg.seed)  # epoch: start_epoch's
    train_loader = make_loader(kind, train_set, train_sampler, batch, device, train=True, **options)
    test_shard = EvalShard(len(test_set))
    test_loader = make_loader(kind, test_set, test_shard, batch, device, train=False, **options)
    return train_loader, test_loader


# -------------------------------------------------------------------------------------------- model
def get_model(cfg: Config, device: torch.device):
    """The model to call, and the unwrapped one whose weights are saved and evaluated."""
    raw_model = build_model(cfg, dataset_info(cfg))  # --model, for the images' shape and classes
    raw_model = raw_model.to(device, memory_format=memory_format(cfg))
    model = raw_model  # one device: nothing to wrap
    if cfg.compile:  # compiled in the first step; raw_model (evaluation, saving) stays eager
        model = torch.compile(model, mode=cfg.compile_mode)  # reduce-overhead: CUDA graphs
    return model, raw_model


# ---------------------------------------------------------------------------------------- optimizer
def get_optimizer(cfg: Config, raw_model: torch.nn.Module, device: torch.device, steps_per_epoch):
    """SGD, its learning-rate schedule, and fp16's loss scaler (a pass-through in bf16 and fp32)."""
    optimizer = build_optimizer(raw_model, cfg, device)
    return optimizer, lr_schedule(optimizer, cfg, steps_per_epoch), grad_scaler(cfg, device)


# --------------------------------------------------------------------------------- train / evaluate
def train_one_epoch(run: Run, epoch: int) -> None:
    """One pass over the training set (the rest of it, when resumed mid-epoch), or up to
    --max_steps, or until a stop signal; a host sync only at the end of each log window and at
    checkpoints."""
    cfg = run.cfg
    model = run.model
    loader = run.train_loader
    model.train()
    skip = run.batch if epoch == run.epoch else 0  # batches a resumed epoch had already trained on
    run.epoch = epoch
    run.batch = skip
    loader.start_epoch(epoch, skip)  # this epoch's augmentation, from where a resumed epoch was
    if not skip:  # a resumed epoch goes on from the log windows its checkpoint had counted
        run.epoch_sums = Sums()
    run.console.start(len(loader) - skip, f"Epoch {epoch + 1}/{cfg.epochs}")
    for index, (images, labels) in enumerate(run.timer.timed(loader), start=skip + 1):
        with autocast(cfg, images.device):  # bf16/fp16 where it is safe, fp32 elsewhere
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()  # fp16: scaled up so small gradients do not underflow
        run.scaler.step(run.optimizer)  # unscales first; skips the step if a gradient overflowed
        run.scaler.update()
        run.scheduler.step()
        run.meter.update(loss, logits, labels)
        run.timer.step_done()
        run.step += 1
        run.batch = index
        run.console.update()
        last = index == len(loader) or cfg.reached_max_steps(run.step)
        checkpoint_due = cfg.checkpoint_interval and run.step % cfg.checkpoint_interval == 0
        if index % cfg.log_interval == 0 or last or checkpoint_due:  # a checkpoint ends a window:
            run.epoch_sums += log_window(run, epoch, index)  # it holds every step's figures
        if last or run.stop:
            break
        if checkpoint_due:
            save_checkpoint(run)  # every rank: collectives inside, in a group; rank 0 writes it
    run.console.close()


def log_window(run: Run, epoch: int, index: int) -> Sums:
    """Read the window's totals (one host sync), report them, and take note of a stop signal."""
    totals = window_sums(run.meter, run.timer)  # this window's figures, on the device
    sums = Sums(totals.tolist())
    gpu = run.telemetry.window()
    run.record_window(epoch, index, sums, gpu)  # the totals, a NaN check, TensorBoard, the log
    run.stop = run.signals.received
    return sums


@torch.no_grad()
def evaluate(cfg: Config, raw_model: torch.nn.Module, loader, device: torch.device, signals=None):
    """Test loss and accuracy over every test image exactly once, how many images that was, and
    the top-5 accuracy; with `signals` (--evaluate), a stop signal ends it between two batches."""
    raw_model.eval()
    batches = until_stopped(loader, signals)  # --evaluate: a stop signal ends it between batches
    with autocast(cfg, device):
        sums = evaluation_sums(raw_model, batches, device)
    loss_sum, correct, correct_top5, images = sums.tolist()
    return loss_sum / images, correct / images, int(images), correct_top5 / images


# ---------------------------------------------------------------------------------------- main loop
def prepare(cfg: Config, started: float) -> tuple[Run | None, object]:
    """Everything before the first step, every refusal before anything is written: the device,
    the run folder and a checkpoint to resume, the data, the model, the optimizer. No run: the run
    had ended already."""
    device, gpus = setup(cfg)
    cfg = resolve_fast_path(cfg, device)  # --amp, --channels_last, --loader made explicit here
    is_main = True  # one process: it prints and writes the files
    run_dir = resolve_run_dir(cfg, MODE, len(gpus))
    checkpoint = resume_checkpoint(cfg, run_dir)  # read and checked before anything is written
    if has_ended(checkpoint, cfg):  # an elastic command run again after the end, say: nothing to do
        Console(is_main, bar=False).line(ended_line(checkpoint, cfg))
        return None, None
    seed_everything(cfg.seed)
    train_loader, test_loader = get_loaders(cfg, device)
    model, raw_model = get_model(cfg, device)
    if cfg.evaluate:
        load_model_weights(raw_model, cfg.evaluate)
    optimizer, scheduler, scaler = get_optimizer(cfg, raw_model, device, len(train_loader))
    check_fits(checkpoint, raw_model, len(train_loader))  # refused before the run folder is claimed
    resumed_at = checkpoint["step"] if checkpoint else None  # where TensorBoard's curves go on
    logger = RunLogger(run_dir, cfg, MODE, world_size=1, resumed_step=resumed_at)
    console = Console(is_main, bar=cfg.progress)
    if not gpus:  # said after every refusal: it never stands between a mistake and its error
        console.warn("no CUDA GPU found: running on the CPU")
    placement = f"on {device}"
    console.line(start_line(MODE, cfg, placement, len(train_loader), run_dir))
    run = Run.start(cfg, device, gpus, started, model=model, raw_model=raw_model,
                    train_loader=train_loader, optimizer=optimizer, scheduler=scheduler,
                    scaler=scaler, logger=logger, console=console, run_dir=run_dir)
    if checkpoint:
        run.resume(checkpoint, rank=0)
    return run, test_loader


def train(run: Run, test_loader) -> None:
    """Every epoch left, each followed by an evaluation and a checkpoint; or --evaluate's one."""
    cfg = run.cfg
    if cfg.evaluate:
        test_batches = run.console.counted(test_loader, "Test")  # a bar, as training's
        run.record_evaluation(evaluate(cfg, run.raw_model, test_batches, run.device, run.signals))
        return
    for epoch in range(run.epoch, cfg.epochs):
        if not run.end_owed:  # else a stop at its last window left it trained but not ended
            run.clock.start_epoch()
            train_one_epoch(run, epoch)
            if run.stop:  # the stop checkpoint keeps the epoch's time so far, ended or not
                return
        epoch_seconds = run.end_epoch()  # over every attempt; paused if --max_steps cut it short
        if not cfg.benchmark:  # --benchmark measures speed only: no evaluation, no checkpoint
            fresh_batchnorm_statistics(cfg, run.raw_model, run.train_loader, epoch,
                                       autocast(cfg, run.device))  # image folders: of these weights
            test_batches = run.console.counted(test_loader, f"Test {epoch + 1}/{cfg.epochs}")
            test = evaluate(cfg, run.raw_model, test_batches, run.device)
            run.record_test(epoch, test, epoch_seconds)
            save_checkpoint(run, test_acc=run.test[1])  # every rank: collectives inside, in a group
        if cfg.reached_max_steps(run.step):
            return


def finish(run: Run) -> int:
    """After the last step: a stop checkpoint, or the weights and the results; the exit status."""
    if run.stop:  # SIGTERM, SIGINT, SIGHUP or SIGUSR1: a checkpoint, then a clean exit
        path = save_checkpoint(run)  # every rank: collectives inside, in a group; rank 0 writes it
        run.console.line(stopped_line(run.stop, run.step, path, run.run_dir, run.owed))
        return StopSignals.EXIT_CODES[run.stop]
    if run.cfg.save_model and not run.cfg.evaluate:
        run.console.line(f"weights saved to {run.logger.save_model(run.raw_model.state_dict())}")
    run.write_results(devices=1)
    return 0


def main(argv=None) -> int:
    started = time.perf_counter()
    cfg = get_config(argv)
    run, test_loader = prepare(cfg, started)
    if run is None:
        return 0
    try:
        train(run, test_loader)
        return finish(run)
    except LoaderWorkerDied as died:  # found between two steps: the run stops as if signalled
        if run.meter.images:  # at a window's end, so that the checkpoint holds every step's figures
            run.epoch_sums += log_window(run, run.epoch, run.batch)
        save_checkpoint(run)
        note = last_checkpoint_note(run.checkpoint_dir)
        raise RunError(f"{died}; stopped at step {run.step}: {note}, continue with "
                       f"{continue_flags(run.run_dir)}") from None
    # ------------------------------------------------------------------------------------- teardown
    finally:
        run.close()


if __name__ == "__main__":
    with user_errors():
        sys.exit(main())
