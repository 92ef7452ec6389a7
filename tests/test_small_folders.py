"""A user's image folder, small and untidy: the batch that fits it, the warm-up counted in steps,
BatchNorm statistics of the weights evaluated, --augment off that mirrors nothing, class names in
two Unicode forms, and a resume on a folder changed since (images added, a class renamed or two
swapped) refused in one line where a copy of the folder elsewhere goes on. Each run as a user
meets it: single_gpu/train.py's main() as its __main__ block runs it, on PNG files."""
from __future__ import annotations

import json
import re
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import runkit
from processes import in_process, train_file

CLASSES = ("ant", "bee", "cat")


def write_folder(root: Path, train: int = 8, val: int = 3) -> Path:
    """root/{train,val}/{ant,bee,cat}/<i>.png: each class its own colour and its own side (so that
    a class's files differ in size from another's, as real photographs do)."""
    draws = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for label, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                side = 12 + 4 * label
                noise = draws.integers(0, 60, (side, side, 3))
                image = (noise + 60 * label).clip(0, 255).astype(np.uint8)
                Image.fromarray(image).save(root / split / name / f"{i}.png")
    return root


def flags(root: Path, runs: Path, *more) -> list[str]:
    """PyramidNet-8 at 32 px on the folder, one epoch."""
    return ["--dataset", "imagefolder", "--data_dir", str(root), "--image_size", "32", "--depth",
            "8", "--alpha", "12", "--epochs", "1", "--log_interval", "2", "--warmup_steps", "1",
            "--num_workers", "0", "--log_dir", str(runs), *more]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("images") / "data")


def one_line(done, code: int = 2) -> str:
    lines = [line for line in done.stderr.splitlines()
             if not line.startswith("warning: no CUDA")]  # the CPU's warning, before the error
    assert done.returncode == code and len(lines) == 1 and "Traceback" not in done.stderr, (
        done.stdout + done.stderr)
    return lines[0]


# ------------------------------------------------------------------------------ the batch, the rate
def test_a_folder_smaller_than_the_default_batch_trains_on_a_batch_it_fits(folder, tmp_path):
    """24 training images: the default 128 halved until an epoch has 4 steps (4 images, 6 steps),
    said in the first line; an explicit batch larger than the folder is refused in one line."""
    done = in_process("single_gpu", *flags(folder, tmp_path, "--run_name", "fits"))
    assert done.returncode == 0, done.stderr
    assert "batch 4 (6 steps an epoch)" in done.stdout.splitlines()[0]
    config = json.loads((tmp_path / "fits" / "results.json").read_text())["config"]
    assert config["batch_size"] == 4
    refused = one_line(in_process("single_gpu", *flags(folder, tmp_path, "-b", "32")))
    assert refused == ("error: --batch_size 32 is more than the 24 training images: give a "
                       "smaller one")


@pytest.mark.parametrize("dataset, epochs, warmup", [("imagefolder", 15, 55),
                                                     ("imagefolder", 3, 11),
                                                     ("cifar10", 15, 16)])
def test_a_folders_warm_up_is_counted_in_steps(dataset, epochs, warmup):
    """11 steps an epoch, --lr_warmup_epochs 5: a folder warms up over at least 50 steps and at
    most a third of the run (55 of 165; 11 of 33), CIFAR-10 over at most a tenth (16)."""
    module = train_file("single_gpu")
    args = module.get_args(["--dataset", dataset, "--epochs", str(epochs), "-b", "128"])
    model = torch.nn.Linear(2, 2)
    _, scheduler, _ = module.get_optimizer(args, model, torch.device("cpu"), 11)
    rates = [scheduler.lr_lambdas[0](step) for step in range(warmup + 1)]
    assert rates[0] == pytest.approx(1 / warmup) and rates[warmup - 1] == rates[warmup] == 1.0


def test_precise_batchnorm_gives_the_statistics_of_the_weights_as_they_are():
    """The running statistics made those of the batches seen with the weights now (their mean and
    unbiased variance over all the images), the momentum and the count of batches as they were."""
    norm = torch.nn.BatchNorm1d(3, momentum=0.25)
    norm.num_batches_tracked.fill_(7)
    batches = [(torch.randn(4, 3) * 2 + 1, None), (torch.randn(4, 3) * 2 + 1, None)]
    runkit.precise_batchnorm(norm, batches, "cpu", torch.contiguous_format, images=8)
    seen = torch.cat([batch for batch, _ in batches])
    assert torch.allclose(norm.running_mean, seen.mean(0), atol=1e-6)
    assert torch.allclose(norm.running_var, torch.stack([b.var(0) for b, _ in batches]).mean(0),
                          atol=1e-5)
    assert norm.momentum == 0.25 and norm.num_batches_tracked.item() == 7


# ------------------------------------------------------------------------------------ the crops
def test_augment_off_with_flip_is_refused_and_off_records_no_mirroring(folder, tmp_path):
    refused = one_line(in_process("single_gpu", *flags(folder, tmp_path, "--augment", "off",
                                                         "--flip")))
    assert refused == ("error: --flip mirrors training images and --augment off trains on them "
                       "as they are: give one of them")
    done = in_process("single_gpu", *flags(folder, tmp_path, "--augment", "off", "--run_name",
                                           "off", "--max_steps", "1"))
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "off" / "results.json").read_text())["config"]
    assert config["augment"] == "off" and config["flip"] is False


# ------------------------------------------------------------------------------- untidy folders
def test_a_class_named_in_decomposed_unicode_is_refused_in_one_line(tmp_path):
    """val/café copied from macOS (decomposed, NFD) beside train/café typed on Linux (composed):
    ImageFolder would see two classes; the run names the folder to rename."""
    root = write_folder(tmp_path / "data", train=2, val=1)
    composed, decomposed = (unicodedata.normalize(form, "café") for form in ("NFC", "NFD"))
    (root / "train" / "cat").rename(root / "train" / composed)
    (root / "val" / "cat").rename(root / "val" / decomposed)
    refused = one_line(in_process("single_gpu", *flags(root, tmp_path / "runs")))
    assert refused == (f"error: --dataset imagefolder: a class folder of {root} is named in "
                       "decomposed Unicode (another split, or a copy, may name it composed): "
                       "rename it")


def test_a_class_folder_that_is_a_dangling_link_is_named_as_one(tmp_path):
    root = write_folder(tmp_path / "data", train=2, val=1)
    shutil.rmtree(root / "val" / "cat")
    (root / "val" / "cat").symlink_to(tmp_path / "gone")
    refused = one_line(in_process("single_gpu", *flags(root, tmp_path / "runs")))
    assert refused == (f"error: {root / 'val' / 'cat'} is a link to {tmp_path / 'gone'}, which is "
                       "not there: mend or remove it")


# ---------------------------------------------------------------------------- a resume on a folder
@pytest.fixture(scope="module")
def trained_once(tmp_path_factory) -> tuple[Path, Path]:
    """A folder and a run of one epoch on it, stopped at its first window: (folder, runs)."""
    base = tmp_path_factory.mktemp("resumed")
    root = write_folder(base / "data", train=4, val=1)
    done = in_process("single_gpu", *flags(root, base / "runs", "--run_name", "run", "-b", "2"),
                      stop_at=2)
    assert done.returncode == 143, done.stderr
    return root, base / "runs"


def swap(root: Path, a: str, b: str) -> None:
    for split in ("train", "val"):
        (root / split / a).rename(root / split / "tmp")
        (root / split / b).rename(root / split / a)
        (root / split / "tmp").rename(root / split / b)


CHANGES = {
    "images added": lambda root: shutil.copy(root / "train" / "bee" / "0.png",
                                             root / "train" / "bee" / "new.png"),
    "a class renamed": lambda root: [(root / split / "cat").rename(root / split / "cow")
                                     for split in ("train", "val")],
    "two classes swapped": lambda root: swap(root, "ant", "bee"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_resume_auto_on_a_folder_changed_since_is_refused(trained_once, tmp_path, change):
    root, runs = trained_once
    changed = shutil.copytree(root, tmp_path / "data")
    CHANGES[change](changed)
    refused = one_line(in_process("single_gpu", *flags(changed, runs, "--run_name", "run", "-b",
                                                        "2", "--resume", "auto")))
    assert re.fullmatch(r"error: --resume: .*checkpoint\.pt was written by another run: the "
                        r"images: 12 images in 3 classes, digest \w+ \(now 1[23] images in [23] "
                        r"classes, digest \w+\); resume with the flags it was written with",
                        refused), refused


def test_resume_auto_on_a_copy_of_the_folder_elsewhere_goes_on(trained_once, tmp_path):
    root, runs = trained_once
    copy = shutil.copytree(root, tmp_path / "elsewhere" / "data")
    state = shutil.copytree(runs / "run", tmp_path / "runs" / "run")
    done = in_process("single_gpu", *flags(copy, state.parent, "--run_name", "run", "-b", "2",
                                           "--resume", "auto"))
    assert done.returncode == 0, done.stderr
    assert json.loads((state / "results.json").read_text())["summary"]["step"] == 6
