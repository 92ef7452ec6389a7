"""Where a comparison ran: the versions and hardware every run records, plus how the GPUs are linked."""
from __future__ import annotations

import re
import shutil
import subprocess

from common.telemetry import environment


def gpu_summary(env: dict) -> str:
    """'4× NVIDIA H100 80GB HBM3' from an environment() record; '' without GPUs."""
    gpus = env.get("gpus") or []
    return ", ".join(f"{gpus.count(name)}× {name}" for name in dict.fromkeys(gpus))


def topology() -> str | None:
    """`nvidia-smi topo -m`: which GPUs are joined by NVLink (NV#) and which only by PCIe. None without a driver."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def fabric(topo: str | None) -> str | None:
    """What NCCL's ring can run over: 'NVLink' when every GPU has NVLink to two others (to one, with two GPUs),
    so a ring can close over NVLink alone; 'PCIe' otherwise; None without a matrix or with one GPU."""
    if not topo:
        return None
    rows = [line.split() for line in topo.splitlines() if re.match(r"^GPU\d+\s", line)]
    gpus = len(rows)
    if gpus < 2:
        return None
    nvlink_peers = [sum(cell.startswith("NV") for cell in row[1:gpus + 1]) for row in rows]
    return "NVLink" if min(nvlink_peers) >= min(2, gpus - 1) else "PCIe"


__all__ = ["environment", "gpu_summary", "topology", "fabric"]
