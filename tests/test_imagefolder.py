"""--dataset imagefolder (DIR/train/<class>/*, DIR/val/<class>/*, read by torchvision's ImageFolder)
and --image_size, on a fixture of a few dozen generated PNGs of several sizes: the folder's facts,
the one line that refuses each bad folder before anything is written, both loaders (the same
evaluation images; the same random resized crops, drawn from (seed, epoch, index)), the synthetic
set at 64 pixels, the loader each device gets, and a run of every mode with the exact evaluation of
every validation image by one and two processes."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import signal
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from common.config import Config, UsageError, batch_note, parse_config
from common.augmentation import (Augmentation, augmentation_draws, crop_boxes, resized,
                                 resized_crop_draws)
from common.data import (DATASET_INFO, IMAGENET_MEAN, IMAGENET_STD, SyntheticCIFAR, dataset_info,
                         load_datasets)
from common.folders import evaluation_crop, image_folder, stored_side
from common.loaders import folder_bytes, make_loader, resolve_loader
from common.optim import warmup_steps
from common.performance import describe_fast_path, flops_per_image, resolve_fast_path
from common.samplers import EvalShard, ShuffleSampler
from comparison.verify_plan import images_in_test_set, images_in_training_set
from conftest import (at_epoch, read_results, read_scalars, refuse_in_process, run_script,
                      train_in_process, two_at_a_time)

CPU = torch.device("cpu")
CLASSES = ("ant", "bee", "cat")
# one name in Unicode's two forms: composed (as typed on Linux) and decomposed (as macOS writes it)
NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
# (width, height): landscape, square (the stored side), portrait
SIZES = [(40, 30), (36, 36), (30, 44), (48, 40)]
# images per class: 24 training images (3 batches of 8), 15 validation ones (8 + 7 on 2 ranks)
TRAIN, VAL = 8, 5
PIXELS = (torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255,
          torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255)


def write_folder(root: Path, train: int = TRAIN, val: int = VAL) -> Path:
    """root/{train,val}/{ant,bee,cat}/<i>.png: ramps that brighten left to right in red and
    top to bottom in green (each crop's place and mirroring can be read back from its
    pixels), blue 80 x class + i."""
    for split, count in (("train", train), ("val", val)):
        for label, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = ramp(*SIZES[i % len(SIZES)], blue=80 * label + i)
                Image.fromarray(image).save(folder / f"{i}.png")
    return root


def ramp(width: int, height: int, blue: int) -> np.ndarray:
    red = np.broadcast_to(np.round(np.arange(width) * 255 / (width - 1)), (height, width))
    green = np.broadcast_to(np.round(np.arange(height) * 255 / (height - 1))[:, None],
                            (height, width))
    return np.stack([red, green, np.full((height, width), blue)], axis=-1).astype(np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("images") / "data")


def flags(folder, log_dir, *more) -> list[str]:
    """A tiny run on the folder: PyramidNet-8 alpha=12 at 32 pixels, one
    epoch of 3 steps of 8 images."""
    return ["--dataset", "imagefolder", "--data_dir", folder, "--image_size", "32", "--depth", "8",
            "--alpha", "12", "--batch_size", "8", "--epochs", "1", "--log_interval", "3",
            "--warmup_steps", "1", "--num_workers", "0", "--no_progress", "--log_dir", log_dir,
            *more]


def pixels(images: torch.Tensor) -> torch.Tensor:
    """Loader output back to 0..255 pixel values."""
    std, mean = PIXELS
    return images * std + mean


# ---------------------------------------------------------------------------------------- the facts
def test_the_folder_gives_its_classes_and_counts(folder):
    facts = image_folder(str(folder))
    assert facts.classes == CLASSES and facts.images == {"train": 24, "val": 15}
    cfg = parse_config(Config, ["--dataset", "imagefolder", "--data_dir", str(folder)])
    info = dataset_info(cfg)
    # 224 by default, ImageNet's statistics
    assert (info.channels, info.size, info.classes, info.mean, info.std, info.flip, info.crop) == \
        (3, 224, 3, IMAGENET_MEAN, IMAGENET_STD, True, "resized")
    assert dataset_info(dataclasses.replace(cfg, image_size=32)).size == 32
    # a results.json's config, as compare.py reads it
    assert dataset_info(dataclasses.asdict(cfg)) == info
    small = dataclasses.replace(cfg, image_size=32, depth=8, alpha=12)
    assert flops_per_image(small) > 0  # the model of 3 classes on 32-pixel images
    assert images_in_training_set({"dataset": "imagefolder", "data_dir": str(folder)}) == 24
    assert images_in_test_set({"dataset": "imagefolder", "data_dir": str(folder)}) == 15
    train, val = load_datasets("imagefolder", str(folder), 0, 0, 32)
    assert (len(train), len(val), train.classes, train.info.classes, train.info.size) == \
        (24, 15, list(CLASSES), 3, 32)
    # ImageFolder's order: by class, then by name
    assert train.targets == [0] * 8 + [1] * 8 + [2] * 8
    image, label = val[5]
    assert image.mode == "RGB" and image.size == SIZES[0] and label == 1


# -------------------------------------------------------------------------------------- bad folders
def break_folder(root: Path, case: str) -> tuple[Path, str]:
    """A small good folder broken as `case` says; returns the --data_dir and
    the path the refusal must name."""
    write_folder(root, train=2, val=1)
    if case == "no folder":
        return root / "nothing", str(root / "nothing")
    if case in ("no train", "no val"):
        shutil.rmtree(root / case[3:])
        return root, f"{root / case[3:]} is missing"
    if case == "no class folders":
        shutil.rmtree(root / "val")
        (root / "val").mkdir()
        (root / "val" / "0.png").write_bytes((root / "train" / "ant" / "0.png").read_bytes())
        return root, f"{root / 'val'} has no class folders"
    if case == "empty class":
        for path in (root / "train" / "bee").iterdir():
            path.unlink()
        (root / "train" / "bee" / "notes.txt").write_text("not an image")
        return root, f"{root / 'train' / 'bee'} has no images"
    if case == "other classes":
        shutil.copytree(root / "val" / "cat", root / "val" / "dog")
        shutil.rmtree(root / "val" / "ant")
        return root, f"only {root / 'train'} has ant; only {root / 'val'} has dog"
    if case == "one class":
        for split in ("train", "val"):
            shutil.rmtree(root / split / "bee")
            shutil.rmtree(root / split / "cat")
        return root, f"{root / 'train'} has one class folder, ant: a classifier needs two classes"
    if case == "dangling class link":  # train/bee moved away, a link left where it was
        shutil.move(root / "train" / "bee", root.parent / "moved")
        (root / "train" / "bee").symlink_to(root.parent / "gone")
        return root, f"{root / 'train' / 'bee'} is a link to {root.parent / 'gone'}, which does not"
    if case == "one name in two forms":  # café typed (composed) and copied from macOS (decomposed)
        for split in ("train", "val"):
            (root / split / "cat").rename(root / split / NFC)
            shutil.copytree(root / split / NFC, root / split / NFD)
        return root, (f"{root / 'train' / NFD} and {root / 'train' / NFC} are one class name, "
                      f"{NFC}, in two Unicode forms")
    if case == "one file in two classes":
        (root / "train" / "cat" / "ant0.png").symlink_to(root / "train" / "ant" / "0.png")
        named = f"{root / 'train' / 'cat' / 'ant0.png'} and {root / 'train' / 'ant' / '0.png'}"
        return root, f"{named} are one file (linked) in two classes"
    path = root / "train" / "bee" / "1.png"
    if case.startswith("truncated "):  # cut in half: each format's reader meets its end early
        kind = case.split()[1]
        path = path.with_suffix(f".{kind}")
        image = Image.open(root / "train" / "bee" / "1.png")
        (root / "train" / "bee" / "1.png").unlink()
        image.convert("L" if kind == "pgm" else "RGB").save(path)
        path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    elif case == "empty file":
        path.write_bytes(b"")
    elif case == "not an image":
        path.write_text("<html>a page saved as a PNG</html>")
    return root, f"{path} cannot be read as an image"


BAD = ["no folder", "no train", "no val", "no class folders", "empty class", "other classes",
       "one class", "dangling class link", "one name in two forms", "one file in two classes",
       "truncated png", "truncated jpg", "truncated bmp", "truncated tiff", "truncated webp",
       "truncated ppm", "truncated pgm", "empty file", "not an image"]


@pytest.mark.parametrize("case", BAD)
def test_each_bad_folder_is_one_line_that_names_it_and_nothing_is_written(tmp_path, case):
    """Refused the way a user meets it (the script's main() under user_errors, in this process): one
    line, exit status 2, before any run folder. The layout is refused where the flags are parsed, an
    image where the datasets are read."""
    data_dir, named = break_folder(tmp_path / "data", case)
    done = refuse_in_process("single_gpu/train.py", *flags(data_dir, tmp_path / "runs"))
    lines = done.stderr.splitlines()
    assert (done.returncode == 2 and len(lines) == 1
            and lines[0].startswith("error: --dataset imagefolder: "))
    assert named in lines[0], lines[0]
    assert any(advice in lines[0] for advice in ("give", "put", "remove", "replace")), lines[0]
    assert not (tmp_path / "runs").exists()


def test_each_file_counts_once_however_links_lead_to_it(tmp_path):
    """A link back up the tree (a loop) and a second link to a file of the same class add nothing:
    torchvision's ImageFolder listed the loop's files again at every depth until the path grew too
    long. A link to a file elsewhere is listed, once."""
    root = write_folder(tmp_path / "data", train=2, val=1)
    ant = root / "train" / "ant"
    (ant / "again").symlink_to(ant)  # a loop
    (ant / "twice.png").symlink_to(ant / "0.png")
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(ant / "1.png", tmp_path / "elsewhere" / "9.png")
    (ant / "outside").symlink_to(tmp_path / "elsewhere")
    facts = image_folder(str(root))
    assert facts.images == {"train": 7, "val": 3}
    assert [path for path, label in facts.samples["train"] if label == 0] == \
        [str(ant / "0.png"), str(ant / "1.png"), str(ant / "outside" / "9.png")]
    train, _ = load_datasets("imagefolder", str(root), 0, 0, 32)
    assert len(train) == 7 and train.targets == [0, 0, 0, 1, 1, 2, 2]


def test_a_png_without_its_end_that_pil_still_reads_is_read(tmp_path):
    """The end-marker check only sends a file to a full decode: one
    PIL can decode is never refused."""
    root = write_folder(tmp_path / "data", train=2, val=1)
    path = root / "train" / "ant" / "1.png"
    path.write_bytes(path.read_bytes()[:-12])  # its IEND chunk cut off: the image data is whole
    train, _ = load_datasets("imagefolder", str(root), 0, 0, 32)
    assert len(train) == 6


def corrupt_inside(path: Path) -> None:
    """A byte of the PNG's image data flipped: its header and its end are
    whole, so only decoding it fails."""
    data = bytearray(path.read_bytes())
    data[data.index(b"IDAT") + 12] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_image_that_fails_only_when_decoded_stops_the_run_naming_it(tmp_path):
    """The gpu loader decodes every image before anything is written: refused, exit status 2. The
    torchvision loader meets it in a worker while training: the run stops as for a dead worker, with
    its checkpoint and the path in one line, exit status 1."""
    root = write_folder(tmp_path / "data", train=2, val=1)
    path = root / "train" / "bee" / "1.png"
    corrupt_inside(path)
    small = ["--batch_size", "2", "--run_name", "run"]
    refused = refuse_in_process("single_gpu/train.py",
                                *flags(root, tmp_path / "gpu", "--loader", "gpu", *small))
    assert (refused.returncode == 2 and refused.stderr.count("\n") == 1
            and not (tmp_path / "gpu").exists())
    assert f"error: --dataset imagefolder: {path} cannot be read as an image (" in refused.stderr
    stopped = train_in_process("single_gpu/train.py",
                               *flags(root, tmp_path / "runs", *small, "--num_workers", "1"))
    lines = stopped.stderr.splitlines()
    assert stopped.returncode == 1 and lines[-1].startswith(f"error: {path} cannot be read as an "
                                                            "image ("), lines
    assert ("replace it with a readable image; stopped at step" in lines[-1]
            and "--resume auto" in lines[-1])
    assert ("Traceback" not in stopped.stderr
            and (tmp_path / "runs" / "run" / "checkpoint.pt").is_file())


def test_a_worker_killed_while_the_gpu_loader_decodes_the_folder_is_one_line(tmp_path,
                                                                            monkeypatch):
    """The gpu loader's decoding workers, ended by the OOM killer (SIGKILL, each at its first
    image here): the run says so in one line before it trains, exit 1, no traceback."""
    import common.gpu_loader

    def killed(self, index):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(common.gpu_loader._Decoded, "__getitem__", killed)
    root = write_folder(tmp_path / "data")
    done = train_in_process("single_gpu/train.py", *flags(root, tmp_path / "runs", "--loader",
                                                          "gpu", "--num_workers", "2"))
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert re.fullmatch(r"error: --dataset imagefolder: DataLoader worker \(pid \d+\) is killed "
                        r"by signal: Killed while decoding the images: run it again, with a "
                        r"smaller --num_workers if the machine ran out of memory", lines[0])
def test_a_class_named_in_two_unicode_forms_in_train_and_val_is_one_class(tmp_path):
    """train/café written on Linux (composed, NFC) and val/café copied from macOS (decomposed, NFD)
    look alike and are one class, named in the composed form, in both splits: the run trains on
    it and evaluates its validation images, which used to be refused as two different classes."""
    root = write_folder(tmp_path / "data", train=2, val=1)
    (root / "train" / "cat").rename(root / "train" / NFC)
    (root / "val" / "cat").rename(root / "val" / NFD)
    done = train_in_process("single_gpu/train.py", *flags(root, tmp_path / "runs", "--batch_size",
                                                          "2", "--run_name", "cafe"))
    assert done.returncode == 0, done.stderr
    facts = image_folder(str(root))
    assert facts.classes == ("ant", "bee", NFC)
    assert [path for path, label in facts.samples["val"] if label == 2] == \
        [str(root / "val" / NFD / "0.png")]
    assert read_results(tmp_path / "runs" / "cafe")["summary"]["test_images"] == 3


def test_augment_off_with_flip_is_refused_and_off_is_recorded_as_mirroring_nothing(folder,
                                                                                   tmp_path):
    """--flip mirrors training images and --augment off trains on the evaluation images as they
    are: given both, one line; --augment off alone is recorded as it ran, flip false, where the
    run's config used to say what --flip was given (true with --flip)."""
    for off in (["--augment", "off"], ["--no_augment"]):
        done = refuse_in_process("single_gpu/train.py", *flags(folder, tmp_path / "refused", *off,
                                                               "--flip"))
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("error: --flip mirrors training images and --augment off")
    assert not (tmp_path / "refused").exists()
    done = train_in_process("single_gpu/train.py", *flags(folder, tmp_path / "runs", "--no_augment",
                                                          "--run_name", "plain"))
    assert done.returncode == 0, done.stderr
    config = read_results(tmp_path / "runs" / "plain")["config"]
    assert (config["augment"], config["flip"]) == ("off", False)
    assert "augment off," in done.stdout.splitlines()[0]


# ------------------------------------------------------------------------ resuming a changed folder
@pytest.fixture(scope="module")
def trained_once(tmp_path_factory) -> tuple[Path, Path]:
    """A folder, and a one-epoch run on it whose checkpoint a resume continues: (folder, runs)."""
    base = tmp_path_factory.mktemp("resumed")
    root = write_folder(base / "data", train=2, val=1)
    done = train_in_process("single_gpu/train.py", *flags(root, base / "runs", "--batch_size", "2",
                                                          "--run_name", "run"))
    assert done.returncode == 0, done.stderr
    return root, base / "runs"


def swap_classes(root: Path) -> None:
    for split in ("train", "val"):
        (root / split / "ant").rename(root / split / "tmp")
        (root / split / "bee").rename(root / split / "ant")
        (root / split / "tmp").rename(root / split / "bee")


CHANGES = {
    "images added": (lambda root: shutil.copy(root / "train" / "bee" / "0.png",
                                              root / "train" / "bee" / "new.png"),
                     "{root}/train/bee held 2 images and holds 3 now"),
    "a class renamed": (lambda root: [(root / split / "cat").rename(root / split / "cow")
                                      for split in ("train", "val")],
                        "its classes were ant, bee, cat and are ant, bee, cow now"),
    "labels swapped": (swap_classes, "{root}/train/ant holds 2 images as before, but other files"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_resume_auto_on_a_folder_changed_since_is_refused_saying_what_changed(trained_once,
                                                                             tmp_path, change):
    """The checkpoint records the folder's classes in order and each class's files: resuming on a
    copy of it that has changed since (images added, a class renamed, two classes' names swapped,
    which swaps their labels) is refused in one line that says what changed, before anything is
    written; it used to go on silently."""
    folder, runs = trained_once
    root, log_dir = tmp_path / "data", tmp_path / "runs"
    shutil.copytree(folder, root)
    shutil.copytree(runs, log_dir)
    make, said = CHANGES[change]
    make(root)
    before = sorted(path.stat().st_mtime_ns for path in (log_dir / "run").iterdir())
    done = run_script("single_gpu/train.py", *flags(root, log_dir, "--batch_size", "2",
                                                    "--run_name", "run", "--resume", "auto",
                                                    "--epochs", "2"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: --resume: {log_dir / 'run' / 'checkpoint.pt'} was "
                                  "written on another image folder: "), done.stderr
    assert said.format(root=root) in done.stderr and "start a new run" in done.stderr
    assert sorted(path.stat().st_mtime_ns for path in (log_dir / "run").iterdir()) == before


def test_resume_auto_on_a_copy_of_the_folder_elsewhere_goes_on(trained_once, tmp_path):
    """The folder as it was, copied to another disk (a job staging its data): the same classes and
    files, other paths and times, so the run goes on from its checkpoint."""
    folder, runs = trained_once
    root, log_dir = tmp_path / "scratch" / "data", tmp_path / "runs"
    shutil.copytree(folder, root)
    shutil.copytree(runs, log_dir)
    done = train_in_process("single_gpu/train.py", *flags(root, log_dir, "--batch_size", "2",
                                                          "--run_name", "run", "--resume", "auto",
                                                          "--epochs", "2"))
    assert done.returncode == 0, done.stderr
    assert read_results(log_dir / "run")["summary"]["steps"] == 6


# ----------------------------------------------------------------------------------- small folders
def test_a_folder_smaller_than_the_default_batch_trains_on_a_batch_that_fits_it(folder, tmp_path):
    """24 training images, no --batch_size: the default 128 is halved until an epoch has 4 steps
    (4 images, 6 steps), and the first line says so; the rate follows the batch. It used to be
    refused (128 > 24), as an explicit --batch_size too large still is, in one line."""
    small = ["--dataset", "imagefolder", "--data_dir", folder, "--image_size", "32", "--depth", "8",
             "--alpha", "12", "--epochs", "1", "--log_interval", "3", "--warmup_steps", "1",
             "--num_workers", "0", "--no_progress", "--log_dir", tmp_path / "runs"]
    done = train_in_process("single_gpu/train.py", *small, "--run_name", "fitted")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert ("global batch 4 on cpu" in first and "the default batch 128 halved to 4 for the 24 "
            "training images (6 steps an epoch; --batch_size sets it)" in first), first
    assert "lr 0.003125 (= 0.1 per 128 images x global batch 4" in first
    results = read_results(tmp_path / "runs" / "fitted")
    assert results["config"]["batch_size"] == 4 and results["summary"]["steps"] == 6
    refused = refuse_in_process("single_gpu/train.py", *small, "--batch_size", "32")
    assert refused.returncode == 2 and refused.stderr == (
        "error: --batch_size 32 is larger than the training set (24 images); use a smaller "
        "batch\n")
    given = parse_config(Config, ["--dataset", "imagefolder", "--data_dir", str(folder),
                                  "--batch_size", "16"])
    assert given.batch_size == 16 and "halved" not in batch_note(given)


def test_a_folders_warm_up_is_counted_in_steps(folder):
    """An image folder's warm-up: 5 epochs' steps, at least 50 and at most a third of the run
    (a tenth, 16 steps, of 15 epochs of 11 let a ResNet-18's loss leap in its second epoch);
    the other datasets keep theirs, at most a tenth."""
    cfg = parse_config(Config, ["--dataset", "imagefolder", "--data_dir", str(folder)])
    for epochs, steps_per_epoch, ramp in ((15, 11, 55), (15, 7, 35), (300, 7, 50), (300, 11, 55),
                                          (1, 3, 1), (300, 390, 1950)):
        assert warmup_steps(dataclasses.replace(cfg, epochs=epochs), steps_per_epoch) == ramp
    assert warmup_steps(dataclasses.replace(cfg, lr_warmup_epochs=0), 11) == 0
    synthetic = parse_config(Config, ["--dataset", "synthetic", "--epochs", "15"])
    assert warmup_steps(synthetic, 11) == 16 and warmup_steps(synthetic, 390) == 585


def test_a_folder_runs_batchnorm_statistics_are_those_of_its_weights(folder, tmp_path):
    """Before each evaluation an image folder's BatchNorm statistics are computed afresh from
    the epoch's training batches with the weights evaluated (the running ones mix the batches of
    the last ~10 steps, each with its own step's weights): model.pt holds exactly those, and the
    count of batches tracked is still the run's steps. Training itself never reads them."""
    from common.augmentation import augmentation
    from common.metrics import batchnorm_statistics
    from models import build_model

    done = train_in_process("single_gpu/train.py", *flags(folder, tmp_path / "runs", "--run_name",
                                                          "bn", "--save_model"))
    assert done.returncode == 0, done.stderr
    cfg = parse_config(Config, [str(arg) for arg in flags(folder, tmp_path / "runs")])
    saved = torch.load(tmp_path / "runs" / "bn" / "model.pt", weights_only=True)
    model = build_model(cfg, dataset_info(cfg))
    model.load_state_dict(saved)
    train, _ = load_datasets("imagefolder", str(folder), 0, 0, 32)
    loader = make_loader("torchvision", train, ShuffleSampler(24, True, 0), 8, CPU, train=True,
                         augment=augmentation(cfg), num_workers=0, seed=0)
    batchnorm_statistics(model, at_epoch(loader, 0), 3)
    names = [name for name in saved if name.endswith(("running_mean", "running_var"))]
    assert names and all(torch.equal(model.state_dict()[name], saved[name]) for name in names)
    assert all(saved[name].item() == 3 for name in saved if name.endswith("num_batches_tracked"))


# -------------------------------------------------------------------------------------- the loaders
def test_both_loaders_give_the_same_evaluation_images(folder):
    """Evaluation: resize to image_size * 256 // 224, centre crop, by PIL in both
    loaders (the gpu loader decodes them once): the same pixels, normalised each
    loader's way (up to a float32 rounding)."""
    _, val = load_datasets("imagefolder", str(folder), 0, 0, 32)
    batches = {kind: next(iter(make_loader(kind, val, EvalShard(15), 15, CPU, train=False,
                                           augment=True, num_workers=0, seed=0)))
               for kind in ("gpu", "torchvision")}
    (gpu, labels), (classic, classic_labels) = batches["gpu"], batches["torchvision"]
    assert gpu.shape == (15, 3, 32, 32) and torch.equal(labels, classic_labels)
    assert (gpu - classic).abs().max() <= 2 ** -21
    expected = np.stack([np.asarray(evaluation_crop(val[i][0], 32)) for i in range(15)])
    assert torch.equal(pixels(gpu).round().permute(0, 2, 3, 1).to(torch.uint8),
                       torch.from_numpy(expected))
    assert stored_side(32) == 36 and stored_side(224) == 256


@pytest.mark.parametrize("dataset", ["imagefolder", "synthetic"])
def test_both_loaders_start_the_model_from_the_same_weights_on_one_seed(folder, tmp_path, dataset):
    """train.py seeds, builds its loaders, then its model: a loader that drew from the global RNG
    on the way (the gpu loader's decoding of a folder, by a DataLoader without a generator of its
    own) would change the initial weights. With one --seed, the same weights whichever loader."""
    from single_gpu.train import get_config, prepare

    data = (["--data_dir", folder, "--image_size", "32"] if dataset == "imagefolder"
            else ["--synthetic_size", "48"])

    def initial_weights(loader: str) -> dict:
        cfg = get_config([str(flag) for flag in flags(
            folder, tmp_path, "--dataset", dataset, *data, "--loader", loader, "--run_name",
            loader)])
        run, _ = prepare(cfg, 0.0)
        run.close()
        return run.raw_model.state_dict()

    gpu, torchvision = initial_weights("gpu"), initial_weights("torchvision")
    assert gpu.keys() == torchvision.keys()
    assert all(torch.equal(gpu[name], torchvision[name]) for name in gpu)


def crop_expected(width: int, height: int, box, mirrored: bool,
                  size: int) -> tuple[np.ndarray, np.ndarray]:
    """The red and green of a size x size crop of a ramp image at `box` (top, left, height,
    width), read off the ramps at each output pixel's centre: what any resampling of a
    linear image gives inside the crop."""
    top, left, box_height, box_width = box
    centres = np.arange(size) + 0.5
    red = (left + centres * box_width / size - 0.5) * 255 / (width - 1)
    green = (top + centres * box_height / size - 0.5) * 255 / (height - 1)
    return (red[::-1] if mirrored else red), green


@pytest.mark.parametrize("kind", ["gpu", "torchvision"])
def test_a_training_crop_is_the_box_drawn_for_its_image_in_either_loader(folder, kind):
    """Every training image in two epochs: inside a one-pixel border (where resamplers treat a box's
    edge each their own way), its red and green are the ramps at the box crop_boxes draws for (seed,
    epoch, index) on the original's pixels, mirrored where the draw says, within 1.5 of 255: a box
    one pixel off moves them by 5 or more. The torchvision loader crops the original with PIL; the
    gpu loader the image stored squashed to stored_side(32) = 36 pixels, with roi_align."""
    train, _ = load_datasets("imagefolder", str(folder), 0, 0, 32)
    sampler = ShuffleSampler(24, shuffle=True, seed=5)
    loader = make_loader(kind, train, sampler, 8, CPU, train=True,
                         augment=Augmentation("resized", flip=True), num_workers=0, seed=5)
    boxes = []
    for epoch in (0, 1):
        at_epoch(loader, epoch)
        images = pixels(torch.cat([batch for batch, _ in loader])).numpy()
        draws = resized_crop_draws(5, epoch, 24, flip=True)
        for image, index in zip(images, list(sampler)):
            width, height = Image.open(train.samples[index][0]).size
            box = tuple(int(v)
                        for v in crop_boxes([draw[index] for draw in draws[:4]], width, height))
            red, green = crop_expected(width, height, box, bool(draws[4][index]), 32)
            assert np.abs(image[0] - red[None, :])[1:-1, 1:-1].max() < 1.5, (epoch, index, box)
            assert np.abs(image[1] - green[:, None])[1:-1, 1:-1].max() < 1.5, (epoch, index, box)
            boxes.append(box)
    assert len(set(boxes)) > 40  # the crops move, from image to image and from epoch to epoch


def test_auto_pads_a_folder_up_to_64_pixels_and_takes_resized_crops_above(folder):
    """--augment auto: CIFAR's pad-and-crop (by an eighth of the side) at an --image_size of 64 or
    less, unmirrored (small images are often digits or letters), ImageNet's mirrored random resized
    crop above; --augment and --flip override it, the flip's default following the crop;
    resolve_fast_path makes the choice explicit, so results.json's config records what ran."""
    def chosen(*more) -> tuple:
        cfg = parse_config(Config, ["--dataset", "imagefolder", "--data_dir", str(folder), *more])
        info, augmentation = dataset_info(cfg), resolve_fast_path(cfg, CPU)
        return info.crop, info.pad, info.flip, augmentation.augment, augmentation.flip

    assert chosen("--image_size", "32") == ("pad", 4, False, "pad", False)
    assert chosen("--image_size", "64") == ("pad", 8, False, "pad", False)
    assert chosen("--image_size", "65") == ("resized", 8, True, "resized", True)
    assert chosen() == ("resized", 28, True, "resized", True)  # 224 pixels
    assert chosen("--image_size", "32", "--augment", "resized")[3:] == ("resized", True)
    assert chosen("--image_size", "32", "--augment", "resized", "--no_flip")[3:] == \
        ("resized", False)
    assert chosen("--image_size", "32", "--flip")[3:] == ("pad", True)
    assert chosen("--augment", "pad")[3:] == ("pad", False)
    assert chosen("--image_size", "32", "--no_augment")[3] == "off"
    for dataset, flip in (("synthetic", True), ("mnist", False)):
        cfg = parse_config(Config, ["--dataset", dataset])
        assert (dataset_info(cfg).crop, dataset_info(cfg).pad, dataset_info(cfg).flip) == \
            ("pad", 4, flip)


@pytest.mark.parametrize("flip", [True, False])
def test_a_small_folder_is_padded_and_cropped_alike_by_both_loaders(folder, flip):
    """At 32 pixels each training image is its evaluation crop padded by 4 pixels and cut back to
    32 at the offsets augmentation_draws gives for (seed, epoch, index), mirrored where the draw
    says (never with --no_flip): the same pixels from both loaders, in two epochs."""
    train, _ = load_datasets("imagefolder", str(folder), 0, 0, 32)
    sampler = ShuffleSampler(24, shuffle=True, seed=3)
    loaders = {kind: make_loader(kind, train, sampler, 8, CPU, train=True,
                                 augment=Augmentation("pad", flip), num_workers=0, seed=3)
               for kind in ("gpu", "torchvision")}
    mirrored = 0
    for epoch in (0, 1):
        gpu, classic = (torch.cat([batch for batch, _ in at_epoch(loaders[kind], epoch)])
                        for kind in ("gpu", "torchvision"))
        assert (gpu - classic).abs().max() <= 2 ** -21
        top, left, flipped = augmentation_draws(3, epoch, 24, flip, pad=4)
        for image, index in zip(pixels(gpu).round().to(torch.uint8), list(sampler)):
            padded = np.pad(np.asarray(evaluation_crop(train[index][0], 32)), ((4, 4), (4, 4),
                                                                                 (0, 0)))
            crop = padded[top[index]:top[index] + 32, left[index]:left[index] + 32]
            crop = crop[:, ::-1] if flipped[index] else crop
            assert np.array_equal(image.permute(1, 2, 0).numpy(), crop), (epoch, index)
            mirrored += int(flipped[index])
    assert (mirrored > 0) == flip


def test_crop_boxes_are_randomresizedcrops_and_the_same_one_at_a_time():
    """crop_boxes of a whole dataset at once equals its image-by-image calls (the torchvision
    loader's), bit for bit; each box lies in its image, covers 8 % to 100 % of it, at an aspect
    ratio of 3/4 to 4/3 where not clamped (on photographs' shapes, 3:4 to 4:3, about one box in five
    is clamped to its image where torchvision would draw again)."""
    draws = resized_crop_draws(0, 3, 2000, flip=True)
    rng = np.random.default_rng(1)
    widths = rng.integers(200, 600, 2000)
    heights = np.rint(widths * rng.uniform(0.75, 1.34, 2000)).astype(np.int64)
    top, left, height, width = crop_boxes(draws[:4], widths, heights)
    for i in range(0, 2000, 97):
        box = crop_boxes([draw[i] for draw in draws[:4]], int(widths[i]), int(heights[i]))
        assert tuple(box) == (top[i], left[i], height[i], width[i])
    assert (top >= 0).all() and (left >= 0).all() and (top + height <= heights).all() and \
        (left + width <= widths).all()
    inside = (width < widths) & (height < heights)
    area = width * height / (widths * heights)
    assert inside.mean() > 0.75 and 0.07 < area[inside].min() and area.max() <= 1
    assert (0.74 < (width / height)[inside]).all() and ((width / height)[inside] < 1.35).all()
    assert 0.4 < draws[4].mean() < 0.6 and not resized_crop_draws(0, 3, 100, flip=False)[4].any()
    # another epoch, other crops
    assert not np.array_equal(resized_crop_draws(0, 4, 2000, True)[0], draws[0])


def test_the_torchvision_loader_crops_alike_with_workers_and_from_a_resumed_batch(folder):
    train, _ = load_datasets("imagefolder", str(folder), 0, 0, 32)

    def epoch_one(workers: int, skip: int = 0) -> torch.Tensor:
        loader = make_loader("torchvision", train, ShuffleSampler(24, True, 0), 8, CPU, train=True,
                             augment=True, num_workers=workers, seed=0)
        return torch.cat([images for images, _ in at_epoch(loader, 1, skip)])

    alone = epoch_one(0)
    assert torch.equal(epoch_one(1), alone) and torch.equal(epoch_one(0, skip=2), alone[16:])


# -------------------------------------------------------------------------------------- other sizes
# sha256 of SyntheticCIFAR(100, 3, train).data
SYNTHETIC_32 = {True: "e9eae3289a4f719f", False: "3b47a58719ecf020"}


def test_the_synthetic_set_stays_the_same_bits_at_32_pixels_and_is_generated_there_above():
    for train, digest in SYNTHETIC_32.items():
        data = SyntheticCIFAR(100, 3, train=train).data
        assert hashlib.sha256(data.tobytes()).hexdigest()[:16] == digest
        large = SyntheticCIFAR(100, 3, train=train, image_size=64)
        assert (hashlib.sha256(large.data.tobytes()).hexdigest()[:16] == digest
                and large.info.size == 64)
    small = SyntheticCIFAR(10, 3, train=True, image_size=16)
    assert small.data.shape == (10, 16, 16, 3) and small.info.size == 16


def test_synthetic_at_64_pixels_is_deterministic_and_the_same_in_both_loaders():
    """Each image padded and cropped at its 32 stored pixels, then resized to 64 by
    `resized` (bilinear), in both loaders: the same batches, again on a second
    loader, differing between epochs."""
    train, test = load_datasets("synthetic", "", 48, 7, 64)
    assert train.info.size == test.info.size == 64 and train.data.shape == (48, 32, 32, 3)

    def epoch(kind: str, number: int) -> torch.Tensor:
        loader = make_loader(kind, train, ShuffleSampler(48, True, 7), 16, CPU, train=True,
                             augment=True, num_workers=0, seed=7)
        return torch.cat([images for images, _ in at_epoch(loader, number)])

    gpu = epoch("gpu", 0)
    assert gpu.shape == (48, 3, 64, 64) and torch.equal(epoch("gpu", 0), gpu)
    assert (epoch("torchvision", 0) - gpu).abs().max() < 1e-5
    assert not torch.equal(epoch("gpu", 1), gpu)
    order = list(ShuffleSampler(48, True, 7))  # epoch 0's order
    top, left, flip = augmentation_draws(7, 0, 48, flip=True)
    padded = np.pad(train.data[order[0]], ((4, 4), (4, 4), (0, 0)))
    first = padded[top[order[0]]:top[order[0]] + 32, left[order[0]]:left[order[0]] + 32]
    first = torch.from_numpy(first[:, ::-1].copy() if flip[order[0]] else first)
    first = first.permute(2, 0, 1).float()
    std, mean = (torch.tensor(v).view(1, 3, 1, 1) * 255 for v in (train.info.std, train.info.mean))
    torch.testing.assert_close(gpu[:1], (resized(first[None], 64) - mean) / std)
    evaluated = next(iter(make_loader("gpu", test, EvalShard(9), 9, CPU, train=False, augment=True,
                                      num_workers=0, seed=7)))[0]
    assert evaluated.shape == (9, 3, 64, 64)


def test_cifar10_and_mnist_shaped_data_is_resized_alike_by_both_loaders():
    """--image_size with cifar10 or mnist: their images are resized, not
    refused, by the synthetic set's path."""
    rng = np.random.default_rng(0)
    for name, shape in (("cifar10", (6, 32, 32, 3)), ("mnist", (6, 28, 28))):
        data = rng.integers(0, 256, shape, dtype=np.uint8)
        dataset = SyntheticCIFAR(6, 0, train=True)
        dataset.data, dataset.targets = data, [0] * 6
        dataset.info = dataclasses.replace(DATASET_INFO[name], size=48)
        batches = [next(iter(make_loader(kind, dataset, ShuffleSampler(6, True, 0), 6, CPU,
                                         train=True, augment=True, num_workers=0, seed=0)))[0]
                   for kind in ("gpu", "torchvision")]
        assert batches[0].shape == (6, DATASET_INFO[name].channels, 48, 48)
        assert (batches[0] - batches[1]).abs().max() < 1e-5


# --------------------------------------------------------------------------------------- the loader
def fake_gpu(monkeypatch, free: int) -> torch.device:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    return torch.device("cuda", 0)


def test_the_gpu_loader_takes_a_folder_that_fits_in_half_the_free_memory(folder, monkeypatch):
    cfg = parse_config(Config, ["--dataset", "imagefolder", "--data_dir", str(folder),
                                "--image_size", "32", "--augment", "resized"])
    # the training images at 36 pixels, the validation ones at 32
    need = 3 * (24 * 36 * 36 + 15 * 32 * 32)
    # pad crops are cut from the evaluation images: every image at 32 pixels
    assert folder_bytes(dataclasses.replace(cfg, augment="pad")) == 3 * 39 * 32 * 32
    assert resolve_loader(cfg, CPU) == "torchvision"  # on the CPU, as before
    assert resolve_loader(dataclasses.replace(cfg, loader="gpu"), CPU) == "gpu"
    assert resolve_loader(cfg, fake_gpu(monkeypatch, 2 * need)) == "gpu"
    assert resolve_loader(cfg, fake_gpu(monkeypatch, 2 * need - 1)) == "torchvision"
    synthetic = dataclasses.replace(cfg, dataset="synthetic")
    assert resolve_loader(synthetic, fake_gpu(monkeypatch, 0)) == "gpu"
    chosen = dataclasses.replace(cfg, loader="torchvision", amp="off", channels_last=False,
                                 align_channels=0)
    assert describe_fast_path(chosen) == ("fp32, NCHW, torchvision loader (the decoded "
                                          "images would take 0.133 MiB, more than half of "
                                          "the 0.266 MiB free on cuda:0)")
    with pytest.raises(UsageError) as refused:
        resolve_loader(dataclasses.replace(cfg, loader="gpu"), fake_gpu(monkeypatch, need - 1))
    assert str(refused.value).startswith("--loader gpu: the image folder's decoded images "
                                         "take 0.133 MiB, more than the 0.133 MiB free on "
                                         "cuda:0: leave out --loader")
    assert resolve_fast_path(cfg, CPU).loader == "torchvision"


# ---------------------------------------------------------------------------------------- compare
def test_compare_benchmarks_the_folders_own_images_through_a_training_runs_loader(folder,
                                                                                  tmp_path):
    """compare.py --dataset imagefolder without --epochs: its --benchmark runs read the folder (not
    synthetic data), through the loader and workers a training run on this machine uses (the
    torchvision loader on the CPU: decoding included), and the report's Data line names the folder
    and its images. A --benchmark run of single_gpu, as compare.py starts one, here in-process."""
    import compare
    from comparison.report.model import model_line

    argv = ["--dataset", "imagefolder", "--data_dir", str(folder), "--image_size", "32",
            "--batch_size", "8", "--modes", "single_gpu"]
    cc, train, group_flags, cuda = compare.configure(argv)
    shared, _ = compare.plan_matrix(cc, train, group_flags, cuda)
    assert "--benchmark" in shared and "--loader" not in shared and "--num_workers" not in shared
    log_dir = tmp_path / "runs"
    done = train_in_process("single_gpu/train.py", *shared, "--batch_size", "8", "--log_dir",
                            log_dir, "--run_name", "benchmark", "--benchmark_steps", "4",
                            "--warmup_steps", "1", "--num_workers", "0")
    assert done.returncode == 0, done.stderr
    results = read_results(log_dir / "benchmark")
    assert (results["config"]["dataset"], results["config"]["loader"]) == ("imagefolder",
                                                                           "torchvision")
    profiled = 0
    if "--profile_steps" in shared:
        profiled = int(shared[shared.index("--profile_steps") + 1])
    assert results["summary"]["steps"] == 5 + profiled  # the profiled steps come after the timed
    assert "imagefolder" in done.stdout.splitlines()[0]
    line = model_line(results["config"], [], 0)
    assert (f"Data: the image folder {folder} (24 training and 15 validation images), 32×32 "
            "images, 3 channels, 3 classes." in line), line


# ----------------------------------------------------------------------------------- on a terminal
def on_a_terminal(*args) -> tuple[int, str]:
    """`python single_gpu/train.py args...` with its stdout on a pseudo-terminal, as a user at a
    terminal runs it: (exit status, everything it wrote there, tqdm's bars included)."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from conftest import REPO

    main, terminal = pty.openpty()
    # 24 rows of 150 columns: a new pseudo-terminal has 0, where tqdm draws nothing
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 150, 0, 0))
    process = subprocess.Popen([sys.executable, str(REPO / "single_gpu/train.py"), *map(str, args)],
                               stdout=terminal, stderr=terminal,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.close(terminal)
    written = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end closed: the process is done
            break
        if not chunk:
            break
        written += chunk
    os.close(main)
    return process.wait(timeout=300), written.decode(errors="replace")


def test_on_a_terminal_the_test_pass_has_a_bar_and_eleven_classes_get_top5(tmp_path):
    """A folder of 11 classes at 16 pixels, two epochs: each test pass is counted on a bar of its
    own ("Test 1/2"), as each epoch's training is; its line and the last line give top-5 beside
    top-1; the first line names the augmentation (pad-2 crop at 16 pixels, not mirrored)."""
    root = tmp_path / "data"
    for split, count in (("train", 2), ("val", 1)):
        for label in range(11):
            (root / split / f"c{label:02d}").mkdir(parents=True)
            for i in range(count):
                Image.fromarray(ramp(20, 20, blue=20 * label + i)).save(
                    root / split / f"c{label:02d}" / f"{i}.png")
    status, written = on_a_terminal(
        "--dataset", "imagefolder", "--data_dir", root, "--image_size", "16", "--depth", "8",
        "--alpha", "12", "--batch_size", "8", "--epochs", "2", "--warmup_steps", "1",
        "--num_workers", "0", "--log_dir", tmp_path / "runs")
    assert status == 0, written
    assert "Epoch 1/2" in written and "Test 1/2" in written and "Test 2/2" in written
    assert "augment pad-2 crop, no flip" in written
    lines = [line.strip("\r") for line in written.replace("\r", "\n").splitlines()]
    tested = [line for line in lines if line.startswith("Epoch 2/2 test loss")]
    assert tested and " (top-5 " in tested[0] and "(11 images)" in tested[0]
    run_dir = tmp_path / "runs" / os.listdir(tmp_path / "runs")[0]
    summary = read_results(run_dir)["summary"]
    assert summary["test_acc"] <= summary["test_acc_top5"] <= 1
    top5 = read_scalars(run_dir)["test/acc_top5_pct"]
    assert [value for _, value in top5][-1] == pytest.approx(100 * summary["test_acc_top5"])
    assert any(line.startswith("best test acc ") and " (top-5 " in line for line in lines)


# --------------------------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    """Every mode trains once on the folder: dist_parallel (torchvision loader, weights saved) and
    fsdp (gpu loader) on two processes each, each evaluating every validation image at its end, then
    single_gpu (torchvision loader) and data_parallel (gpu loader) in this process; then single_gpu
    evaluates dist_parallel's weights in one process."""
    log_dir = tmp_path_factory.mktemp("folder_runs")
    two = ["--nproc_per_node", "2"]
    done = dict(zip(("dist_parallel", "fsdp"), two_at_a_time(
        lambda: run_script("dist_parallel/train.py", *flags(folder, log_dir, "--run_name",
                                                            "dist_parallel", "--save_model", *two)),
        lambda: run_script("fsdp/train.py", *flags(folder, log_dir, "--run_name", "fsdp",
                                                   "--loader", "gpu", *two)))))
    done["single_gpu"] = train_in_process("single_gpu/train.py",
                                          *flags(folder, log_dir, "--run_name", "single_gpu"))
    done["data_parallel"] = train_in_process("data_parallel/train.py",
                                             *flags(folder, log_dir, "--run_name", "data_parallel",
                                                    "--loader", "gpu"))
    done["evaluated"] = train_in_process("single_gpu/train.py", *flags(
        folder, log_dir, "--run_name", "evaluated", "--evaluate",
        log_dir / "dist_parallel" / "model.pt"))
    return log_dir, done


@pytest.mark.parametrize("mode, loader", [("single_gpu", "torchvision"), ("data_parallel", "gpu"),
                                          ("dist_parallel", "torchvision"), ("fsdp", "gpu")])
def test_every_mode_trains_on_the_folder(runs, mode, loader):
    log_dir, done = runs
    assert done[mode].returncode == 0, done[mode].stderr
    first = next(line for line in done[mode].stdout.splitlines() if line.startswith(f"{mode}:"))
    assert ", imagefolder, " in first and f"{loader} loader" in first
    results = read_results(log_dir / mode)
    assert results["config"]["loader"] == loader and results["config"]["image_size"] == 32
    assert results["summary"]["steps"] == 3 and results["summary"]["test_images"] == 15
    assert results["summary"]["test_acc"] * 15 == \
        pytest.approx(round(results["summary"]["test_acc"] * 15))
    assert "(15 images)" in done[mode].stdout  # on two ranks: 8 and 7, summed


def test_one_and_two_processes_evaluate_every_validation_image_once_alike(runs):
    """dist_parallel's end of training evaluated its weights on two ranks (8 and 7 images);
    single_gpu --evaluate reads those weights and evaluates all 15 in one process: the same
    accuracy, the same loss but for the order of its sums."""
    log_dir, done = runs
    assert done["evaluated"].returncode == 0, done["evaluated"].stderr
    one, two = (read_results(log_dir / name)["summary"] for name in ("evaluated", "dist_parallel"))
    assert one["test_images"] == two["test_images"] == 15
    assert (one["test_acc"] == two["test_acc"]
            and one["test_loss"] == pytest.approx(two["test_loss"], rel=1e-5))
