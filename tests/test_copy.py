"""The copy test: a mode's train.py taken away, as the README says, with runkit.py and pyramidnet.py
copied beside it (no subfolders) into a project that already has a `models/` package of its own.
The user puts their own model in get_model and their own data, a plain TensorDataset, in
get_datasets, and runs the copy as it is: single_gpu as `python train.py`, dist_parallel under
torchrun with 2 processes on gloo. It trains, and results.json's parameters, FLOPs and MFU are
those of the user's model, measured on it (PyramidNet-110's would be 28,485,477 parameters)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, free_port

# the user's own package, named as the project's models/ folder is: it must not be shadowed
USERS_MODELS = '''import torch


class Linear(torch.nn.Module):
    """The user's model: one linear map of the pixels."""

    def __init__(self, classes: int, side: int = 32):
        super().__init__()
        self.fc = torch.nn.Linear(3 * side * side, classes)

    def forward(self, images):
        return self.fc(images.flatten(1))
'''
# what the user writes in get_datasets: 96 training and 32 test images of their own
USERS_DATA = '''def get_datasets(args):
    """My images."""
    draws = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8, generator=draws)
    labels = torch.randint(0, 10, (128,), generator=draws)
    return TensorDataset(images[:96], labels[:96]), TensorDataset(images[96:], labels[96:]), 10


'''
FLAGS = ["--dataset", "synthetic", "--batch_size", "16", "--epochs", "2", "--log_interval", "3",
         "--warmup_steps", "1", "--num_workers", "0", "--run_name", "mine"]
PIXELS, CLASSES = 3 * 32 * 32, 10
# one image's FLOPs, forward and backward, of Linear(3072, 10): the forward's product is
# 2 * 3072 * 10; the backward computes the weight's gradient only (the images need none), as many
PARAMETERS, FLOPS = PIXELS * CLASSES + CLASSES, 2 * (2 * PIXELS * CLASSES)


def users_copy(tmp_path, mode: str):
    """A project of the user's: their models/ package, and the three files copied beside each
    other, get_model and get_datasets edited to the user's model and data."""
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "models" / "__init__.py").write_text(USERS_MODELS)
    shutil.copy(REPO / "runkit.py", project)
    shutil.copy(REPO / "models" / "pyramidnet.py", project)
    text = (REPO / mode / "train.py").read_text()
    pyramidnet = r"PyramidNet\(args\.depth, args\.alpha, args\.block, classes, channels\)"
    text, models = re.subn(pyramidnet, "Linear(classes)", text)
    text, datasets = re.subn(r"def get_datasets\(args\):.*?\n\n\n", USERS_DATA, text, flags=re.S)
    assert models == 1 and datasets == 1, "the lines a user edits moved: mend this test"
    text = text.replace("from pyramidnet import PyramidNet\n",
                        "from pyramidnet import PyramidNet\nfrom models import Linear\n")
    (project / "train.py").write_text(text)
    return project


def results(project) -> dict:
    return json.loads((project / "runs" / "mine" / "results.json").read_text())


def check_the_users_model(done: subprocess.CompletedProcess, project, world_size: int) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    run = results(project)
    summary = run["summary"]
    assert run["world_size"] == world_size and summary["step"] == 2 * 96 // 16
    assert summary["parameters"] == PARAMETERS
    assert summary["flops_per_image"] == FLOPS
    assert summary["mfu"] is None and "CPU" in summary["mfu_note"]  # measured against a GPU's peak
    assert summary["test_images"] == 32 and 0 <= summary["test_acc"] <= 1
    assert "PyramidNet-110" not in done.stdout


def test_single_gpu_copied_into_a_project_trains_the_users_model_on_their_data(tmp_path):
    project = users_copy(tmp_path, "single_gpu")
    done = subprocess.run([sys.executable, "train.py", *FLAGS, "--log_dir", "runs"], cwd=project,
                          capture_output=True, text=True, timeout=300)
    check_the_users_model(done, project, world_size=1)


@pytest.mark.parametrize("mode", ["dist_parallel"])
def test_a_parallel_file_copied_runs_under_torchrun_on_two_processes(tmp_path, mode):
    project = users_copy(tmp_path, mode)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), "train.py", *FLAGS, "--log_dir",
                           "runs"], cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    check_the_users_model(done, project, world_size=2)
