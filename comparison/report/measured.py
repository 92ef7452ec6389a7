"""A configuration as its table row sums it up (`Measured`): every figure of its speed is made
from one statistic, its step, the mean of the timed steps (each run's, results.csv's
step_time_mean_s), averaged over its runs, ± their standard deviation. Its images/s is the global
batch ÷ that step, its epoch the run's training images ÷ those images/s, its speedup those
images/s ÷ single_gpu's, its scaling efficiency the speedup ÷ its GPUs (one GPU's too); the ± of
each is the step's std as the same share of the figure. The table, the sentences and the pictures
all take them from here; `groups` gathers the runs of each configuration, in the table's order."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from comparison.matrix import PlannedRun
from comparison.report.formatting import fine_digits, fmt_spread
from comparison.report.outcome import Outcome
from comparison.report.rows import baseline


def groups(outcomes: list[Outcome]) -> list[list[Outcome]]:
    by_setting: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        by_setting.setdefault(o.run.setting, []).append(o)
    return list(by_setting.values())


# what a run's `gpus` counts
UNITS = {"gpu": ("GPU", "GPUs"), "cpu": ("CPU process", "CPU processes")}


@dataclass
class Measured:
    """A configuration as its table row sums it up: its successful runs that timed steps (their
    CSV rows) and single_gpu's images/s with the same --amp (`base`; None: not measured). Every
    figure of its speed is made from one statistic, its step (step_s, ± step_std_s): the table's
    cells, the sentences and the pictures all read them here."""
    run: PlannedRun  # the configuration's first run
    rows: list[dict]
    base: float | None = None

    def mean(self, key: str) -> float | None:
        values = [row[key] for row in self.rows if row[key] is not None]
        return statistics.fmean(values) if values else None

    @property
    def step_s(self) -> float:
        """The mean of the timed steps (each run's), averaged over the runs: the table's step."""
        return self.mean("step_time_mean_s")

    @property
    def step_std_s(self) -> float:
        """The sample standard deviation of the runs' steps (0 with one run)."""
        steps = [row["step_time_mean_s"] for row in self.rows]
        return statistics.stdev(steps) if len(steps) > 1 else 0.0

    @property
    def share(self) -> float:
        """The step's std as a share of the step: the same share of every figure made from it."""
        return self.step_std_s / self.step_s

    @property
    def images_per_sec(self) -> float:
        """The global batch ÷ the step (not the mean of each run's images/s)."""
        return self.rows[0]["global_batch"] / self.step_s

    @property
    def images_per_sec_std(self) -> float:
        return self.images_per_sec * self.share

    @property
    def speedup(self) -> float | None:
        """Its images/s ÷ single_gpu's (the same --amp); None where single_gpu timed no step."""
        return self.images_per_sec / self.base if self.base else None

    @property
    def efficiency(self) -> float | None:
        """The speedup ÷ the GPUs used: on one GPU what its speedup says."""
        return self.speedup / self.run.gpus if self.base else None

    @property
    def amp(self) -> str | None:
        return self.rows[0]["amp"]

    @property
    def per_gpu_batch(self) -> int:
        return self.rows[0]["per_gpu_batch"]

    @property
    def low(self) -> float:
        """The bottom of the configuration's range of images/s: mean − std, as the table shows
        it."""
        return self.images_per_sec - self.images_per_sec_std

    @property
    def high(self) -> float:
        return self.images_per_sec + self.images_per_sec_std

    def cell(self, value: float, digits: int, unit: str = "") -> str:
        """A figure made from the step, ± the step's share of it."""
        return fmt_spread(value, value * self.share, digits, len(self.rows), unit)

    def speed(self) -> str:
        """Its images/s as the table's cell has it: '1,200 ± 50'."""
        return self.cell(self.images_per_sec, 0)

    def step_cell(self) -> str:
        ms = 1000 * self.step_s
        return fmt_spread(ms, 1000 * self.step_std_s, fine_digits(ms), len(self.rows))

    def epoch_cell(self) -> str:
        images = self.rows[0]["train_images"]
        if not images:
            return "—"
        epoch = images / self.images_per_sec
        return self.cell(epoch, fine_digits(epoch))

    def speedup_cell(self) -> str:
        return self.cell(self.speedup, 2, "×") if self.base else "—"

    def efficiency_cell(self) -> str:
        return self.cell(100 * self.efficiency, 0, " %") if self.base else "—"

    def name(self, count: bool = True) -> str:
        """The configuration in a sentence, as PlannedRun.describe() has it: 'dist_parallel on 2
        GPUs (nccl)'; without its count, 'dist_parallel (nccl)'; single_gpu without its one GPU."""
        described = self.run.describe()
        counted = described.split(" (")[0]
        if count and self.run.mode != "single_gpu":
            return described
        return self.run.mode + described[len(counted):]


def measured(outcomes: list[Outcome]) -> list[Measured]:
    """The configurations with a timed step, in the table's order, each with single_gpu's
    images/s (baseline) beside it."""
    timed = []
    for group in groups(outcomes):
        rows = [o.row for o in group if o.status == "ok" and o.row["images_per_sec"] is not None]
        if rows:
            timed.append(Measured(group[0].run, rows, baseline(outcomes, rows[0]["amp"])))
    return timed
