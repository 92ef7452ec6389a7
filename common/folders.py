"""An image folder's layout (DIR/train/<class>/* and DIR/val/<class>/*, as torchvision's
ImageFolder reads it), listed once per process without opening an image: what Config's checks
refuse before a run starts, and what common/data.py's loaders read. Listed as ImageFolder lists it
(its classes, extensions and order, symbolic links followed), except that each file is listed once
however many links lead to it, and a link back up the tree is followed once, where ImageFolder
walks it round until the path grows too long (a class of 12 images listed as 252)."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import UsageError
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
    folder without images, class folders that differ between train/ and val/, fewer than two
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
        try:
            names = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
        except OSError as error:
            raise UsageError(f"--dataset imagefolder: {folder} cannot be read ({error.strerror}): "
                             f"give a folder this user can read") from None
        if not names:
            raise UsageError(f"--dataset imagefolder: {folder} has no class folders: put each "
                             f"class's {holds} images in {folder}/<class>/")
        samples = list_images(folder, names, extensions)
        counts = np.bincount([target for _, target in samples], minlength=len(names))
        empty = [name for name, count in zip(names, counts) if count == 0]
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


def image_folder_refusal(data_dir: str) -> str | None:
    """Why `data_dir` is no image folder a run can read, in one line (None: it is one); for
    Config's checks."""
    try:
        image_folder(data_dir)
    except UsageError as error:
        return str(error)
    return None
