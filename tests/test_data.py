"""The data path of the train files: CIFAR-10 read by torchvision from a fixture in the real
python format (and from its archive put in the folder, offline), what its reader says when the
files are missing or damaged, the training order (the single process's equals DistributedSampler's
with one replica, so one-process runs of every mode see the same batches), and each training image
a pad-4 crop of its own, mirrored or not, drawn alike whatever the workers."""
from __future__ import annotations

import hashlib
import pickle
import tarfile

import numpy as np
import pytest
import torch
import torchvision.datasets
import torchvision.datasets.cifar
from torch.utils.data import DistributedSampler, TensorDataset

from processes import TINY, in_process, train_file

SINGLE = train_file("single_gpu")
CPU = torch.device("cpu")
_, _, MEAN, STD = SINGLE.IMAGES["cifar10"]


def unnormalise(images: torch.Tensor) -> np.ndarray:
    """Loader output (N, 3, H, W) back to (N, H, W, 3) pixel values."""
    pixels = images * torch.tensor(STD).view(1, 3, 1, 1) * 255 + torch.tensor(MEAN).view(
        1, 3, 1, 1) * 255
    assert (pixels - pixels.round()).abs().max() < 1e-2
    return pixels.round().to(torch.int64).permute(0, 2, 3, 1).numpy()


def prepared(*argv):
    """(args, train set, test set) as main() makes them, and the loaders."""
    args = SINGLE.get_args([str(arg) for arg in argv])
    train_set, test_set, _ = SINGLE.get_datasets(args)
    SINGLE.data_defaults(args, len(train_set))
    return args, train_set, test_set, SINGLE.get_loaders(args, train_set, test_set, CPU)


# ----------------------------------------------------------------------------------- CIFAR-10 files
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck"]


def write_cifar10(root, per_batch: int = 4, test_size: int = 6, seed: int = 0) -> dict:
    """cifar-10-batches-py/ as in cifar-10-python.tar.gz: pickled dicts with data uint8 (n, 3072)
    (the 1024 red, then green, then blue values of a row-major 32x32 image), labels, batch_label,
    filenames; batches.meta with label_names. The originals were pickled by Python 2, whose str keys
    torchvision's reader (pickle.load with encoding="latin1") sees as str: "data", "labels". Returns
    the arrays written and every file's md5."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {}

    def batch(name, n, label):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        entry = {"batch_label": label, "labels": labels, "data": data,
                 "filenames": [f"{name}_{i}.png" for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        written[name] = (data, labels)

    for k in range(1, 6):
        batch(f"data_batch_{k}", per_batch, f"training batch {k} of 5")
    batch("test_batch", test_size, "testing batch 1 of 1")
    meta = {"num_cases_per_batch": per_batch, "label_names": LABEL_NAMES, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    written["md5"] = {path.name: md5(path) for path in folder.iterdir()}
    return written


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def use_checksums(monkeypatch, checksums: dict) -> None:
    """torchvision checks every file against the real CIFAR-10's md5s: give it the fixture's
    instead, so the integrity check still runs."""
    cifar = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cifar, "train_list",
                        [[f"data_batch_{k}", checksums[f"data_batch_{k}"]] for k in range(1, 6)])
    monkeypatch.setattr(cifar, "test_list", [["test_batch", checksums["test_batch"]]])
    monkeypatch.setattr(cifar, "meta", {"filename": "batches.meta", "key": "label_names",
                                        "md5": checksums["batches.meta"]})


def test_cifar10_is_read_from_its_python_batches(tmp_path, monkeypatch, offline):
    written = write_cifar10(tmp_path)
    use_checksums(monkeypatch, written["md5"])

    def no_download(*args, **kwargs):
        raise AssertionError("CIFAR-10 is present and intact: nothing may be downloaded")

    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", no_download)
    args, train, test, (_, test_loader) = prepared("--dataset", "cifar10", "--data_dir", tmp_path,
                                                   "--batch_size", 4, "-j", 0)
    assert len(train) == 20 and len(test) == 6
    assert train.data.shape == (20, 32, 32, 3) and train.data.dtype == np.uint8
    assert train.classes == LABEL_NAMES and (args.image_size, args.augment) == (32, "pad")
    train_rows = np.concatenate([written[f"data_batch_{k}"][0] for k in range(1, 6)])
    train_labels = sum((written[f"data_batch_{k}"][1] for k in range(1, 6)), [])
    assert train.targets == train_labels and test.targets == written["test_batch"][1]
    for dataset, rows in ((train, train_rows), (test, written["test_batch"][0])):
        for i in (0, 5, len(rows) - 1):
            chw = rows[i].reshape(3, 32, 32)
            assert np.array_equal(dataset.data[i], chw.transpose(1, 2, 0))
            # green of row 2, column 7
            assert dataset.data[i][2, 7, 1] == rows[i][1024 + 2 * 32 + 7]
    # the test loader gives them as they are, normalised with CIFAR-10's statistics
    images = torch.cat([batch for batch, _ in test_loader])
    labels = torch.cat([batch for _, batch in test_loader])
    assert np.array_equal(unnormalise(images), test.data.astype(np.int64))
    assert labels.tolist() == written["test_batch"][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-batches-py"]


def test_cifar10_archive_put_in_the_folder_is_extracted_offline(tmp_path, monkeypatch, offline):
    """What a user without a network does: put cifar-10-python.tar.gz into the data folder."""
    source = tmp_path / "source"
    written = write_cifar10(source)
    use_checksums(monkeypatch, written["md5"])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = data_dir / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", md5(archive))
    _, train, test, _ = prepared("--dataset", "cifar10", "--data_dir", data_dir, "-b", 4)
    assert len(train) == 20 and len(test) == 6
    assert train.targets[:4] == written["data_batch_1"][1]
    assert (data_dir / "cifar-10-batches-py" / "test_batch").is_file()


@pytest.mark.parametrize("case", ["missing", "cut short", "checksum wrong"])
def test_cifar10_missing_or_damaged_offline_is_one_line_saying_what_to_do(tmp_path, monkeypatch,
                                                                         offline, case):
    """No CIFAR-10 and no network, a file cut short (its md5 passes), a file whose md5 fails
    (torchvision downloads again, which fails offline): one line naming the folder, the archive
    to put there, or --dataset synthetic; exit status 2, no run folder."""
    if case != "missing":
        written = write_cifar10(tmp_path)
        path = tmp_path / "cifar-10-batches-py" / "data_batch_1"
        path.write_bytes(path.read_bytes()[:100])
        use_checksums(monkeypatch, {**written["md5"], **(
            {"data_batch_1": md5(path)} if case == "cut short" else {})})
    done = in_process("single_gpu", *TINY, "--dataset", "cifar10", "--data_dir", tmp_path,
                      "--log_dir", tmp_path / "runs")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr and str(tmp_path) in errors[0]
    assert "cifar-10-python.tar.gz" in errors[0] and "--dataset synthetic" in errors[0]
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------- order and crops
@pytest.mark.parametrize("size", [1, 10, 37])
@pytest.mark.parametrize("seed", [0, 7])
def test_one_process_trains_in_distributed_samplers_order_with_one_replica(size, seed):
    """Each epoch's order depends only on --seed and the epoch: single_gpu's (and data_parallel's)
    is DistributedSampler's with one replica, dist_parallel's with one process."""
    dataset = TensorDataset(torch.zeros(size, 3, 32, 32, dtype=torch.uint8),
                            torch.zeros(size, dtype=torch.long))
    args = SINGLE.get_args([*TINY, "--seed", str(seed), "--batch_size", "1"])
    SINGLE.data_defaults(args, size)
    loader, _ = SINGLE.get_loaders(args, dataset, dataset, CPU)
    reference = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
    orders = []
    for epoch in (0, 1, 2):
        SINGLE.epoch_batches(loader, epoch, {"batch": 0})
        reference.set_epoch(epoch)
        orders.append(list(loader.sampler))
        assert orders[-1] == list(reference), epoch
    assert size < 3 or orders[0] != orders[1]


def test_no_shuffle_is_the_sets_order_every_epoch():
    args = SINGLE.get_args([*TINY, "--no_shuffle", "--batch_size", "4"])
    _, train_set, _, (loader, _) = prepared(*[*TINY, "--synthetic_size", "16", "--no_shuffle",
                                             "--batch_size", "4"])
    labels = [torch.cat([batch for _, batch in SINGLE.epoch_batches(loader, epoch, {"batch": 0})])
              for epoch in (0, 1)]
    assert args.shuffle is False
    assert labels[0].tolist() == labels[1].tolist() == train_set.tensors[1].tolist()


def pad_crop(image: torch.Tensor, stored: torch.Tensor) -> tuple | None:
    """(top, left, mirrored) of the window of `stored` padded by 4 that `image` is, if any."""
    padded = torch.nn.functional.pad(stored, (4, 4, 4, 4))
    for top in range(9):
        for left in range(9):
            window = padded[:, top:top + 32, left:left + 32]
            for mirrored in (False, True):
                if torch.equal(image, window.flip(-1) if mirrored else window):
                    return top, left, mirrored
    return None


@pytest.mark.parametrize("workers", [0, 2])
def test_each_training_image_is_a_pad4_crop_of_its_own_mirrored_or_not(workers):
    """The synthetic set's training images, as CIFAR-10's: each the stored image padded by 4 and
    cut back to 32 at an offset drawn for (seed, epoch, index), mirrored half the time; the same
    with DataLoader workers as without; the test images as stored."""
    flags = [*TINY, "--synthetic_size", "64", "--batch_size", "16", "-j", workers]
    _, train_set, test_set, (loader, test_loader) = prepared(*flags)
    SINGLE.epoch_batches(loader, 1, {"batch": 0})
    order = list(loader.sampler)
    images = unnormalise(torch.cat([batch for batch, _ in SINGLE.epoch_batches(
        loader, 1, {"batch": 0})]))
    found = [pad_crop(torch.from_numpy(image).permute(2, 0, 1), train_set.tensors[0][index].long())
             for image, index in zip(images, order)]
    assert None not in found
    assert len({crop[:2] for crop in found}) > 10 and 10 < sum(crop[2] for crop in found) < 54
    if workers:
        _, _, _, (alone, _) = prepared(*flags[:-1], 0)
        assert torch.equal(torch.cat([batch for batch, _ in SINGLE.epoch_batches(
            alone, 1, {"batch": 0})]), torch.cat([batch for batch, _ in SINGLE.epoch_batches(
                loader, 1, {"batch": 0})]))
    tested = unnormalise(torch.cat([batch for batch, _ in test_loader]))
    assert np.array_equal(tested, test_set.tensors[0].permute(0, 2, 3, 1).long().numpy())
