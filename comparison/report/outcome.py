"""What a run came to: its `Outcome` (ok, failed, interrupted, not run), with its results.json and
its log, as comparison/runner.py hands it over; `row` is filled in by rows.fill_rows."""
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
    row: dict = field(default_factory=dict)
