"""Where a comparison ran: the versions and hardware every run
records, plus how the GPUs are linked."""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess

import torch


def environment() -> dict:
    """The versions and hardware of this machine, for the report's Environment section."""
    cuda = torch.cuda.is_available()
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if cuda else None,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "driver": None, "cpu": cpu_name(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "hostname": platform.node()}
    if cuda:
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception:  # no NVML: the driver goes unnamed
            pass
    return env


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_summary(env: dict) -> str:
    """'4× NVIDIA H100 80GB HBM3' from an environment() record; '' without GPUs."""
    gpus = env.get("gpus") or []
    return ", ".join(f"{gpus.count(name)}× {name}" for name in dict.fromkeys(gpus))


# terminal escape sequences (CSI: ESC [ parameters, intermediates, final byte), which nvidia-smi
# prints around its header line even into a pipe
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def topology() -> str | None:
    """`nvidia-smi topo -m`, escape codes removed: which GPUs are joined by NVLink (NV#) and which
    only by PCIe. None without a driver."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (ANSI_ESCAPE.sub("", done.stdout) if done.returncode == 0 and done.stdout.strip()
            else None)


def gpu_uuids() -> dict[str, int]:
    """{UUID: nvidia-smi index} of every GPU, from `nvidia-smi --query-gpu`;
    empty when it cannot be read."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    table = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        index, _, uuid = line.partition(",")
        if index.strip().isdigit():
            table[uuid.strip()] = int(index)
    return table


def visible_gpus(visible: str | None, gpus_here: int,
                 uuids: dict[str, int] | None = None) -> list[int] | None:
    """nvidia-smi's indices (the rows of `topo -m`) of the GPUs torch sees, in torch's order, from
    CUDA_VISIBLE_DEVICES (`visible`, None when unset): indices, or UUIDs as nvidia-smi prints them
    or a unique start of one, as CUDA takes them (`uuids`: gpu_uuids(), read only when needed).
    Indices are read in nvidia-smi's PCI bus order, which CUDA follows with
    CUDA_DEVICE_ORDER=PCI_BUS_ID and, in practice, on a node of identical GPUs. None when an entry
    matches no GPU or names a MIG instance, which has no row."""
    if visible is None:
        return list(range(gpus_here))
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if uuids is None and not all(entry.isdigit() for entry in entries):
        uuids = gpu_uuids()
    found = [[int(entry)]
             if entry.isdigit() else [i for uuid, i in uuids.items() if uuid.startswith(entry)]
             for entry in entries]
    if any(len(match) != 1 or match[0] >= gpus_here for match in found):
        return None
    return [match[0] for match in found]


def fabric(topo: str | None, gpus: int | None = None, env=os.environ,
           uuids: dict[str, int] | None = None ) -> str | None:
    """What NCCL's ring can run over among the GPUs the runs used: the first `gpus` (all when None)
    of those that CUDA_VISIBLE_DEVICES in `env` shows, as compare.py's runs take them. 'NVLink' when
    every one has NVLink to two others of them (to one, with two GPUs), so a ring can close over
    NVLink alone; 'PCIe' otherwise. None without a matrix, with one GPU, or when the GPUs used
    cannot be found in the matrix."""
    if not topo:
        return None
    rows = [line.split() for line in ANSI_ESCAPE.sub("", topo).splitlines()
            if re.match(r"^GPU\d+\s", line)]
    used = (visible_gpus(env.get("CUDA_VISIBLE_DEVICES"), len(rows), uuids) or [])[:gpus]
    if len(used) < 2:
        return None
    nvlink_peers = [sum(rows[i][1 + j].startswith("NV") for j in used) for i in used]
    return "NVLink" if min(nvlink_peers) >= min(2, len(used) - 1) else "PCIe"
