"""compare.py --verify: the checks the tests run on the CPU, run on this machine, each with the
figure it measured, its tolerance and its verdict.

Every run is started as compare.py starts its matrix (its own subprocess, logs/, runs/,
--run_timeout), with the same model, data, global batch and seed, for --max_steps steps (default 24)
and enough epochs to reach them. N is the largest --gpu_counts: every GPU here, or 2 CPU processes
over gloo without GPUs. The checks:

1. single_gpu, data_parallel on one device, and dist_parallel and fsdp with one
   process end with the same weights.
Checks 2 to 5 run for dist_parallel and for fsdp, each as --modes has them:
2. N processes end where one process ends that averages the losses of the N per-rank shares of
   every global batch, each share through its own forward pass, as each rank's BatchNorm sees only
   its share (`reference_training`). With --sync_bn on: dist_parallel's N processes with
   SyncBatchNorm end where one ends.
3. The N-process run's model.pt evaluated by 1, 2 and N processes (and 3 on the CPU) gives the same
   accuracy and loss, every test image counted once.
4. Every N-process run ends with bit-identical parameters on every rank (its end-of-run sync check;
   fsdp's gathers each parameter whole from the ranks' slices).
5. The N-process run stopped halfway and continued with `--resume auto` ends where the uninterrupted
   run ends (the halves started as `python <mode>/train.py --nproc_per_node N`, the uninterrupted
   run by torchrun). With both modes, each continues the other's halfway checkpoint (in that run's
   folder): the checkpoint is one format, whole tensors, whichever mode wrote it. fsdp continues
   without resharding after forward (ZeRO-2; its other runs reshard, ZeRO-3), so its check 5 holds
   both ways of sharding to the same weights.

The verdicts are printed, and written with their figures and the reasons for each tolerance to
verify.md and verify.json in the --out folder. tests/test_parallel.py runs `compare.py
--verify` on the CPU and asserts on it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from common.command_line import config_argv
from common.config import Config, UsageError
from common.augmentation import augmentation
from common.data import dataset_info, image_size, load_datasets
from common.folders import image_folder
from common.loaders import make_loader
from common.devices import seed_everything
from common.optim import build_optimizer, lr_schedule
from common.performance import autocast, grad_scaler, memory_format, resolve_fast_path
from comparison.matrix import GROUP_MODES, PlannedRun, check_runs, command, cpu_threads
from comparison.report import Outcome, fmt_seconds, model_title, write_file
from comparison.runner import run_all, signal_name, signals_deferred, start
from models import build_model

DEFAULT_STEPS = 24


def defaults(cuda: bool) -> dict:
    """The train.py flags --verify sets unless given: synthetic data (offline, nothing to download);
    without GPUs, beside compare.py's CPU defaults, 266 training images (8 steps per epoch for 1 or
    2 processes) and 53 test images, a prime, so that no number of processes divides them and every
    evaluation of check 3 has shards of unequal size."""
    return {"dataset": "synthetic", **({} if cuda else {"synthetic_size": 266})}


# synthetic: --synthetic_size; imagefolder: counted
TRAIN_IMAGES = {"cifar10": 50_000, "mnist": 60_000}
# synthetic: a fifth of --synthetic_size; imagefolder: counted
TEST_IMAGES = {"cifar10": 10_000, "mnist": 10_000}


# ---------------------------------------------------------------------------------------- reference
def reference_training(cfg: Config, world_size: int,
                       device: torch.device) -> dict[str, torch.Tensor]:
    """What `world_size` DDP processes without SyncBatchNorm compute, in this one process without
    DDP: every global batch is the ranks' shares (rank r's DistributedSampler indices, batches of
    batch_size / world_size), each share goes through its own forward pass in its own autocast
    region (so BatchNorm normalises it alone and autocast casts the weights for it alone, as on its
    rank), and the loss is the mean of the shares' losses (DDP averages the ranks' gradients).
    train.py's seeding, loaders, augmentation, model, precision, optimizer, schedule and loss
    scaling, for cfg.epochs epochs of at most cfg.max_steps steps; on the CPU on as many intra-op
    threads as each run has (matrix.cpu_threads). Returns the trained parameters, on the CPU."""
    cfg = resolve_fast_path(cfg, device)  # --amp and --channels_last as the runs resolved them
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads())
    try:
        return _train_reference(cfg, world_size, device)
    finally:
        torch.set_num_threads(threads)


def _train_reference(cfg: Config, world_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    # train.py: seed, then the loaders (no global RNG drawn), then the model
    seed_everything(cfg.seed)
    train_set, _ = load_datasets(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed,
                                 image_size(cfg))
    kind = cfg.loader or ("gpu" if device.type == "cuda" else "torchvision")
    loaders = []
    for rank in range(world_size):
        sampler = DistributedSampler(train_set, world_size, rank, shuffle=cfg.shuffle,
                                     seed=cfg.seed)
        loaders.append(make_loader(kind, train_set, sampler, cfg.batch_size // world_size, device,
                                   train=True, augment=augmentation(cfg),
                                   num_workers=cfg.num_workers, seed=cfg.seed,
                                   memory_format=memory_format(cfg)))
    model = build_model(cfg, dataset_info(cfg))
    model = model.to(device, memory_format=memory_format(cfg))
    optimizer = build_optimizer(model, cfg, device)
    scheduler, scaler = lr_schedule(optimizer, cfg, len(loaders[0])), grad_scaler(cfg, device)
    model.train()
    step = 0
    for epoch in range(cfg.epochs):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)  # as train.py does: the epoch's order
            loader.start_epoch(epoch)  # and its augmentation
        for shares in zip(*loaders):
            losses = []
            # an autocast region per share, as each rank has its own: autocast caches a weight's
            # bf16 copy per region, and a shared copy would add the shares' gradients in bf16
            for images, labels in shares:
                with autocast(cfg, device):
                    losses.append(F.cross_entropy(model(images), labels))
            loss = sum(losses) / world_size
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            if cfg.reached_max_steps(step):
                break
        if cfg.reached_max_steps(step):
            break
    params = dict(model.named_parameters())  # in the paper's shapes, as model.pt holds them
    return {name: value.cpu().clone() for name, value in model.state_dict().items()
            if name in params}


# --------------------------------------------------------------------------------------- tolerances
@dataclass(frozen=True)
class Tolerance:
    value: float  # the largest difference that passes; 0: bitwise
    text: str     # as the table shows it
    why: str      # one sentence, for the notes under the table


BITWISE = Tolerance(0.0, "0 (bitwise)", "the runs do the same float operations in the same "
                                        "order: every bit agrees")
# Where two runs round differently somewhere (the order of a sum, another kernel), SGD carries the
# difference forward and amplifies it. Measured on the CPU, 24 steps of the CPU default (tiny model,
# batch 32, 266 images, 3 epochs): 4 ranks against their reference 5.2e-6, a 4-rank run resumed at
# step 12 against the uninterrupted one 2.4e-7 (the only difference: the order in which the
# all-reduce adds the ranks' gradients); one process on 1 thread against 2 threads (every
# convolution adds in another order) 7.5e-4 in fp32 and 2.5e-3 under bf16 autocast. The errors these
# checks are there to catch measured 5.1e-4 (a step left out), 4.5e-3 (BatchNorm over the whole
# batch instead of each rank's share), 1.8e-2 (another data order), 2.0e-2 (no augmentation) and
# 4.4e-2 (gradients summed, not averaged).
SUMMATION_ORDER = Tolerance(
    1e-4, "1e-4", "with more than two ranks the all-reduce adds the ranks' gradients in another "
                  "order than autograd in the reference, and in another order again in a resumed "
                  "run's first step (DDP lays out its gradient buckets anew once per process, in "
                  "the order the gradients arrived); 24 fp32 steps of 4 ranks on the CPU differ by "
                  "up to 5.2e-6, and a step left out by 5.1e-4")
ROUNDING = {
    "off": Tolerance(5e-3, "5e-3", "the runs may take other kernels (on GPUs cuDNN autotunes per "
                                   "process, some backward kernels add with atomics, a rank's "
                                   "smaller batch takes other kernels, and convolutions round to "
                                   "TF32's 10 bits; --compile fuses each wrapper's graph its own "
                                   "way); on the CPU, other summation orders in every "
                                   "convolution move 24 fp32 steps by 7.5e-4. Set from that and "
                                   "reasoning, not measured on a GPU"),
    "half": Tolerance(2e-2, "2e-2", "the runs may take other kernels (on GPUs cuDNN autotunes per "
                                    "process, some backward kernels add with atomics, a rank's "
                                    "smaller batch takes other kernels; --compile fuses each "
                                    "wrapper's graph its own way) and autocast rounds activations "
                                    "to 8 (bf16) or 11 (fp16) bits; on the CPU, other summation "
                                    "orders under bf16 autocast move 24 steps by 2.5e-3. Set from "
                                    "that and reasoning, not measured on a GPU"),
}


@dataclass(frozen=True)
class EvaluationTolerance:
    accuracy: float  # the largest difference in test accuracy (a fraction) that passes
    loss: float      # the largest relative difference in test loss that passes
    text: str
    why: str


EXACT_EVALUATION = EvaluationTolerance(
    0.0, 1e-6, "accuracy 0, loss 1e-6 relative; images exact",
    "on the CPU in fp32 an image's logits do not depend on the batch it is in: the accuracy is "
    "exact, and the loss differs only in the order its float64 sums are added. Every test image is "
    "counted once, by every count")
ROUNDED_EVALUATION = EvaluationTolerance(
    0.005, 1e-3, "accuracy 0.5 points, loss 1e-3 relative; images exact",
    "on GPUs (and under autocast) an image in a batch of another size may take another kernel, "
    "whose logits differ in their last bits: enough to change the prediction of an image whose two "
    "best classes are that close. Set from reasoning, not measured on a GPU. Every test image is "
    "counted once, by every count")


# ----------------------------------------------------------------------------------------- the runs
@dataclass(frozen=True)
class Launch:
    """One run of the verification: a matrix run's command line, plus what makes it this run."""
    run: PlannedRun
    # after the run's own flags, so these win (a later flag overrides an earlier one)
    flags: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # the launches whose files it reads, by name
    # its run folder when not its own: the second half continues the first's
    folder: str | None = None
    # dist_parallel started as `python dist_parallel/train.py --nproc_per_node N`
    self_launch: bool = False

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def run_dir(self) -> str:
        return self.folder or self.run.name


@dataclass
class Group:
    """The runs of one mode with a process group (GROUP_MODES: checks 2 to 5 run
    for each), by what each is for."""
    trained: Launch                   # on N processes: checks 2 to 5 start from it
    first_half: Launch
    # processes -> --evaluate of trained's model.pt
    evaluations: dict[int, Launch] = field(default_factory=dict)
    # its first half continued, by this mode or, with both modes, by the other
    resumed: Launch | None = None
    resumes: str | None = None        # the mode whose first half it continues


@dataclass
class Setting:
    """The runs of one --amp and backend, by what each is for."""
    amp: str | None
    backend: str | None
    one_device: dict[str, Launch] = field(default_factory=dict)  # mode -> its one-device run
    # dist_parallel and fsdp, as --modes has them
    groups: dict[str, Group] = field(default_factory=dict)
    sync_bn: Launch | None = None
    sync_bn_not_run: str | None = None  # why there is no SyncBatchNorm run

    def label(self) -> str:
        return ", ".join(part for part in (self.backend, f"amp {self.amp or 'default'}") if part)


@dataclass
class Row:
    check: str
    runs: str
    measured: str
    tolerance: str
    verdict: str  # pass, FAIL or not run
    why: str = ""  # FAIL: what failed; not run: why not
    figures: dict = field(default_factory=dict)  # the figures unrounded, for verify.json


class Verification:
    """What `compare.py --verify` runs and checks, planned from compare.py's
    flags before anything starts."""

    def __init__(self, cc, train: dict, group_flags: dict[str, list[str]], cuda: bool, out: Path):
        self.cuda, self.out, self.modes = cuda, out, cc.modes
        self.processes = max(cc.gpu_counts)
        self.steps = train.get("max_steps") or DEFAULT_STEPS
        if self.steps < 2:
            raise UsageError("--verify stops a run halfway and resumes it: "
                             "give --max_steps 2 or more")
        batch = train.get("batch_size", Config.batch_size)
        # enough for the steps
        epochs = cc.epochs or -(-self.steps // max(images_in_training_set(train) // batch, 1))
        self.train = {**train, "max_steps": self.steps, "epochs": epochs}
        # where check 5 stops its first half: half the steps the N-process runs take, which --epochs
        # can make fewer than --max_steps
        images = images_in_training_set(train)
        steps = min(self.steps, epochs * steps_per_epoch(images, batch, self.processes))
        self.halfway = steps // 2
        if self.halfway < 1 and any(mode in cc.modes for mode in GROUP_MODES):
            raise UsageError(f"--verify stops a run halfway and resumes it, but {epochs} "
                             f"epoch(s) of {images} images, global batch {batch} over "
                             f"{self.processes} processes, is {steps} step: it has no halfway "
                             f"point; give more --epochs (or images)")
        self.shared = config_argv(Config,
                                  {k: v for k, v in self.train.items() if k != "batch_size"})
        self.group_flags, self.batch = group_flags, batch
        self.deterministic, self.compiled = (bool(train.get("deterministic")),
                                             bool(train.get("compile")))
        self.launches: dict[tuple, Launch] = {}
        # reference_training's weights by config (check 2)
        self.references: dict[Config, dict | str] = {}
        # on the CPU, 3 processes evaluate too: fsdp's, where it runs (dist_parallel's
        # evaluation is the same lines without the empty batches that keep fsdp's ranks
        # in step), else dist_parallel's
        self.evaluates_on_three = "fsdp" if "fsdp" in cc.modes else "dist_parallel"
        backends = cc.backends if any(mode in cc.modes for mode in GROUP_MODES) else (None,)
        self.settings = [self._plan(amp, backend, "on" in cc.sync_bn) for amp in cc.amp
                         for backend in backends]
        training = [launch.run for launch in self.launches.values()
                    if "--evaluate" not in launch.flags]
        check_runs(training, self.shared, group_flags)
        if not any(s.groups or len(s.one_device) > 1 for s in self.settings):
            modes = " ".join(cc.modes)
            raise UsageError(f"--verify --modes {modes} leaves no check to run: check 1 compares "
                             f"two modes or more, checks 2 to 5 need dist_parallel or fsdp; add a "
                             f"mode to --modes")

    # ------------------------------------------------------------------------------------- planning
    def _add(self, mode: str, processes: int, backend: str | None, amp: str | None, label: str,
             flags=(), needs=(), folder=None, sync_bn=False, self_launch=False,
             reshard=True) -> Launch:
        """The launch of this run, planned once however many checks need it."""
        reshard = reshard if mode == "fsdp" else None  # --reshard_after_forward: fsdp's
        key = (mode, processes, backend, amp, label, tuple(flags), sync_bn, reshard)
        if key not in self.launches:
            run = PlannedRun(mode, processes, backend, amp, sync_bn, self.batch, 1,
                      index=len(self.launches) + 1, unit="gpu" if self.cuda else "cpu", label=label,
                      reshard_after_forward=reshard)
            self.launches[key] = Launch(run, tuple(flags), tuple(needs), folder=folder,
                                        self_launch=self_launch)
        return self.launches[key]

    def _plan(self, amp: str | None, backend: str | None, sync_bn: bool) -> Setting:
        setting, n = Setting(amp, backend), self.processes
        save = ("--save_model",)
        for mode in ("single_gpu", "data_parallel"):
            if mode in self.modes:  # on GPUs, command() gives them --gpu_devices 0
                setting.one_device[mode] = self._add(mode, 1, None, amp, "train", save)
        for mode in (mode for mode in GROUP_MODES if mode in self.modes):
            setting.groups[mode] = self._plan_group(mode, amp, backend, setting, save)
        if "dist_parallel" not in self.modes:
            setting.sync_bn_not_run = "--modes leaves out dist_parallel"
        elif not sync_bn:
            setting.sync_bn_not_run = "give --sync_bn on to check SyncBatchNorm (GPUs)"
        elif not self.cuda or n < 2:
            setting.sync_bn_not_run = ("SyncBatchNorm needs GPUs (PyTorch's refuses CPU modules)"
                                       if not self.cuda else "SyncBatchNorm needs two or more GPUs")
        else:
            setting.one_device.setdefault("dist_parallel", self._add("dist_parallel", 1, backend,
                                                                     amp, "train", save))
            setting.sync_bn = self._add("dist_parallel", n, backend, amp, "train", save,
                                        sync_bn=True)
        # check 5: with both modes, each continues the other's half
        for mode, group in setting.groups.items():
            group.resumes = next((other for other in setting.groups if other != mode), mode)
            first_half = setting.groups[group.resumes].first_half
            label = "resumed" if group.resumes == mode else f"resumed_from_{group.resumes}"
            group.resumed = self._add(mode, n, backend, amp, label,
                                      ("--run_name", first_half.name, "--resume", "auto", *save),
                                      needs=(first_half.name,), folder=first_half.name,
                                      # fsdp: ZeRO-2, where every other fsdp run is ZeRO-3
                                      self_launch=True, reshard=False)
        return setting

    def _plan_group(self, mode: str, amp: str | None, backend: str | None, setting: Setting,
                    save) -> Group:
        """The runs of a mode with a process group: its one-process run (check 1, beside
        the other modes), its N-process run, the first half of a stopped one, and the
        --evaluate runs of its model.pt."""
        n = self.processes
        if setting.one_device:  # check 1
            setting.one_device[mode] = self._add(mode, 1, backend, amp, "train", save)
        trained = self._add(mode, n, backend, amp, "train", save)
        # the two halves are started as `python <mode>/train.py --nproc_per_node N`, the trained run
        # under torchrun: check 5 holds the self-launch to torchrun as well
        halfway = ("--max_steps", str(self.halfway))
        first_half = self._add(mode, n, backend, amp, "first_half", halfway, self_launch=True)
        group = Group(trained, first_half)
        model = str(self.out / "runs" / trained.run_dir / "model.pt")
        # N: the run's own
        for processes in evaluation_counts(n, self.cuda, mode == self.evaluates_on_three):
            by = "single_gpu" if processes == 1 else mode
            group.evaluations[processes] = self._add(
                by, processes, backend if processes > 1 else None, amp, "evaluate",
                ("--evaluate", model, *self.uneven_batches(processes)), needs=(trained.name,))
        return group

    def uneven_batches(self, processes: int) -> tuple[str, ...]:
        """On the CPU, the batch flag that gives one rank one evaluation batch fewer than
        another: the per-rank batch of the smaller shard's size (53 test images over 3 ranks:
        shards of 18, 18 and 17, batches of 17). Under fsdp that rank then runs an empty batch,
        so that every rank gathers the weights as often; a batch that gave every rank as many
        batches would leave that path unchecked."""
        images = images_in_test_set({"dataset": self.train.get("dataset", Config.dataset),
                                     "synthetic_size": self.train.get("synthetic_size",
                                                                      Config.synthetic_size),
                                     "data_dir": self.train.get("data_dir", Config.data_dir)})
        if self.cuda or processes == 1 or not images % processes:
            return ()
        return "--batch_size", str(images // processes * processes)

    # -------------------------------------------------------------------------------------- running
    def main(self, timeout: int, argv: list[str], device: str) -> int:
        """Run, judge, print the verdicts and write verify.md and verify.json; non-zero if a
        check failed, with the failed checks named in the last line. Stopped by a signal
        (Ctrl-C, SIGTERM, SIGHUP): every run stopped, no verdict, and the exit status 128 + the
        signal (compare.main: why)."""
        started = time.monotonic()
        outcomes, signum = self.run(timeout)
        if signum is not None:
            print(f"verify: interrupted by {signal_name(signum)}, no verdict (the runs so far are "
                  f"in {self.out})", file=sys.stderr)
            return 128 + signum
        rows = self.judge(outcomes)
        for row in rows:
            figure = row.why or f"{row.measured} (tolerance {row.tolerance})"
            print(f"{row.verdict:<8} {row.check}: {figure}", flush=True)
        with signals_deferred() as received:  # a signal now waits for verify.md, not cut it short
            paths = self.write(rows, outcomes, argv, device, time.monotonic() - started)
        print(f"wrote {', '.join(path.name for path in paths)} in {self.out}")
        print(f"verify: {summary_line(rows)}", flush=True)
        if received:
            return 128 + received[0]
        return 1 if any(row.verdict == "FAIL" for row in rows) else 0

    def argv(self, launch: Launch) -> list[str]:
        """The launch's command line: its matrix run's, then its own flags."""
        return [*command(launch.run, self.shared, self.group_flags, self.out / "runs", self.cuda,
                         launch.self_launch),
                *launch.flags]

    def run(self, timeout: int) -> tuple[dict[str, Outcome], int | None]:
        """Every launch, ({name: outcome}, None): one at a time on GPUs (each run has them all), two
        at a time on the CPU where neither needs the other's files (each process computes on one
        thread). With the signal that stopped compare.py in place of None: the runs under way
        interrupted, the rest not run."""
        launches = list(self.launches.values())
        where = "GPUs" if self.cuda else "the CPU"
        print(f"verify: {len(launches)} runs on {where} -> {self.out}; each stopped after "
              f"{timeout} s (--run_timeout)", flush=True)

        def begin(task: Launch):
            run_dir = self.out / "runs" / task.run_dir
            return start(task.run, self.argv(task), self.out, self.cuda, run_dir)

        def finished(task: Launch, outcome: Outcome) -> None:
            ok = outcome.status == "ok"
            status = "ok" if ok else f"{outcome.status.upper()}: {outcome.error}"
            print(f"    {task.name}: {status} ({fmt_seconds(outcome.seconds)})", flush=True)

        def not_run(task: Launch, why: str) -> Outcome:
            return Outcome(task.run, "not run", error=why)

        by_name = {task.name: task for task in launches}
        needed = {name for task in launches for name in task.needs}
        # the runs others need first, then those that need them, then the rest:
        # the longest chains start first
        order = sorted(launches,
                       key=lambda task: 0 if task.name in needed else 1 if task.needs else 2)
        needs = lambda task: [by_name[name] for name in task.needs]  # noqa: E731
        outcomes, signum = run_all(order, begin, needs, 1 if self.cuda else 2, not_run, timeout,
                                   finished)
        return {task.name: outcomes[task] for task in launches}, signum  # in the order planned

    # --------------------------------------------------------------------------------------- checks
    def judge(self, outcomes: dict[str, Outcome]) -> list[Row]:
        """A row per check of every setting, from the runs' outcomes and the files in their run
        folders: check 1, then checks 2 to 5 of each mode with a process group (SyncBatchNorm's
        beside dist_parallel's check 2)."""
        rows = []
        for setting in self.settings:
            ours = [self.one_device(setting, outcomes)]
            for mode in GROUP_MODES:
                ours.append(self.against_reference(setting, mode, outcomes))
                if mode == "dist_parallel":
                    ours.append(self.sync_batchnorm(setting, outcomes))
                ours += [self.evaluation(setting, mode, outcomes),
                         self.ranks_in_sync(setting, mode, outcomes),
                         self.resumed(setting, mode, outcomes)]
            if len(self.settings) > 1:
                for row in ours:
                    row.check = f"[{setting.label()}] {row.check}"
            rows += ours
        return rows

    def exact(self) -> bool:
        """Whether runs that do the same computation do the same float operations: on the
        CPU, or with --deterministic on GPUs, and never with --compile (which fuses each
        wrapper's graph its own way)."""
        return (not self.cuda or self.deterministic) and not self.compiled

    def rounding(self, setting: Setting) -> Tolerance:
        """The tolerance of runs that round differently: on the CPU in fp32 only the order of the
        gradient sums differs; elsewhere the kernels may, and the compute dtype says by how much."""
        if not self.cuda and self.amp_of(setting) == "off" and not self.compiled:
            return SUMMATION_ORDER
        return ROUNDING["off" if self.amp_of(setting) == "off" else "half"]

    def all_reduce_order(self, setting: Setting) -> Tolerance:
        """The tolerance of runs that differ only in the order the all-reduce adds the ranks'
        gradients (checks 2 and 5). Two ranks: none, as a sum of two is the same in either order
        and the halving of each gradient (DDP's before its all-reduce, FSDP's before its
        reduce-scatter) is exact (measured on the CPU: 0; on GPUs, with --deterministic,
        reasoned). More ranks: rounding."""
        return BITWISE if self.exact() and self.processes <= 2 else self.rounding(setting)

    def amp_of(self, setting: Setting) -> str:
        return setting.amp or ("off" if not self.cuda else "bf16")

    def weights(self, launch: Launch) -> dict[str, torch.Tensor]:
        return torch.load(self.out / "runs" / launch.run_dir / "model.pt", map_location="cpu",
                          weights_only=True)

    CHECK_1 = "1. one device: every mode ends with the same weights"

    def one_device(self, setting: Setting, outcomes: dict[str, Outcome]) -> Row:
        runs = list(setting.one_device.values())
        if len(runs) < 2:
            return Row(self.CHECK_1, "—", "—", "—", "not run",
                       "--modes selects fewer than two modes")
        tolerance = BITWISE if self.exact() else self.rounding(setting)
        failure = failed(outcomes, runs)
        if failure:
            return fail(self.CHECK_1, runs, tolerance, failure)
        first, others = runs[0], runs[1:]
        reference = self.weights(first)
        differences = {launch.run.mode: max_difference(self.weights(launch), reference)
                       for launch in others}
        measured = max(differences.values())
        figure = ("max abs difference of every weight and BatchNorm statistic "
                  f"from {first.run.mode}: "
                  + ", ".join(f"{mode} {value:.3g}" for mode, value in differences.items()))
        passed = measured <= tolerance.value
        if tolerance is BITWISE:  # then what the runs report must agree exactly too
            keys = ("train_loss", "train_acc", "test_loss", "test_acc", "steps")
            summaries = [outcomes[launch.name].results["summary"] for launch in runs]
            differ = [key for key in keys
                      if any(s[key] != summaries[0][key] for s in summaries[1:])]
            figure += "; reported " + (f"{', '.join(differ)} differ" if differ else
                                       "train loss and accuracy, test loss "
                                       "and accuracy, steps equal")
            passed = passed and not differ
        return Row(self.CHECK_1, names(runs), figure, tolerance.text, verdict(passed),
                   figures={"max_abs_difference": differences, "tolerance": tolerance.value})

    def check_2(self, mode: str) -> str:
        return f"2. {mode} on {self.processes} processes ends where reference_training ends"

    def against_reference(self, setting: Setting, mode: str, outcomes: dict[str, Outcome]) -> Row:
        group = setting.groups.get(mode)
        if group is None:
            return not_run(self.check_2(mode), mode)
        tolerance = self.all_reduce_order(setting)
        failure = failed(outcomes, [group.trained])
        if failure:
            return fail(self.check_2(mode), [group.trained], tolerance, failure)
        reference = self.reference(outcomes[group.trained.name].results["config"])
        if isinstance(reference, str):  # out of memory, say: the check cannot be made here
            return fail(self.check_2(mode), [group.trained], tolerance,
                        f"reference_training failed: {reference}")
        measured = max_difference(reference, self.weights(group.trained), list(reference))
        return Row(self.check_2(mode), f"{names([group.trained])}, "
                                       "reference_training in this process",
                   f"max abs difference of every parameter: {measured:.3g}", tolerance.text,
                   verdict(measured <= tolerance.value), figures={"max_abs_difference": measured,
                                                                  "tolerance": tolerance.value})

    def reference(self, saved: dict) -> dict[str, torch.Tensor] | str:
        """reference_training of a run's config, computed once for every mode that trained
        under it (the modes' own flags aside, their configs agree); the first line of its error
        when it could not be computed."""
        cfg = config_of(saved)
        if cfg not in self.references:
            device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
            try:
                self.references[cfg] = reference_training(cfg, self.processes, device)
            except RuntimeError as error:
                text = str(error).strip()
                self.references[cfg] = text.splitlines()[0] if text else type(error).__name__
        return self.references[cfg]

    def sync_batchnorm(self, setting: Setting, outcomes: dict[str, Outcome]) -> Row:
        title = f"2. with SyncBatchNorm, {self.processes} processes end where 1 process ends"
        if setting.sync_bn is None:
            return Row(title, "—", "—", "—", "not run", setting.sync_bn_not_run)
        one = setting.one_device["dist_parallel"]
        tolerance = self.rounding(setting)
        failure = failed(outcomes, [setting.sync_bn, one])
        if failure:
            return fail(title, [setting.sync_bn, one], tolerance, failure)
        measured = max_difference(self.weights(setting.sync_bn), self.weights(one))
        return Row(title, names([setting.sync_bn, one]),
                   f"max abs difference of every weight and BatchNorm statistic: {measured:.3g}",
                   tolerance.text, verdict(measured <= tolerance.value),
                   figures={"max_abs_difference": measured, "tolerance": tolerance.value})

    def check_3(self, mode: str, group: Group | None) -> str:
        planned = evaluation_counts(self.processes, self.cuda, mode == self.evaluates_on_three)
        counts = sorted({*(group.evaluations if group else planned), self.processes})
        return (f"3. {mode}: evaluation by {', '.join(map(str, counts))} processes, the "
                "same accuracy and loss")

    def evaluation(self, setting: Setting, mode: str, outcomes: dict[str, Outcome]) -> Row:
        group = setting.groups.get(mode)
        if group is None:
            return not_run(self.check_3(mode, group), mode)
        exact = not self.cuda and self.amp_of(setting) == "off"
        tolerance = EXACT_EVALUATION if exact else ROUNDED_EVALUATION
        # the --evaluate launches, then the N-process run's own end-of-run
        # evaluation of the weights it saved
        runs = [*((f"{count} (--evaluate)", launch) for count, launch in group.evaluations.items()),
                (f"{self.processes} (the run's own)", group.trained)]
        failure = failed(outcomes, [launch for _, launch in runs])
        if failure:
            return fail(self.check_3(mode, group), [launch for _, launch in runs], tolerance,
                        failure)
        results = {what: outcomes[launch.name].results["summary"] for what, launch in runs}
        images = {what: summary["test_images"] for what, summary in results.items()}
        expected = images_in_test_set(outcomes[group.trained.name].results["config"])
        base = results[runs[0][0]]  # one process: single_gpu --evaluate
        acc_difference = max(abs(r["test_acc"] - base["test_acc"]) for r in results.values())
        loss_difference = max(abs(r["test_loss"] - base["test_loss"]) / abs(base["test_loss"])
                              for r in results.values())
        counted = all(count == expected for count in images.values())
        figure = (f"test accuracy {100 * base['test_acc']:.2f} %, largest difference "
                  f"{100 * acc_difference:.3g} points; loss {base['test_loss']:.4f}, largest "
                  f"relative difference {loss_difference:.2g}; "
                  + (f"each counted all {expected} test images" if counted else
                     "images counted: " + ", ".join(f"{images[w]} by {w}" for w in images)
                     + f" of {expected}"))
        passed = (acc_difference <= tolerance.accuracy and loss_difference <= tolerance.loss
                  and counted)
        return Row(self.check_3(mode, group), names(launch for _, launch in runs), figure,
                   tolerance.text, verdict(passed),
                   figures={"test_acc": {w: r["test_acc"] for w, r in results.items()},
                            "test_loss": {w: r["test_loss"] for w, r in results.items()},
                            "images": images, "test_images": expected})

    def check_4(self, mode: str) -> str:
        whole = " (gathered whole from the slices)" if mode == "fsdp" else ""
        return f"4. {mode}: parameters identical on every rank{whole} (the end-of-run sync check)"

    def ranks_in_sync(self, setting: Setting, mode: str, outcomes: dict[str, Outcome]) -> Row:
        group = setting.groups.get(mode)
        if group is None:
            return not_run(self.check_4(mode), mode)
        if self.processes == 1:
            return Row(self.check_4(mode), "—", "—", "—", "not run",
                       "N is 1: one rank has nothing to differ from")
        extra = (setting.sync_bn,) if mode == "dist_parallel" else ()
        runs = [run for run in (group.trained, group.first_half, group.resumed, *extra) if run]
        failure = failed(outcomes, runs)
        if failure:
            return fail(self.check_4(mode), runs, BITWISE, failure)
        summaries = {run.name: outcomes[run.name].results["summary"] for run in runs}
        apart = [name for name, summary in summaries.items()
                 if summary["params_in_sync"] is not True]
        buffers = max(summary["buffers_max_abs_diff"] for summary in summaries.values())
        figure = (f"parameters identical on all {self.processes} ranks in "
                  f"{len(runs) - len(apart)} of {len(runs)} runs"
                  + (f" (not in {', '.join(apart)})" if apart else "")
                  + f"; BatchNorm statistics differ by up to {buffers:.3g}"
                  + (" (each rank's BatchNorm sees its own share)" if buffers else ""))
        return Row(self.check_4(mode), names(runs), figure, BITWISE.text, verdict(not apart),
                   figures={"params_in_sync": {n: s["params_in_sync"]
                                               for n, s in summaries.items()},
                            "buffers_max_abs_diff": buffers})

    def check_5(self, mode: str, group: Group | None = None) -> str:
        how = " without resharding (ZeRO-2)" if mode == "fsdp" else ""
        if group is not None and group.resumes != mode:
            return (f"5. {mode}: {group.resumes}'s run stopped at step {self.halfway}, continued "
                    f"by {mode}{how}, ends where {mode}'s uninterrupted run ends")
        return (f"5. {mode}: stopped at step {self.halfway} and resumed{how}, the run ends where "
                f"the uninterrupted one ends")

    def resumed(self, setting: Setting, mode: str, outcomes: dict[str, Outcome]) -> Row:
        group = setting.groups.get(mode)
        if group is None:
            return not_run(self.check_5(mode), mode)
        first_half = setting.groups[group.resumes].first_half
        runs = [first_half, group.resumed, group.trained]
        return self.continued(self.check_5(mode, group), runs, group.resumed, group.trained,
                              "the halves self-launched with --resume auto, the "
                              "uninterrupted run under torchrun",
                              setting, outcomes)

    def continued(self, title: str, runs: list[Launch], resumed: Launch, uninterrupted: Launch,
                  how: str, setting: Setting, outcomes: dict[str, Outcome]) -> Row:
        """A run that resumed halfway against the run that was not stopped: the
        same weights and statistics."""
        tolerance = self.all_reduce_order(setting)
        failure = failed(outcomes, runs)
        if failure:
            return fail(title, runs, tolerance, failure)
        said = f"resumed at step {self.halfway} "
        if said not in outcomes[resumed.name].log.read_text(errors="replace"):
            return fail(title, runs, tolerance, f"{resumed.name} did not say '{said.strip()}': it "
                                                "did not continue the first half")
        measured = max_difference(self.weights(resumed), self.weights(uninterrupted))
        return Row(title, names(runs),
                   f"max abs difference of every weight and BatchNorm statistic: {measured:.3g} "
                   f"({how})", tolerance.text, verdict(measured <= tolerance.value),
                   figures={"max_abs_difference": measured, "tolerance": tolerance.value})

    # --------------------------------------------------------------------------------------- report
    def tolerance_notes(self, rows: list[Row]) -> list[str]:
        """Why each tolerance in the table is what it is, once each."""
        shown = {row.tolerance for row in rows}
        every = (BITWISE, SUMMATION_ORDER, *ROUNDING.values(), EXACT_EVALUATION, ROUNDED_EVALUATION)
        notes = [f"- **{t.text}**: {t.why}." for t in every if t.text in shown]
        if (any(s.groups for s in self.settings)
            and self.all_reduce_order(self.settings[0]) is BITWISE):
            notes.append("- Checks 2 and 5 are bitwise with two ranks: DDP halves each gradient "
                         "before its all-reduce, FSDP before its reduce-scatter, which is exact, "
                         "and the collective adds two values, the same in either order. With more "
                         "ranks the order of the sums differs, and they take a tolerance.")
        rounded = {t.text for t in (SUMMATION_ORDER, *ROUNDING.values())}
        if self.steps != DEFAULT_STEPS and shown & rounded:
            notes.append(f"- The tolerances above were set for {DEFAULT_STEPS} steps; "
                         f"this verification ran {self.steps}, and the rounding "
                         "differences grow with every step.")
        if self.cuda and not self.deterministic:
            notes.append("- Without `--deterministic` the GPU runs may take other kernels from "
                         "run to run, so checks 1, 2 and 5 hold within a tolerance as large as "
                         "some of the errors they look for. `python compare.py --verify "
                         "--deterministic` makes check 1 bitwise, and checks 2 and 5 too with two "
                         "GPUs (`--gpu_counts 2`).")
        return notes

    def write(self, rows: list[Row], outcomes: dict[str, Outcome], argv: list[str], device: str,
              elapsed: float) -> list[Path]:
        cfg = next((o.results["config"] for o in outcomes.values() if o.results), {**self.train})
        failed_rows = [row for row in rows if row.verdict == "FAIL"]
        run_rows = [f"| `{o.run.name}` | {o.status} | {fmt_seconds(o.seconds)} | {o.error or ''} | "
                    + (f"`logs/{o.run.name}.log` |" if o.log else "— |") for o in outcomes.values()]
        lines = [
            f"# Verification: {model_title(cfg)} — {device}",
            "",
            f"`{shlex.join(['python', 'compare.py', *argv])}` — {datetime.now():%Y-%m-%d %H:%M}, "
            f"{len(outcomes)} runs in {fmt_seconds(elapsed)}: {self.steps} steps of global batch "
            f"{self.batch} on {cfg.get('dataset', Config.dataset)} (at most {self.train['epochs']} "
            f"epochs), seed {cfg.get('seed', Config.seed)}; N = {self.processes} "
            f"{'GPUs' if self.cuda else 'CPU processes'}.",
            "",
            "| check | runs | measured | tolerance | verdict |",
            "|---|---|---|---|---|",
            *[f"| {r.check} | {r.runs} | {r.measured} | {r.tolerance} | "
              f"{r.verdict if r.verdict == 'pass' else f'**{r.verdict}**'}"
              f"{': ' + r.why if r.why else ''} |"
              for r in rows],
            "",
            summary_line(rows),
            "",
            "## Why these tolerances",
            "",
            *self.tolerance_notes(rows),
            "",
            "## Runs",
            "",
            "Each run's command line heads its log; its run folder (results.json, "
            "model.pt) is in `runs/`.",
            "",
            "| run | status | time | error | log |",
            "|---|---|---|---|---|",
            *run_rows,
        ]
        write_file(self.out / "verify.md", ("\n".join(lines) + "\n").encode())
        record = {"command": ["compare.py", *argv], "device": device, "steps": self.steps,
                  "processes": self.processes, "passed": not failed_rows,
                  "checks": [dataclasses.asdict(row) for row in rows],
                  "runs": [{"name": o.run.name, "status": o.status, "error": o.error,
                            "seconds": o.seconds,
                            "log": f"logs/{o.run.name}.log" if o.log else None}
                           for o in outcomes.values()]}
        text = json.dumps(record, indent=2, default=str) + "\n"
        write_file(self.out / "verify.json", text.encode())
        return [self.out / "verify.md", self.out / "verify.json"]


# ------------------------------------------------------------------------------------------ helpers
def images_in_training_set(train: dict) -> int:
    dataset = train.get("dataset", Config.dataset)
    if dataset == "imagefolder":
        return image_folder(train.get("data_dir", Config.data_dir)).images["train"]
    return (train.get("synthetic_size", Config.synthetic_size) if dataset == "synthetic"
            else TRAIN_IMAGES[dataset])


def steps_per_epoch(images: int, batch: int, processes: int) -> int:
    """Optimizer steps in an epoch of `processes` processes: DistributedSampler pads the images to
    a whole share per process, and each process's loader drops its last incomplete batch."""
    per_process = -(-images // processes)
    return per_process // max(batch // processes, 1)  # a batch that does not divide: check_runs


def images_in_test_set(config: dict) -> int:
    dataset = config["dataset"]
    if dataset == "imagefolder":
        return image_folder(config.get("data_dir", Config.data_dir)).images["val"]
    return config["synthetic_size"] // 5 if dataset == "synthetic" else TEST_IMAGES[dataset]


def evaluation_counts(n: int, cuda: bool, three: bool = True) -> list[int]:
    """The --evaluate launches: 1 process (single_gpu) and 2; on the CPU, with `three`, 3 as well,
    which divides neither the CPU default's batch (32) nor its test set (53). N processes is the
    trained run's own evaluation. On GPUs no more than N: NCCL takes one GPU per rank."""
    counts = {1, 2} | (set() if cuda or not three else {3})
    return sorted(c for c in counts if c == 1 or c != n and (not cuda or c < n))


def config_of(saved: dict) -> Config:
    """The Config a run recorded in its results.json (its own flags beyond Config's left out)."""
    names = {f.name for f in dataclasses.fields(Config)}
    return Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()
                     if k in names})


def max_difference(ours: dict, theirs: dict, names=None) -> float:
    """The largest absolute difference over the tensors `names` (default: all of `ours`); inf where
    a tensor is missing or has another shape."""
    names = list(ours) if names is None else names
    if any(n not in theirs or theirs[n].shape != ours[n].shape for n in names):
        return math.inf
    return max(((ours[n].double() - theirs[n].double()).abs().max().item()
                if ours[n].numel() else 0.0 for n in names), default=0.0)


def names(launches) -> str:
    return ", ".join(f"`{launch.name}`" for launch in launches)


def verdict(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def failed(outcomes: dict[str, Outcome], launches) -> str | None:
    """What stops a check: the first run it needs that did not
    succeed, with its error and its log."""
    for launch in launches:
        outcome = outcomes[launch.name]
        if outcome.status != "ok":
            log = f" (log: `logs/{launch.name}.log`)" if outcome.log else ""
            return f"`{launch.name}` {outcome.status}: {outcome.error}{log}"
    return None


def not_run(check: str, mode: str) -> Row:
    return Row(check, "—", "—", "—", "not run", f"--modes leaves out {mode}")


def fail(check: str, launches, tolerance, failure: str) -> Row:
    return Row(check, names(launches), "—", tolerance.text, "FAIL", failure)


def summary_line(rows: list[Row]) -> str:
    failed_rows = [row for row in rows if row.verdict == "FAIL"]
    ran = [row for row in rows if row.verdict != "not run"]
    not_run = len(rows) - len(ran)
    skipped = f" ({not_run} not run)" if not_run else ""
    if failed_rows:
        return (f"FAILED: {len(failed_rows)} of {len(ran)} checks{skipped}: "
                + "; ".join(row.check for row in failed_rows))
    return f"passed: all {len(ran)} checks{skipped}"
