"""What compare.py writes, and how: each file whole or not at all (`write_file`), and the names of
the pictures it may draw (comparison/plots.py draws them)."""
from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_file(path: Path, data: bytes) -> None:
    """`data` into `path`, whole or not at all: written to a temporary file beside it
    (.<name>.<pid>.<random>.tmp), synced, then renamed over it. An earlier file stays as it was
    whatever stops the write (a full disk, a signal, a crash), and an OSError names the file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as error:  # named by the file it is about, not by its stand-in
        raise OSError(error.errno, error.strerror, str(path)) from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


# The pictures compare.py may draw (comparison/plots.py draws those it has figures for)
PICTURES = ("images_per_sec.png", "scaling_efficiency.png", "step_breakdown.png",
            "memory_per_gpu.png")
EARLIER_PICTURES = ("step_time.png",)  # what earlier versions drew: --overwrite removes them too
