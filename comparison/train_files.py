"""The train files as the comparison meets them: each mode's `<mode>/train.py`, imported from its
path only for its parser, `get_args(argv)`, which reads a run's command line exactly as the run
will read it. compare.py builds every run's argv and has the mode's own parser check it before any
run starts (`parse`); a refusal there is the run's own one line. Nothing else of a train file is
called here: the runs themselves are processes (comparison/runner.py), read back through their
files (results.json, the traces, the event files)."""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
from pathlib import Path
from types import ModuleType

from comparison.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
MODES = ("single_gpu", "data_parallel", "dist_parallel", "fsdp", "pipeline_parallel")
# a process group of one process per GPU, started under torchrun
GROUP_MODES = ("dist_parallel", "fsdp", "pipeline_parallel")
# the process-group modes that split the batch and keep the whole model's step on every rank
DATA_GROUP_MODES = ("dist_parallel", "fsdp")


def script(mode: str) -> Path:
    return REPO / mode / "train.py"


@functools.cache
def train_file(mode: str) -> ModuleType:
    """`<mode>/train.py` as a module of its own name (`<mode>_train`: the five files do not
    shadow one another), imported once. Importing it runs nothing but its imports and definitions
    (the files' rule: `main()` runs only under `__main__`)."""
    spec = importlib.util.spec_from_file_location(f"{mode}_train", script(mode))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(mode: str, argv: list[str]) -> argparse.Namespace:
    """`argv` as `<mode>/train.py` reads it (its get_args; no --batch_size: the one it takes,
    which compare.py then passes), or its refusal as a UsageError: the one line the run itself
    would print, without its "(see --help)"."""
    module = train_file(mode)
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
            args = module.get_args([str(arg) for arg in argv])
    except module.runkit.UsageError as refusal:
        raise UsageError(str(refusal).removesuffix(" (see --help)")) from None
    except SystemExit:  # --help, or a parser that exits on its own
        raise UsageError(f"{mode}/train.py refused {' '.join(map(str, argv))}: "
                         f"{quiet.getvalue().strip().splitlines()[-1:]}") from None
    args.batch_size = args.batch_size or default_batch(vars(args))
    return args


def default_batch(config: dict) -> int:
    """The global batch a train file takes when none is given (its data_defaults): 128, halved
    for a small image folder until an epoch has 4 steps."""
    from comparison.model_shapes import training_images

    batch, images = 128, config["dataset"] == "imagefolder" and training_images(config)
    while images and images < 4 * batch > 4:
        batch //= 2
    return batch


@functools.cache
def defaults(mode: str = "single_gpu") -> dict:
    """Every flag of `<mode>/train.py` with its default: what a run is given when compare.py passes
    nothing for it."""
    return vars(parse(mode, []))


def flag_name(token: str) -> str | None:
    """The flag a command-line token names, as typed, its leading dashes and any `=value` left
    out and its hyphens read as underscores ('--batch-size=64' -> 'batch_size', '-e' -> 'e');
    None for a value."""
    if not token.startswith("-") or token == "-" or token[1:2].isdigit() or token[1:2] == ".":
        return None
    return token.lstrip("-").split("=", 1)[0].replace("-", "_")


def without(argv: list[str], *names: str) -> list[str]:
    """`argv` less the flags `names` (as flag_name gives them) and their values: a flag written
    `--name=value` is one token, `--name value` two."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif flag_name(token) in names:
            skip = "=" not in token
        else:
            kept.append(token)
    return kept
