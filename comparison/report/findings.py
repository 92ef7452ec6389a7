"""What report.md's results table says, in sentences computed from its figures (`findings`): the
CPU runs oversubscribed (and the title's end that says so), the verdict (whether the fastest
configuration can be told apart from the rest), data_parallel on the CPU, the noise floor, the
parallel configurations no faster than one GPU, the scaling at the most GPUs run, the run-to-run
spread, and the runs that did not succeed; then the note on runs without timed steps."""
from __future__ import annotations

from comparison.matrix import Cores
from comparison.report.formatting import fmt_percent, listed
from comparison.report.measured import UNITS, Measured, measured
from comparison.report.noise import (against_one, contenders, noise_floor, outrun, overlap,
                                     run_counts, tie_group, wraps_nothing)
from comparison.report.outcome import Outcome


def findings(outcomes: list[Outcome], cores: Cores | None = None) -> list[str]:
    """What the table says, as a list of sentences computed from its figures: runs with more
    processes than cores (their figures measure contention), whether the fastest configuration can
    be told apart from the rest (and by how much), DataParallel on the CPU (which wraps nothing),
    the difference this run can resolve (noise_line), each parallel configuration faster than one
    GPU, tied with it or slower (against_one_lines), the scaling efficiency at the most GPUs run,
    which configurations the run-to-run spread cannot tell apart, and the runs that failed and why
    (each with its log). `cores`: the CPU cores the runs shared (None: not known, nothing said of
    them)."""
    timed = measured(outcomes)
    crowded = oversubscription_line(outcomes, cores)
    if not timed:
        nothing = "- **No run timed a step**, so there is nothing to compare."
        return [line for line in (crowded, nothing) if line] + failures(outcomes)
    lines = [crowded, verdict_line(timed), wraps_nothing_line(timed), noise_line(timed),
             *against_one_lines(timed), scaling_line(timed, cores), spread_line(timed)]
    return [line for line in lines if line] + failures(outcomes)


def oversubscription_line(outcomes: list[Outcome], cores: Cores | None) -> str | None:
    """Whether some CPU runs had more processes (times their threads) than the cores they shared:
    such processes take turns on the cores, so the runs' speed measures that contention, not the
    parallelism."""
    crowded = cores.crowded([o.run for o in outcomes]) if cores else []
    if not crowded:
        return None
    counts = sorted({run.gpus for run in crowded})
    threads = ("one thread each" if cores.threads == 1 else
               f"{cores.threads} threads each (OMP_NUM_THREADS)")
    return (f"- **Oversubscribed: up to {counts[-1]} CPU processes on {cores.available} cores.** "
            f"The runs on {listed([str(n) for n in counts])} CPU processes ({threads}) had more "
            "threads than this machine has cores, so their processes took turns on the cores: "
            "their images/s, speedup and scaling efficiency measure that contention, not the "
            f"parallelism. `--gpu_counts` up to {cores.fit} keeps a core for every thread here.")


def oversubscription_title(outcomes: list[Outcome], cores: Cores | None) -> str:
    """The report's title's end where some CPU runs were oversubscribed: ' — oversubscribed: 8
    processes on 2 cores'; '' otherwise."""
    crowded = cores.crowded([o.run for o in outcomes]) if cores else []
    if not crowded:
        return ""
    most = max(run.gpus for run in crowded)
    return f" — oversubscribed: {most} processes on {cores.available} cores"


def verdict_line(timed: list[Measured]) -> str:
    """The first thing the table says: the fastest configuration, named only where it lies above
    every other beyond the noise (noise.ties: its range of images/s, mean ± std over its runs as
    the table shows it, above every other's, and by more than the noise floor where one was
    measured; with one run, by the floor alone); otherwise which configurations cannot be told
    apart, and why (one run each and no floor measures no noise; or their ranges overlap or lie
    within the floor)."""
    ranked = contenders(timed)
    if not ranked:
        return ("- **Nothing to rank:** only data_parallel on the CPU timed a step, and without "
                "GPUs it is single_gpu's computation.")
    first, floor = ranked[0], noise_floor(timed)
    if len(ranked) == 1:
        aside = [m for m in timed if wraps_nothing(m)]
        if aside:
            too = listed([f"{m.name()} timed a step too ({m.speed()} images/s)" for m in aside])
            return (f"- **{first.name()} is the only configuration ranked** ({first.speed()} "
                    f"images/s): {too}, but without GPUs it is single_gpu's computation (below), "
                    "not a mode to rank it against; single_gpu in --modes gives the speedup and "
                    "the noise floor.")
        return (f"- **Only {first.name()} timed a step** ({first.speed()} images/s): nothing to "
                "compare it with.")
    once = [m for m in ranked if len(m.rows) < 2]
    if once and floor is None:
        figures = "; ".join(f"{m.name()} {m.speed()}" for m in ranked)
        apart = "**The configurations cannot be told apart"
        which = (f"{apart}: one run each**" if len(once) == len(ranked) else
                 f"{apart}:** {listed([m.name() for m in once])} timed one run only, which")
        return (f"- {which} measures no run-to-run spread, so no difference between them is shown "
                "to be more than noise (`--repeat 3` measures it). Images/s in their runs, fastest "
                f"first: {figures}.")
    tied, outran = tie_group(ranked, floor)
    if len(tied) > 1:
        figures = "; ".join(f"{m.name()} {m.speed()}" for m in tied)
        within = f" or lie within the {fmt_percent(floor[0])} noise floor" if floor else ""
        spread = (f"one run each, their images/s lie within the {fmt_percent(floor[0])} noise "
                  "floor" if len(once) == len(ranked) else
                  f"their images/s (mean ± std over {run_counts(ranked)} runs) overlap{within}")
        below = "".join(f" {m.name()} ({m.speed()}) is not told from {first.name()} either, but "
                        f"lies below {outrun(m, ranked, floor).name()} beyond the noise."
                        for m in outran)
        return (f"- **{listed([m.name() for m in tied])} cannot be told apart:** {spread}: "
                f"{figures}.{below}")
    second = ranked[1]
    text = (f"- **Fastest: {first.name()}**, {first.speed()} images/s: "
            f"{first.images_per_sec / second.images_per_sec:.2f}× the next fastest, "
            f"{second.name()} at {second.speed()}")
    single = next((m for m in ranked if m.run.mode == "single_gpu" and m.amp == first.amp), None)
    if first.run.mode != "single_gpu" and single is not None and single is not second:
        text += (f", and {first.images_per_sec / single.images_per_sec:.2f}× {single.name()} at "
                 f"{single.speed()} (the speedup column)")
    text += "; " + above_every_other(ranked, floor, "lies ")
    if first.run.mode == "single_gpu":
        return text + f": no parallel mode beat one {UNITS[first.run.unit][0]} here."
    return text + "."


def above_every_other(ranked: list[Measured], floor: tuple | None, verb: str = "") -> str:
    """How the fastest of `ranked` lies above the rest (ties judged it so): 'its range (mean ± std
    over 3 runs) lies above every other's, by more than the 14 % noise floor'; with one run of
    some, 'it lies more than the 11 % noise floor above every other's (one run each: the floor
    tells them apart)'."""
    once = [m for m in ranked if len(m.rows) < 2]
    if not once:
        return (f"its range (mean ± std over {run_counts(ranked)} runs) {verb}above every other's"
                + (f", by more than the {fmt_percent(floor[0])} noise floor" if floor else ""))
    each = ("one run each" if len(once) == len(ranked) else
            f"{listed([m.name() for m in once])} timed one run only")
    return (f"it {verb}more than the {fmt_percent(floor[0])} noise floor above every other's "
            f"({each}: the floor tells them apart)")


def wraps_nothing_line(timed: list[Measured]) -> str | None:
    """What data_parallel on the CPU is (wraps_nothing), in place of a rank among the modes."""
    wrapped = next((m for m in timed if wraps_nothing(m)), None)
    if wrapped is None:
        return None
    single = next((m for m in timed if m.run.mode == "single_gpu" and m.amp == wrapped.amp), None)
    against = (f"; its {wrapped.speed()} images/s against single_gpu's {single.speed()} is no "
               "measure of DataParallel" if single else "")
    return (f"- **{wrapped.name()} is single_gpu's computation:** without GPUs nn.DataParallel "
            f"calls the model itself, with nothing to scatter, replicate or gather{against}, so it "
            "is left out of the ranking.")


def scaling_line(timed: list[Measured], cores: Cores | None = None) -> str | None:
    """The scaling efficiency of each configuration at the most GPUs run, and whether that many
    CPU processes oversubscribed the cores; None when one GPU count ran."""
    if len({m.run.gpus for m in timed}) < 2:
        return None
    most = max(m.run.gpus for m in timed)
    at_most = [m for m in timed if m.run.gpus == most]
    unit, units = UNITS[at_most[0].run.unit]
    text = f"- **Scaling at {most} {units}**, the most run: "
    known = [(m, m.efficiency) for m in at_most if m.efficiency is not None]
    if not known:
        return (text + "no single_gpu run with the same `--amp` timed a step, so there is no "
                "scaling efficiency.")
    parts = [f"{fmt_percent(efficiency)} for {m.name(count=False)}" for m, efficiency in known]
    single = next((m for m in timed if m.run.mode == "single_gpu" and m.amp == known[0][0].amp),
                  None)
    batch = known[0][0].per_gpu_batch
    if single is None or single.per_gpu_batch == batch:
        share = f"each {unit} with {batch} images, as many as single_gpu"
    else:
        share = f"each {unit} with {batch} of the {batch * most} images single_gpu takes alone"
    crowded = (f"; {most} processes on {cores.available} cores are oversubscribed, so this "
               "efficiency measures their contention"
               if cores and cores.crowded([m.run for m in at_most]) else "")
    return (text + f"scaling efficiency (speedup ÷ {units}) " + listed(parts)
            + f"; {share}{crowded}.")


def spread_line(timed: list[Measured]) -> str | None:
    """With repeats, which configurations' images/s ranges (mean ± std over their runs) overlap,
    the fastest first: their differences cannot be told from run-to-run noise. None with one run
    each (the verdict says so)."""
    ranked = contenders(timed)
    if len(ranked) < 2 or any(len(m.rows) < 2 for m in ranked):
        return None
    runs = run_counts(ranked)
    overlapping = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:] if overlap(a, b)]
    if not overlapping:
        return ("- **Spread:** no two configurations' images/s overlap (mean ± std over their "
                "runs): every difference above is larger than the run-to-run spread, as far as "
                f"{runs} runs each can tell.")
    shown = [f"{a.name()} at {a.speed()} images/s and {b.name()} at {b.speed()}"
             for a, b in overlapping[:3]]
    more = f", and {len(overlapping) - 3} more pairs" if len(overlapping) > 3 else ""
    return (f"- **Within the run-to-run spread** ({runs} runs each): " + "; ".join(shown) + more
            + ". Their images/s (mean ± std) overlap: the difference between them cannot be told "
            "from run-to-run noise.")


def noise_line(timed: list[Measured]) -> str | None:
    """The difference this run can resolve, stated where it was measured: the gap between two
    configurations that did the same computation (noise_floor), and the spread of the repeats
    (each configuration's std over its runs, as a share of its images/s). None where neither was
    measured (one run each, no such pair: the verdict says so)."""
    floor = noise_floor(timed)
    repeated = [m for m in timed if len(m.rows) > 1]
    widest = max(repeated, key=lambda m: m.share) if repeated else None
    spread_text = (f"up to {fmt_percent(widest.share)} of a configuration's images/s (the std over "
                   f"its {run_counts(repeated)} runs, {widest.name()}'s)" if widest else "")
    if floor is None:
        if widest is None:
            return None
        return (f"- **Noise floor: the spread of the repeats,** {spread_text}: configurations "
                "whose ranges (mean ± std) overlap are not told apart here.")
    share, a, b = floor
    why = ("nn.DataParallel without GPUs calls the model itself" if b.run.unit == "cpu" else
           "nn.DataParallel on one GPU moves the batch onto it and calls the model itself")
    runs = ("The repeats vary too: " + spread_text + "." if widest else
            "One run each: `--repeat 3` measures the spread of the repeats too.")
    return (f"- **Noise floor: {fmt_percent(share)}.** {a.name()} and {b.name()} do the same "
            f"computation ({why}), yet measured {a.speed()} and {b.speed()} images/s, "
            f"{fmt_percent(share)} apart: differences of less than {fmt_percent(share)} between "
            "configurations are not shown to be more than noise here, and the sentences and the "
            f"recommendation judge so. {runs}")


def against_one_lines(timed: list[Measured]) -> list[str]:
    """Each parallel configuration against one GPU (against_one), a sentence per kind: faster
    beyond the noise, tied with it (neither a gain nor a loss shown), slower beyond the noise."""
    found = against_one(timed, noise_floor(timed))
    if not found:
        return []
    unit = UNITS[found[0][0].run.unit][0]
    says = {"faster": (f"Faster than one {unit}", "."),
            "tie": (f"Tied with one {unit}", f": neither faster nor slower than one {unit}, as "
                                             "far as this run can tell."),
            "slower": (f"Slower than one {unit}", ": the parallelism cost more here than it "
                                                "brought.")}
    lines = []
    for verdict, (lead, end) in says.items():
        named = "; ".join(f"{m.name()} at {m.speedup_cell()} one {unit} ({why})"
                          for m, kind, why in found if kind == verdict)
        if named:
            lines.append(f"- **{lead}:** {named}{end}")
    return lines


def failures(outcomes: list[Outcome]) -> list[str]:
    """The runs that did not succeed, each with its error and its log (runs not started for the same
    reason together), or that every run succeeded."""
    failed = [o for o in outcomes if o.status != "ok"]
    if not failed:
        return ["- Every run succeeded."]
    lines = [f"- **{len(failed)} of {len(outcomes)} runs did not succeed:**"]
    merged: list[tuple[list[Outcome], str]] = []
    for o in failed:
        if (merged and o.status == "not run" and merged[-1][0][-1].status == "not run"
            and merged[-1][1] == o.error):
            merged[-1][0].append(o)
        else:
            merged.append(([o], o.error))
    for together, error in merged:
        o = together[0]
        names = ", ".join(f"`{each.run.name}`" for each in together)
        log = f" (log: `{o.row['log']}`)" if o.row.get("log") else ""
        after = f" after {o.seconds:.1f} s" if o.status != "not run" else ""
        lines.append(f"  - {names}: {o.status}{after} — {error}{log}")
    return lines


def untimed_note(outcomes: list[Outcome], warmup_steps: int) -> list[str]:
    """What a row of runs without timed steps means and what to do about it; nothing when every run
    timed steps."""
    if not any(o.status == "ok" and o.row["images_per_sec"] is None for o in outcomes):
        return []
    return [f"*no timed steps*: the run succeeded but ended within its {warmup_steps} warm-up "
            f"steps (`--warmup_steps`) and the profiled steps after them (`--profile_steps`), "
            f"which are not timed, so it measured no speed. Give it more steps (more `--epochs`, a "
            f"larger `--synthetic_size`) or fewer `--warmup_steps` or `--profile_steps`.", ""]
