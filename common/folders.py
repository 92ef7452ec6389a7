"""An image folder (--dataset imagefolder: DIR/train/<class>/* and DIR/val/<class>/*, as
torchvision's ImageFolder reads it): its layout, listed once per process without opening an image
(what Config's checks refuse before a run starts); every image checked readable before a run
starts (`check_images`); its splits read as ImageFolder reads them (`FolderSplit`); and its
evaluation images, resized and centre-cropped as ImageNet's (`evaluation_crop`); and what a
checkpoint records of it, so that a resume on a folder changed since is refused (`folder_record`,
`folder_change`). Listed as ImageFolder lists it (its classes, extensions and order, symbolic links
followed), except that each file is listed once however many links lead to it, a link back up the
tree is followed once, where ImageFolder walks it round until the path grows too long (a class of
12 images listed as 252), and a class is named in Unicode's composed form (NFC), the same class in
train/ and val/ whichever form each folder's name was written in."""
from __future__ import annotations

import functools
import hashlib
import os
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from common.errors import UsageError
from common.workers import UnreadableImage
from models.factory import torchvision

SPLITS = {"train": "training", "val": "validation"}  # the folders, and what each one holds


@dataclass(frozen=True)
class ImageFolderFacts:
    """What a run needs to know of an image folder before reading an image: its class folders
    (the same in train/ and val/, sorted as ImageFolder sorts them) and how many images each split
    has."""
    root: str
    classes: tuple[str, ...]
    images: dict  # split -> number of images
    samples: dict  # split -> ((path, class index), ...), in ImageFolder's order


@functools.cache
def image_folder(data_dir: str) -> ImageFolderFacts:
    """The facts of the image folder `data_dir`, listed once per process with torchvision's own
    find_classes and make_dataset (what ImageFolder lists); a folder ImageFolder could not read, or
    that would train on other classes than it evaluates, is refused in one line that names the path
    and says what to do: data_dir, train/ or val/ missing, a split without class folders, a class
    folder that is a link leading nowhere, two class folders of one name in two Unicode forms, a
    class folder without images, class folders that differ between train/ and val/, fewer than two
    classes, one file listed in two classes. No image is opened (check_images does that)."""
    extensions = torchvision().datasets.folder.IMG_EXTENSIONS  # ImageFolder's

    root = Path(data_dir)
    layout = f"{root}/train/<class>/* and {root}/val/<class>/*"
    if not root.is_dir():
        raise UsageError(f"--dataset imagefolder: {root} is not a folder: give --data_dir the "
                         f"folder that holds train/ and val/, one folder of images per class in "
                         f"each ({layout})")
    classes, images, listed = {}, {}, {}
    for split, holds in SPLITS.items():
        folder = root / split
        if not folder.is_dir():
            state = "not a folder" if folder.exists() else "missing"
            raise UsageError(f"--dataset imagefolder: {folder} is {state}: put the {holds} images "
                             f"in {folder}/<class>/, one folder per class ({layout})")
        folders = class_folders(folder)
        if not folders:
            raise UsageError(f"--dataset imagefolder: {folder} has no class folders: put each "
                             f"class's {holds} images in {folder}/<class>/")
        names = sorted(folders)
        samples = list_images(folder, [folders[name] for name in names], extensions)
        counts = np.bincount([target for _, target in samples], minlength=len(names))
        empty = [folders[name] for name, count in zip(names, counts) if count == 0]
        if empty:
            more = ""
            if len(empty) > 1:
                more = f" (and {len(empty) - 1} more class folders without images)"
            raise UsageError(f"--dataset imagefolder: {folder / empty[0]} has no images{more}: put "
                             f"its {holds} images there ({', '.join(extensions)}), or remove "
                             f"the folder")
        classes[split], images[split], listed[split] = names, len(samples), tuple(samples)
        if len(names) < 2:
            raise UsageError(f"--dataset imagefolder: {folder} has one class folder, {names[0]}: "
                             "a classifier needs two classes or more: put each other class's "
                             f"{holds} images in a folder of its own beside it")
    if classes["train"] != classes["val"]:
        only = {split: sorted(set(classes[split]) - set(classes[other]))
                for split, other in (("train", "val"), ("val", "train"))}
        said = "; ".join(f"only {root / split} has {', '.join(names[:5])}"
                         f"{' ...' * (len(names) > 5)}" for split, names in only.items() if names)
        raise UsageError(f"--dataset imagefolder: train/ and val/ have different class folders "
                         f"({said}): give both the same classes")
    return ImageFolderFacts(str(root), tuple(classes["train"]), images, listed)


def class_folders(folder: Path) -> dict[str, str]:
    """{class name: its folder's name} of the split `folder`: each folder in it (a link to one
    followed), named in Unicode's composed form (NFC), so that a name typed on one system and
    copied from another (macOS writes the decomposed form, NFD) is one class in train/ and val/. Two
    folders of one name in two forms, and a link that leads nowhere, are refused in one line."""
    try:
        entries = list(os.scandir(folder))
    except OSError as error:
        raise UsageError(f"--dataset imagefolder: {folder} cannot be read ({error.strerror}): "
                         f"give a folder this user can read") from None
    folders = {}
    for entry in sorted(entries, key=lambda entry: entry.name):
        if entry.is_symlink() and not os.path.exists(entry.path):
            target = os.path.join(folder, os.readlink(entry.path))
            raise UsageError(f"--dataset imagefolder: {entry.path} is a link to "
                             f"{os.path.normpath(target)}, which does not exist: point it at the "
                             "class's folder, or remove the link")
        if not entry.is_dir():
            continue
        name = unicodedata.normalize("NFC", entry.name)
        if name in folders:
            raise UsageError(f"--dataset imagefolder: {folder / folders[name]} and {entry.path} "
                             f"are one class name, {name}, in two Unicode forms (composed and "
                             "decomposed): move the images into one of them and remove the other")
        folders[name] = entry.name
    return folders


def list_images(folder: Path, classes: list[str],
                extensions: tuple[str, ...]) -> list[tuple[str, int]]:
    """(path, class index) of every file with one of `extensions` under folder/<class>/ for each of
    `classes` (sorted), in the order of torchvision's make_dataset: by class, then by folder, then
    by name; symbolic links followed as it follows them, but each folder entered once (a link to a
    folder already listed, a loop, is not followed again) and each file listed once, however many
    links (symbolic or hard) lead to it. A file listed in two classes is refused in one line: its
    class would depend on which link came first."""
    samples, seen_folders, seen_files = [], set(), {}
    for index, name in enumerate(classes):
        walked = []
        for top, folders, files in os.walk(folder / name, followlinks=True):
            folders.sort()  # entered in the order they are listed: the first link wins
            real = os.path.realpath(top)
            if real in seen_folders:
                folders.clear()
                continue
            seen_folders.add(real)
            walked.append((top, sorted(files)))
        for top, files in sorted(walked):
            for file in files:
                path = os.path.join(top, file)
                if not file.lower().endswith(extensions):
                    continue
                try:
                    status = os.stat(path)
                    key = (status.st_dev, status.st_ino)
                except OSError:  # a link that leads nowhere: check_images names it
                    key = path
                first = seen_files.setdefault(key, (path, index))
                if first[1] != index:
                    raise UsageError(f"--dataset imagefolder: {path} and {first[0]} are one file "
                                     f"(linked) in two classes, {name} and {classes[first[1]]}: "
                                     "remove it from one of them")
                if first[0] == path:
                    samples.append((path, index))
    return samples


@functools.cache
def folder_record(data_dir: str) -> dict:
    """What a checkpoint records of the image folder its run trains on, so that resuming on a
    folder that has changed since is refused (`folder_change`): its classes in order and, for each
    split, each class's images: how many, and a digest of their paths inside the split and their
    sizes in bytes (not their times or inodes, which a copy of the folder to another disk changes).
    Listed once per process, as `image_folder`."""
    facts = image_folder(data_dir)
    record = {"classes": list(facts.classes)}
    for split in SPLITS:
        digests = [hashlib.sha256() for _ in facts.classes]
        counts = [0] * len(facts.classes)
        for path, target in facts.samples[split]:
            inside = unicodedata.normalize("NFC", os.path.relpath(path, Path(data_dir, split)))
            digests[target].update(f"{inside}\0{_size(path)}\0".encode())
            counts[target] += 1
        record[split] = [[count, digest.hexdigest()] for count, digest in zip(counts, digests)]
    return record


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # a link that leads nowhere: check_images names it
        return -1


def folder_change(saved: dict | None, data_dir: str) -> str | None:
    """What differs between the image folder a checkpoint recorded (`saved`, a `folder_record`;
    None: a checkpoint of other data, or written before checkpoints recorded it) and `data_dir`
    now, in words for a one-line refusal; None if nothing does."""
    if not isinstance(saved, dict):
        return None
    now = folder_record(data_dir)
    if saved.get("classes") != now["classes"]:
        then = saved.get("classes") or []
        return (f"its classes were {', '.join(map(str, then))} and are "
                f"{', '.join(now['classes'])} now (a class added, removed or renamed changes "
                "every label after it)")
    for split in SPLITS:
        before = saved.get(split) or []
        for name, was, is_ in zip(now["classes"], before, now[split]):
            if was == is_:
                continue
            where = Path(data_dir, split, name)
            if was[0] != is_[0]:
                return f"{where} held {was[0]} images and holds {is_[0]} now"
            return (f"{where} holds {is_[0]} images as before, but other files (moved from "
                    "another class, renamed or replaced)")
    return None


def image_folder_refusal(data_dir: str) -> str | None:
    """Why `data_dir` is no image folder a run can read, in one line (None: it is one); for
    Config's checks."""
    try:
        image_folder(data_dir)
    except UsageError as error:
        return str(error)
    return None


# ---- its images: checked before a run, read by both loaders ----

CHECK_THREADS = 16  # files read at once by check_images: the reads wait on the disk, not on a core
TAIL = 4096  # bytes at the end of a PNG or JPEG where its end marker must be


def unreadable(path: str) -> str | None:
    """Why the image file `path` cannot be read (None: it can), found to its end: PIL identifies it
    from its first bytes; a PNG or JPEG, compressed, must end with its end marker (IEND, FFD9),
    which a file cut short lacks, and one that does not is decoded in full, and refused only if PIL
    cannot decode it (a JPEG with data after its end, as some phones write, is read). Every other
    format the loader reads (BMP, PPM, PGM, TIFF, WebP) has no end marker, and is decoded in full:
    for the uncompressed ones, a copy of their bytes."""
    from PIL import Image

    try:
        with Image.open(path) as image:  # reads the header only
            kind = image.format
        with open(path, "rb") as file:
            file.seek(max(0, os.path.getsize(path) - TAIL))
            tail = file.read()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return _reason(error, path)
    marker = {"PNG": b"IEND", "JPEG": b"\xff\xd9"}.get(kind)
    if marker is not None and marker in tail:
        return None
    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return _reason(error, path)
    return None


def _reason(error: Exception, path: str) -> str:
    """PIL's words for why `path` could not be read, without the path (the line names it once)."""
    text = " ".join(str(error).replace(repr(path), "").replace(path, "").split()).strip(" :")
    return text[:160] or type(error).__name__


def check_images(paths: list[str]) -> None:
    """Refuse the first of `paths` (in order) that cannot be read as an image, in one line, before
    anything is written: a file cut short, empty, or not an image. `unreadable` reads two small
    pieces of each PNG or JPEG and decodes the other formats, a few files at a time (they wait on
    the disk, or decode in PIL, which lets go of the GIL)."""
    # a task per 1024 files, not one per file
    parts = [paths[i:i + 1024] for i in range(0, len(paths), 1024)]
    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        checked = pool.map(lambda part: [unreadable(path) for path in part], parts)
        for part, reasons in zip(parts, checked):
            bad = next(((path, why) for path, why in zip(part, reasons) if why), None)
            if bad:
                raise UsageError(f"--dataset imagefolder: {bad[0]} cannot be read as an image "
                                 f"({bad[1]}): replace it with a readable image, or delete it")


def stored_side(size: int) -> int:
    """The side at which the gpu loader stores an image folder's training images: the evaluation's
    resize (image_size * 256 // 224, 256 for 224), where the random resized crops are drawn."""
    return size * 256 // 224


def evaluation_crop(image, size: int):
    """An image folder's evaluation image: the PIL image resized (its shorter side to image_size *
    256 // 224, bilinear with antialiasing) and centre-cropped to size x size."""
    from torchvision.transforms import functional

    return functional.center_crop(functional.resize(image, stored_side(size)), [size, size])


class FolderSplit(Dataset):
    """One split of an image folder (train/ or val/), its images as `image_folder` listed them
    (ImageFolder's classes and order, each file once) and read as torchvision's ImageFolder reads
    them (its default_loader: PIL, converted to RGB): [i] is (PIL RGB image, class index);
    .samples, .targets and .classes as ImageFolder's, .info the run's DatasetInfo."""

    def __init__(self, folder: Path, info):
        facts = image_folder(str(folder.parent))
        self.info, self.samples = info, list(facts.samples[folder.name])
        self.targets, self.classes = [target for _, target in self.samples], list(facts.classes)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        from PIL import Image
        from torchvision.datasets.folder import default_loader

        path, target = self.samples[index]
        try:
            return default_loader(path), target
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            raise UnreadableImage(f"{path} cannot be read as an image ({_reason(error, path)}): "
                                  "replace it with a readable image") from None
