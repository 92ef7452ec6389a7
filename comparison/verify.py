"""compare.py --verify: the checks the tests run on the CPU, run on this machine, each with the
figure it measured, its tolerance and its verdict.

Every run is started as compare.py starts its matrix (its own subprocess, logs/, runs/,
--run_timeout), with the same model, data, global batch and seed, for --max_steps steps (default 24)
and enough epochs to reach them. N is the largest --gpu_counts: every GPU here, or 2 CPU processes
over gloo without GPUs. The checks compare the runs with one another through their files: each
run's last checkpoint.pt (every weight, BatchNorm statistic and momentum buffer), its results.json
and its event files.

1. single_gpu, data_parallel on one device, and dist_parallel and fsdp with one
   process end with the same weights and momentum.
2. dist_parallel and fsdp on N processes end with the same weights and momentum: DDP (every rank
   the whole model, the gradients all-reduced in buckets while backward goes on) and FSDP2 (each
   rank a slice, the gradients reduce-scattered) are two mechanisms of the same average, and check
   1 holds each of them, on one process, to single_gpu. With --sync_bn on: dist_parallel's N
   processes with SyncBatchNorm end where one ends.
Checks 3 to 5 run for dist_parallel and for fsdp, each as --modes has them:
3. The N-process run's checkpoint evaluated by 1, 2 and N processes (and 3 on the CPU) gives the
   same accuracy and loss, and every count counts every test image once.
4. Every N-process run ends with identical parameters on every rank (results.json's
   params_in_sync).
5. The N-process run stopped halfway and continued with `--resume auto` ends where the uninterrupted
   run ends (the halves started as `python <mode>/train.py --nproc_per_node N`, the uninterrupted
   run by torchrun), and its event file shows it continued from halfway. With both modes, each
   continues the other's halfway checkpoint (in that run's folder): the checkpoint is one format,
   whole tensors, whichever mode wrote it. fsdp continues without resharding after forward (ZeRO-2;
   its other runs reshard, ZeRO-3), so its check 5 holds both ways of sharding to the same weights.
6. pipeline_parallel on N processes (N stages, `--microbatches N`: micro-batch m holds the images
   DDP's rank m holds) ends with the weights and momentum of dist_parallel's N-process run. Their
   BatchNorm running statistics differ, and the row gives by how much: the pipeline updates each
   BatchNorm once a micro-batch, DDP once a step on each rank and saves rank 0's. Not run, with
   the reason, where the pipeline cannot run: one process, a model it cannot cut into N stages,
   or a flag it refuses (--compile, --channels_last, --amp fp16), however --modes was given.

The verdicts are printed, and written with their figures and the reasons for each tolerance to
verify.md and verify.json in the --out folder. tests/test_parallel.py runs `compare.py
--verify` on the CPU and asserts on it.

What runs: comparison/verify_plan.py; the checks and their tolerances: comparison/verify_checks.py.
This file runs the plan, then prints and writes the verdicts.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from comparison.matrix import command
from comparison.report.files import write_file
from comparison.report.formatting import fmt_seconds
from comparison.report.model import model_title, run_config
from comparison.report.outcome import Outcome
from comparison.runner import run_all, signal_name, signals_deferred, start
from comparison.verify_checks import (BITWISE, EXACT_EVALUATION, ROUNDED_EVALUATION, ROUNDING,
                                      SUMMATION_ORDER, Checks, Row)
from comparison.verify_plan import DEFAULT_STEPS, Launch


class Verification(Checks):
    """compare.py --verify: its Plan (comparison/verify_plan.py) run, judged by its Checks
    (comparison/verify_checks.py), the verdicts printed and written."""

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
        """The launch's command line: its matrix run's flags, then its own."""
        return command(launch.run, self.flags(launch), launch.self_launch)

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
        if any(s.pipeline for s in self.settings):
            notes.append(self.pipeline_note())
        if any(s.groups for s in self.settings):
            notes.append("- Check 2 holds DDP and FSDP to each other, and check 1 each of them, on "
                         "one process, to single_gpu: a mistake that both train files made alike "
                         "in their parallel lines (each rank's share of the data, the average of "
                         "the gradients) would pass check 2, and one that only shows with two "
                         "ranks would pass check 1. The tests hold those lines to torch's own "
                         "DistributedSampler and collectives.")
        rounded = {t.text for t in (SUMMATION_ORDER, *ROUNDING.values())}
        if self.steps != DEFAULT_STEPS and shown & rounded:
            notes.append(f"- The tolerances above were set for {DEFAULT_STEPS} steps; "
                         f"this verification ran {self.steps}, and the rounding "
                         "differences grow with every step.")
        if self.cuda and not self.deterministic:
            notes.append("- Without `--deterministic` the GPU runs may take other kernels from "
                         "run to run, so checks 1, 2, 5 and 6 hold within a tolerance as large as "
                         "some of the errors they look for. `python compare.py --verify "
                         "--deterministic` makes check 1 bitwise, and checks 2 and 5 too with two "
                         "GPUs (`--gpu_counts 2`), and check 6 with `--no-channels_last` as "
                         "well.")
        return notes

    def pipeline_note(self) -> str:
        """Check 6's tolerance and what it leaves out, as this verification has them."""
        note = ("- Check 6: each of the pipeline's micro-batches is a DDP rank's share of the "
                "step, its BatchNorm normalising that share alone, so each gradient is the same "
                "average: the pipeline adds the micro-batches' gradients in order and divides by N "
                "once, DDP divides each by N and the all-reduce adds them. ")
        if self.pipeline_order(self.settings[0]) is BITWISE:
            note += ("With two processes that is the same bits (halving is exact, and two values "
                     "add alike in either order). ")
        if self.processes > 2:
            note += ("With more than two the sums go in another order (and a division by 3 is not "
                     "exact): 4 CPU processes differ by 1.4e-5 after 24 fp32 steps. ")
        if self.cuda and self.values["channels_last"] is not False:
            note += ("On GPUs dist_parallel lays its images out channels_last unless "
                     "`--no-channels_last` is given, and the pipeline never does: other kernels, "
                     "which round otherwise even with `--deterministic`. ")
        return note + ("The BatchNorm running statistics are left out of it and shown: the "
                       "pipeline updates each BatchNorm N times a step, once a micro-batch; DDP "
                       "once a step on each rank, and keeps rank 0's.")

    def write(self, rows: list[Row], outcomes: dict[str, Outcome], argv: list[str], device: str,
              elapsed: float) -> list[Path]:
        cfg = run_config(next((o.results["config"] for o in outcomes.values() if o.results),
                              self.values))
        failed_rows = [row for row in rows if row.verdict == "FAIL"]
        run_rows = [f"| `{o.run.name}` | {o.status} | {fmt_seconds(o.seconds)} | {o.error or ''} | "
                    + (f"`logs/{o.run.name}.log` |" if o.log else "— |") for o in outcomes.values()]
        lines = [
            f"# Verification: {model_title(cfg)} — {device}",
            "",
            f"`{shlex.join(['python', 'compare.py', *argv])}` — {datetime.now():%Y-%m-%d %H:%M}, "
            f"{len(outcomes)} runs in {fmt_seconds(elapsed)}: {self.steps} steps of global batch "
            f"{self.batch} on {cfg['dataset']} (at most {self.epochs} "
            f"epochs), seed {cfg['seed']}; N = {self.processes} "
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
            "checkpoint.pt, the event files) is in `runs/`.",
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


def summary_line(rows: list[Row]) -> str:
    failed_rows = [row for row in rows if row.verdict == "FAIL"]
    ran = [row for row in rows if row.verdict != "not run"]
    not_run = len(rows) - len(ran)
    skipped = f" ({not_run} not run)" if not_run else ""
    if failed_rows:
        return (f"FAILED: {len(failed_rows)} of {len(ran)} checks{skipped}: "
                + "; ".join(row.check for row in failed_rows))
    return f"passed: all {len(ran)} checks{skipped}"
