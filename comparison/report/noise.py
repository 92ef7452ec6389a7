"""How the report tells configurations apart, the same way in the verdict, the sentences and the
recommendation: the modes ranked (`contenders`, data_parallel on the CPU aside: it wraps
nothing), two ranges of images/s that overlap (`overlap`), the noise floor that two
configurations doing the same computation measured (`noise_floor`), whether a pair can be judged
at all (`judged`: repeats, or a floor), the pairs that cannot be told apart (`ties`) or can
(`beyond`, `outrun`), the configurations that tie with the fastest (`tie_group`), and each
parallel configuration against one GPU: faster, a tie or slower (`against_one`)."""
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


def judged(a: Measured, b: Measured, floor: tuple | None) -> bool:
    """Whether this run can tell two configurations apart at all: where a noise floor was measured
    (noise_floor), by it; otherwise only where both were repeated, their ranges (mean ± std over
    their runs) standing for the noise. One run of either and no floor: nothing measured the
    noise."""
    return floor is not None or (len(a.rows) > 1 and len(b.rows) > 1)


def ties(a: Measured, b: Measured, floor: tuple | None) -> bool:
    """Whether two configurations cannot be told apart: nothing measured the noise (judged), their
    ranges overlap, or their images/s differ by no more than the noise floor (noise_floor; None:
    not measured). The verdict, the sentences and the recommendation judge by it."""
    apart = max(a.images_per_sec, b.images_per_sec) / min(a.images_per_sec, b.images_per_sec)
    return (not judged(a, b, floor) or overlap(a, b)
            or (floor is not None and apart - 1 <= floor[0]))


def beyond(faster: Measured, slower: Measured, floor: tuple | None) -> bool:
    """Whether `faster` measured more images/s than `slower` beyond the noise (not ties)."""
    return faster.images_per_sec > slower.images_per_sec and not ties(faster, slower, floor)


def outrun(m: Measured, ranked: list[Measured], floor: tuple | None) -> Measured | None:
    """The fastest of `ranked` that measured more images/s than `m` beyond the noise (beyond);
    None where none did."""
    return next((other for other in ranked if beyond(other, m, floor)), None)


def tie_group(ranked: list[Measured], floor: tuple | None) -> tuple[list, list]:
    """The configurations that cannot be told from the fastest of `ranked` (ties), and those of
    them that another configuration outran beyond the noise (outrun: one within a wide range of
    the fastest can lie below a narrow one's), which are not of the group; no two of the group
    can be told apart. Where every one but the fastest was outran, they stay in the group: none
    of them is told from the fastest."""
    close = [m for m in ranked[1:] if ties(ranked[0], m, floor)]
    outran = [m for m in close if outrun(m, ranked, floor) is not None]
    if len(outran) == len(close):
        return [ranked[0], *close], []
    return [ranked[0], *[m for m in close if m not in outran]], outran


def apart_why(m: Measured, other: Measured, floor: tuple | None, than: str) -> str:
    """Why `m` is told apart from `other` (beyond), as the sentences give it: 'more than the 11 %
    noise floor below 1×' (`than`: what `other` is, as its figure is quoted), or with repeats 'its
    range below single_gpu's 1.00 ± 0.02×, by more than the 11 % noise floor'."""
    side = "above" if m.images_per_sec > other.images_per_sec else "below"
    if len(m.rows) > 1 and len(other.rows) > 1:
        return f"its range {side} {than}" + (
            f", by more than the {fmt_percent(floor[0])} noise floor" if floor else "")
    return f"more than the {fmt_percent(floor[0])} noise floor {side} {than}"


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


def against_one(timed: list[Measured], floor: tuple | None) -> list[tuple[Measured, str, str]]:
    """Each parallel configuration against single_gpu with the same --amp, where it can be judged
    (judged): 'faster' or 'slower' beyond the noise (beyond), or a 'tie'; with why (its range
    includes 1×, overlaps single_gpu's, lies within the floor of 1×, or lies beyond it), fastest
    first."""
    found = []
    for m in contenders(timed):
        single = next((s for s in timed if s.run.mode == "single_gpu" and s.amp == m.amp), None)
        if m.run.mode == "single_gpu" or single is None or not judged(m, single, floor):
            continue
        one = f"single_gpu's {single.speedup_cell()}" if len(single.rows) > 1 else "1×"
        if not ties(m, single, floor):
            verdict = "faster" if m.images_per_sec > single.images_per_sec else "slower"
            found.append((m, verdict, apart_why(m, single, floor, one)))
        elif len(m.rows) > 1 and abs(m.speedup - 1) <= m.speedup * m.share:
            found.append((m, "tie", "its range includes 1×"))
        elif overlap(m, single):
            found.append((m, "tie", f"its range overlaps {one}"))
        else:
            found.append((m, "tie", f"within the {fmt_percent(floor[0])} noise floor of 1×"))
    return found
