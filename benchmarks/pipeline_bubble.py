"""The pipeline's bubble, measured: how much of a 2-stage step each rank waits for its neighbour,
against GPipe's (S - 1) / (M + S - 1) for S stages and M micro-batches.

    python benchmarks/pipeline_bubble.py                        # 2 CPU processes, M = 2, 4, 8
    python benchmarks/pipeline_bubble.py --microbatches 4 16 --schedule gpipe

For each M it runs pipeline_parallel/train.py as a user does (`--nproc_per_node 2`, synthetic data,
--benchmark) with --profile_steps, and splits each rank's trace as compare.py's report does
(comparison/breakdown.py). On gloo a stage's sends and receives are recorded on its training thread
as ranges (gloo:send, gloo:recv) from the schedule's start of them to their end, around the compute
they overlap; the split's bubble is the time one of them is open and the stage runs nothing else:
it waits for its neighbour (the transfer itself, a copy between two processes of one machine, is a
small part of that wait). The schedule's time is the step less the data wait and the optimizer,
which no schedule overlaps; the idle share is the bubble over it, the figure compare's report and
results.csv give (split_bubble_share). The formula assumes stages of equal time: the busier stage
waits only while the pipeline fills and drains, the lighter one waits for it besides, so the table
shows both ranks, and the busier stage's share (the smaller) is the one the formula predicts.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from comparison.breakdown import step_breakdowns, trace_files  # noqa: E402


def theory(stages: int, microbatches: int) -> float:
    """GPipe's bubble: the share of a step a stage idles, stages of equal time."""
    return (stages - 1) / (microbatches + stages - 1)


def idle_share(trace: dict) -> float:
    """The mean over a rank's traced steps of its bubble (the wait for its neighbour) over its
    schedule (the step less its data wait and optimizer)."""
    shares = [step["bubble_ms"] / (step["step_ms"] - step["data_ms"] - step["optimizer_ms"])
              for step in step_breakdowns(trace)]
    return sum(shares) / len(shares) if shares else math.nan


def idle_shares(run_dir: Path) -> dict[str, float]:
    """{rank: its idle share} from the traces in a run folder."""
    return {str(rank): idle_share(json.loads(path.read_text()))
            for rank, path in trace_files(run_dir).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--alpha", type=float, default=48)
    parser.add_argument("--profile_steps", type=int, default=5)
    args = parser.parse_args()
    stages = 2
    print(f"pipeline_parallel, {stages} stages ({args.schedule}), PyramidNet-{args.depth} "
          f"a={args.alpha:g}, batch {args.batch_size}, synthetic 32 px, 2 CPU processes on gloo")
    print(f"{'M':>3} {'rank 0 idle':>12} {'rank 1 idle':>12} {'busier stage':>13} "
          f"{'(S-1)/(M+S-1)':>14} {'difference':>11}")
    with tempfile.TemporaryDirectory() as log_dir:
        for microbatches in args.microbatches:
            name = f"bubble-m{microbatches}"
            command = [sys.executable, str(REPO / "pipeline_parallel" / "train.py"),
                       "--nproc_per_node", str(stages), "--dataset", "synthetic",
                       "--synthetic_size", str(args.batch_size * 12), "--depth", str(args.depth),
                       "--alpha", str(args.alpha), "--batch_size", str(args.batch_size),
                       "--num_workers", "0", "--benchmark", "--warmup_steps", "2",
                       "--benchmark_steps", "3", "--profile_steps", str(args.profile_steps),
                       "--schedule", args.schedule, "--microbatches", str(microbatches),
                       "--log_dir", log_dir, "--run_name", name]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"M = {microbatches}: the run failed (exit {done.returncode}):\n"
                      f"{done.stdout[-2000:]}{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            shares = idle_shares(Path(log_dir) / name)
            if len(shares) != stages or any(math.isnan(share) for share in shares.values()):
                print(f"M = {microbatches}: {len(shares)} of {stages} traces held a whole step",
                      file=sys.stderr)
                return 1
            busier = min(shares.values())
            expected = theory(stages, microbatches)
            print(f"{microbatches:>3} {100 * shares['0']:>11.1f}% {100 * shares['1']:>11.1f}% "
                  f"{100 * busier:>12.1f}% {100 * expected:>13.1f}% "
                  f"{100 * (busier - expected):>+10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
