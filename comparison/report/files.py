"""What compare.py writes, and how: each file whole or not at all (`write_file`), and the names of
the pictures it may draw (comparison/plots.py draws them)."""
from __future__ import annotations

from pathlib import Path

from common.logger import write_atomically


def write_file(path: Path, data: bytes) -> None:
    """`data` into `path`, whole or not at all (common.logger.write_atomically): an
    earlier file stays as it was whatever stops the write (a full disk, a signal, a
    crash), and an OSError names the file."""
    write_atomically(path, lambda f: f.write(data))


# The pictures compare.py may draw (comparison/plots.py draws those it has figures for)
PICTURES = ("images_per_sec.png", "scaling_efficiency.png", "step_breakdown.png",
            "memory_per_gpu.png")
EARLIER_PICTURES = ("step_time.png",)  # what earlier versions drew: --overwrite removes them too
