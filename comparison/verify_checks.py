"""The checks of compare.py --verify, each judging the outcomes of the runs a Plan
(comparison/verify_plan.py) made and the files in their run folders (checkpoint.pt, results.json,
the event files): a `Row` per check with the figure it measured, its tolerance and its verdict, and
the tolerances themselves with the reason for each."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from comparison.errors import plural
from comparison.report.outcome import Outcome
from comparison.train_files import DATA_GROUP_MODES
from comparison.verify_plan import (Group, Launch, Plan, Setting, evaluation_counts,
                                    images_in_test_set)


@dataclass(frozen=True)
class Tolerance:
    value: float  # the largest difference that passes; 0: bitwise
    text: str     # as the table shows it
    why: str      # one sentence, for the notes under the table


BITWISE = Tolerance(0.0, "0 (bitwise)", "the runs do the same float operations in the same "
                                        "order: every bit agrees")
# Where two runs round differently somewhere (the order of a sum, another kernel), SGD carries the
# difference forward and amplifies it. Measured on the CPU, 24 steps of the CPU default (tiny model,
# batch 32, 266 images, 3 epochs): 4 ranks against a one-process reference of their shares 5.2e-6,
# a 4-rank run resumed at step 12 against the uninterrupted one 2.4e-7 (the only difference: the
# order in which the all-reduce adds the ranks' gradients); one process on 1 thread against 2
# threads (every convolution adds in another order) 7.5e-4 in fp32 and 2.5e-3 under bf16 autocast.
# The errors these checks are there to catch measured 5.1e-4 (a step left out), 4.5e-3 (BatchNorm
# over the whole batch instead of each rank's share), 1.8e-2 (another data order), 2.0e-2 (no
# augmentation) and 4.4e-2 (gradients summed, not averaged).
SUMMATION_ORDER = Tolerance(
    1e-4, "1e-4", "with more than two ranks DDP's all-reduce and FSDP's reduce-scatter add the "
                  "ranks' gradients in orders of their own, and DDP in another order again in a "
                  "resumed run's first step (it lays out its gradient buckets anew once per "
                  "process, in the order the gradients arrived); 24 fp32 steps of 4 ranks on the "
                  "CPU differ from a one-process reference by up to 5.2e-6, and a step left out "
                  "by 5.1e-4")
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


@dataclass
class Row:
    check: str
    runs: str
    measured: str
    tolerance: str
    verdict: str  # pass, FAIL or not run
    why: str = ""  # FAIL: what failed; not run: why not
    figures: dict = field(default_factory=dict)  # the figures unrounded, for verify.json


class Checks(Plan):
    """The checks of a Plan: `judge` makes a Row of every check of every setting from the runs'
    outcomes; the other methods are the checks and the tolerances they hold the runs to. They read
    what the Plan set: its settings, processes, halfway step, device and run folder."""

    def judge(self, outcomes: dict[str, Outcome]) -> list[Row]:
        """A row per check of every setting, from the runs' outcomes and the files in their run
        folders: check 1, check 2 (and SyncBatchNorm's beside it), then checks 3 to 5 of each mode
        with a process group, then check 6 (the pipeline)."""
        rows = []
        for setting in self.settings:
            ours = [self.one_device(setting, outcomes), self.modes_agree(setting, outcomes),
                    self.sync_batchnorm(setting, outcomes)]
            for mode in DATA_GROUP_MODES:
                ours += [self.evaluation(setting, mode, outcomes),
                         self.ranks_in_sync(setting, mode, outcomes),
                         self.resumed(setting, mode, outcomes)]
            ours.append(self.pipeline_trains_ddp(setting, outcomes))
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
        """The tolerance of runs that differ only in the order their collectives add the ranks'
        gradients (checks 2 and 5). Two ranks: none, as a sum of two is the same in either order
        and the halving of each gradient (DDP's before its all-reduce, FSDP's before its
        reduce-scatter) is exact (measured on the CPU: 0; on GPUs, with --deterministic,
        reasoned). More ranks: rounding."""
        return BITWISE if self.exact() and self.processes <= 2 else self.rounding(setting)

    def pipeline_order(self, setting: Setting) -> Tolerance:
        """Check 6's tolerance. Each micro-batch's gradient is a DDP rank's (the same images,
        normalised by their own BatchNorm statistics); the pipeline adds the M = N micro-batches'
        in order and divides the sum by N, DDP divides each by N and its all-reduce adds them. Two
        ranks: the same bits, as in check 2 (halving is exact, and two values add alike in either
        order; measured on the CPU: 0, fp32 and bf16). More: another order, and a third not
        exact: rounding (4 CPU processes, 24 fp32 steps: 1.4e-5). On GPUs, besides, dist_parallel
        lays its images out channels_last unless --no-channels_last is given, and the pipeline
        never does: other kernels, rounding even with --deterministic."""
        tolerance = self.all_reduce_order(setting)
        ddp_channels_last = self.values["channels_last"] is not False and self.cuda
        return self.rounding(setting) if ddp_channels_last else tolerance

    def amp_of(self, setting: Setting) -> str:
        return setting.amp or ("off" if not self.cuda else "bf16")

    def state(self, launch: Launch) -> dict[str, torch.Tensor]:
        """What the launch's last checkpoint.pt holds of the training: every weight and BatchNorm
        statistic (`model.<name>`) and SGD's momentum of every parameter (`momentum.<position>`, as
        optimizer.state_dict() keys it in every mode)."""
        return training_state(self.out / "runs" / launch.run_dir / "checkpoint.pt")

    CHECK_1 = "1. one device: every mode ends with the same weights and momentum"

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
        reference = self.state(first)
        differences = {launch.run.mode: max_difference(self.state(launch), reference)
                       for launch in others}
        measured = max(differences.values())
        figure = ("max abs difference of every weight, BatchNorm statistic and momentum "
                  f"from {first.run.mode}'s: "
                  + ", ".join(f"{mode} {value:.3g}" for mode, value in differences.items()))
        passed = measured <= tolerance.value
        if tolerance is BITWISE:  # then what the runs report must agree exactly too
            keys = ("train_loss", "train_acc", "test_loss", "test_acc", "step")
            summaries = [outcomes[launch.name].results["summary"] for launch in runs]
            differ = [key for key in keys
                      if any(s.get(key) != summaries[0].get(key) for s in summaries[1:])]
            figure += "; reported " + (f"{', '.join(differ)} differ" if differ else
                                       "train loss and accuracy, test loss "
                                       "and accuracy, steps equal")
            passed = passed and not differ
        return Row(self.CHECK_1, names(runs), figure, tolerance.text, verdict(passed),
                   figures={"max_abs_difference": differences, "tolerance": tolerance.value})

    def check_2(self) -> str:
        return (f"2. dist_parallel and fsdp on {self.processes} processes end with the same "
                "weights and momentum")

    def modes_agree(self, setting: Setting, outcomes: dict[str, Outcome]) -> Row:
        """DDP's N processes (each rank the whole model, its gradients all-reduced in buckets while
        backward goes on) against FSDP2's (each rank a slice, its gradients reduce-scattered):
        two mechanisms of the same average, held to each other's checkpoint."""
        groups = [setting.groups.get(mode) for mode in DATA_GROUP_MODES]
        if None in groups:
            missing = DATA_GROUP_MODES[groups.index(None)]
            return Row(self.check_2(), "—", "—", "—", "not run",
                       f"--modes leaves out {missing}: the check holds the two to each other")
        runs = [group.trained for group in groups]
        tolerance = self.all_reduce_order(setting)
        failure = failed(outcomes, runs)
        if failure:
            return fail(self.check_2(), runs, tolerance, failure)
        measured = max_difference(self.state(runs[1]), self.state(runs[0]))
        return Row(self.check_2(), names(runs),
                   f"max abs difference of every weight, BatchNorm statistic and momentum: "
                   f"{measured:.3g}", tolerance.text, verdict(measured <= tolerance.value),
                   figures={"max_abs_difference": measured, "tolerance": tolerance.value})

    def sync_batchnorm(self, setting: Setting, outcomes: dict[str, Outcome]) -> Row:
        title = f"2. with SyncBatchNorm, {self.processes} processes end where 1 process ends"
        if setting.sync_bn is None:
            return Row(title, "—", "—", "—", "not run", setting.sync_bn_not_run)
        one = setting.one_device["dist_parallel"]
        tolerance = self.rounding(setting)
        failure = failed(outcomes, [setting.sync_bn, one])
        if failure:
            return fail(title, [setting.sync_bn, one], tolerance, failure)
        measured = max_difference(self.state(setting.sync_bn), self.state(one))
        return Row(title, names([setting.sync_bn, one]),
                   f"max abs difference of every weight, BatchNorm statistic and momentum: "
                   f"{measured:.3g}", tolerance.text, verdict(measured <= tolerance.value),
                   figures={"max_abs_difference": measured, "tolerance": tolerance.value})

    def check_3(self, mode: str, group: Group | None) -> str:
        planned = evaluation_counts(self.processes, self.cuda)
        counts = sorted({*(group.evaluations if group else planned), self.processes})
        return (f"3. {mode}: evaluation by {', '.join(map(str, counts))} processes, the "
                "same accuracy and loss, every test image counted once")

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
        slices = "; fsdp's ranks hold slices of the same tensors" if mode == "fsdp" else ""
        return (f"4. {mode}: parameters identical on every rank (results.json's "
                f"params_in_sync{slices})")

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
        records = {run.name: outcomes[run.name].results for run in runs}
        apart = [name for name, record in records.items()
                 if record.get("params_in_sync") is not True]
        buffers = max(record.get("buffers_max_abs_diff") or 0.0 for record in records.values())
        figure = (f"parameters identical on all {self.processes} ranks in "
                  f"{len(runs) - len(apart)} of {len(runs)} runs"
                  + (f" (not in {', '.join(apart)})" if apart else "")
                  + (f"; BatchNorm statistics differ by up to {buffers:.3g} (each rank's "
                     "BatchNorm sees its own share)" if buffers else
                     "; BatchNorm statistics identical too"))
        return Row(self.check_4(mode), names(runs), figure, BITWISE.text, verdict(not apart),
                   figures={"params_in_sync": {n: r.get("params_in_sync")
                                               for n, r in records.items()},
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
        title = self.check_5(mode, group)
        tolerance = self.all_reduce_order(setting)
        failure = failed(outcomes, runs)
        if failure:
            return fail(title, runs, tolerance, failure)
        first = first_step_written(self.out / "runs" / group.resumed.run_dir)
        if first is None or first <= self.halfway:
            said = "no scalar" if first is None else f"its first scalar at step {first}"
            return fail(title, runs, tolerance, f"{group.resumed.name} did not continue the first "
                                                f"half: its event file has {said}, not one after "
                                                f"step {self.halfway}")
        measured = max_difference(self.state(group.resumed), self.state(group.trained))
        return Row(title, names(runs),
                   f"max abs difference of every weight, BatchNorm statistic and momentum: "
                   f"{measured:.3g} (the halves self-launched, the second with --resume auto, "
                   f"its first step logged {first}, past step {self.halfway}; the uninterrupted "
                   "run under torchrun)", tolerance.text,
                   verdict(measured <= tolerance.value),
                   figures={"max_abs_difference": measured, "tolerance": tolerance.value,
                            "continued_from_step": first})

    def check_6(self) -> str:
        n = self.processes
        return (f"6. pipeline_parallel on {plural(n, 'process')} ({plural(n, 'stage')}, "
                f"{plural(n, 'micro-batch')} a step) ends with dist_parallel's weights and "
                "momentum")

    def pipeline_trains_ddp(self, setting: Setting, outcomes: dict[str, Outcome]) -> Row:
        """pipeline_parallel's N stages (each rank a contiguous run of the model's pieces, a step's
        batch in N micro-batches, micro-batch m DDP's rank m's images) against dist_parallel's N
        processes: every weight and momentum buffer held to the tolerance. The BatchNorm running
        statistics differ, and the row says by how much: the pipeline updates each BatchNorm once
        a micro-batch, N times a step; DDP once a step on each rank, and saves rank 0's."""
        title = self.check_6()
        if setting.pipeline is None:
            return Row(title, "—", "—", "—", "not run", setting.pipeline_not_run)
        runs = [setting.groups["dist_parallel"].trained, setting.pipeline]
        tolerance = self.pipeline_order(setting)
        failure = failed(outcomes, runs)
        if failure:
            return fail(title, runs, tolerance, failure)
        amps = [outcomes[launch.name].results["config"]["amp"] for launch in runs]
        if amps[0] != amps[1]:  # a GPU without bf16: DDP's default is fp16, the pipeline's off
            return Row(title, names(runs), "—", tolerance.text, "not run",
                       f"dist_parallel trained under --amp {amps[0]}, the pipeline under "
                       f"{amps[1]} (each its default here; the pipeline refuses fp16): give "
                       "--amp off or bf16")
        ddp, pipe = (self.state(launch) for launch in runs)
        trained = max_difference(*(batchnorm(s, None) for s in (pipe, ddp)))
        statistics = max_difference(*(batchnorm(s, STATISTICS) for s in (pipe, ddp)))
        updates = [sorted({int(v) for v in batchnorm(s, TRACKED).values()}) for s in (pipe, ddp)]
        figure = f"max abs difference of every weight and momentum: {trained:.3g}"
        if updates[1]:
            figure += (f"; BatchNorm running statistics not compared: they differ by up to "
                       f"{statistics:.3g}, as each BatchNorm was updated "
                       f"{' or '.join(map(str, updates[0]))} times in the pipeline (once a "
                       f"micro-batch) and {' or '.join(map(str, updates[1]))} in DDP (once a step "
                       "on each rank; rank 0's saved)")
        return Row(title, names(runs), figure, tolerance.text, verdict(trained <= tolerance.value),
                   figures={"max_abs_difference": trained, "tolerance": tolerance.value,
                            "batchnorm_statistics_max_abs_difference": statistics,
                            "batchnorm_updates": dict(zip(("pipeline_parallel", "dist_parallel"),
                                                          updates))})


STATISTICS, TRACKED = (".running_mean", ".running_var"), (".num_batches_tracked",)  # BatchNorm's


def batchnorm(state: dict[str, torch.Tensor], endings: tuple | None) -> dict[str, torch.Tensor]:
    """The tensors of a training_state whose names end in one of `endings`; None: every tensor but
    BatchNorm's running statistics and counts of updates."""
    if endings is None:
        return {name: value for name, value in state.items()
                if not name.endswith((*STATISTICS, *TRACKED))}
    return {name: value for name, value in state.items() if name.endswith(endings)}


def training_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every weight and BatchNorm statistic of a checkpoint.pt (`model.<name>`) and SGD's momentum
    of every parameter (`momentum.<position>`), read with weights_only=True."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    tensors = {f"model.{name}": value for name, value in state["model"].items()}
    for position, entry in state["optimizer"]["state"].items():
        if "momentum_buffer" in entry and entry["momentum_buffer"] is not None:
            tensors[f"momentum.{position}"] = entry["momentum_buffer"]
    return tensors


def first_step_written(run_dir: Path) -> int | None:
    """The first step of train/loss in the newest event file of a run folder: what the last attempt
    of the run wrote first (a run resumed at step h writes from step h + 1 on, into a file of its
    own), as TensorBoard's own reader reads it. None without one."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    files = sorted(run_dir.glob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime)
    if not files:
        return None
    accumulator = EventAccumulator(str(files[-1]), size_guidance={SCALARS: 0})
    accumulator.Reload()
    if "train/loss" not in accumulator.Tags()[SCALARS]:
        return None
    return min(event.step for event in accumulator.Scalars("train/loss"))


def max_difference(ours: dict, theirs: dict) -> float:
    """The largest absolute difference over the tensors of `ours`; inf where `theirs` lacks one, has
    one more, or one of another shape."""
    if ours.keys() != theirs.keys() or any(theirs[n].shape != ours[n].shape for n in ours):
        return math.inf
    return max(((ours[n].double() - theirs[n].double()).abs().max().item()
                if ours[n].numel() else 0.0 for n in ours), default=0.0)


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
