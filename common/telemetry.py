"""GPU telemetry from NVML and a description of the machine, for TensorBoard and results.json.

A background thread samples, every `interval` seconds, the utilisation ("a kernel was running
during the last sample period", not efficiency) and the memory in use of each GPU the run uses.
Torch's device index is mapped to NVML's physical GPU through its UUID, so the figures are right
under CUDA_VISIBLE_DEVICES. Without an NVIDIA driver there is one notice and the fields are
null; training is never affected.
"""
from __future__ import annotations

import os
import platform
import threading
from pathlib import Path
from typing import NamedTuple

import torch

GIB = 1024 ** 3


def nvml_handle(pynvml, device_index: int):
    """NVML's handle of torch's `cuda:<device_index>`, found by UUID
    (CUDA_VISIBLE_DEVICES may renumber GPUs)."""
    uuid = str(torch.cuda.get_device_properties(device_index).uuid)
    return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-"))
                                            else f"GPU-{uuid}")


class GpuTelemetry:
    """`window()` -> {device index: (mean utilisation %, mean memory
    used GiB)} since the last call."""

    def __init__(self, device_indices, interval: float = 0.1, notice=print):
        self.device_indices = list(device_indices)
        self.interval = interval
        self.handles = {}
        self.sums = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = None
        if not self.device_indices:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handles = {i: nvml_handle(pynvml, i) for i in self.device_indices}
        except Exception as error:  # no driver, no library, or a GPU NVML cannot see
            notice(f"GPU telemetry off (NVML unavailable: {error}); utilisation "
                   "and memory will be null")
            self.handles = {}
            return
        self._reset()
        self.thread = threading.Thread(target=self._sample_forever, name="gpu-telemetry",
                                       daemon=True)
        self.thread.start()

    def _reset(self):
        self.sums = {i: [0.0, 0.0, 0] for i in self.handles}

    def _sample_forever(self):
        while not self.stopped.wait(self.interval):
            readings = {}
            for i, handle in self.handles.items():
                try:
                    util = self.pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    used = self.pynvml.nvmlDeviceGetMemoryInfo(handle).used / GIB
                except Exception:
                    continue
                readings[i] = (util, used)
            with self.lock:
                for i, (util, used) in readings.items():
                    self.sums[i][0] += util
                    self.sums[i][1] += used
                    self.sums[i][2] += 1

    def window(self) -> dict[int, tuple[float | None, float | None]]:
        with self.lock:
            means = {i: (u / n, m / n) if n else (None, None) for i, (u, m, n) in self.sums.items()}
            self._reset()
        return {i: means.get(i, (None, None)) for i in self.device_indices}

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
            self.pynvml.nvmlShutdown()


class PeakMemory(NamedTuple):
    """A GPU's peak memory in GiB since the warm-up: `allocated`, the tensors' high-water mark
    (torch.cuda.max_memory_allocated), and `reserved`, the caching allocator's
    (max_memory_reserved), which also holds what CUDA graphs keep in their private pools: a graph's
    replays allocate nothing, so its memory shows in `reserved` only."""
    allocated: float
    reserved: float


def peak_memory_gb(device_indices) -> dict[int, PeakMemory]:
    """Each device's PeakMemory."""
    return {i: PeakMemory(torch.cuda.max_memory_allocated(i) / GIB,
                          torch.cuda.max_memory_reserved(i) / GIB)
            for i in device_indices}


MEMORY_SNAPSHOT = "memory_snapshot.pickle"
MEMORY_VIZ = "https://pytorch.org/memory_viz"
# the allocator's events kept at most (torchtitan's choice): a few KB each with their stacks
MEMORY_EVENTS = 100_000


class MemoryHistory:
    """--memory_snapshot N: the CUDA caching allocator's history over the run's first N optimizer
    steps (every allocation and free of every GPU of this process, with the Python and C++ stack
    that made it), written to <run folder>/memory_snapshot.pickle for pytorch.org/memory_viz,
    which draws the memory in use over time, each block named by its stack. It shows what a peak
    figure cannot: where the weights, the gradients, the optimizer's state, the activations and
    FSDP's gathered parameters rise and fall within a step. Recording starts with the first step
    (the model and optimizer are in memory already: drawn as blocks of unknown origin) and stops
    after step N, or at the end of a run of fewer steps. The process that writes the run folder
    records (rank 0: its GPU); `say` reports the file. A CUDA device is checked before (the
    flag is refused without one)."""

    def __init__(self, steps: int, run_dir: Path | None, say=print):
        self.steps = steps if run_dir is not None else 0
        self.path = run_dir / MEMORY_SNAPSHOT if run_dir is not None else None
        self.say = say
        self.recording = False
        if self.steps:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all",
                                                     max_entries=MEMORY_EVENTS)
            self.recording = True

    def step_done(self, step: int) -> None:
        if self.recording and step >= self.steps:
            self.write(step)

    def write(self, step: int) -> None:
        """The history so far into the file, then the recording stopped."""
        torch.cuda.memory._dump_snapshot(str(self.path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.recording = False
        what = f"the first {step} steps" if step > 1 else "the first step"
        self.say(f"memory snapshot of {what}: {self.path} (open it in {MEMORY_VIZ})")

    def close(self, step: int) -> None:
        """A run that ended before step N: what it recorded (none without a step)."""
        if self.recording and step:
            self.write(step)
        elif self.recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


def environment() -> dict:
    """Versions and hardware, recorded with every run so a figure can be
    traced to where it was measured."""
    cuda = torch.cuda.is_available()
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": (".".join(map(str, torch.cuda.nccl.version()))
                 if cuda and hasattr(torch.cuda, "nccl") else None),
        "gpus": ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                 if cuda else []),
        "driver": None,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
    if cuda:
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return env


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
