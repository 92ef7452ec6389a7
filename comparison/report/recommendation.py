"""report.md's `Recommendation:` line: the mode to use on this machine for this model, and why,
from the table's figures (as Measured has them, told apart as noise.ties judges, with the noise
floor the run measured) and the model
state each mode needs per GPU (the memory projection's arithmetic). `recommendation` lists its
rules, in order: memory first (`memory_choice`), then speed (`speed_rules`)."""
from __future__ import annotations

from comparison.projection import MEMORY_GPU_COUNTS, PIPELINE_STAGES, memory_per_gpu, pipeline_point
from comparison.report.breakdown import step_split
from comparison.report.formatting import fmt_bytes, fmt_percent, listed
from comparison.report.measured import UNITS, Measured, measured
from comparison.report.noise import (against_one, apart_why, contenders, noise_floor, outrun,
                                     tie_group, wraps_nothing)
from comparison.report.outcome import Outcome
from comparison.report.projection_memory import STATE_PARTS


MODE_NAMES = {"single_gpu": "single_gpu", "data_parallel": "data_parallel (nn.DataParallel)",
              "dist_parallel": "dist_parallel (DDP)", "fsdp": "fsdp (FSDP2)",
              "pipeline_parallel": "pipeline_parallel (torch.distributed.pipelining)"}
# among modes whose speeds cannot be told apart: DDP first (WHY_DDP);
# DataParallel last, PyTorch's own advice
PREFERENCE = ("dist_parallel", "fsdp", "single_gpu", "pipeline_parallel", "data_parallel")
WHY_DDP = ("DDP is the default where modes tie: PyTorch recommends it over DataParallel even on "
           "one machine, it scales past one node, and FSDP spends traffic to save memory this "
           "model does not need saved (docs/guide.md)")


def recommendation(outcomes: list[Outcome], memory: dict) -> str:
    """The report's `Recommendation:` line: the mode to use on this machine for this model, and why,
    from the table's figures (images/s and speedup as Measured has them; two configurations told
    apart only as the verdict tells them apart, noise.ties: their images/s ranges, mean ± std, do
    not overlap and differ by more than the noise floor the run measured; with one run, by that
    floor alone; data_parallel on the CPU, which wraps nothing, not among them: `contenders`) and
    the model state each mode needs per GPU (memory_projection's arithmetic). A mode that was run
    and timed no step (failed, stopped, not reached: lost_mode) is never recommended, and is named
    for what happened to it. The rules, in order:

    1. Memory: where DDP's model state outgrows one GPU (the projection), or a dist_parallel run
       ran out of memory, fsdp, on the fewest GPUs that hold the state; pipeline_parallel instead
       where it ran beside fsdp on as many GPUs, its largest stage holds its part of the state,
       and its step waits less in its bubble and transfers than fsdp's in its exposed all-gathers
       and reduce-scatters (the split of the step); none of these modes where FSDP does not hold
       it on 64 GPUs, or where fsdp was run and failed.
    2. No configuration timed a step: nothing to choose by.
    3. A configuration with one run and no noise floor measured: nothing measured the noise, so
       no mode is shown faster: dist_parallel, the default (WHY_DDP).
    4. The fastest configuration beyond the noise of every other: its mode. data_parallel is
       recommended over dist_parallel only so, on measured cause; dist_parallel that was not run
       is still the default.
    5. Otherwise the modes that tie with the fastest and that no configuration outran beyond the
       noise: the first of them in PREFERENCE (dist_parallel where it is among them,
       data_parallel only where it ties with nothing else), the rest named.
    Where dist_parallel was run and timed no step, rules 3 to 5 choose among the modes measured,
    in PREFERENCE. The mode recommended says which of its configurations were slower than one GPU
    beyond the noise, and, where none of them was faster, which tied with it (noise.against_one);
    where some of its runs failed, how many. On the CPU, a sentence on what CPU processes standing
    in for GPUs can and cannot tell."""
    timed, unit = measured(outcomes), UNITS[outcomes[0].run.unit]
    text, mode = (memory_choice(outcomes, memory, unit)
                  or speed_rules(timed, memory, unit, outcomes))
    text += caveats(mode, timed, outcomes, noise_floor(timed), unit) if mode else ""
    if outcomes[0].run.unit == "cpu":
        text += (" On this CPU-only machine each \"GPU\" is a CPU process with one thread: its "
                 "figures show the modes' mechanics (processes over gloo, the split batch, each "
                 "wrapper's own cost), not what GPUs would gain, nor NCCL, nor GPU memory "
                 "(projected, not measured); run compare.py on GPUs to choose for them.")
    return "Recommendation: " + text


def lost_mode(outcomes: list[Outcome], mode: str) -> str | None:
    """Why `mode`, which the comparison ran, timed no step: 'dist_parallel (DDP) failed here
    (`03-dist_parallel-2gpu-nccl-r1`: exit status 1: ...; its log `logs/...`)', or was stopped,
    was not run (compare.py stopped first), timed no step; None where it timed a step, or was not
    among the modes run."""
    runs = [o for o in outcomes if o.run.mode == mode]
    if not runs or any(o.status == "ok" and o.row["images_per_sec"] is not None for o in runs):
        return None
    first = next((o for o in runs if o.status != "ok"), runs[0])
    how = {"failed": "failed", "interrupted": "was stopped", "not run": "was not run",
           "ok": "timed no step"}[first.status]
    error = first.error or "it ended within its --warmup_steps"
    log = f"; its log `{first.row['log']}`" if first.row.get("log") else ""
    return f"{MODE_NAMES[mode]} {how} here (`{first.run.name}`: {error}{log})"


def state_per_gpu(memory: dict, gpus: int, mode: str, reshard: bool = True) -> float:
    """Bytes per GPU of the runs' model state under `mode` (projection.memory_per_gpu)."""
    return sum(memory_per_gpu(memory["models"][0], gpus, mode, reshard, memory["amp"],
                              memory["momentum"]).values())


def capacity_text(memory: dict) -> str:
    """The GPU memory the state is weighed against: "its 79.2 GiB", or "an
    assumed 80.0 GiB" (no GPU here)."""
    return f"{'an assumed' if memory['assumed'] else 'its'} {fmt_bytes(memory['gpu_bytes'])}"


def fits_text(memory: dict) -> str:
    """The model state under DDP on one GPU, named as projection.md names it."""
    assumed = " (assumed: no GPU here)" if memory["assumed"] else ""
    return (f"the model state under DDP, {fmt_bytes(state_per_gpu(memory, 1, 'dist_parallel'))} "
            f"per GPU ({STATE_PARTS}; projection.md), fits one GPU of "
            f"{fmt_bytes(memory['gpu_bytes'])}{assumed}")


def memory_choice(outcomes: list[Outcome], memory: dict,
                  unit: tuple[str, str]) -> tuple[str, str | None] | None:
    """Rule 1 of recommendation(): fsdp where DDP cannot hold the model state, the text and the
    mode it recommends (None: none); None where DDP can hold it."""
    ddp = state_per_gpu(memory, 1, "dist_parallel")
    ran_out = [o for o in outcomes if o.run.mode == "dist_parallel" and o.status == "failed"
               and "out of memory" in (o.error or "").lower()
               and not any(p.status == "ok" and p.run.mode == o.run.mode
                           and p.run.gpus == o.run.gpus for p in outcomes)]
    if ddp <= memory["gpu_bytes"] and not ran_out:
        return None
    fsdp = measured([o for o in outcomes if o.run.mode == "fsdp"])
    lost = lost_mode(outcomes, "fsdp")
    if ran_out:
        why = (f"dist_parallel ran out of memory (`{ran_out[0].run.name}`, its log in "
               f"`{ran_out[0].row.get('log') or 'logs/'}`)")
        if lost:
            return (f"none of the modes run here: {why}, and {lost}: see what stopped it in its "
                    "log, and run compare.py again.", None)
        where = (f"fsdp ran ({fsdp[0].name()}, {fsdp[0].images_per_sec:,.0f} images/s)" if fsdp else
                 "fsdp shards the model state over the GPUs: add it to --modes")
        return f"fsdp (FSDP2): {why} and {where}.", "fsdp"
    gpus = memory["runs_fsdp_gpus"][True]
    need = (f"under DDP each GPU would need {fmt_bytes(ddp)} for the model state alone "
            f"({STATE_PARTS}), more than {capacity_text(memory)}")
    if gpus is None:
        most = MEMORY_GPU_COUNTS[-1]
        return (f"none of these modes: {need}, and FSDP on {most} GPUs still "
                f"{fmt_bytes(state_per_gpu(memory, most, 'fsdp'))} each (projection.md); a smaller "
                "model, or a parallelism this suite does not have (tensor, pipeline stages with "
                "FSDP inside them).", None)
    each = fmt_bytes(state_per_gpu(memory, gpus, "fsdp"))
    if lost:
        return (f"none of the modes run here: {need}; FSDP would hold it on {gpus} GPUs or more "
                f"({each} each), but {lost}: see what stopped it in its log, and run compare.py "
                "again.", None)
    split_wins = pipeline_over_fsdp(outcomes, memory)
    if split_wins:
        return f"pipeline_parallel (torch.distributed.pipelining): {need}; {split_wins}", \
            "pipeline_parallel"
    return (f"fsdp (FSDP2): {need}; FSDP holds it on {gpus} GPUs or more ({each} each, resharding "
            "after forward), activations on top (projection.md)." + pipeline_note(memory),
            "fsdp")


def largest_stage(memory: dict, stages: int, microbatches: int) -> float | None:
    """Bytes of model state on a pipeline's largest stage (projection.pipeline_point), for
    PyramidNet, whose pieces the memory projection holds; None for another model."""
    pieces = memory.get("pieces")
    if not pieces or stages > len(pieces):
        return None
    return pipeline_point(pieces, stages, microbatches, memory["amp"],
                          memory["momentum"]).state_bytes


def pipeline_over_fsdp(outcomes: list[Outcome], memory: dict) -> str | None:
    """Why pipeline_parallel beats fsdp where the state outgrows one GPU: both ran on as many GPUs
    and recorded their step's split, the pipeline's largest stage holds its part of the state, and
    its wait (bubble and exposed transfers) is less than fsdp's exposed communication; None
    otherwise."""
    timed = measured(outcomes)
    for pipe in (m for m in timed if m.run.mode == "pipeline_parallel"):
        fsdp = next((m for m in timed if m.run.mode == "fsdp" and m.run.gpus == pipe.run.gpus
                     and m.amp == pipe.amp), None)
        splits = (step_split(pipe), step_split(fsdp) if fsdp else None)
        stage = largest_stage(memory, pipe.run.gpus, int(pipe.rows[0]["microbatches"]))
        if None in splits or stage is None or stage > memory["gpu_bytes"]:
            continue
        waits = splits[0].parts["bubble_ms"] + splits[0].parts["comm_exposed_ms"]
        fsdp_waits = splits[1].parts["comm_exposed_ms"]
        if waits < fsdp_waits:
            return (f"{pipe.name()} holds it in {pipe.run.gpus} stages of {fmt_bytes(stage)} at "
                    f"most, and its step waits {waits:.1f} ms in its bubble and transfers against "
                    f"{fsdp_waits:.1f} ms of exposed all-gathers and reduce-scatters for "
                    f"{fsdp.name()} (Where a step goes): splitting the model costs less here than "
                    "FSDP's traffic, activations on top (projection.md).")
    return None


def pipeline_note(memory: dict) -> str:
    """Where a pipeline's stages would hold the state too: the fewest of PIPELINE_STAGES whose
    largest stage fits, as a sentence after fsdp's; empty where none does or for another model."""
    fits = next(((stages, stage) for stages in PIPELINE_STAGES
                 if (stage := largest_stage(memory, stages, stages)) is not None
                 and stage <= memory["gpu_bytes"]), None)
    if fits is None:
        return ""
    return (f" pipeline_parallel would hold it too, on {fits[0]} stages ({fmt_bytes(fits[1])} on "
            "the largest): `--modes fsdp pipeline_parallel` on as many GPUs weighs FSDP's traffic "
            "against the pipeline's bubble.")


def speed_text(m: Measured, unit: tuple[str, str]) -> str:
    """A configuration's speed as the table has it: its speedup over one GPU,
    else its images/s (mean ± std)."""
    if m.speedup is not None and m.run.mode != "single_gpu":
        return f"{m.speedup_cell()} one {unit[0]}"
    return f"{m.speed()} images/s"


def caveats(mode: str, timed: list[Measured], outcomes: list[Outcome], floor,
            unit: tuple[str, str]) -> str:
    """What the recommendation adds of the mode it chose (noise.against_one): each of its
    configurations slower than one GPU beyond the noise; where none of them was faster, those
    that tied with it; and how many of its runs did not succeed."""
    text = ""
    ones = [found for found in against_one(timed, floor) if found[0].run.mode == mode]
    gained = any(verdict == "faster" for _, verdict, _ in ones)
    for kind, lead, end in (("slower", f"It was slower than one {unit[0]} here", "."),
                            ("tie", f"It ties with one {unit[0]}", f": neither faster nor "
                                    f"slower than one {unit[0]}, as far as this run can tell.")):
        named = "; ".join(f"{m.name()} at {speed_text(m, unit)} ({why})"
                          for m, verdict, why in ones if verdict == kind)
        if named and not (kind == "tie" and gained):
            text += f" {lead}: {named}{end}"
    runs = [o for o in outcomes if o.run.mode == mode]
    failed = [o for o in runs if o.status != "ok"]
    if failed:
        text += (f" {len(failed)} of its {len(runs)} runs did not succeed "
                 f"({listed([f'`{o.run.name}`' for o in failed])}: below).")
    return text


def slower_text(m: Measured, ranked: list[Measured], floor, unit: tuple[str, str]) -> str:
    """'dist_parallel on 2 GPUs (nccl) was slower beyond the noise (0.86 ± 0.04× one GPU, its
    range below single_gpu (1,390 ± 10 images/s))': `m` against the fastest that outran it
    (noise.outrun)."""
    faster = outrun(m, ranked, floor)
    return (f"{m.name()} was slower beyond the noise ({speed_text(m, unit)}, "
            + apart_why(m, faster, floor, f"{faster.name()} ({faster.speed()} images/s)") + ")")


def beyond_all(best: Measured, ranked: list[Measured], floor) -> str:
    """How the fastest lies above every other configuration, judged as ties judges it."""
    once = [m for m in ranked if len(m.rows) < 2]
    if once:
        each = "one run each" if len(once) == len(ranked) else "some of them run once"
        return (f"more than the {fmt_percent(floor[0])} noise floor above every other "
                f"configuration's images/s, {each}")
    return (f"its range (mean ± std over {len(best.rows)} runs) above every other "
            "configuration's" + (f" by more than the {fmt_percent(floor[0])} noise floor"
                                 if floor else ""))


def speed_rules(timed: list[Measured], memory: dict, unit: tuple[str, str],
                outcomes: list[Outcome]) -> tuple[str, str | None]:
    """Rules 2 to 5 of recommendation(), the model state fitting one GPU under DDP: the text, and
    the mode it recommends (None: none)."""
    if not timed:
        return ("none: no run timed a step, so nothing was measured to choose by (the failed "
                "runs are listed below).", None)
    fits = fits_text(memory)
    ranked = contenders(timed)  # data_parallel on the CPU is single_gpu's computation
    lost = lost_mode(outcomes, "dist_parallel")
    if not ranked:
        if lost:
            return (f"none: {fits}, but only data_parallel on the CPU timed a step, which is "
                    f"single_gpu's computation there, and {lost}.", None)
        return (f"dist_parallel (DDP), not run here (add it to --modes): {fits}; only "
                "data_parallel on the CPU timed a step, which is single_gpu's computation there, "
                f"and {WHY_DDP}.", "dist_parallel")
    best, others = ranked[0], ranked[1:]
    ddp = next((m for m in ranked if m.run.mode == "dist_parallel"), None)
    not_run = "" if ddp else ", not run here (add it to --modes)"
    floor = noise_floor(timed)

    def default(why: str, among: list[Measured]) -> tuple[str, str]:
        """DDP, the default (WHY_DDP); where DDP was run and timed no step, the first mode of
        `among` in PREFERENCE, DDP named for what happened to it."""
        if lost is None:
            return f"dist_parallel (DDP){not_run}: {fits}; {why}, and {WHY_DDP}.", "dist_parallel"
        modes = {m.run.mode for m in among}
        chosen = next(mode for mode in PREFERENCE if mode in modes)
        return (f"{MODE_NAMES[chosen]}: {fits}; {why}; {lost}, so it is not recommended, and "
                f"among the modes measured {chosen} comes first in the order used where modes tie "
                "(fsdp, single_gpu, then data_parallel, which PyTorch advises against: "
                "docs/guide.md).", chosen)

    if not others:
        aside = "".join(f"; {m.name()}, {m.speed()} images/s, is single_gpu's computation here"
                        for m in timed if wraps_nothing(m))
        if aside:
            return default(f"the only configuration ranked is {best.name()} "
                           f"({speed_text(best, unit)}{aside}, not a mode to rank it against; "
                           "single_gpu in --modes gives the speedup and the noise floor)", ranked)
        return default(f"only {best.name()} timed a step ({speed_text(best, unit)}), nothing to "
                       "compare it with", ranked)
    if floor is None and any(len(m.rows) < 2 for m in ranked):
        also = (f", and {ddp.name()} {speed_text(ddp, unit)} in its, slower in one run, which no "
                "noise measured here confirms or rules out" if ddp not in (None, best) else "")
        return default("one run per configuration measures no spread, so no mode is shown faster "
                       f"than another ({best.name()} was fastest in its run, "
                       f"{speed_text(best, unit)}{also}; `--repeat 3` measures the spread)",
                       ranked)
    tied, outran = tie_group(ranked, floor)
    if len(tied) == 1:
        above = beyond_all(best, ranked, floor)
        if best.run.mode == "dist_parallel":
            return (f"dist_parallel (DDP): {fits}, and DDP was fastest: {best.name()} at "
                    f"{speed_text(best, unit)}, {above}.", "dist_parallel")
        if best.run.mode == "fsdp":
            return (f"fsdp (FSDP2): fastest, {best.name()} at {speed_text(best, unit)}, {above}, "
                    f"DDP's included, though {fits}.", "fsdp")
        if best.run.mode == "single_gpu":
            slower = "; ".join(f"{m.name()} at {speed_text(m, unit)}" for m in others
                               if m.run.mode != "single_gpu")
            return ("single_gpu: faster than every parallel configuration here "
                    f"({speed_text(best, unit)}, {above}), each of them slower: {slower}; for "
                    "this model and batch the parallel modes cost this machine more than they "
                    "bring; with more GPUs or a larger batch, dist_parallel (DDP).", "single_gpu")
        fastest = (f"data_parallel (nn.DataParallel): fastest, {best.name()} at "
                   f"{speed_text(best, unit)}, {above}")
        if lost:
            return f"{fastest}; {lost}, so it is not recommended.", "data_parallel"
        if ddp is None:
            return default(f"data_parallel was fastest ({speed_text(best, unit)}) but "
                           "dist_parallel was not measured beside it", ranked)
        return (f"{fastest}, dist_parallel's ({speed_text(ddp, unit)}) included: the measured "
                "cause to prefer it on this machine; DDP still scales past one node "
                "(docs/guide.md).", "data_parallel")
    return tie_rule(tied, outran, ranked, floor, unit, ddp, default)


def tie_rule(tied: list[Measured], outran: list[Measured], ranked: list[Measured], floor,
             unit: tuple[str, str], ddp: Measured | None, default) -> tuple[str, str]:
    """Rule 5 of recommendation(): the configurations that cannot be told from the fastest
    (noise.tie_group: `tied`), the first of their modes in PREFERENCE; those within the noise of
    the fastest that another outran (`outran`), and dist_parallel where it is not among them,
    named slower."""
    chosen = next(mode for mode in PREFERENCE if mode in {m.run.mode for m in tied})
    ranges = "; ".join(f"{m.name()} {m.speed()}" for m in tied)
    if all(len(m.rows) < 2 for m in ranked):
        how = f"lie within the {fmt_percent(floor[0])} noise floor, one run each"
    else:
        how = ("(mean ± std over the repeats) overlap"
               + (f" or lie within the {fmt_percent(floor[0])} noise floor" if floor else ""))
    tie = (f"no difference measurable between {listed([m.name() for m in tied])}: their images/s "
           f"{how} ({ranges}), so any of them")
    slower = [*outran, *([ddp] if ddp is not None and chosen != "dist_parallel"
                         and ddp not in tied and ddp not in outran else [])]
    tie += "".join(f"; {slower_text(m, ranked, floor, unit)}" for m in slower)
    if ddp is None or chosen == "dist_parallel":
        return default(tie, tied)
    return (f"{MODE_NAMES[chosen]}: {tie}, the measured cause to prefer {chosen} here.", chosen)
