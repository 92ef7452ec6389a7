"""--memory_snapshot N: the CUDA allocator's history over the first N steps, for
pytorch.org/memory_viz (common/telemetry.py MemoryHistory). What needs a GPU (the file itself,
as memory_viz reads it) is tests/gpu/test_cuda_paths.py's; here, without one: the flag is refused
in one line in every mode and in compare.py before anything starts, and the recorder's steps
(when it writes, what it says) with torch's two calls stood in for."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import common.telemetry
from common.telemetry import MEMORY_SNAPSHOT, MemoryHistory
from conftest import REPO, TINY, refuse_in_process

REFUSAL = ("error: --memory_snapshot 3 records the CUDA caching allocator's history, and this run "
           "has no CUDA GPU: leave out --memory_snapshot, or run it on a GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
@pytest.mark.parametrize("script", ["single_gpu/train.py", "data_parallel/train.py"])
def test_refused_on_the_cpu_in_one_line(script, tmp_path):
    done = refuse_in_process(script, *TINY, "--memory_snapshot", "3", "--log_dir", tmp_path)
    assert done.returncode == 2 and done.stderr == REFUSAL + "\n", done.stderr
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_refused_by_the_self_launch_before_any_worker(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "fsdp" / "train.py"), *TINY,
                           "--nproc_per_node", "2", "--memory-snapshot", "3", "--log_dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == REFUSAL + "\n", done.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_refused_by_compare_before_any_run(tmp_path):
    done = refuse_in_process("compare.py", "--memory_snapshot", "3", "--out", tmp_path / "out")
    assert done.returncode == 2 and done.stderr.startswith(REFUSAL), done.stderr
    assert not (tmp_path / "out").exists()


def test_an_evaluation_has_no_steps_to_record():
    done = refuse_in_process("single_gpu/train.py", "--memory_snapshot", "3", "--evaluate",
                             "weights.pt")
    assert done.returncode == 2 and "--memory_snapshot records training steps and --evaluate " \
        "trains none" in done.stderr


@pytest.fixture
def recorder(monkeypatch):
    """torch's two calls recorded, not made (they need a CUDA allocator)."""
    calls = []
    monkeypatch.setattr(common.telemetry.torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **options: calls.append(("record", enabled)))
    monkeypatch.setattr(common.telemetry.torch.cuda.memory, "_dump_snapshot",
                        lambda path: calls.append(("dump", path)))
    return calls


def test_the_history_is_written_once_after_step_n(recorder, tmp_path):
    said = []
    history = MemoryHistory(3, tmp_path, said.append)
    assert recorder == [("record", "all")]
    for step in range(1, 6):
        history.step_done(step)
    history.close(5)
    path = str(tmp_path / MEMORY_SNAPSHOT)
    assert recorder == [("record", "all"), ("dump", path), ("record", None)]
    assert said == [f"memory snapshot of the first 3 steps: {path} (open it in "
                    "https://pytorch.org/memory_viz)"]


def test_a_shorter_run_writes_what_it_recorded(recorder, tmp_path):
    said = []
    history = MemoryHistory(10, tmp_path, said.append)
    history.step_done(1)
    history.close(1)
    assert recorder[1:] == [("dump", str(tmp_path / MEMORY_SNAPSHOT)), ("record", None)]
    assert said and "the first step:" in said[0]
    recorder.clear()
    MemoryHistory(10, tmp_path).close(0)  # stopped before any step: nothing to write
    assert recorder == [("record", "all"), ("record", None)]


def test_only_the_process_that_writes_the_run_records(recorder):
    history = MemoryHistory(3, None)  # another rank: no run folder
    history.step_done(3)
    history.close(3)
    assert recorder == []
