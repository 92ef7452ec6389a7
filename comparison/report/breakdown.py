"""report.md's "Where a step goes": the split of each configuration's step (`Split`), the mean
over its ranks and runs of the profiled steps (each rank's trace_rank<r>.json, split by
comparison/breakdown.py) into compute,
communication exposed and hidden, a pipeline's bubble, data, the optimizer and the rest, and each
rank's work. One
function (`step_split`) computes what the split's table, its sentences and step_breakdown.png
show."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from comparison.report.formatting import fmt_spread, listed
from comparison.report.measured import UNITS, Measured, measured
from comparison.report.noise import wraps_nothing
from comparison.report.outcome import Outcome
from comparison.report.rows import SPLIT_PARTS


PART_NAMES = {"compute_ms": "compute", "comm_exposed_ms": "exposed communication",
              "bubble_ms": "bubble", "data_ms": "data", "optimizer_ms": "optimizer",
              "other_ms": "other"}
# what each parallel mode communicates
COLLECTIVES = {"dist_parallel": "gradient all-reduce", "fsdp": "all-gathers and reduce-scatters",
               "data_parallel": "scatter, replication and gather",
               "pipeline_parallel": "activations and their gradients between stages"}
STRAGGLER_SHARE = 0.10  # ranks whose work differs by more than this share of the step: named

PARALLEL_MODES = ("data_parallel", "dist_parallel", "fsdp", "pipeline_parallel")


@dataclass
class Split:
    """A configuration's step as the split's table, its sentences and step_breakdown.png all show
    it (step_split computes it once): ms per step, each the mean over the configuration's runs of
    the mean over its ranks of the profiled steps."""
    parts: dict[str, float]  # SPLIT_PARTS: they add up to step_ms
    comm_ms: float           # all communication, hidden behind compute or not
    hidden_ms: float         # comm_ms less the exposed part: overlapped with compute, not added
    step_ms: float
    step_std_ms: float       # over the runs (0 with one)
    runs: int                # the runs that recorded a split
    work: dict[int, float]   # rank -> its step less its exposed communication and bubble
    profiled_steps: int | None
    # a pipeline's: its busiest stage's bubble over its schedule (rows.split_row), the mean over
    # the runs, and (S-1)/(M+S-1) for its stages and micro-batches; None in the other modes
    bubble_share: float | None = None
    bubble_theory: float | None = None

    def step_cell(self) -> str:
        """The profiled step as the split's table shows it, and step_breakdown.png at its bar's
        end, with its error bar: '43.6 ± 2.1', mean ± std over the runs."""
        return fmt_spread(self.step_ms, self.step_std_ms, 1, self.runs)

    @property
    def slowest(self) -> int:
        return max(self.work, key=self.work.get)

    @property
    def least(self) -> int:
        return min(self.work, key=self.work.get)

    @property
    def straggler(self) -> bool:
        """Whether the ranks' work differs notably (more than STRAGGLER_SHARE of the step)."""
        spread_ms = self.work[self.slowest] - self.work[self.least]
        return spread_ms > STRAGGLER_SHARE * self.step_ms


def step_split(m: Measured) -> Split | None:
    """The configuration's split (Split), from the CSV rows of its runs that recorded one; None
    where none did."""
    rows = [row for row in m.rows if row.get("split_step_ms") is not None]
    if not rows:
        return None
    mean = lambda key: statistics.fmean(row[key] for row in rows)  # noqa: E731
    per_rank = [[float(w) for w in row["split_work_ms_per_rank"].split()] for row in rows]
    ranks = min(len(work) for work in per_rank)
    steps = [row["split_step_ms"] for row in rows]
    theory = rows[0].get("bubble_share_theory")  # a pipeline's, the same in each of its runs
    return Split(parts={part: mean(f"split_{part}") for part in SPLIT_PARTS},
                 comm_ms=mean("split_comm_ms"), hidden_ms=mean("split_comm_hidden_ms"),
                 step_ms=mean("split_step_ms"),
                 step_std_ms=statistics.stdev(steps) if len(steps) > 1 else 0.0, runs=len(rows),
                 work={r: statistics.fmean(work[r] for work in per_rank) for r in range(ranks)},
                 profiled_steps=rows[0].get("profiled_steps"),
                 bubble_share=mean("split_bubble_share") if theory is not None else None,
                 bubble_theory=theory)


SPLIT_HEADER = ("| configuration | step, ms (mean of timed steps, as above) | profiled step, ms "
                "(mean ± std over the runs) | "
                "compute | communication exposed | bubble | data | optimizer | other | "
                "communication hidden behind compute (not added) | "
                "slowest rank: work, ms (least) |")


def breakdown_section(outcomes: list[Outcome], profiling: int) -> list[str]:
    """report.md's "Where a step goes": each configuration's split (step_split) as a table, then a
    sentence per parallel configuration at its mode's most GPUs. `profiling`: the --profile_steps
    the runs were given, which says why a split is missing."""
    timed = measured(outcomes)
    splits = [(m, step_split(m)) for m in timed]
    if not any(split for _, split in splits):
        return [not_recorded(profiling, bool(timed))]
    steps = sorted({split.profiled_steps for _, split in splits if split and split.profiled_steps})
    counted = f"{listed([str(n) for n in steps])} steps" if steps else "a few steps"
    lines = [
        f"Each rank's step over {counted} recorded by torch.profiler after the timed steps "
        "(`--profile_steps`, never timed), split into compute, exposed communication (the step "
        "waiting for it), the bubble (a pipeline stage waiting for its neighbour's activations or "
        "gradients), waiting for data, the optimizer and the rest: these add up to the "
        "profiled step. The communication hidden behind compute ran while other work did, so it "
        "is shown beside the parts, not added to them. **ms per step, the mean over ranks** (and "
        "over a configuration's runs). A step runs from the loop's call for its batch to the end "
        "of its optimizer step. The profiled steps are a few, with the profiler's own "
        "overhead: the timed step of the results table stands beside them. The slowest rank is "
        "the one with the most work (its step less its exposed communication and bubble: the time "
        "it did not wait for the others). Each rank's trace is in its run folder, "
        "`runs/<run>/trace_rank<r>.json` (Perfetto, chrome://tracing, TensorBoard's profile "
        "plugin).",
        "",
        SPLIT_HEADER,
        "|" + "---|" * SPLIT_HEADER.count(" | ") + "---|",
    ]
    for m, split in splits:
        timed_step = m.step_cell()
        if split is None:
            lines.append(f"| {m.name()} | {timed_step} | not recorded | | | | | | | | |")
            continue
        parts = [f"{split.parts[part]:.1f}" for part in SPLIT_PARTS]
        slowest = (f"rank {split.slowest}: {split.work[split.slowest]:.1f} (rank {split.least}: "
                   f"{split.work[split.least]:.1f})" if len(split.work) > 1 else "—")
        lines.append(f"| {m.name()} | {timed_step} | {split.step_cell()} | " + " | ".join(parts)
                     + f" | {split.hidden_ms:.1f} | {slowest} |")
    sentences = [split_line(m, split, timed) for m, split in splits
                 if split and m in compared(timed)]
    missing = [m for m, split in splits if split is None]
    if missing:
        why = not_recorded(profiling, True).removeprefix("Not recorded: ")
        sentences.append(f"- Not recorded for {listed([m.name() for m in missing])}: {why}")
    return lines + ([""] + sentences if sentences else [])


def not_recorded(profiling: int, timed: bool) -> str:
    """Why no split of the step is there."""
    if not timed:
        return "Not recorded: no run timed a step, so none was profiled."
    if profiling == 0:
        return ("Not recorded: `--profile_steps 0` left the profiler off; by default compare.py "
                "profiles 3 steps of every run and splits them here.")
    return ("Not recorded: no run left a trace of a whole step in its run folder "
            "(`trace_rank<r>.json`).")


def compared(timed: list[Measured]) -> list[Measured]:
    """The parallel configurations given a sentence: every one at its mode's most GPUs (each
    backend, --amp and setting there), data_parallel on the CPU aside (it wraps nothing)."""
    chosen = []
    for mode in PARALLEL_MODES:
        of_mode = [m for m in timed if m.run.mode == mode and not wraps_nothing(m)]
        if of_mode:
            most = max(m.run.gpus for m in of_mode)
            chosen += [m for m in of_mode if m.run.gpus == most]
    return chosen


def split_line(m: Measured, split: Split, timed: list[Measured]) -> str:
    """What separates a parallel configuration's step from single_gpu's (the same --amp): its
    communication, hidden and exposed; its compute against single_gpu's (the per-GPU batch
    shrinks it); the part that grew most; and the slowest rank where the ranks' work differs
    notably (a straggler the others wait for)."""
    collective = COLLECTIVES[m.run.mode]
    exposed = split.parts["comm_exposed_ms"]
    clauses = [f"{split.hidden_ms:.1f} ms of its {split.comm_ms:.1f} ms of {collective} hidden "
               f"behind compute, {exposed:.1f} ms exposed" if split.comm_ms > 0 else
               "no communication recorded"]
    single = next((s for s in timed if s.run.mode == "single_gpu" and s.amp == m.amp), None)
    reference = step_split(single) if single else None
    if reference is not None:
        unit = UNITS[m.run.unit][0]
        batch = (f" for {m.per_gpu_batch} images per {unit}, against {single.per_gpu_batch}"
                 if m.per_gpu_batch != single.per_gpu_batch else "")
        change = lambda part: (f"{PART_NAMES[part]} {reference.parts[part]:.1f} → "  # noqa: E731
                               f"{split.parts[part]:.1f} ms")
        grown = {part: split.parts[part] - reference.parts[part] for part in SPLIT_PARTS}
        most = max(grown, key=grown.get)
        compute_grew_most = most == "compute_ms" and grown[most] > 0  # said once, below
        text = (f"against single_gpu, its profiled step {reference.step_ms:.1f} → "
                f"{split.step_ms:.1f} ms{batch}: "
                + ("" if compute_grew_most else change("compute_ms") + "; "))
        clauses.append(text + (f"the part that grew most, {change(most)}" if grown[most] > 0 else
                               "no part grew"))
    if split.bubble_share is not None:
        clauses.append(f"its busiest stage waited for its neighbour {100 * split.bubble_share:.1f} "
                       f"% of its schedule (the step less its data wait and optimizer), against "
                       f"(S−1)/(M+S−1) = {100 * split.bubble_theory:.1f} % for "
                       f"{m.rows[0]['stages']} stages and {m.rows[0]['microbatches']} "
                       f"micro-batches ({m.rows[0]['schedule']}): the bubble, "
                       f"{split.parts['bubble_ms']:.1f} ms a step over its ranks")
    if split.straggler:
        clauses.append(f"rank {split.slowest} is the slowest, {split.work[split.slowest]:.1f} ms "
                       f"of work per step against {split.work[split.least]:.1f} ms on rank "
                       f"{split.least}, which waits for it in "
                       + ("the bubble" if split.bubble_share is not None else
                          "exposed communication"))
    return f"- **{m.name()}:** " + "; ".join(clauses) + "."
