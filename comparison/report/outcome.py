"""What a run came to: its `Outcome` (ok, failed, interrupted, not run), with its results.json, its
log and its run folder, as comparison/runner.py hands it over; `split` (read from the run folder's
traces) and `row` are filled in by rows.fill_rows."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from comparison.matrix import PlannedRun


@dataclass
class Outcome:
    run: PlannedRun
    status: str                    # ok, failed, interrupted (compare.py stopped), not run
    seconds: float = 0.0
    error: str | None = None
    results: dict | None = None
    log: Path | None = None
    run_dir: Path | None = None    # its run folder: results.json, the traces, the event files
    # each rank's mean split of its profiled steps, {rank: {step_ms, compute_ms, ...}}, from its
    # trace_rank<r>.json (comparison/breakdown.py); None: no trace
    split: dict | None = None
    row: dict = field(default_factory=dict)
