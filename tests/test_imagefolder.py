"""--dataset imagefolder (DIR/train/<class>/*, DIR/val/<class>/*, read by torchvision's ImageFolder)
and --image_size, on a fixture of a few dozen generated PNGs of several sizes: the folder's facts,
--augment auto (CIFAR's pad crop up to 64 pixels, ImageNet's mirrored resized crop above), the one
line that refuses each bad folder before anything is written, the crops drawn from (seed, epoch,
index) whatever the workers or a resumed batch, the synthetic set at 64 pixels, issue 44's recipe
for a small folder (the batch fitted to it, a warm-up in steps, the BatchNorm statistics of the
weights evaluated, the folder's record a resume compares), and a run of every mode with the exact
evaluation of every validation image by one and two processes."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2 as T

import runkit
from conftest import read_results, read_scalars
from processes import in_process, run, script, train_file

SINGLE = train_file("single_gpu")
CPU = torch.device("cpu")
CLASSES = ("ant", "bee", "cat")
# (width, height): landscape, square, portrait
SIZES = [(40, 30), (36, 36), (30, 44), (48, 40)]
# images per class: 24 training images (3 batches of 8), 15 validation ones (8 + 7 on 2 ranks)
TRAIN, VAL = 8, 5


def write_folder(root: Path, train: int = TRAIN, val: int = VAL, classes=CLASSES) -> Path:
    """root/{train,val}/<class>/<i>.png: ramps that brighten left to right in red and top to
    bottom in green (a crop's place and mirroring can be read from its pixels), blue 20 x class
    + i."""
    for split, count in (("train", train), ("val", val)):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = ramp(*SIZES[i % len(SIZES)], blue=20 * label + i)
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


def flags(folder, log_dir, *more) -> list:
    """A tiny run on the folder: PyramidNet-8 alpha=12 at 32 pixels, one epoch of 3 steps of 8
    images."""
    return ["--dataset", "imagefolder", "--data_dir", folder, "--image_size", "32", "--depth", "8",
            "--alpha", "12", "--batch_size", "8", "--epochs", "1", "--log_interval", "3",
            "--warmup_steps", "1", "--num_workers", "0", "--log_dir", log_dir, *more]


def prepared(*argv, images: int | None = None):
    """The flags as main() makes them what they stand for (get_args, then data_defaults for the
    datasets read, or for `images` training images): (args, train set, test set, classes)."""
    args = SINGLE.get_args([str(arg) for arg in argv])
    if images is not None:
        SINGLE.data_defaults(args, images)
        return args, None, None, None
    train_set, test_set, classes = SINGLE.get_datasets(args)
    SINGLE.data_defaults(args, len(train_set))
    return args, train_set, test_set, classes


def pixels(images: torch.Tensor) -> torch.Tensor:
    """Normalised images back to 0..255 pixel values, ImageNet's statistics undone."""
    _, _, mean, std = SINGLE.IMAGES["imagefolder"]
    return images * torch.tensor(std).view(-1, 3, 1, 1) * 255 + torch.tensor(mean).view(
        -1, 3, 1, 1) * 255


# ---------------------------------------------------------------------------------------- the facts
def test_the_folder_gives_its_classes_and_counts_and_imagenets_defaults(folder):
    args, train, val, classes = prepared("--dataset", "imagefolder", "--data_dir", folder)
    assert (classes, len(train), len(val), train.classes) == (3, 24, 15, list(CLASSES))
    # ImageFolder's order: by class, then by name
    assert train.targets == [0] * 8 + [1] * 8 + [2] * 8
    image, label = val[5]
    assert image.mode == "RGB" and image.size == SIZES[0] and label == 1
    # 224 pixels, ImageNet's mirrored resized crop; the default batch halved to 4 steps an epoch
    assert (args.image_size, args.augment, args.flip, args.batch_size) == (224, "resized", True, 4)
    assert args.data == runkit.check_image_folder(folder) == \
        f"24 images in 3 classes, digest {args.data.rsplit(' ', 1)[1]}"
    args.image_size = 32
    _, raw_model, flops = SINGLE.get_model(args, classes, CPU)
    assert raw_model.fc.out_features == 3 and flops > 0


@pytest.mark.parametrize("more, chosen", [
    (["--image_size", "32"], ("pad", False)),
    (["--image_size", "64"], ("pad", False)),
    (["--image_size", "65"], ("resized", True)),
    ([], ("resized", True)),  # 224 pixels
    (["--image_size", "32", "--augment", "resized"], ("resized", True)),
    (["--image_size", "32", "--augment", "resized", "--no-flip"], ("resized", False)),
    (["--image_size", "32", "--flip"], ("pad", True)),
    (["--augment", "pad"], ("pad", False)),
    (["--image_size", "32", "--augment", "off"], ("off", False)),
])
def test_auto_pads_a_folder_up_to_64_pixels_and_takes_mirrored_resized_crops_above(folder, more,
                                                                                   chosen):
    """--augment auto: CIFAR's pad-and-crop at an --image_size of 64 or less, unmirrored (small
    images are often digits or letters), ImageNet's mirrored random resized crop above; --augment
    and --flip override it, the flip's default following the crop; results.json's config records
    what ran, as these args are."""
    args, *_ = prepared("--dataset", "imagefolder", "--data_dir", folder, *more, images=24)
    assert (args.augment, args.flip) == chosen


@pytest.mark.parametrize("dataset, flip", [("synthetic", True), ("cifar10", True),
                                           ("mnist", False)])
def test_the_built_in_sets_are_padded_and_cropped_at_their_side_digits_never_mirrored(dataset,
                                                                                       flip):
    args, *_ = prepared("--dataset", dataset, images=1000)
    assert (args.augment, args.flip, args.image_size) == \
        ("pad", flip, 28 if dataset == "mnist" else 32)


# -------------------------------------------------------------------------------------- bad folders
def break_folder(root: Path, case: str) -> tuple[Path, str]:
    """A small good folder broken as `case` says; returns the --data_dir and what the refusal
    must name."""
    write_folder(root, train=2, val=1)
    if case == "no folder":
        return root / "nothing", str(root / "nothing" / "train")
    if case in ("no train", "no val"):
        shutil.rmtree(root / case[3:])
        return root, f"{root / case[3:]} is not a folder"
    if case == "no class folders":
        shutil.rmtree(root / "val")
        (root / "val").mkdir()
        (root / "val" / "0.png").write_bytes((root / "train" / "ant" / "0.png").read_bytes())
        return root, "and val/ []"
    if case == "empty class":
        for path in (root / "train" / "bee").iterdir():
            path.unlink()
        (root / "train" / "bee" / "notes.txt").write_text("not an image")
        return root, f"{root / 'train' / 'bee'} holds no image"
    if case == "other classes":
        shutil.copytree(root / "val" / "cat", root / "val" / "dog")
        shutil.rmtree(root / "val" / "ant")
        return root, "['ant', 'bee', 'cat'] and val/ ['bee', 'cat', 'dog']"
    assert case == "one class"
    for split in ("train", "val"):
        shutil.rmtree(root / split / "bee")
        shutil.rmtree(root / split / "cat")
    return root, "['ant'] and val/ ['ant']: give both the same class folders, two at least"


@pytest.mark.parametrize("case", ["no folder", "no train", "no val", "no class folders",
                                  "empty class", "other classes", "one class"])
def test_each_bad_folder_is_one_line_that_names_it_and_nothing_is_written(tmp_path, case):
    """Refused the way a user meets it (the script's main() under one_line_errors, in this
    process): one line, exit status 2, before any run folder. (An image that cannot be decoded:
    tests/test_bad_input.py, by a real process.)"""
    data_dir, named = break_folder(tmp_path / "data", case)
    done = in_process("single_gpu", *flags(data_dir, tmp_path / "runs"))
    lines = [line for line in done.stderr.splitlines() if not line.startswith("warning: no CUDA")]
    assert (done.returncode == 2 and len(lines) == 1
            and lines[0].startswith("error: --dataset imagefolder: ")), done.stderr
    assert named in lines[0], lines[0]
    assert any(advice in lines[0] for advice in ("give", "put", "remove")), lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_link_back_up_the_tree_is_refused_and_a_link_elsewhere_is_listed(tmp_path):
    """A link to a folder elsewhere is listed; a link back up the tree (a loop), which
    torchvision's ImageFolder follows until the path is too long (a class of 2 images read as
    342), is refused in one line naming it, before any run folder."""
    root = write_folder(tmp_path / "data", train=2, val=1)
    ant = root / "train" / "ant"
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(ant / "1.png", tmp_path / "elsewhere" / "9.png")
    (ant / "outside").symlink_to(tmp_path / "elsewhere")
    _, train, _, _ = prepared("--dataset", "imagefolder", "--data_dir", root)
    assert len(train) == 7 and train.targets == [0, 0, 0, 1, 1, 2, 2]
    (ant / "outside" / "back").symlink_to(root / "train")  # a loop, one link further down
    done = in_process("single_gpu", *flags(root, tmp_path / "runs"))
    lines = [line for line in done.stderr.splitlines() if not line.startswith("warning: no CUDA")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: --dataset imagefolder: {ant / 'outside' / 'back'} ")
    assert "loop" in lines[0] and "remove it" in lines[0]
    assert not (tmp_path / "runs").exists()


# -------------------------------------------------------------------------------------- the crops
def loaders(*argv):
    args, train, test, _ = prepared(*[str(arg) for arg in argv])
    return SINGLE.get_loaders(args, train, test, CPU)


def epoch(loader, number: int, skip: int = 0) -> torch.Tensor:
    """The epoch's training images as the loop gets them, from its batch `skip` on."""
    return torch.cat([images for images, _ in SINGLE.epoch_batches(loader, number,
                                                                   {"batch": skip})])


def test_evaluation_is_the_centre_of_the_image_resized_as_imagenet_is_evaluated(folder):
    """Every validation image, resized to 32 * 256 // 224 = 36 pixels on its shorter side, its
    centre 32 x 32: each evaluation pass the same pixels."""
    _, test_loader = loaders("--dataset", "imagefolder", "--data_dir", folder, "--image_size", 32)
    images = torch.cat([batch for batch, _ in test_loader])
    assert images.shape == (15, 3, 32, 32)
    assert torch.equal(images, torch.cat([batch for batch, _ in test_loader]))
    val = test_loader.dataset.dataset
    expected = [np.asarray(T.CenterCrop(32)(T.Resize(36)(val[i][0]))) for i in range(15)]
    assert torch.equal(pixels(images).round().permute(0, 2, 3, 1).to(torch.uint8),
                       torch.from_numpy(np.stack(expected)))


@pytest.mark.parametrize("flip", ["--flip", "--no-flip"])
def test_a_small_folder_is_its_evaluation_crop_padded_and_cropped(folder, flip):
    """At 32 pixels each training image is its evaluation crop padded by 4 pixels and cut back to
    32 at an offset drawn for it, mirrored only with --flip; in two epochs the offsets move."""
    train_loader, test_loader = loaders("--dataset", "imagefolder", "--data_dir", folder,
                                        "--image_size", 32, "--batch_size", 8, flip)
    evaluated = test_loader.dataset.transform
    offsets, mirrored = set(), 0
    for number in (0, 1):
        SINGLE.epoch_batches(train_loader, number, {"batch": 0})  # the epoch's order, seeded
        order = list(train_loader.sampler)
        for image, index in zip(pixels(epoch(train_loader, number)).round(), order):
            centre = pixels(evaluated(train_loader.dataset.dataset[index][0])[None])[0].round()
            found = crop_of(image, torch.nn.functional.pad(centre, (4, 4, 4, 4)))
            assert found, (number, index)
            offsets.add(found[:2])
            mirrored += found[2]
    assert len(offsets) > 10 and (mirrored > 0) == (flip == "--flip")


def crop_of(image: torch.Tensor, padded: torch.Tensor) -> tuple | None:
    """(top, left, mirrored) of the 32 x 32 window of `padded` that `image` is, if any."""
    for top in range(padded.shape[1] - 31):
        for left in range(padded.shape[2] - 31):
            window = padded[:, top:top + 32, left:left + 32]
            for mirrored in (False, True):
                if torch.equal(image, window.flip(-1) if mirrored else window):
                    return top, left, mirrored
    return None


def test_the_crops_are_drawn_alike_by_workers_and_from_a_resumed_batch(folder):
    """Random resized crops drawn from (seed, epoch, index): the same with a DataLoader worker,
    and from batch 2 on for a resumed epoch; another epoch, other crops."""
    def train_loader(workers: int):
        return loaders("--dataset", "imagefolder", "--data_dir", folder, "--image_size", 32,
                       "--batch_size", 8, "--augment", "resized", "--num_workers", workers)[0]

    alone = epoch(train_loader(0), 1)
    assert alone.shape == (24, 3, 32, 32)
    assert torch.equal(epoch(train_loader(1), 1), alone)
    assert torch.equal(epoch(train_loader(0), 1, skip=2), alone[16:])
    assert not torch.equal(epoch(train_loader(0), 2), alone)


def test_synthetic_at_64_pixels_is_cropped_at_32_then_resized_the_same_every_time():
    flags_64 = ["--dataset", "synthetic", "--synthetic_size", 48, "--image_size", 64,
                "--batch_size", 16, "--seed", 7]
    train_loader, test_loader = loaders(*flags_64)
    first = epoch(train_loader, 0)
    assert first.shape == (48, 3, 64, 64)
    assert torch.equal(epoch(loaders(*flags_64)[0], 0), first)
    assert not torch.equal(epoch(train_loader, 1), first)
    assert next(iter(test_loader))[0].shape == (9, 3, 64, 64)


# ------------------------------------------------------------------------- issue 44's small folder
@pytest.fixture(scope="module")
def small_folder(folder, tmp_path_factory):
    """The folder trained as its user would first try it, without --batch_size: two epochs at 32
    pixels, a window at every step, the weights saved: (run folder, finished run)."""
    log_dir = tmp_path_factory.mktemp("small_folder")
    done = in_process("single_gpu", "--dataset", "imagefolder", "--data_dir", folder,
                      "--image_size", 32, "--depth", 8, "--alpha", 12, "--epochs", 2,
                      "--log_interval", 1, "--warmup_steps", 1, "--num_workers", 0, "--log_dir",
                      log_dir, "--run_name", "run")
    assert done.returncode == 0, done.stderr
    return log_dir / "run", done


def test_the_default_batch_is_halved_until_an_epoch_has_four_steps(small_folder):
    run_dir, done = small_folder
    config = read_results(run_dir)["config"]
    assert (config["batch_size"], read_results(run_dir)["summary"]["step"]) == (4, 12)
    first = done.stdout.splitlines()[0]
    assert "batch 4" in first and "6 steps an epoch" in first, first


def test_the_rate_warms_up_over_a_third_of_a_short_run_in_steps(small_folder):
    """--lr_warmup_epochs 5 of a 6-step epoch would be 30 steps, more than the run: the warm-up
    takes a third of its 12 steps; train/lr is the rate each step trained with (0.1 per 128 images
    at a batch of 4), a tenth of it from the second epoch on."""
    run_dir, _ = small_folder
    base = 0.1 * 4 / 128
    factors = [0.25, 0.5, 0.75, 1, 1, 1] + [0.1] * 6
    assert dict(read_scalars(run_dir)["train/lr"]) == pytest.approx(
        {step: base * factor for step, factor in enumerate(factors, start=1)}, rel=1e-6)


def test_the_checkpoint_holds_the_batchnorm_statistics_of_its_own_weights(small_folder, folder):
    """The statistics the last evaluation used, as saved: those of the saved weights over the last
    epoch's training batches (PreciseBN), not the running averages of ten steps' weights."""
    run_dir, _ = small_folder
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    args = SINGLE.get_args(["--dataset", "imagefolder", "--data_dir", str(folder),
                            "--image_size", "32", "--depth", "8", "--alpha", "12",
                            "--num_workers", "0"])
    train_set, test_set, classes = SINGLE.get_datasets(args)
    SINGLE.data_defaults(args, len(train_set))
    train_loader, _ = SINGLE.get_loaders(args, train_set, test_set, CPU)
    model = SINGLE.PyramidNet(8, 12, "basic", classes)
    model.load_state_dict(state["model"])
    runkit.precise_batchnorm(model, SINGLE.epoch_batches(train_loader, 1, {"batch": 0}), CPU,
                             torch.contiguous_format)
    buffers = {name: value for name, value in model.state_dict().items() if "running_" in name}
    assert buffers and all(torch.allclose(value, state["model"][name], rtol=1e-5, atol=1e-6)
                           for name, value in buffers.items())


def test_a_resume_on_a_folder_that_changed_is_refused_naming_the_change(small_folder, folder,
                                                                        tmp_path):
    """The checkpoint resumed on a copy of its folder (ended: nothing to train), then on the copy
    with one more image: refused in one line that gives the record it was made with, and now."""
    run_dir, _ = small_folder
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    again = ["--dataset", "imagefolder", "--data_dir", copy, "--image_size", 32, "--depth", 8,
             "--alpha", 12, "--epochs", 2, "--num_workers", 0, "--log_dir", tmp_path,
             "--run_name", "again", "--resume", run_dir / "checkpoint.pt"]
    ended = in_process("single_gpu", *again)
    assert ended.returncode == 0 and "this run has ended" in ended.stdout, ended.stderr
    shutil.copy(copy / "train" / "ant" / "0.png", copy / "train" / "ant" / "new.png")
    refused = in_process("single_gpu", *again)
    assert refused.returncode == 2 and refused.stderr.count("error: ") == 1, refused.stderr
    assert (f"the images: {runkit.check_image_folder(folder)} (now 25 images in 3 classes, digest"
            in refused.stderr), refused.stderr
    assert not (tmp_path / "again").exists()


# --------------------------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    """Every mode trains once on the folder: dist_parallel (weights saved) and fsdp on two
    processes each, side by side, each evaluating every validation image at its end; single_gpu
    and data_parallel in this process; then single_gpu evaluates dist_parallel's weights."""
    from concurrent.futures import ThreadPoolExecutor

    log_dir = tmp_path_factory.mktemp("folder_runs")
    two = ["--nproc_per_node", "2"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        launched = {mode: pool.submit(run, script(mode), *flags(folder, log_dir, "--run_name",
                                                                 mode, *two, *more))
                    for mode, more in (("dist_parallel", ["--save_model"]), ("fsdp", []))}
        done = {mode: future.result() for mode, future in launched.items()}
    for mode in ("single_gpu", "data_parallel"):
        done[mode] = in_process(mode, *flags(folder, log_dir, "--run_name", mode))
    done["evaluated"] = in_process("single_gpu", *flags(
        folder, log_dir, "--run_name", "evaluated", "--evaluate",
        log_dir / "dist_parallel" / "model.pt"))
    return log_dir, done


@pytest.mark.parametrize("mode", ["single_gpu", "data_parallel", "dist_parallel", "fsdp"])
def test_every_mode_trains_on_the_folder(runs, mode):
    log_dir, done = runs
    assert done[mode].returncode == 0, done[mode].stdout + done[mode].stderr
    first = next(line for line in done[mode].stdout.splitlines() if line.startswith(f"{mode} "))
    assert ": PyramidNet-8 a=12 (30,103 parameters) at 32 px, imagefolder, pad crop," in first, (
        first)
    assert "batch 8" in first and "3 steps an epoch" in first, first
    results = read_results(log_dir / mode)
    assert (results["config"]["dataset"], results["config"]["image_size"]) == ("imagefolder", 32)
    summary = results["summary"]
    assert summary["step"] == 3 and summary["test_images"] == 15
    assert summary["test_acc"] * 15 == pytest.approx(round(summary["test_acc"] * 15))
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


def test_a_benchmark_of_a_folder_times_its_own_images(folder, tmp_path):
    """--benchmark on an image folder reads the folder (not synthetic data): its warm-up and timed
    steps, no evaluation."""
    done = in_process("single_gpu", *flags(folder, tmp_path, "--run_name", "benchmark",
                                           "--benchmark", "--benchmark_steps", 4))
    assert done.returncode == 0, done.stderr
    assert ", imagefolder, " in done.stdout.splitlines()[0]
    results = read_results(tmp_path / "benchmark")
    assert results["config"]["dataset"] == "imagefolder"
    assert (results["summary"]["step"], results["summary"]["timed_steps"]) == (5, 4)
    assert results["summary"]["tested_step"] is None
