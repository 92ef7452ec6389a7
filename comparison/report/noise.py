"""How the report tells configurations apart, the same way in the verdict, the sentences and the
recommendation: the modes ranked (`contenders`, data_parallel on the CPU aside: it wraps
nothing), two ranges of images/s that overlap (`overlap`), the noise floor that two
configurations doing the same computation measured (`noise_floor`), the pairs that cannot be told
apart (`ties`) and the parallel configurations no faster than one GPU (`no_gain`)."""
from __future__ import annotations

from comparison.report.formatting import fmt_percent
from comparison.report.measured import Measured


def wraps_nothing(m: Measured) -> bool:
    """data_parallel on the CPU: nn.DataParallel without GPUs calls the model itself (nothing to
    scatter, replicate or gather), so it is single_gpu's computation, and is not ranked among the
    modes."""
    return m.run.mode == "data_parallel" and m.run.unit == "cpu"


def contenders(timed: list[Measured]) -> list[Measured]:
    """The configurations ranked by speed, fastest first: every one that timed a step but
    data_parallel on the CPU (wraps_nothing). The verdict, the spread line and the recommendation
    rank these alike."""
    return sorted((m for m in timed if not wraps_nothing(m)), key=lambda m: m.images_per_sec,
                  reverse=True)


def run_counts(timed: list[Measured]) -> str:
    """How many runs each configuration has: '3', or '2–3'."""
    counts = sorted({len(m.rows) for m in timed})
    return f"{counts[0]}–{counts[-1]}" if len(counts) > 1 else f"{counts[0]}"


def overlap(a: Measured, b: Measured) -> bool:
    """Whether two configurations' ranges of images/s (mean ± std over their runs, as the table
    shows them) overlap: their difference cannot be told from run-to-run noise. The verdict, the
    spread line and the recommendation all judge by it."""
    return a.low <= b.high and b.low <= a.high


def ties(a: Measured, b: Measured, floor: tuple | None) -> bool:
    """Whether two configurations cannot be told apart: their ranges overlap, or their images/s
    differ by no more than the noise floor (noise_floor; None: not measured). The verdict, the
    no-gain line and the recommendation judge by it."""
    apart = max(a.images_per_sec, b.images_per_sec) / min(a.images_per_sec, b.images_per_sec)
    return overlap(a, b) or (floor is not None and apart - 1 <= floor[0])


def same_computation(timed: list[Measured]) -> list[tuple[Measured, Measured]]:
    """The pairs of configurations that do the same computation: single_gpu and data_parallel on
    one GPU (nn.DataParallel on one device calls the model itself), or on the CPU (where it always
    does), with the same --amp and global batch. What they measured apart is noise."""
    pairs = []
    for single in (m for m in timed if m.run.mode == "single_gpu"):
        pairs += [(single, m) for m in timed
                  if m.run.mode == "data_parallel" and (m.run.gpus == 1 or m.run.unit == "cpu")
                  and m.amp == single.amp and m.rows[0]["global_batch"] ==
                  single.rows[0]["global_batch"]]
    return pairs


def noise_floor(timed: list[Measured]) -> tuple[float, Measured, Measured] | None:
    """The difference between configurations that this run cannot resolve, where two of them did
    the same computation (same_computation): the share by which their images/s differ (the
    faster ÷ the slower, less 1), with the pair; the widest such gap where there are several.
    None where no such pair was measured."""
    gaps = [(max(a.images_per_sec, b.images_per_sec) / min(a.images_per_sec, b.images_per_sec)
             - 1, a, b) for a, b in same_computation(timed)]
    return max(gaps, key=lambda gap: gap[0]) if gaps else None


def no_gain(timed: list[Measured], floor: tuple | None) -> list[tuple[Measured, str]]:
    """The parallel configurations no faster than single_gpu (the same --amp), with why: their
    range of speedup includes 1×, or overlaps single_gpu's, or lies within the noise floor (ties).
    Judged only where it can be: both repeated, or a noise floor measured."""
    found = []
    for m in contenders(timed):
        single = next((s for s in timed if s.run.mode == "single_gpu" and s.amp == m.amp), None)
        if m.run.mode == "single_gpu" or single is None or not ties(m, single, floor):
            continue
        if (len(m.rows) < 2 or len(single.rows) < 2) and floor is None:
            continue
        if len(m.rows) > 1 and abs(m.speedup - 1) <= m.speedup * m.share:
            why = "its range includes 1× single_gpu's"
        elif overlap(m, single):
            why = f"its range overlaps single_gpu's {single.speedup_cell()}"
        else:
            why = f"within the {fmt_percent(floor[0])} noise floor of 1×"
        found.append((m, why))
    return found
