r"""Train PyramidNet on CIFAR-10 with DistributedDataParallel: a process per GPU, one node or many.

    torchrun --standalone --nproc_per_node 4 train.py --batch_size 512   # 4 GPUs, 128 images each
    python train.py --dataset synthetic --synthetic_size 5000 --depth 20 --alpha 24 \
                    --epochs 1 --nproc_per_node 2   # 2 CPU workers, offline, a minute or two
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_id JOB --rdzv_backend c10d \
             --rdzv_endpoint HOST:29500 train.py --batch_size 2048   # on each of two nodes
    python train.py --evaluate ../runs/<run>/model.pt   # test loss and accuracy of saved weights

single_gpu/train.py plus DDP's lines, each with its comment: the rank from the environment, the
process group, DistributedSampler, set_epoch, DDP, all-reduced sums, rank 0's files; without a GPU
it trains on the CPU. `--batch_size` is the global batch, as in every mode. `python train.py --help`
lists every flag. Read it in order: setup, data, model, optimizer, the loop (`train_one_epoch`),
then `main`: prepare, train, finish. A comment that begins `robustness:` marks a line that is
there so that a failure, a signal or a bad launch ends cleanly; `telemetry:`, one there to measure
the run; `convenience:`, `python train.py` starting its own workers: skip those on a first read.
"""
# ------------------------------------------------------------------------------------------ imports
import gc
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python train.py` finds common/

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from common.augmentation import augmentation
from common.checkpoint import (StopSignals, check_fits, ended_line, has_ended, last_checkpoint_note,
                               resume_checkpoint, stopped_line, until_any_rank_stopped)
from common.config import Config, GroupConfig, flag, parse_config
from common.data import dataset_info, image_size, load_datasets
from common.devices import seed_everything
from common.errors import RunError, user_errors
from common.guards import (broadcast_from_rank0, compile_leader, local_rank0_first,
                           raise_group_failure, exit_together_if_rank0_refused)
from common.launcher import CheckedLaunch, self_launch, tell_self_launch_stopped
from common.loaders import make_loader
from common.logger import Console, RunLogger, load_model_weights, resolve_run_dir, start_line
from common.loop import Run, save_checkpoint
from common.metrics import Sums, evaluation_sums, fresh_batchnorm_statistics, window_sums
from common.optim import build_optimizer, lr_schedule
from common.performance import autocast, grad_scaler, memory_format, resolve_fast_path
from common.rules import per_process_batch
from common.samplers import EvalShard
from common.sync_check import verify_sync
from common.workers import LoaderWorkerDied
from models import build_model

MODE = "dist_parallel"


# ------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class DistConfig(GroupConfig):  # the process group's flags (common/config.py), and DDP's own
    sync_bn: bool = flag(False, "BatchNorm statistics over the global batch (SyncBatchNorm; GPUs "
                                "only)")
    bucket_cap_mb: float = flag(25.0, "DDP gradient bucket size: each full bucket is all-reduced "
                                      "while backward goes on", above=0, at_most=8e12)  # fits int64


def get_config(argv=None) -> Config:
    return parse_config(DistConfig, argv, description=__doc__)


# -------------------------------------------------------------------------------------------- setup
def setup(cfg: DistConfig):
    """The device to train on, and the CUDA ids it uses ([] on the CPU)."""
    launch = CheckedLaunch(cfg, MODE)  # robustness: a bad launch in one line; torchrun restarts
    rank = int(os.environ["RANK"])  # this process's place among all the job's processes
    local_rank = launch.local_rank  # its place on this node: LOCAL_RANK (in a pod, RANK % GPUs)
    world_size = int(os.environ["WORLD_SIZE"])  # how many processes the job has
    gpus = launch.node_gpus[local_rank:local_rank + 1]  # the local_rank-th GPU, before the group
    if gpus:
        torch.cuda.set_device(gpus[0])
    backend = cfg.backend or ("nccl" if gpus else "gloo")
    bound_to = torch.device("cuda", gpus[0]) if backend == "nccl" else None  # NCCL: this GPU
    with launch:  # robustness: a failed rendezvous in one line; a store of its own after a restart
        dist.init_process_group(backend, init_method=launch.init_method, store=launch.store,
                                rank=rank, world_size=world_size, timeout=launch.timeout,
                                device_id=bound_to)
    device = torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")
    return device, gpus


# --------------------------------------------------------------------------------------------- data
def get_loaders(cfg: Config, device: torch.device):
    with local_rank0_first():  # one download per node: the node's other ranks wait at a barrier
        train_set, test_set = load_datasets(cfg.dataset, cfg.data_dir, cfg.synthetic_size,
                                            cfg.seed, image_size(cfg))
    batch = per_process_batch(cfg.batch_size, dist.get_world_size(), len(train_set))  # split
    kind = cfg.loader  # gpu, or torchvision: resolve_fast_path chose it for this device
    options = dict(augment=augmentation(cfg), num_workers=cfg.num_workers, seed=cfg.seed,
                   memory_format=memory_format(cfg))
    # each rank's share of every epoch (rank, world size: the group's), all from one shuffle
    train_sampler = DistributedSampler(train_set, shuffle=cfg.shuffle, seed=cfg.seed)
    train_loader = make_loader(kind, train_set, train_sampler, batch, device, train=True, **options)
    test_shard = EvalShard(len(test_set), dist.get_rank(), dist.get_world_size())  # each image once
    test_loader = make_loader(kind, test_set, test_shard, batch, device, train=False, **options)
    return train_loader, test_loader


# -------------------------------------------------------------------------------------------- model
def get_model(cfg: DistConfig, device: torch.device):
    """The model to call, and the unwrapped one whose weights are saved and evaluated."""
    raw_model = build_model(cfg, dataset_info(cfg))  # --model, for the images' shape and classes
    raw_model = raw_model.to(device, memory_format=memory_format(cfg))
    if cfg.sync_bn:  # BatchNorm statistics over the global batch: an all-reduce in every BN forward
        raw_model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(raw_model)
    # DDP broadcasts rank 0's weights now, then all-reduces (averages) gradients in buckets during
    # backward. gradient_as_bucket_view: gradients live in the buckets (no copy); static_graph: the
    # same graph every step, a promise (find_unused_parameters: off); off under torch.compile's DDP
    model = DDP(raw_model, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=True,
                static_graph=not cfg.compile)
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
    ranks = gather_by_rank({0: Sums(totals.tolist())})  # telemetry: each rank's own, rank/<r>/
    dist.all_reduce(totals)  # every rank's loss, correct predictions, images and seconds, added up
    sums = Sums(totals.tolist()).mean_time(dist.get_world_size())  # each rank timed the same steps
    gpu = gather_by_rank(run.telemetry.window())  # telemetry: every rank's GPU, keyed by rank
    stop = totals.new_tensor(run.signals.vote())  # robustness: 1 for a stop signal to this rank
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # robustness: a signal to any rank stops them all
    run.record_window(epoch, index, sums, gpu, ranks)  # the totals, a NaN check, TensorBoard, log
    run.stop = StopSignals.agreed(stop.tolist())  # robustness: the same signal on every rank
    return sums


@torch.no_grad()
def evaluate(cfg: Config, raw_model: torch.nn.Module, loader, device: torch.device, signals=None):
    """Test loss and accuracy over every test image exactly once, how many images that was, and
    the top-5 accuracy; with `signals` (--evaluate), a stop signal ends it between two batches."""
    raw_model.eval()
    for buffer in raw_model.buffers():  # not DDP's forward: a sync per batch, on unequal shards;
        dist.broadcast(buffer, src=0)  # rank 0's BatchNorm statistics: those of the saved weights
    # robustness: --evaluate's stop signal to any rank ends every rank's at the same batch
    batches = until_any_rank_stopped(loader, signals, device)
    with autocast(cfg, device):
        sums = evaluation_sums(raw_model, batches, device)
    dist.all_reduce(sums)  # each rank evaluated its shard: summed, every test image counts once
    loss_sum, correct, correct_top5, images = sums.tolist()
    return loss_sum / images, correct / images, int(images), correct_top5 / images


# telemetry: each rank's {gpu: value}, as {rank: value} on every rank
def gather_by_rank(per_gpu: dict) -> dict:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, per_gpu)  # one GPU per rank: one value each
    return {rank: value for rank, values in enumerate(gathered) for value in values.values()}


# ---------------------------------------------------------------------------------------- main loop
def prepare(cfg: DistConfig, started: float) -> tuple[Run | None, object]:
    """Everything before the first step, every refusal before anything is written: the device,
    the run folder and a checkpoint to resume, the data, the model, the optimizer. No run: the run
    had ended already."""
    device, gpus = setup(cfg)
    cfg = resolve_fast_path(cfg, device)  # --amp, --channels_last, --loader made explicit here
    is_main = dist.get_rank() == 0  # rank 0 prints and writes the files: the others have no folder
    run_dir = resolve_run_dir(cfg, MODE, dist.get_world_size()) if is_main else None
    checkpoint = broadcast_from_rank0(lambda: resume_checkpoint(cfg, run_dir))  # rank 0 reads it
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
    with exit_together_if_rank0_refused():  # robustness: rank 0's refusal ends every rank
        logger = RunLogger(run_dir, cfg, MODE, dist.get_world_size(), resumed_at)
    console = Console(is_main, bar=cfg.progress)
    if not gpus:  # said after every refusal: it never stands between a mistake and its error
        console.warn("no CUDA GPU found: running on the CPU")
    placement = f"= {dist.get_world_size()} x {train_loader.batch_size} over {dist.get_backend()}"
    console.line(start_line(MODE, cfg, placement, len(train_loader), run_dir))
    run = Run.start(cfg, device, gpus, started, model=model, raw_model=raw_model,
                    train_loader=train_loader, optimizer=optimizer, scheduler=scheduler,
                    scaler=scaler, logger=logger, console=console, run_dir=run_dir)
    if checkpoint:
        run.resume(checkpoint, rank=dist.get_rank())  # the same weights and position on every rank
    # telemetry: one cold compile per node, the others' wait for it timed apart; every rank
    # calls it (collectives inside)
    if cfg.compile:
        run.timer.compiling.follow(compile_leader(device, cfg.dist_timeout))
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
            run.train_loader.sampler.set_epoch(epoch)  # this epoch's shuffle, alike on every rank
            train_one_epoch(run, epoch)
            if run.stop:  # the stop checkpoint keeps the epoch's time so far, ended or not
                return
        epoch_seconds = run.end_epoch()  # over every attempt; paused if --max_steps cut it short
        # telemetry: are the ranks' weights equal? Every rank asks (collectives inside), before
        # evaluate() aligns the BatchNorm buffers
        if cfg.verify_sync or epoch + 1 == cfg.epochs or cfg.reached_max_steps(run.step):
            run.sync = verify_sync(run.raw_model, cfg.sync_bn, is_main=dist.get_rank() == 0)
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
        if dist.get_rank() == 0:  # robustness: to the self-launch, if that started this worker
            tell_self_launch_stopped(run.step, path)
        dist.barrier()  # robustness: no rank exits before rank 0 wrote it (a launcher ends the job)
        run.console.line(stopped_line(run.stop, run.step, path, run.run_dir, run.owed))
        return StopSignals.EXIT_CODES[run.stop]
    if run.cfg.save_model and not run.cfg.evaluate and dist.get_rank() == 0:  # rank 0 writes them
        run.console.line(f"weights saved to {run.logger.save_model(run.raw_model.state_dict())}")
    records = [None] * dist.get_world_size()  # telemetry: one record per rank, in rank order
    dist.all_gather_object(records, run.rank_record())  # telemetry: peaks, compile wait, profile
    if dist.get_rank() == 0:  # rank 0 writes results.json and the traces, over all the ranks
        run.write_results(dist.get_world_size(), records=records)
    return 0


def main(argv=None) -> int:
    started = time.perf_counter()
    cfg = get_config(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # convenience: `python train.py`
        return self_launch(cfg, __file__, argv, MODE)  # starts the workers as torchrun would
    run, test_loader = prepare(cfg, started)
    if run is None:
        return 0
    try:
        train(run, test_loader)
        return finish(run)
    except LoaderWorkerDied as died:  # robustness: the others cannot stop with it: no checkpoint
        note = last_checkpoint_note(run.checkpoint_dir)
        raise RunError(f"rank {dist.get_rank()}: {died} at step {run.step}; {note}") from None
    except RuntimeError as error:  # robustness: a collective whose peer died or stalled: one line
        raise_group_failure(error, dist.get_rank(), run.step + 1)
        raise
    # ------------------------------------------------------------------------------------- teardown
    finally:
        run.close()


if __name__ == "__main__":
    with user_errors():
        try:
            sys.exit(main())
        finally:  # always, even after an error, so that no rank is left holding the group
            if dist.is_initialized():
                gc.collect()  # robustness: the wrapped model lets go of the group first, so that
                dist.destroy_process_group()  # the group's threads end before Python does
