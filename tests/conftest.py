"""Helpers shared by the tests: run a train.py the way a user does, and read what a run left behind."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A tiny model on a small synthetic set: a run takes seconds on two CPU cores.
TINY = ["--dataset", "synthetic", "--synthetic_size", "256", "--depth", "8", "--alpha", "12", "--batch_size", "32",
        "--epochs", "1", "--log_interval", "4", "--warmup_steps", "1", "--loader", "gpu", "--num_workers", "0"]


def run_script(script: str, *args, cwd=REPO, timeout=300, env=None) -> subprocess.CompletedProcess:
    """`python <script> args...` in a subprocess, output captured; `script` is relative to the repository."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def read_results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's TensorBoard event files, read with the record format and tensorboardX's protos."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            record = data[offset + 12: offset + 12 + length]  # u64 length, u32 crc, payload, u32 crc
            offset += 12 + length + 4
            event = Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to reach the network fails as it does without one (torchvision's download helpers)."""
    import urllib.error

    import torchvision.datasets.utils

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets.utils, "_urlretrieve", no_network)
    monkeypatch.setattr(torchvision.datasets.utils, "_get_redirect_url", no_network)
    monkeypatch.setattr(torchvision.datasets.utils, "_is_remote_location_available", lambda: False, raising=False)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """In-process tests: tiny convolutions run ~100x faster on one intra-op thread than on two contended ones
    (2-core machine). Subprocesses are not affected."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
