"""--dataset mnist: torchvision's MNIST reader on a fixture in the real IDX file format, both
loaders (1x28x28, MNIST's normalisation, never a horizontal flip), the model and FLOP count built
for it, a run of single_gpu and of two dist_parallel processes on it, and the one-line answer when
the files are missing or corrupt."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import struct

import numpy as np
import pytest
import torch
import torchvision.datasets
import torchvision.datasets.utils
from torch.utils.flop_counter import FlopCounterMode

from common.config import DATASETS, Config, UsageError, parse_config
from common.data import DATASET_INFO, load_datasets
from common.loaders import make_loader
from common.performance import flops_per_image
from common.samplers import EvalShard, ShuffleSampler
from conftest import TINY, at_epoch, read_results, run_script
from models import pyramidnet
from test_bad_input import assert_refused, no_network

CPU = torch.device("cpu")
MNIST = DATASET_INFO["mnist"]
FILES = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte"}
# TINY on the fixture: 64 training images, 4 steps of 16 an epoch; 16 test images
TINY_MNIST = [*TINY, "--dataset", "mnist", "--batch_size", "16", "--epochs", "2", "--no_progress"]


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
    """Loader output (N, 1, 28, 28) back to uint8-valued (N, 28, 28) integers,
    through MNIST's mean and std."""
    pixels = images[:, 0] * (MNIST.std[0] * 255) + MNIST.mean[0] * 255
    assert (pixels - pixels.round()).abs().max() < 1e-2
    return pixels.round().to(torch.int64).numpy()


# ---------------------------------------------------------------------------------------- the facts
def test_every_dataset_choice_has_its_facts():
    assert set(DATASET_INFO) == set(DATASETS)
    assert (MNIST.channels, MNIST.size, MNIST.classes, MNIST.mean, MNIST.std, MNIST.flip) == \
        (1, 28, 10, (0.1307,), (0.3081,), False)
    assert DATASET_INFO["synthetic"] == DATASET_INFO["cifar10"]  # synthetic stays CIFAR-shaped
    assert parse_config(Config, ["--dataset", "mnist"]).dataset == "mnist"


def test_model_and_flops_follow_the_dataset():
    model = pyramidnet(8, 12, "basic", num_classes=MNIST.classes, in_channels=MNIST.channels)
    # 28 -> 14 -> 7, then global average pooling
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    cifar = Config(depth=8, alpha=12)
    mnist = dataclasses.replace(cifar, dataset="mnist")
    forward = FlopCounterMode(display=False)
    with forward:
        model(torch.empty(1, 1, 28, 28))
    # backward ~ 2 forwards
    assert flops_per_image(mnist) == pytest.approx(3 * forward.get_total_flops(), rel=0.01)
    # fewer pixels, one channel
    assert flops_per_image(mnist) < flops_per_image(cifar) * (28 * 28) / (32 * 32)


# ------------------------------------------------------------------------------------------ reading
def test_mnist_is_read_from_its_idx_files(mnist_dir, monkeypatch, offline):
    data_dir, written = mnist_dir

    def no_download(*args, **kwargs):
        raise AssertionError("MNIST is present: nothing may be downloaded")

    monkeypatch.setattr(torchvision.datasets.mnist, "download_and_extract_archive", no_download)
    train, test = load_datasets("mnist", str(data_dir), 0, 0)
    assert (len(train), len(test)) == (64, 16) and train.info == test.info == MNIST
    assert np.array_equal(np.asarray(train.data), written["train"][0])
    assert np.asarray(test.targets).tolist() == written["t10k"][1].tolist()
    # evaluation batches: every test image once, normalised, unaugmented
    for kind in ("gpu", "torchvision"):
        loader = make_loader(kind, test, EvalShard(16), 16, CPU, train=False, augment=True,
                             num_workers=0, seed=0)
        images, labels = next(iter(loader))
        assert images.shape == (16, 1, 28, 28) and images.dtype == torch.float32
        assert np.array_equal(unnormalise(images), written["t10k"][0])
        torch.testing.assert_close(images[:, 0],
                                   (torch.as_tensor(written["t10k"][0]) / 255 - 0.1307) / 0.3081)
        assert labels.tolist() == written["t10k"][1].tolist()
    assert sorted(p.name for p in (data_dir / "MNIST" / "raw").iterdir()) == sorted(FILES)


@pytest.mark.parametrize("kind", ["gpu", "torchvision"])
def test_augmentation_crops_but_never_mirrors_a_digit(mnist_dir, kind):
    """Every training image, over two epochs, is a pad-4 crop of its original and its ramps still
    brighten from left to right: with a flip half of them would darken."""
    data_dir, written = mnist_dir
    train, _ = load_datasets("mnist", str(data_dir), 0, 0)
    sampler = ShuffleSampler(64, shuffle=True, seed=0)
    loader = make_loader(kind, train, sampler, 16, CPU, train=True, augment=True, num_workers=0,
                         seed=0)
    moved = 0
    for epoch in (0, 1):
        at_epoch(loader, epoch)
        sampler_order = list(sampler)
        pixels = np.concatenate([unnormalise(images) for images, _ in loader])
        assert pixels.shape == (64, 28, 28)
        for image, index in zip(pixels, sampler_order):
            original = np.pad(written["train"][0][index].astype(np.int64), 4)
            crops = [(top, left) for top in range(9) for left in range(9)
                     if np.array_equal(image, original[top:top + 28, left:left + 28])]
            assert crops, "not a pad-4 crop of its image (a mirrored one?)"
            moved += crops != [(4, 4)]
            for row in image:
                lit = row[row > 0]
                assert (np.diff(lit) > 0).all(), ("a ramp darkens from left to "
                                                  "right: the image was flipped")
    assert moved > 64  # the crops do move


def test_gzipped_files_put_in_raw_are_unpacked_offline(tmp_path, monkeypatch, offline):
    """The error message says: put train-images-idx3-ubyte.gz ... into <data_dir>/MNIST/raw/. That
    works without a network: torchvision finds each .gz with its md5 (the fixture's, here, instead
    of the real files') and unpacks it."""
    written = write_mnist(tmp_path, compress=True)
    resources = [(name, written["md5"][name]) for name, _ in torchvision.datasets.MNIST.resources]
    monkeypatch.setattr(torchvision.datasets.MNIST, "resources", resources)
    train, test = load_datasets("mnist", str(tmp_path), 0, 0)
    assert np.array_equal(np.asarray(test.data), written["t10k"][0]) and len(train) == 64
    assert FILES <= {p.name for p in (tmp_path / "MNIST" / "raw").iterdir()}


def assert_one_line(error: UsageError, *named: str) -> None:
    message = str(error)
    assert "\n" not in message
    for text in (*named, "train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                 "--dataset synthetic"):
        assert text in message, (text, message)


def test_missing_mnist_offline_is_a_usage_error(tmp_path, offline):
    with pytest.raises(UsageError) as error:
        load_datasets("mnist", str(tmp_path), 0, 0)
    assert_one_line(error.value, f"{tmp_path}/MNIST/raw/", "could not be read", "name resolution")


@pytest.mark.parametrize("keep", [0, 3, 100, 0.5])
def test_truncated_mnist_file_is_a_usage_error(tmp_path, offline, keep):
    write_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    raw = path.read_bytes()
    path.write_bytes(raw[:int(keep * len(raw)) if isinstance(keep, float) else keep])
    with pytest.raises(UsageError) as error:
        load_datasets("mnist", str(tmp_path), 0, 0)
    assert_one_line(error.value, "corrupt or incomplete", "delete that folder",
                    str(tmp_path / "MNIST" / "raw"))


def test_labels_that_do_not_match_the_images_are_a_usage_error(tmp_path, offline):
    written = write_mnist(tmp_path)
    labels = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(idx(written["t10k"][1][:10]))
    with pytest.raises(UsageError) as error:
        load_datasets("mnist", str(tmp_path), 0, 0)
    assert_one_line(error.value, "corrupt or incomplete", "10 labels for (16, 28, 28) images")


# --------------------------------------------------------------------------------------------- runs
def test_two_dist_parallel_processes_train_on_mnist_and_single_gpu_evaluates_it(mnist_dir,
                                                                                 tmp_path):
    """One run per mode family: dist_parallel on 2 processes with the torchvision loader trains a
    one-channel model on the fixture's MNIST; single_gpu --evaluate builds the same model from
    --dataset and reads those weights."""
    data_dir, _ = mnist_dir
    done = run_script("dist_parallel/train.py", *TINY_MNIST, "--nproc_per_node", "2", "--loader",
                      "torchvision", "--data_dir", data_dir, "--log_dir", tmp_path, "--run_name",
                      "ddp", "--save_model", env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    # the test set is the fixture's 16 images, 8 on each rank, summed
    assert "(16 images)" in done.stdout
    results = read_results(tmp_path / "ddp")
    summary = results["summary"]
    assert results["world_size"] == 2 and summary["params_in_sync"] is True
    assert (summary["steps"] == 8
            and summary["test_acc"] * 16 == pytest.approx(round(summary["test_acc"] * 16)))
    assert summary["flops_per_image"] == flops_per_image(parse_config(Config, TINY_MNIST))
    state = torch.load(tmp_path / "ddp" / "model.pt", weights_only=True)
    assert state["conv1.weight"].shape[1] == 1  # a one-channel model
    evaluated = run_script("single_gpu/train.py", *TINY_MNIST, "--data_dir", data_dir, "--log_dir",
                           tmp_path, "--run_name", "evaluated", "--evaluate",
                           tmp_path / "ddp" / "model.pt")
    assert evaluated.returncode == 0, evaluated.stderr
    assert read_results(tmp_path / "evaluated")["summary"]["test_acc"] == summary["test_acc"]


def test_missing_mnist_is_one_line_and_no_traceback(tmp_path):
    missing = tmp_path / "no" / "data"
    done = run_script("single_gpu/train.py", *TINY_MNIST, "--data_dir", missing, "--log_dir",
                      tmp_path / "runs", env=no_network())
    assert_refused(done, "MNIST could not be read", f"{missing}/MNIST/raw/",
                   "train-images-idx3-ubyte.gz", "--dataset synthetic")
    assert not (tmp_path / "runs").exists()  # refused before anything was written
