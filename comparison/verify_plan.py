"""What compare.py --verify runs, planned from compare.py's flags before anything starts: the runs
(`Launch`), grouped by what each is for: each --amp and backend's `Setting`, its one-device runs
(check 1), its N-process runs of both process-group modes (check 2), each process-group mode's
`Group` (checks 3 to 5: the N-process run, its first half, that half continued, the --evaluate runs
of its checkpoint), pipeline_parallel's N-stage run (check 6, beside dist_parallel's N-process run),
and how many steps, epochs and images they take."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from comparison import model_shapes
from comparison.errors import UsageError
from comparison.matrix import PlannedRun, check_run, run_flags
from comparison.train_files import DATA_GROUP_MODES, parse

PIPELINE = "pipeline_parallel"

DEFAULT_STEPS = 24


def defaults(cuda: bool) -> list[str]:
    """The train.py flags --verify gives every run before the user's own (which win): synthetic data
    (offline, nothing to download); without GPUs, beside compare.py's CPU defaults, 266 training
    images (8 steps per epoch for 1 or 2 processes) and 53 test images, a prime, so that no number
    of processes divides them and every evaluation of check 3 has shards of unequal size."""
    return ["--dataset", "synthetic", *([] if cuda else ["--synthetic_size", "266"])]


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
    """The runs of one mode with a process group (DATA_GROUP_MODES: checks 3 to 5 run
    for each), by what each is for."""
    trained: Launch                   # on N processes: checks 2 to 5 start from it
    first_half: Launch
    # processes -> --evaluate of trained's checkpoint.pt
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
    pipeline: Launch | None = None  # pipeline_parallel on N stages, N micro-batches (check 6)
    pipeline_not_run: str | None = None  # why there is no pipeline run

    def label(self) -> str:
        return ", ".join(part for part in (self.backend, f"amp {self.amp or 'default'}") if part)


class Plan:
    """What `compare.py --verify` runs and checks, planned from compare.py's
    flags before anything starts."""

    def __init__(self, cc, train: list[str], group_flags: dict[str, list[str]], cuda: bool,
                 out: Path):
        self.cuda, self.out, self.modes = cuda, out, cc.modes
        self.processes = max(cc.gpu_counts)
        values = vars(parse("single_gpu", train))
        self.steps = values["max_steps"] or DEFAULT_STEPS
        if self.steps < 2:
            raise UsageError("--verify stops a run halfway and resumes it: "
                             "give --max_steps 2 or more")
        batch = values["batch_size"]
        images = images_in_training_set(values)
        # enough for the steps
        epochs = cc.epochs or -(-self.steps // max(images // batch, 1))
        # the flags of every run: the user's, then the steps and epochs of the verification
        self.train = [*train, "--max_steps", str(self.steps), "--epochs", str(epochs)]
        self.epochs = epochs
        # where check 5 stops its first half: half the steps the N-process runs take, which --epochs
        # can make fewer than --max_steps
        steps = min(self.steps, epochs * steps_per_epoch(images, batch, self.processes))
        self.halfway = steps // 2
        if self.halfway < 1 and any(mode in cc.modes for mode in DATA_GROUP_MODES):
            raise UsageError(f"--verify stops a run halfway and resumes it, but {epochs} "
                             f"epoch(s) of {images} images, global batch {batch} over "
                             f"{self.processes} processes, is {steps} step: it has no halfway "
                             f"point; give more --epochs (or images)")
        self.shared = self.train
        self.group_flags, self.batch, self.values = group_flags, batch, values
        self.deterministic, self.compiled = bool(values["deterministic"]), bool(values["compile"])
        self.launches: dict[tuple, Launch] = {}
        backends = cc.backends if any(mode in cc.modes for mode in DATA_GROUP_MODES) else (None,)
        self.settings = [self._plan(amp, backend, "on" in cc.sync_bn) for amp in cc.amp
                         for backend in backends]
        for index, launch in enumerate(self.launches.values()):  # each as it will run
            check_run(launch.run, self.flags(launch), cuda, model=index == 0)
        # check 6 runs only beside dist_parallel's group: no setting without a group has a check
        if not any(s.groups or len(s.one_device) > 1 for s in self.settings):
            modes = " ".join(cc.modes)
            raise UsageError(f"--verify --modes {modes} leaves no check to run: check 1 compares "
                             f"two modes or more, checks 2 to 5 need dist_parallel or fsdp, check "
                             f"6 dist_parallel and pipeline_parallel; add a mode to --modes")

    def flags(self, launch: Launch) -> list[str]:
        """The launch's train.py flags: its matrix run's, then its own."""
        return [*run_flags(launch.run, self.shared, self.group_flags, self.out / "runs",
                           self.cuda), *launch.flags]

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
        for mode in ("single_gpu", "data_parallel"):
            if mode in self.modes:  # on GPUs, command() gives them --gpu_devices 0
                setting.one_device[mode] = self._add(mode, 1, None, amp, "train")
        for mode in (mode for mode in DATA_GROUP_MODES if mode in self.modes):
            setting.groups[mode] = self._plan_group(mode, amp, backend, setting)
        if "dist_parallel" not in self.modes:
            setting.sync_bn_not_run = "--modes leaves out dist_parallel"
        elif not sync_bn:
            setting.sync_bn_not_run = "give --sync_bn on to check SyncBatchNorm (GPUs)"
        elif not self.cuda or n < 2:
            setting.sync_bn_not_run = ("SyncBatchNorm needs GPUs (PyTorch's refuses CPU modules)"
                                       if not self.cuda else "SyncBatchNorm needs two or more GPUs")
        else:
            setting.one_device.setdefault("dist_parallel", self._add("dist_parallel", 1, backend,
                                                                     amp, "train"))
            setting.sync_bn = self._add("dist_parallel", n, backend, amp, "train", sync_bn=True)
        # check 5: with both modes, each continues the other's half
        for mode, group in setting.groups.items():
            group.resumes = next((other for other in setting.groups if other != mode), mode)
            first_half = setting.groups[group.resumes].first_half
            label = "resumed" if group.resumes == mode else f"resumed_from_{group.resumes}"
            group.resumed = self._add(mode, n, backend, amp, label,
                                      ("--run_name", first_half.name, "--resume", "auto"),
                                      needs=(first_half.name,), folder=first_half.name,
                                      # fsdp: ZeRO-2, where every other fsdp run is ZeRO-3
                                      self_launch=True, reshard=False)
        self._plan_pipeline(amp, backend, setting)
        return setting

    def _plan_pipeline(self, amp: str | None, backend: str | None, setting: Setting) -> None:
        """Check 6's run: pipeline_parallel on N processes, a stage each, N micro-batches a step
        (micro-batch m holds the images DDP's rank m holds: the pipeline's `dealt`). Not planned,
        with the reason, where it cannot run: --modes without it or dist_parallel, one process, a
        model it cannot cut into N stages, or a flag its own parser refuses (--compile,
        --channels_last, --amp fp16). The other checks run all the same, whether --modes named
        pipeline_parallel or not."""
        setting.pipeline_not_run = self.pipeline_not_run()
        if setting.pipeline_not_run is not None:
            return
        n = self.processes
        launch = self._add(PIPELINE, n, backend, amp, "train", ("--microbatches", str(n)))
        try:
            parse(PIPELINE, self.flags(launch))
        except UsageError as refusal:  # its refusal of --compile, --channels_last, --amp fp16
            self.launches.popitem()  # the launch just planned, the last: not to run
            setting.pipeline_not_run = f"{PIPELINE}/train.py refuses these flags: {refusal}"
            return
        setting.pipeline = launch

    def pipeline_not_run(self) -> str | None:
        """Why check 6 cannot run whatever the setting, or None: the modes, N, the model."""
        n = self.processes
        if n < 2:  # and --verify's default --modes leaves it out
            return "N is 1: a pipeline needs two stages or more"
        if PIPELINE not in self.modes:
            return f"--modes leaves out {PIPELINE}"
        if "dist_parallel" not in self.modes:
            return "--modes leaves out dist_parallel: the check holds the pipeline to its run"
        pieces = model_shapes.pipeline_piece_count(self.values)
        if pieces is None:
            return (f"{PIPELINE}/train.py cuts PyramidNet or an nn.Sequential into stages, and "
                    f"--model {self.values['model']} is neither")
        if pieces < n:
            return (f"the model has {pieces} pieces to cut into {n} stages: give a smaller "
                    "--gpu_counts, or a deeper model")
        return None

    def _plan_group(self, mode: str, amp: str | None, backend: str | None,
                    setting: Setting) -> Group:
        """The runs of a mode with a process group: its one-process run (check 1, beside
        the other modes), its N-process run, the first half of a stopped one, and the
        --evaluate runs of its checkpoint.pt."""
        n = self.processes
        if setting.one_device:  # check 1
            setting.one_device[mode] = self._add(mode, 1, backend, amp, "train")
        trained = self._add(mode, n, backend, amp, "train")
        # the two halves are started as `python <mode>/train.py --nproc_per_node N`, the trained run
        # under torchrun: check 5 holds the self-launch to torchrun as well
        halfway = ("--max_steps", str(self.halfway))
        first_half = self._add(mode, n, backend, amp, "first_half", halfway, self_launch=True)
        group = Group(trained, first_half)
        model = str(self.out / "runs" / trained.run_dir / "checkpoint.pt")
        # N: the run's own
        for processes in evaluation_counts(n, self.cuda):
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
        images = images_in_test_set(self.values)
        if self.cuda or processes == 1 or not images % processes:
            return ()
        return "--batch_size", str(images // processes * processes)


def images_in_training_set(values: dict) -> int:
    """One epoch's images (`values`: the train.py flags as read); 0 where an image folder cannot
    be listed (its runs then refuse it)."""
    return model_shapes.training_images(values) or 0


def steps_per_epoch(images: int, batch: int, processes: int) -> int:
    """Optimizer steps in an epoch of `processes` processes: DistributedSampler pads the images to
    a whole share per process, and each process's loader drops its last incomplete batch."""
    per_process = -(-images // processes)
    return per_process // max(batch // processes, 1)  # a batch that does not divide: check_runs


def images_in_test_set(values: dict) -> int:
    """The test set's images (`values`: the train.py flags, or a run's results.json config)."""
    return model_shapes.test_images(values) or 0


def evaluation_counts(n: int, cuda: bool) -> list[int]:
    """The --evaluate launches: 1 process (single_gpu) and 2; on the CPU 3 as well, which divides
    neither the CPU default's batch (32) nor its test set (53). N processes is the trained run's
    own evaluation. On GPUs no more than N: NCCL takes one GPU per rank."""
    counts = {1, 2} | (set() if cuda else {3})
    return sorted(c for c in counts if c == 1 or c != n and (not cuda or c < n))
