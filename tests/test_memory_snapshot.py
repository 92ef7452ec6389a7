"""--memory_snapshot N: the CUDA allocator's history over the first N steps, for
pytorch.org/memory_viz (runkit.StepTimer). What needs a GPU (the file itself, as memory_viz reads
it) is tests/gpu/test_cuda_paths.py's; here, without one: the flag is refused in one line in every
mode before anything is written, and the recorder's steps (when it writes) with torch's two calls
stood in for."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import runkit
from benchmarks.fast import train_file
from conftest import REPO
from test_fast_path import TINY, in_process

REFUSAL = "error: --memory_snapshot needs a GPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
@pytest.mark.parametrize("mode", ["single_gpu", "data_parallel"])
def test_refused_on_the_cpu_in_one_line(mode, tmp_path):
    code, _, err = in_process(train_file(mode).main, *TINY, "--memory_snapshot", "3",
                              "--log_dir", tmp_path)
    assert code == 2 and err.splitlines()[-1] == REFUSAL, err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_refused_by_the_self_launchs_workers_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "fsdp" / "train.py"), *TINY,
                           "--nproc_per_node", "2", "--memory-snapshot", "3", "--log_dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count(REFUSAL) == 1, done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())


@pytest.fixture
def recorder(monkeypatch):
    """torch's two calls recorded, not made (they need a CUDA allocator)."""
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **options: calls.append(("record", enabled)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: calls.append(("dump", path)))
    return calls


def test_the_history_is_written_once_after_step_n(recorder, tmp_path):
    path = tmp_path / "memory_snapshot.pickle"
    timer = runkit.StepTimer(torch.device("cpu"), warmup_steps=1, step=0, snapshot=(3, path))
    assert recorder == [("record", "all")]
    for _ in timer.timed(range(5)):
        timer.step_done()
    timer.close()
    assert recorder == [("record", "all"), ("dump", str(path)), ("record", None)]


def test_without_the_flag_nothing_is_recorded(recorder):
    timer = runkit.StepTimer(torch.device("cpu"), warmup_steps=1, step=0, snapshot=0)
    for _ in timer.timed(range(3)):
        timer.step_done()
    timer.close()
    assert recorder == []
