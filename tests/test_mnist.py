"""--dataset mnist: torchvision's MNIST reader on a fixture in the real IDX file format, the train
files' loaders (1x28x28, MNIST's normalisation, never a horizontal flip), the model and FLOP count
built for it, a run of two dist_parallel processes on it evaluated by single_gpu, and what the
reader says when the files are missing or corrupt."""
from __future__ import annotations

import gzip
import hashlib
import struct

import numpy as np
import pytest
import torch
import torchvision.datasets
import torchvision.datasets.mnist
from torch.utils.flop_counter import FlopCounterMode

import runkit
from conftest import read_results
from processes import TINY, in_process, run, script, train_file

SINGLE = train_file("single_gpu")
CPU = torch.device("cpu")
FILES = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte"}
# TINY on the fixture: 64 training images, 4 steps of 16 an epoch; 16 test images
TINY_MNIST = [*TINY, "--dataset", "mnist", "--batch_size", "16", "--epochs", "2"]


# -------------------------------------------------------------------------------------- the fixture
def idx(array: np.ndarray) -> bytes:
    """The IDX format of yann.lecun.com/exdb/mnist: magic 0x0000 0x08 (unsigned byte) <ndim>, then
    every dimension as a big-endian int32, then the bytes, row-major."""
    return (struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
            + array.tobytes())


def digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n 28x28 images, classes told apart by place, and asymmetric: class c lights rows 2c+4
    and 2c+5 with a ramp that brightens from left to right (so a mirrored image is told
    apart), at a random brightness."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 10
    rng.shuffle(labels)
    ramp = 10.0 + 8.0 * np.arange(28)  # 10 .. 226, strictly increasing
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    for image, label, brightness in zip(images, labels, rng.uniform(0.6, 1.0, n)):
        image[2 * label + 4: 2 * label + 6] = np.round(brightness * ramp)
    return images, labels.astype(np.uint8)


def write_mnist(data_dir, train: int = 64, test: int = 16, compress: bool = False) -> dict:
    """<data_dir>/MNIST/raw/ as torchvision reads it: the four IDX files uncompressed (what
    MNIST._check_exists looks for), or gzipped as downloaded (train-images-idx3-ubyte.gz ...),
    which torchvision checks against the real files' md5 and unpacks. Returns the arrays written,
    and the md5 of each file written."""
    raw = data_dir / "MNIST" / "raw"
    raw.mkdir(parents=True)
    written, md5s = {}, {}
    for split, n, seed in (("train", train, 1), ("t10k", test, 2)):
        images, labels = digits(n, seed)
        written[split] = images, labels
        for name, array in ((f"{split}-images-idx3-ubyte", images),
                            (f"{split}-labels-idx1-ubyte", labels)):
            data = gzip.compress(idx(array)) if compress else idx(array)
            path = raw / (name + ".gz" if compress else name)
            path.write_bytes(data)
            md5s[path.name] = hashlib.md5(data).hexdigest()
    written["md5"] = md5s
    return written


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("mnist")
    return data_dir, write_mnist(data_dir)


def unnormalise(images: torch.Tensor) -> np.ndarray:
    """Loader output (N, 1, 28, 28) back to (N, 28, 28) pixel values, through MNIST's mean and
    std."""
    _, _, (mean,), (std,) = SINGLE.IMAGES["mnist"]
    pixels = images[:, 0] * (std * 255) + mean * 255
    assert (pixels - pixels.round()).abs().max() < 1e-2
    return pixels.round().to(torch.int64).numpy()


def prepared(*argv):
    """(args, train set, test set, (train loader, test loader)) as main() makes them."""
    args = SINGLE.get_args([str(arg) for arg in argv])
    train_set, test_set, _ = SINGLE.get_datasets(args)
    SINGLE.data_defaults(args, len(train_set))
    return args, train_set, test_set, SINGLE.get_loaders(args, train_set, test_set, CPU)


# ---------------------------------------------------------------------------------------- the facts
def test_the_model_and_its_flops_follow_the_dataset():
    """One channel at 28 pixels: the model's stem takes one, its FLOPs are counted on it (backward
    about twice the forward), fewer than CIFAR-10's."""
    args = SINGLE.get_args([*TINY, "--dataset", "mnist"])
    SINGLE.data_defaults(args, 64)
    assert (args.image_size, args.augment, args.flip) == (28, "pad", False)
    _, raw_model, flops = SINGLE.get_model(args, 10, CPU)
    assert raw_model.conv1.in_channels == 1
    assert raw_model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with FlopCounterMode(display=False) as forward:
        raw_model.eval()(torch.empty(1, 1, 28, 28))
    assert flops == pytest.approx(3 * forward.get_total_flops(), rel=0.01)
    cifar = SINGLE.get_args(TINY)
    SINGLE.data_defaults(cifar, 64)
    assert flops < SINGLE.get_model(cifar, 10, CPU)[2] * (28 * 28) / (32 * 32)


# ------------------------------------------------------------------------------------------ reading
def test_mnist_is_read_from_its_idx_files(mnist_dir, monkeypatch, offline):
    data_dir, written = mnist_dir

    def no_download(*args, **kwargs):
        raise AssertionError("MNIST is present: nothing may be downloaded")

    monkeypatch.setattr(torchvision.datasets.mnist, "download_and_extract_archive", no_download)
    _, train, test, (_, test_loader) = prepared(*TINY_MNIST, "--data_dir", data_dir)
    assert (len(train), len(test)) == (64, 16)
    assert np.array_equal(np.asarray(train.data), written["train"][0])
    assert np.asarray(test.targets).tolist() == written["t10k"][1].tolist()
    # evaluation batches: every test image once, normalised, unaugmented
    images, labels = next(iter(test_loader))
    assert images.shape == (16, 1, 28, 28) and images.dtype == torch.float32
    assert np.array_equal(unnormalise(images), written["t10k"][0])
    torch.testing.assert_close(images[:, 0],
                               (torch.as_tensor(written["t10k"][0]) / 255 - 0.1307) / 0.3081)
    assert labels.tolist() == written["t10k"][1].tolist()
    assert sorted(p.name for p in (data_dir / "MNIST" / "raw").iterdir()) == sorted(FILES)


def test_augmentation_crops_but_never_mirrors_a_digit(mnist_dir):
    """Every training image, over two epochs, is a pad-3 crop (an eighth of 28) of its original
    and its ramps still brighten from left to right: with a flip half of them would darken."""
    data_dir, written = mnist_dir
    _, _, _, (loader, _) = prepared(*TINY_MNIST, "--data_dir", data_dir)
    moved = 0
    for epoch in (0, 1):
        SINGLE.epoch_batches(loader, epoch, {"batch": 0})
        order = list(loader.sampler)
        pixels = np.concatenate([unnormalise(images) for images, _ in SINGLE.epoch_batches(
            loader, epoch, {"batch": 0})])
        assert pixels.shape == (64, 28, 28)
        for image, index in zip(pixels, order):
            original = np.pad(written["train"][0][index].astype(np.int64), 3)
            crops = [(top, left) for top in range(7) for left in range(7)
                     if np.array_equal(image, original[top:top + 28, left:left + 28])]
            assert crops, "not a pad-3 crop of its image (a mirrored one?)"
            moved += crops != [(3, 3)]
            for row in image:
                lit = row[row > 0]
                assert (np.diff(lit) > 0).all(), "a ramp darkens from left to right: flipped"
    assert moved > 64  # the crops do move


def test_an_image_size_resizes_the_digits(mnist_dir):
    data_dir, _ = mnist_dir
    _, _, _, (loader, test_loader) = prepared(*TINY_MNIST, "--data_dir", data_dir,
                                              "--image_size", 48)
    assert next(iter(loader))[0].shape == (16, 1, 48, 48)
    assert next(iter(test_loader))[0].shape == (16, 1, 48, 48)


def test_gzipped_files_put_in_raw_are_unpacked_offline(tmp_path, monkeypatch, offline):
    """What a user without a network does: put train-images-idx3-ubyte.gz ... into
    <data_dir>/MNIST/raw/; torchvision finds each .gz with its md5 (the fixture's, here, instead of
    the real files') and unpacks it."""
    written = write_mnist(tmp_path, compress=True)
    resources = [(name, written["md5"][name]) for name, _ in torchvision.datasets.MNIST.resources]
    monkeypatch.setattr(torchvision.datasets.MNIST, "resources", resources)
    _, train, test, _ = prepared(*TINY_MNIST, "--data_dir", tmp_path)
    assert np.array_equal(np.asarray(test.data), written["t10k"][0]) and len(train) == 64
    assert FILES <= {p.name for p in (tmp_path / "MNIST" / "raw").iterdir()}


@pytest.mark.parametrize("case", ["missing", "cut short", "labels of other images"])
def test_missing_or_corrupt_mnist_is_one_line_saying_what_to_do(tmp_path, offline, case):
    """One line naming <data_dir>/MNIST/raw/ and the files to put there, or --dataset synthetic;
    exit status 2, nothing written."""
    if case != "missing":
        written = write_mnist(tmp_path)
        raw = tmp_path / "MNIST" / "raw"
        if case == "cut short":
            path = raw / "train-images-idx3-ubyte"
            path.write_bytes(path.read_bytes()[:100])
        else:
            (raw / "t10k-labels-idx1-ubyte").write_bytes(idx(written["t10k"][1][:10]))
    done = in_process("single_gpu", *TINY_MNIST, "--data_dir", tmp_path, "--log_dir",
                      tmp_path / "runs")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr
    assert f"{tmp_path}/MNIST/raw" in errors[0] and "--dataset synthetic" in errors[0]
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------- runs
def test_two_dist_parallel_processes_train_on_mnist_and_single_gpu_evaluates_it(mnist_dir,
                                                                                 tmp_path):
    """dist_parallel on 2 processes trains a one-channel model on the fixture's MNIST;
    single_gpu --evaluate builds the same model from --dataset and reads those weights."""
    data_dir, _ = mnist_dir
    done = run(script("dist_parallel"), *TINY_MNIST, "--nproc_per_node", "2", "--data_dir",
               data_dir, "--log_dir", tmp_path, "--run_name", "ddp", "--save_model")
    assert done.returncode == 0, done.stderr
    assert "(16 images)" in done.stdout  # the fixture's 16, 8 on each rank, summed
    results = read_results(tmp_path / "ddp")
    summary = results["summary"]
    assert results["world_size"] == 2 and results["params_in_sync"] is True
    assert (summary["step"] == 8
            and summary["test_acc"] * 16 == pytest.approx(round(summary["test_acc"] * 16)))
    model = SINGLE.PyramidNet(8, 12, "basic", 10, 1)
    assert summary["flops_per_image"] == runkit.flops_per_image(model, torch.zeros(2, 1, 28, 28))
    state = torch.load(tmp_path / "ddp" / "model.pt", weights_only=True)
    assert state["conv1.weight"].shape[1] == 1  # a one-channel model
    evaluated = in_process("single_gpu", *TINY_MNIST, "--data_dir", data_dir, "--log_dir",
                           tmp_path, "--run_name", "evaluated", "--evaluate",
                           tmp_path / "ddp" / "model.pt")
    assert evaluated.returncode == 0, evaluated.stderr
    assert read_results(tmp_path / "evaluated")["summary"]["test_acc"] == summary["test_acc"]
