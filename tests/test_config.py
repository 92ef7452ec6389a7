"""common/config.py flags, common/optim.py schedule, common/devices.py,
common/metrics.py, common/logger.py."""
from __future__ import annotations

import dataclasses
import os
import random
import re
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import common.config
import common.domains
import common.logger
import common.metrics
from common.command_line import build_parser
from common.config import (AMPS, BASE_BATCH, REPO_ROOT, Config, UsageError, as_today, flag,
                           parse_config)
from common.domains import SYNTHETIC_BYTES_PER_IMAGE, check_domains, missing_domains
from common.errors import NAME_MAX, PATH_MAX, user_errors
from common.devices import cuda_devices, seed_everything
from common.workers import default_num_workers
from common.logger import MARKER, load_model_weights, resolve_run_dir
from common.metrics import StepTimer, Sums, TrainMeter, evaluation_sums, window_sums
from common.optim import build_optimizer, describe_lr, lr_factor, lr_schedule, warmup_steps
from dist_parallel.train import DistConfig
from fsdp.train import FsdpConfig
from models import pyramidnet
from models.pyramidnet import parameters_at_least

CPU = torch.device("cpu")



def parse(*argv: str) -> Config:
    return parse_config(Config, list(argv))


# ------------------------------------------------------------------------------------------- config

def test_defaults():
    cfg = parse()
    assert cfg == Config()
    assert (cfg.batch_size, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.nesterov) == \
        (128, 0.1, 0.9, 1e-4, True)
    assert (cfg.depth, cfg.alpha, cfg.block) == (110, 270.0, "basic")
    assert (cfg.epochs, cfg.max_steps, cfg.lr_warmup_epochs) == (300, 0, 5.0)
    assert (cfg.dataset, cfg.synthetic_size, cfg.loader, cfg.num_workers) == \
        ("cifar10", 50_000, None, None)
    assert (cfg.shuffle, cfg.augment, cfg.flip, cfg.progress) == (True, "auto", None, True)
    assert (cfg.save_model, cfg.overwrite, cfg.evaluate, cfg.run_name, cfg.gpu_devices) == \
        (False, False, None, None, None)
    assert (cfg.log_interval, cfg.warmup_steps, cfg.seed, cfg.deterministic) == (50, 10, 0, False)
    assert cfg.data_dir == str(REPO_ROOT / "data") and cfg.log_dir == str(REPO_ROOT / "runs")
    assert REPO_ROOT == __import__("pathlib").Path(__file__).resolve().parents[1]
    assert BASE_BATCH == 128 and cfg.effective_lr() == 0.1


@pytest.mark.parametrize("dataset, augment, crop, flip", [("imagefolder", True, "resized", True),
                                                      ("mnist", True, "pad", False),
                                                      ("cifar10", False, "off", False)])
def test_a_config_written_before_augment_was_a_choice_reads_as_what_it_ran(dataset, augment, crop,
                                                                           flip):
    """A checkpoint's or results.json's config from when --augment was on or off, without --flip:
    the crop it meant (an image folder's was the random resized crop) and the flip it had (none
    without augmentation)."""
    today = as_today({"dataset": dataset, "augment": augment})
    assert (today["augment"], today["flip"]) == (crop, flip)


def test_bool_flags():
    cfg = parse("--no_nesterov", "--no_shuffle", "--no_augment", "--no_progress", "--save_model",
                "--overwrite")
    assert (cfg.nesterov, cfg.shuffle, cfg.augment, cfg.progress, cfg.save_model,
            cfg.overwrite) == (False, False, "off", False, True, True)
    # --no_augment stands for --augment off; --flip and --no_flip set a choice the run makes
    assert (parse("--augment", "pad").augment, parse("--no_flip").flip,
            parse("--flip").flip) == ("pad", False, True)
    # one form per bool
    for wrong in ("--nesterov", "--shuffle", "--no_save_model", "--no_overwrite"):
        with pytest.raises(UsageError, match=r"unrecognized arguments"):
            parse(wrong)


def test_typed_values():
    cfg = parse("--gpu_devices", "0", "1", "--alpha", "48", "--depth", "20", "--lr", "0.05",
                "--batch_size", "512", "--loader", "torchvision", "--dataset", "synthetic",
                "--block", "bottleneck", "--run_name", "x", "--evaluate", "model.pt",
                "--lr_warmup_epochs", "2.5")
    assert cfg.gpu_devices == (0, 1) and isinstance(cfg.gpu_devices, tuple)
    assert cfg.alpha == 48.0 and isinstance(cfg.alpha, float)
    assert cfg.depth == 20 and isinstance(cfg.depth, int)
    assert (cfg.lr, cfg.batch_size, cfg.loader, cfg.dataset, cfg.block) == \
        (0.05, 512, "torchvision", "synthetic", "bottleneck")
    assert (cfg.run_name, cfg.evaluate, cfg.lr_warmup_epochs) == ("x", "model.pt", 2.5)
    assert cfg.effective_lr() == pytest.approx(0.2)
    assert parse("--gpu_devices", "3").gpu_devices == (3,)


@pytest.mark.parametrize("argv, pattern", [
    (["--dataset", "imagenet"], "--dataset"), (["--loader", "dali"], "--loader"),
    (["--block", "wide"], "--block"), (["--batch_size", "many"], "--batch_size"),
    (["--gpu_devices"], "--gpu_devices"), (["--bogus"], "--bogus"), (["extra"], "extra")])
def test_argparse_mistakes_are_one_line(argv, pattern):
    with pytest.raises(UsageError) as error:
        parse(*argv)
    message = str(error.value)
    assert "\n" not in message and message.endswith("(see --help)") and pattern in message


@pytest.mark.parametrize("argv, pattern", [
    (["--batch_size", "0"], "--batch_size"), (["--batch_size", "-3"], "--batch_size"),
    (["--epochs", "-1"], "--epochs"), (["--depth", "109"], "--depth"),
    (["--alpha", "0"], "--alpha"), (["--alpha", "-5"], "--alpha"),
    (["--depth", "110", "--block", "bottleneck", "--alpha", "0"], "--alpha"),
    (["--lr", "0"], "--lr"), (["--max_steps", "-1"], "--max_steps"),
    (["--synthetic_size", "4"], "--synthetic_size"), (["--num_workers", "-1"], "--num_workers"),
    (["--log_interval", "0"], "--log_interval"), (["--warmup_steps", "-1"], "--warmup_steps"),
    (["--lr_warmup_epochs", "-1"], "--lr_warmup_epochs"), (["--run_name", "a/b"], "--run_name"),
    (["--run_name", ".."], "--run_name"), (["--run_name", ""], "--run_name")])
def test_invalid_values_name_their_flag(argv, pattern):
    with pytest.raises(UsageError, match=re.escape(pattern)) as error:
        parse(*argv)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("argv, pattern", [
    (["--alpha", "inf"], "--alpha"),
    (["--lr_warmup_epochs", "inf", "--batch_size", "256"], "--lr_warmup_epochs")])
def test_infinite_values_are_usage_errors(argv, pattern):
    """inf passes `> 0` and `>= 0`; unchecked, it would die later in round() with a traceback
    (OverflowError) instead of the one-line usage error."""
    with pytest.raises(UsageError, match=re.escape(pattern)):
        cfg = parse(*argv)
        pyramidnet(cfg.depth, cfg.alpha, cfg.block)  # what a run does next
        describe_lr(cfg, 10)


def test_depth_error_names_the_valid_form():
    with pytest.raises(UsageError, match=r"6n\+2"):
        parse("--depth", "109")
    with pytest.raises(UsageError, match=r"9n\+2"):
        parse("--depth", "109", "--block", "bottleneck")
    assert parse("--depth", "164", "--block", "bottleneck").depth == 164
    assert parse("--epochs", "0").epochs == 0


def test_config_is_frozen_and_validated_directly():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0
    with pytest.raises(UsageError, match="--batch_size"):
        Config(batch_size=0)
    assert dataclasses.replace(cfg, batch_size=256).effective_lr() == pytest.approx(0.2)


def test_help_lists_every_field_with_its_default():
    text = build_parser(Config, "the description").format_help()
    assert "the description" in text
    for f in dataclasses.fields(Config):
        if f.type == "bool" or f.type is bool:
            assert (f"--no_{f.name}" if f.default else f"--{f.name}") in text
        else:
            assert f"--{f.name}" in text
    assert "(default: 128)" in text


def test_a_mode_subclass_adds_its_own_flags():
    @dataclass(frozen=True)
    class ModeConfig(Config):
        bucket_mb: int = flag(25, "gradient bucket size", at_least=1)
        sync_bn: bool = flag(False, "synchronised BatchNorm")

    cfg = parse_config(ModeConfig, ["--bucket_mb", "8", "--sync_bn", "--no_nesterov"])
    assert (cfg.bucket_mb, cfg.sync_bn, cfg.nesterov) == (8, True, False)
    assert parse_config(ModeConfig, []).bucket_mb == 25
    with pytest.raises(UsageError, match="--bucket_mb must be a whole number at least 1, not 0"):
        parse_config(ModeConfig, ["--bucket_mb", "0"])


def test_user_errors_turns_usage_error_into_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        with user_errors():
            raise UsageError("bad flag")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: bad flag\n"
    with pytest.raises(SystemExit) as exit_info:
        with user_errors():
            raise KeyboardInterrupt
    assert exit_info.value.code == 130
    with pytest.raises(ZeroDivisionError):  # a bug stays a traceback
        with user_errors():
            _ = 1 / 0


# ------------------------------------------------------------------------------------------ domains

def path_of(size: int) -> str:
    """An absolute path of exactly `size` bytes, in names of at most 200."""
    names, left = [], size
    while left > 0:
        names.append("x" * min(200, left - 1))
        left -= len(names[-1]) + 1
    return "/" + "/".join(names)


# the longest --log_dir: room below it for the run folder and a file
FOLDER_ROOM = PATH_MAX - 2 * (NAME_MAX + 1)
BIG = str(2**63)  # one past torch's largest integer
# --num_workers's edge on this machine: one training process, the default batch of 32-pixel images
MOST_WORKERS = common.domains.most_worker_processes(1, Config().batch_size * 3 * 32 * 32 * 4)[0]
# Every flag's domain at its edges: field -> (values accepted, values refused). A value is the
# flag's argument, a tuple of them (nargs), or, starting with "--", a whole command line (a bool's
# flag, or a value with the flags it needs). Refusals of a rule between fields name the flag too
# (momentum 0 with Nesterov, an lr that overflows).
DOMAINS = {
    # optimisation
    "batch_size": (["1"], ["0", "-3", BIG]),
    "epochs": (["0"], ["-1", BIG]),
    "max_steps": (["0", str(2**63 - 1)], ["-1", BIG]),
    "lr": (["1e-37", "--lr 3.4e38 --batch_size 128"],  # what float32 weights' updates hold
           ["0", "-0.1", "nan", "inf", "--lr=-inf", "--lr 1e308 --batch_size 256",
            "--lr 1e-322 --batch_size 1", "--lr 1e300 --batch_size 128",
            "--lr 3.4e38 --batch_size 256", "1e-38"]),
    "lr_warmup_epochs": (["0", "1e9"], ["-1", "nan", "inf", "1e10"]),
    # 0: with Nesterov
    "momentum": (["0.999", "--momentum 0 --no_nesterov"], ["0", "-0.1", "1", "nan", "inf"]),
    "weight_decay": (["0", "10", "3.4e38"], ["--weight_decay=-1e-4", "nan", "inf", "1e39"]),
    "nesterov": (["--no_nesterov"], []),
    # model
    "model": (["pyramidnet", "resnet18", "vit_b_16"],
              ["", "resnt18", "yolo", "fasterrcnn_resnet50_fpn"]),
    "depth": (["8", "--depth 11 --block bottleneck"],
              ["2", "-4", "109", BIG, "--depth 8 --block bottleneck"]),
    "alpha": (["1e-3"], ["0", "-5", "nan", "inf", "1e7"]),  # 1e7: petabytes of weights
    "block": (["bottleneck"], ["wide"]),
    "width_multiple": (["1", "64"], ["0", "-8", "1000000"]),
    # data
    "dataset": (["synthetic", "mnist"], ["imagenet"]),
    "data_dir": ([".", "relative/data", path_of(FOLDER_ROOM)],
                 ["", "/proc/data", "/sys/data", "a\0b", "/tmp/" + "x" * (NAME_MAX + 1),
                  path_of(FOLDER_ROOM + 1)]),
    "image_size": (["8", "224", "4096"], ["7", "0", "4097"]),
    "synthetic_size": (["5"], ["4", "0", "-1", str(10**13)]),  # 10**13: 246 PB while generated
    "loader": (["gpu", "torchvision"], ["dali"]),
    # the most this machine holds (4 a core, at the default batch), and a million: 100 TB at least
    "num_workers": (["0", str(MOST_WORKERS)], ["-1", BIG, str(MOST_WORKERS + 1), "1000000"]),
    "shuffle": (["--no_shuffle"], []),
    "augment": (["auto", "pad", "resized", "off", "--no_augment"], ["crop", "True"]),
    "flip": (["--flip", "--no_flip"], []),
    # speed
    "amp": (list(AMPS), ["fp8"]),
    "channels_last": (["--channels_last", "--no_channels_last"], []),
    "align_channels": (["0", "8", "256"], ["-1", "257", BIG]),
    "compile": (["--compile"], []),
    "compile_mode": (["--compile --compile_mode default", "--compile --compile_mode max-autotune"],
                     ["fast", "--compile_mode default"]),  # without --compile it would be ignored
    "compile_cache": (["--compile --compile_cache .", "--compile --compile_cache relative/cache"],
                      ["", "/proc/cache", "--compile_cache /tmp/cache"]),
    "cudnn_benchmark_limit": (["0", "10"], ["-1", str(10**6 + 1)]),
    "benchmark": (["--benchmark"], []),
    "benchmark_steps": (["1"], ["0", BIG]),
    # hardware and reproducibility
    "gpu_devices": ([("0", "1")], [("-1",), ("0", "-1")]),
    "seed": (["0", str(2**32 - 1)], ["-1", str(2**32)]),  # numpy's seeds
    "deterministic": (["--deterministic"], []),
    # logging and outputs
    "log_dir": ([".", "/tmp/runs", path_of(FOLDER_ROOM)],
                ["", "/proc/runs", "/proc", "/sys/kernel/runs", "a\0b",
                 "/tmp/" + "x" * (NAME_MAX + 1), path_of(FOLDER_ROOM + 1)]),
    "run_name": (["r", "x" * NAME_MAX, "\u00e9" * (NAME_MAX // 2)],  # é: 2 bytes
                 ["", ".", "..", "a/b", "a\0b", "x" * (NAME_MAX + 1),
                  "\u00e9" * (NAME_MAX // 2 + 1), "a\nb", "a\tb", "a\rb", "\x1b[31mred", "a\u2028b",
                  "a\\b"]),  # one line; no separator
    "overwrite": (["--overwrite"], []),
    "log_interval": (["1"], ["0"]),
    "warmup_steps": (["0"],
                     ["-1", f"--benchmark --warmup_steps {2**62} --benchmark_steps {2**62}"]),
    "profile_steps": (["0", "1"], ["-1"]),
    "memory_snapshot": (["0", "1"], ["-1"]),
    "save_model": (["--save_model"], []),
    "checkpoint_interval": (["0"], ["-1"]),
    "resume": (["--resume auto --run_name r", "checkpoint.pt", path_of(PATH_MAX)],
               ["", "a\0b", path_of(PATH_MAX + 1)]),
    "evaluate": (["model.pt", path_of(PATH_MAX)],
                 ["", "/tmp/" + "x" * (NAME_MAX + 1), path_of(PATH_MAX + 1)]),
    "progress": (["--no_progress"], []),
    # dist_parallel's own
    "backend": (["gloo", "nccl"], ["mpi"]),
    "init_method": (["env://", "tcp://10.0.0.1:29500", "tcp://[::1]:1", "file:///tmp/rendezvous"],
                    ["", "env", "tcp://host", "tcp://host:0", "tcp://host:65536", "tcp://:29500",
                     "file://relative/path", "http://host:80"]),
    "verify_sync": (["--verify_sync"], []),
    "nproc_per_node": (["1"], ["0", "-2"]),
    # 1e10 s: torch's ns clock overflows
    "dist_timeout": (["1e-3", "1e9"], ["0", "-5", "nan", "inf", "1e10"]),
    "max_restarts": (["0"], ["-1"]),
    "sync_bn": (["--sync_bn"], []),
    # 9e12 MiB: bytes past int64
    "bucket_cap_mb": (["1e-3", "8e12"], ["0", "-1", "nan", "inf", "9e12"]),
    "reshard_after_forward": (["--no_reshard_after_forward"], []),
}
CONFIG_CLASSES = (Config, DistConfig, FsdpConfig)


def classes_with(name: str) -> list[type]:
    """The config classes that have the flag: Config's are in all three, the process
    group's in both parallel ones."""
    return [kind for kind in CONFIG_CLASSES if name in {f.name for f in dataclasses.fields(kind)}]


def argv_for(name: str, value) -> list[str]:
    if isinstance(value, tuple):
        return [f"--{name}", *value]
    return value.split(" ") if value.startswith("--") else [f"--{name}", value]


def test_a_negative_number_argparse_takes_for_a_flag_is_explained():
    """argparse reads -1e-4 and -inf as flags, not values: the line says how to give them."""
    with pytest.raises(UsageError, match=r"--weight_decay: expected one argument \(-1e-4 starts "
                                         r"with -, which argparse takes for a flag: give it after "
                                         r"=, as in --weight_decay=-1e-4\)"):
        parse("--weight_decay", "-1e-4")
    assert parse("--weight_decay=-0").weight_decay == 0


def shown(value) -> str | None:
    """How the error line shows a single value: a number as Python prints it,
    text quoted; None for a command."""
    if isinstance(value, tuple) or value.startswith("--"):
        return None
    for kind, form in ((int, str), (float, lambda number: f"{number:g}")):
        try:
            return form(kind(value))
        except ValueError:
            pass
    return repr(value)[:40]


def cases(column: int) -> list:
    return [pytest.param(name, value, id=f"{name}={ascii(value)[:30]}")
            for name, row in DOMAINS.items() for value in row[column]]


def test_every_field_has_a_domain_and_its_edges_in_the_table():
    """A field added without a domain (flag's bounds or check; a bool's type and a choice's choices
    count), or without its row here, fails this test."""
    assert all(missing_domains(kind) == [] for kind in CONFIG_CLASSES)
    fields = [f.name for kind in CONFIG_CLASSES for f in dataclasses.fields(kind)]
    assert list(DOMAINS) == list(dict.fromkeys(fields))  # every field, in the classes' order

    @dataclass(frozen=True)
    class Forgotten(Config):
        buckets: int = flag(25, "a number without a domain")
        sync: bool = flag(False, "a bool: its type is its domain")

    assert missing_domains(Forgotten) == ["buckets"]


@pytest.mark.parametrize("name, value", cases(0))
def test_edge_values_in_the_domain_are_accepted(name, value):
    for config_class in classes_with(name):
        parse_config(config_class, argv_for(name, value))


@pytest.mark.parametrize("name, value", cases(1))
def test_values_outside_the_domain_are_refused_in_one_line(name, value):
    """Through the parser, as every train.py parses: a UsageError (one line, exit status 2 under
    user_errors) that names the flag and the value and says what to give instead."""
    for config_class in classes_with(name):
        with pytest.raises(UsageError) as error:
            parse_config(config_class, argv_for(name, value))
        message = str(error.value)
        assert "\n" not in message and f"--{name}" in message, message
        assert any(advice in message
                   for advice in ("must be", "give", "use", "choose from")), message
        assert shown(value) is None or shown(value) in message, message


def test_values_of_the_wrong_type_are_refused_when_built_directly():
    """A config built in code (compare.py, tests) gets the same checks as
    the parser's, types included."""
    for name, value, wanted in [("nesterov", "yes", "true or false"),
                                ("lr", "0.1", "a finite number"),
                                ("batch_size", 1.5, "a whole number"),
                                ("batch_size", True, "a whole number"), ("log_dir", None, "text"),
                                ("gpu_devices", (), "one or more values"),
                                ("dataset", None, "one of cifar10")]:
        with pytest.raises(UsageError, match=f"^--{name} must be {wanted}"):
            Config(**{name: value})


@dataclass(frozen=True)
class Sweep:
    """A config dataclass of its own, as compare.py's CompareConfig adopts check_domains."""
    out: str | None = flag(None, "output folder", check="folder")
    amp: tuple[str, ...] | None = flag(None, "precisions", nargs="+", choices=AMPS)
    gpu_counts: tuple[int, ...] | None = flag(None, "GPU counts", nargs="+", at_least=1)
    repeat: int = flag(1, "runs of each configuration", at_least=1)
    run_timeout: int = flag(3600, "seconds a run may take", at_least=1)

    def __post_init__(self):
        check_domains(self)


def test_any_frozen_config_dataclass_can_check_its_domains():
    assert missing_domains(Sweep) == []
    assert Sweep(gpu_counts=(1, 2)).gpu_counts == (1, 2)
    # an item None: each run's default
    assert dataclasses.replace(Sweep(), amp=(None,)).amp == (None,)
    for kwargs, message in [({"repeat": 0}, "--repeat must be a whole number at least 1, not 0"),
                            ({"gpu_counts": (2, 0)},
                             "--gpu_counts must be a whole number at least 1, not 0"),
                            ({"amp": ("fp8",)}, "--amp must be one of bf16, fp16, off, not 'fp8'"),
                            ({"out": "/proc/results"},
                             "--out must be a folder outside /proc and /sys"),
                            ({"run_timeout": -1},
                             "--run_timeout must be a whole number at least 1, not -1")]:
        with pytest.raises(UsageError, match=f"^{re.escape(message)}"):
            Sweep(**kwargs)


def test_a_benchmark_without_synthetic_size_makes_only_the_images_its_steps_draw():
    """--benchmark without --synthetic_size: (warm-up + timed + profiled steps) x the global batch,
    one epoch, at most the default's 50,000 and at least 5; given (even as the default's value, or
    abbreviated as argparse allows), it stays. Without --benchmark nothing changes, --max_steps
    included (a run continued with another --max_steps must see the same epochs)."""
    def sized(*flags):
        cfg = parse("--benchmark", *flags)
        return cfg.synthetic_size, cfg.epochs

    assert sized() == ((10 + 100) * 128, 1)  # the defaults: 14,080 images
    assert sized("--warmup_steps", "2", "--benchmark_steps", "6", "--profile_steps", "3",
                 "--batch_size", "32") == (11 * 32, 1)
    assert sized("--benchmark_steps", "1000") == (50_000, 3)  # 1,010 steps of 128: 3 epochs
    assert sized("--batch_size", "1", "--warmup_steps", "0", "--benchmark_steps", "2") == (5, 1)
    assert sized("--synthetic_size", "50000") == (50_000, 1)
    assert sized("--synthetic_s=300") == (300, 55)  # 110 steps of 2 batches
    assert parse().synthetic_size == parse("--max_steps", "24").synthetic_size == 50_000


def test_sizes_beyond_the_machines_memory_are_refused_naming_them(monkeypatch):
    """On a machine of 2 GiB: the largest --synthetic_size that fits is accepted and the next
    refused with the largest; PyramidNet-110 alpha 270 (114 MB of weights) is accepted, alpha 2,700
    (9 GiB) refused. Nothing is allocated to find out."""
    # read by --synthetic_size's domain (common/domains.py) and by Config's check of the weights
    for module in (common.domains, common.config):
        monkeypatch.setattr(module, "physical_memory", lambda: 2**31)
    most = 2**31 // SYNTHETIC_BYTES_PER_IMAGE
    assert parse("--synthetic_size", str(most)).synthetic_size == most
    with pytest.raises(UsageError, match=f"--synthetic_size must be at most {most} images "
                                         "on this machine .*2 GiB"):
        parse("--synthetic_size", str(most + 1))
    assert parse().alpha == 270
    with pytest.raises(UsageError, match=r"--alpha 2700 .* at least 9\.\d+ GiB, more "
                                         r"than this machine's 2 GiB.*smaller --depth, "
                                         r"--alpha or --width_multiple"):
        parse("--alpha", "2700")
    # the system does not say: no refusal
    for module in (common.domains, common.config):
        monkeypatch.setattr(module, "physical_memory", lambda: None)
    assert parse("--alpha", "1e7", "--synthetic_size", str(10**13)).alpha == 1e7


def test_num_workers_is_bounded_by_the_cores_and_the_memory_of_the_machine(monkeypatch):
    """-j 1000, meant as -j 10, forked a thousand workers and the machine ran out of memory: past
    what the machine holds --num_workers is refused in one line that says the most and why, before
    anything forks. On 16 usable cores and 32 GiB: -j 16 (a worker a core) and up to 64 pass, 65 is
    refused by the cores, and four training processes on the node share them; ImageNet-sized
    batches of 256 images (2 x 154 MB ahead per worker) are held by the memory first, with a
    smaller --batch_size named. The default fits every machine."""
    monkeypatch.setattr(common.domains, "usable_cores", lambda: 16)
    monkeypatch.setattr(common.domains, "physical_memory", lambda: 32 * 2**30)
    assert parse("-j", "16").num_workers == 16 and parse("-j", "64").num_workers == 64
    with pytest.raises(UsageError, match=r"^--num_workers 1000 is more DataLoader worker processes "
                                         r"than this machine can hold: at most 64 per training "
                                         r"process here \(4 per usable core: 16 cores;"):
        parse("-j", "1000")
    with pytest.raises(UsageError, match=r"at most 64 per"):
        parse("-j", "65")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # a torchrun worker of four on the node
    with pytest.raises(UsageError, match=r"at most 16 per training process here \(4 per usable "
                                         r"core: 16 cores, shared by 4 training processes"):
        parse("-j", "17")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    imagenet = ("--dataset", "synthetic", "--model", "resnet50", "--batch_size", "256")
    with pytest.raises(UsageError, match=r"at most 47 per training process here \(each "
                                         r"--num_workers is two workers.*about 688 MiB.*32 GiB "
                                         r"of memory\); give fewer, a smaller --batch_size"):
        parse(*imagenet, "-j", "48")
    assert parse(*imagenet, "-j", "47").num_workers == 47
    assert common.domains.worker_processes_refusal(default_num_workers(), 1, 2**20) is None


@pytest.mark.parametrize("depth, alpha, block, width_multiple", [
    (8, 12, "basic", 1), (20, 24, "basic", 8), (56, 84, "basic", 1), (8, 12, "basic", 64),
    (11, 12, "bottleneck", 1), (20, 48, "bottleneck", 8)])
def test_parameters_at_least_is_a_close_lower_bound(depth, alpha, block, width_multiple):
    model = pyramidnet(depth, alpha, block, width_multiple=width_multiple)
    real = sum(p.numel() for p in model.parameters())
    assert 0.75 * real <= parameters_at_least(depth, alpha, block, width_multiple) <= real


def test_parameters_at_least_takes_constant_time():
    """A depth of 6e15 + 2 (3e15 blocks) is counted at once, as large as it is."""
    assert 1e21 < parameters_at_least(6 * 10**15 + 2, 270) < float("inf")


# -------------------------------------------------------------------------------------------- optim

def cfg_for(**kwargs) -> Config:
    return Config(**{"depth": 8, "alpha": 12, **kwargs})


@pytest.mark.parametrize("batch, lr",
                         [(128, 0.1), (512, 0.4), (64, 0.05), (1024, 0.8), (32, 0.025)])
def test_effective_lr_scales_linearly(batch, lr):
    cfg = cfg_for(batch_size=batch)
    assert cfg.effective_lr() == pytest.approx(lr)
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg, CPU)
    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(lr)
    assert (group["momentum"], group["weight_decay"], group["nesterov"]) == (0.9, 1e-4, True)
    assert isinstance(optimizer, torch.optim.SGD)
    assert build_optimizer(torch.nn.Linear(2, 2), cfg_for(nesterov=False),
                           CPU).param_groups[0]["nesterov"] is False


# "cuda": the fused SGD a GPU run builds, here on CPU tensors
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_first_step_the_grad_scaler_skips_leaves_sgd_as_if_it_had_not_happened(device):
    """fp16: the first step overflows, the GradScaler skips it, the next one counts. The
    optimizer must then be exactly where plain SGD that never saw the skipped step is. Fused
    SGD left to itself would create its momentum buffers uninitialised at the skipped step and
    build on them (off by ~1e16 here)."""
    def trained(optimizer_of, skip_first: bool):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 8)
        optimizer = optimizer_of(model)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
        for poison in ([True] if skip_first else []) + [False, False]:
            loss = model(torch.ones(4, 64)).square().mean() * (float("inf") if poison else 1.0)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return model.weight.detach(), optimizer

    plain = lambda model: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,  # noqa: E731
                                          weight_decay=1e-4, nesterov=True)
    reference, _ = trained(plain, skip_first=False)
    built = lambda model: build_optimizer(model, cfg_for(), torch.device(device))  # noqa: E731
    weight, optimizer = trained(built, True)
    assert optimizer.param_groups[0]["fused"] is (True if device == "cuda" else None)
    torch.testing.assert_close(weight, reference, rtol=1e-6, atol=1e-7)


def test_momentum_buffers_start_at_zero_in_the_parameters_layout():
    model = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    optimizer = build_optimizer(model, cfg_for(), CPU)
    buffer = optimizer.state[model.weight]["momentum_buffer"]
    assert not buffer.any() and buffer.stride() == model.weight.stride()
    # plain SGD: none
    assert build_optimizer(model, cfg_for(momentum=0.0, nesterov=False), CPU).state == {}


@pytest.mark.parametrize("batch", [32, 128, 512])
def test_the_rate_warms_up_at_every_batch(batch):
    """A first epoch at the full rate blew the test loss of a ResNet on a small folder up to 8e4
    (BENCHMARKS.md): the warm-up runs at every batch size, --lr_warmup_epochs 0 turns it off."""
    cfg = cfg_for(batch_size=batch, epochs=10)
    assert warmup_steps(cfg, 20) == 20  # a tenth of the 200 steps
    assert lr_factor(0, cfg, 20) == pytest.approx(1 / 20) and lr_factor(19, cfg, 20) == 1.0
    assert "linear warm-up over 20 steps" in describe_lr(cfg, 20)
    off = cfg_for(batch_size=batch, epochs=10, lr_warmup_epochs=0)
    assert warmup_steps(off, 20) == 0 and "warm-up" not in describe_lr(off, 20)


@pytest.mark.parametrize("epochs, warmup_epochs, steps_per_epoch, expected", [
    (10, 5.0, 20, 20),  # capped at a tenth of the 200 steps
    (300, 5.0, 10, 50),  # 5 epochs
    (300, 2.5, 10, 25),
    (100, 0.0, 10, 0)])
def test_warmup_length(epochs, warmup_epochs, steps_per_epoch, expected):
    cfg = cfg_for(batch_size=512, epochs=epochs, lr_warmup_epochs=warmup_epochs)
    assert warmup_steps(cfg, steps_per_epoch) == expected
    assert warmup_steps(cfg_for(batch_size=129, epochs=epochs, lr_warmup_epochs=warmup_epochs),
                        steps_per_epoch) == expected


def test_warmup_ramps_linearly():
    cfg = cfg_for(batch_size=512, epochs=300, lr_warmup_epochs=5)
    ramp = warmup_steps(cfg, 10)
    assert ramp == 50
    factors = [lr_factor(step, cfg, 10) for step in range(60)]
    assert factors[:ramp] == pytest.approx([(step + 1) / ramp for step in range(ramp)])
    assert factors[0] == pytest.approx(1 / 50) and factors[ramp - 1] == 1.0
    assert factors[ramp:] == [1.0] * 10
    assert np.all(np.diff(factors[:ramp]) > 0)


def test_step_decay_at_half_and_three_quarters():
    cfg = cfg_for(batch_size=128, epochs=300)
    spe = 391
    assert lr_factor(150 * spe - 1, cfg, spe) == 1.0
    assert lr_factor(150 * spe, cfg, spe) == pytest.approx(0.1)
    assert lr_factor(225 * spe - 1, cfg, spe) == pytest.approx(0.1)
    assert lr_factor(225 * spe, cfg, spe) == pytest.approx(0.01)
    assert lr_factor(300 * spe - 1, cfg, spe) == pytest.approx(0.01)
    # 2.5 and 3.75: the rate drops at epoch index 3 and 4
    odd = cfg_for(epochs=5, lr_warmup_epochs=0)
    assert [lr_factor(e * 10, odd, 10) for e in range(5)] == pytest.approx([1, 1, 1, 0.1, 0.01])
    text = describe_lr(odd, 10)
    assert "after epochs 3 and 4" in text


def test_decay_after_warmup():
    cfg = cfg_for(batch_size=256, epochs=20, lr_warmup_epochs=1)
    assert warmup_steps(cfg, 10) == 10
    assert lr_factor(9, cfg, 10) == 1.0 and lr_factor(100, cfg, 10) == pytest.approx(0.1)
    assert lr_factor(150, cfg, 10) == pytest.approx(0.01)


def test_lambda_lr_follows_lr_factor():
    cfg = cfg_for(batch_size=512, epochs=8, lr_warmup_epochs=1)
    spe = 5
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg, CPU)
    scheduler = lr_schedule(optimizer, cfg, spe)
    seen = []
    for _ in range(8 * spe):
        seen.append(optimizer.param_groups[0]["lr"])  # the rate optimizer.step() uses for this step
        assert scheduler.get_last_lr()[0] == pytest.approx(seen[-1])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.4 * lr_factor(step, cfg, spe) for step in range(8 * spe)])
    assert seen[0] == pytest.approx(0.4 / 4) and max(seen) == pytest.approx(0.4)
    assert seen[-1] == pytest.approx(0.004)


def test_scheduler_state_dict_round_trips():
    cfg = cfg_for(batch_size=512, epochs=8, lr_warmup_epochs=1)
    first = build_optimizer(torch.nn.Linear(2, 2), cfg, CPU)
    scheduler = lr_schedule(first, cfg, 5)
    for _ in range(13):
        first.step()
        scheduler.step()
    state = scheduler.state_dict()
    second = build_optimizer(torch.nn.Linear(2, 2), cfg, CPU)
    resumed = lr_schedule(second, cfg, 5)
    resumed.load_state_dict(state)
    assert resumed.last_epoch == 13
    for _ in range(10):
        first.step()
        second.step()
        scheduler.step()
        resumed.step()
        assert second.param_groups[0]["lr"] == pytest.approx(first.param_groups[0]["lr"])
    assert second.param_groups[0]["lr"] == pytest.approx(0.4 * lr_factor(23, cfg, 5))


def test_describe_lr():
    text = describe_lr(cfg_for(batch_size=512, epochs=300), 97)
    assert text.startswith("lr 0.4 ")
    assert "0.1 per 128 images x global batch 512" in text
    assert "warm-up over 485 steps" in text and "after epochs 150 and 225" in text
    assert describe_lr(cfg_for(batch_size=32, epochs=300), 97).startswith("lr 0.025 ")


# ------------------------------------------------------------------------------------------ devices

@pytest.fixture
def gpus(monkeypatch):
    """Pretend the machine has `count` visible CUDA GPUs (0 = no CUDA)."""
    def set_count(count):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return set_count


def test_cuda_devices_on_a_machine_without_cuda(gpus):
    gpus(0)
    assert cuda_devices(None, default_all=True) == []
    assert cuda_devices(None, default_all=False) == []
    for requested in [(3,), (0,)]:
        with pytest.raises(UsageError) as error:
            cuda_devices(requested, default_all=False)
        message = str(error.value)
        assert "no CUDA GPU" in message and "leave out --gpu_devices" in message
        assert f"no GPU {requested[0]}" in message


def test_cuda_devices_refuses_repeats(gpus):
    gpus(0)
    with pytest.raises(UsageError, match="GPU 0 more than once"):
        cuda_devices((0, 0), default_all=True)
    gpus(4)
    with pytest.raises(UsageError, match="GPU 2 more than once"):
        cuda_devices((1, 2, 3, 2), default_all=True)


def test_cuda_devices_may_share_a_gpu_when_asked(gpus):
    """Several gloo ranks on one GPU (dist_parallel --backend gloo
    --gpu_devices 0 0); ids are still checked."""
    gpus(1)
    assert cuda_devices((0, 0), default_all=True, shared=True) == [0, 0]
    with pytest.raises(UsageError, match="no GPU 1"):
        cuda_devices((0, 1), default_all=True, shared=True)
    with pytest.raises(UsageError, match="more than once; list each GPU "
                                         "once .under --backend gloo"):
        cuda_devices((0, 0), default_all=True, sharing_hint=" (under --backend gloo ...)")


def test_cuda_devices_with_gpus(gpus):
    gpus(2)
    assert cuda_devices(None, default_all=True) == [0, 1]
    assert cuda_devices(None, default_all=False) == [0]
    assert cuda_devices((1,), default_all=False) == [1]
    assert cuda_devices((1, 0), default_all=True) == [1, 0]
    for requested in [(2,), (0, 5), (-1,)]:
        with pytest.raises(UsageError, match="GPUs 0-1 are visible"):
            cuda_devices(requested, default_all=True)


def test_cuda_devices_on_this_machine():
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert cuda_devices(None, default_all=True) == list(range(visible))
    with pytest.raises(UsageError):
        cuda_devices((visible,), default_all=True)


def test_seed_everything():
    def draw():
        return random.random(), np.random.rand(), torch.rand(1).item()

    seed_everything(5)
    a = draw()
    seed_everything(5)
    assert draw() == a
    seed_everything(6)
    assert draw() != a


# ------------------------------------------------------------------------------------------ metrics

def test_sums_arithmetic():
    sums = Sums([10.0, 6, 8, 4, 2.0, 0.5])
    assert sums.loss == 1.25 and sums.acc == 0.75 and sums.images == 8 and sums.timed_steps == 4
    assert sums.batch_time == 0.5 and sums.data_frac == 0.25
    assert sums.images_per_sec(128) == 256.0
    total = sums + Sums([2.0, 2, 2, 1, 0.5, 0.0])
    assert total.values == [12.0, 8, 10, 5, 2.5, 0.5]
    assert (total.loss == 1.2 and total.acc == 0.8 and total.batch_time == 0.5
            and total.data_frac == 0.2)
    empty = Sums()
    assert empty.values == [0.0] * Sums.SIZE == [0.0] * 6
    assert (empty.loss, empty.acc, empty.batch_time, empty.data_frac,
            empty.images_per_sec(128)) == (None,) * 5
    assert (empty + sums).values == sums.values
    # images seen during warm-up only: loss yes, timing no
    no_timing = Sums([3.0, 1, 2, 0, 0.0, 0.0])
    assert (no_timing.loss == 1.5 and no_timing.batch_time is None
            and no_timing.images_per_sec(32) is None)


def test_train_meter_accumulates_on_the_device():
    meter = TrainMeter(CPU)
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [5.0, 0.0, 0.0]])
    meter.update(torch.tensor(0.5), logits, torch.tensor([0, 1, 0, 2]))  # 2 correct of 4
    meter.update(torch.tensor(1.5, requires_grad=True), logits[:2], torch.tensor([0, 1]))  # 2 of 2
    totals = meter.take()
    assert totals.dtype == torch.float64 and totals.device == CPU
    assert totals.tolist() == [0.5 * 4 + 1.5 * 2, 4.0, 6.0]
    assert meter.take().tolist() == [0.0, 0.0, 0.0]  # take() starts afresh


class FakeClock:
    """Stands in for time.perf_counter: the 'loader' and the 'step' advance it by known amounts."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


def test_step_timer_leaves_out_warmup_and_splits_data_from_compute(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(common.metrics, "time", clock)
    data = [0.5, 0.25, 1.0, 0.125, 0.5, 0.25, 0.0]
    compute = [4.0, 3.0, 2.0, 1.0, 3.0, 5.0, 1.0]

    def loader(count):
        for i in range(count):
            clock.now += data[i]
            yield i

    timer = StepTimer(CPU, warmup_steps=2)
    assert timer.window() == (0, 0.0, 0.0) and timer.percentiles() == (None, None)
    seen = []
    for batch in timer.timed(loader(5)):
        seen.append(batch)
        clock.now += compute[batch]
        timer.step_done()
    assert seen == [0, 1, 2, 3, 4]
    steps, step_seconds, data_seconds = timer.window()
    assert steps == 3  # steps 0 and 1 are warm-up
    assert step_seconds == pytest.approx(sum(data[i] + compute[i] for i in (2, 3, 4)))
    assert data_seconds == pytest.approx(sum(data[i] for i in (2, 3, 4)))
    assert data_seconds <= step_seconds
    assert timer.window() == (0, 0.0, 0.0)  # a window is read once
    p50, p90 = timer.percentiles()
    # per step: its data wait + compute
    assert sorted(timer.step_seconds) == pytest.approx([1.125, 3.0, 3.5])
    # linear interpolation between 3.0 and 3.5
    assert p50 == pytest.approx(3.0) and p90 == pytest.approx(3.4)
    # warm-up is counted over the run, not per window
    timer2_batches = loader(2)
    for batch in timer.timed(timer2_batches):
        clock.now += compute[batch]
        timer.step_done()
    assert timer.window()[0] == 2
    assert len(timer.step_seconds) == 5 and timer.data_seconds == pytest.approx(1.625 + 0.75)


def test_step_timer_on_the_cpu_with_the_real_clock():
    timer = StepTimer(CPU, warmup_steps=2)
    x = torch.randn(64, 64)
    for _ in timer.timed(range(6)):
        (x @ x).sum().item()
        timer.step_done()
    steps, step_seconds, data_seconds = timer.window()
    assert steps == 4 and step_seconds > 0 and 0 <= data_seconds <= step_seconds
    p50, p90 = timer.percentiles()
    assert p50 is not None and 0 < p50 <= p90


@pytest.mark.parametrize("warmup", [0, 3])
def test_peak_memory_is_reset_when_the_warm_up_ends(monkeypatch, warmup):
    """Peak memory describes the timed steps: the warm-up's cuDNN autotuning
    workspaces and compilation are left out, on every GPU the run uses, once. (On a
    GPU, tests/gpu checks the figure itself.)"""
    events = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda gpu: events.append(f"reset {gpu}"))
    timer = StepTimer(CPU, warmup_steps=warmup, gpus=[2, 5])
    for _ in timer.timed(range(6)):
        timer.step_done()
        events.append("step")
    # the reset comes as the last warm-up step closes (or at once, with none)
    before = max(warmup - 1, 0)
    assert events == ["step"] * before + ["reset 2", "reset 5"] + ["step"] * (6 - before)


def test_window_sums_joins_meter_and_timer(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(common.metrics, "time", clock)
    meter, timer = TrainMeter(CPU), StepTimer(CPU, warmup_steps=0)
    for _ in timer.timed(range(2)):
        clock.now += 2.0
        meter.update(torch.tensor(1.0), torch.tensor([[1.0, 0.0]] * 4), torch.tensor([0, 0, 1, 1]))
        timer.step_done()
    values = window_sums(meter, timer)
    assert values.dtype == torch.float64 and values.shape == (Sums.SIZE,)
    sums = Sums(values.tolist())
    assert sums.values == [8.0, 4.0, 8.0, 2.0, 4.0, 0.0]
    assert sums.loss == 1.0 and sums.acc == 0.5 and sums.images_per_sec(4) == 2.0


def test_evaluation_sums_equals_a_manual_loop():
    torch.manual_seed(0)
    model = pyramidnet(8, 12, "basic").eval()
    generator = torch.Generator().manual_seed(1)
    loader = [(torch.randn(n, 3, 32, 32, generator=generator),
               torch.randint(10, (n,), generator=generator))
              for n in (5, 3, 1)]
    sums = evaluation_sums(model, loader, CPU)
    assert sums.dtype == torch.float64 and sums.shape == (4,)
    loss, correct, top5, images = 0.0, 0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            # one image at a time: also checks the batch is summed, not averaged
            for i in range(len(y)):
                logits = model(x[i:i + 1])
                loss += F.cross_entropy(logits, y[i:i + 1]).item()
                correct += int(logits.argmax(1).item() == y[i].item())
                # the label among the five largest logits: at most 4 others larger
                top5 += int((logits[0] > logits[0, y[i]]).sum().item() < 5)
                images += 1
    assert sums[0].item() == pytest.approx(loss, rel=1e-5)
    assert sums[1].item() == correct and sums[3].item() == images == 9
    assert sums[2].item() == top5 and correct <= top5 < images  # 9 images of 10 classes
    # summed over shards, as a process group's all_reduce adds them: the whole set's sums
    shards = [evaluation_sums(model, loader[:1], CPU), evaluation_sums(model, loader[1:], CPU)]
    assert torch.equal(shards[0][1:] + shards[1][1:], sums[1:])
    assert torch.is_grad_enabled()  # evaluation_sums left grad mode as it was


def test_evaluation_sums_of_an_empty_loader():
    sums = evaluation_sums(torch.nn.Linear(2, 2), [], CPU)
    assert sums.dtype == torch.float64 and sums.tolist() == [0.0, 0.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------------- logger

def test_resolve_run_dir(tmp_path):
    log_dir = tmp_path / "runs" / "nested"
    cfg = Config(log_dir=str(log_dir), run_name="first")
    assert resolve_run_dir(cfg, "single_gpu", 0) == log_dir / "first"
    assert list(tmp_path.iterdir()) == []  # checked, nothing created
    default = resolve_run_dir(Config(log_dir=str(tmp_path)), "dist_parallel", 4)
    pid = os.getpid()  # two runs started in the same second differ by their process
    assert default.parent == tmp_path
    assert re.fullmatch(rf"dist_parallel-4gpu-\d{{8}}-\d{{6}}-{pid}", default.name)
    single = resolve_run_dir(Config(log_dir=str(tmp_path)), "single_gpu", 0)
    assert re.fullmatch(rf"single_gpu-cpu-\d{{8}}-\d{{6}}-{pid}", single.name)
    assert list(tmp_path.iterdir()) == []


def test_resolve_run_dir_refuses_an_existing_run(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "results.json").write_text("{}")
    (tmp_path / "taken" / MARKER).write_text("")
    with pytest.raises(UsageError, match="exists already.*--overwrite"):
        resolve_run_dir(Config(log_dir=str(tmp_path), run_name="taken"), "single_gpu", 1)
    taken = Config(log_dir=str(tmp_path), run_name="taken", overwrite=True)
    assert resolve_run_dir(taken, "single_gpu", 1) == tmp_path / "taken"
    assert (tmp_path / "taken" / "results.json").read_text() == "{}"  # resolving never deletes


@pytest.mark.parametrize("below", ["", "sub", "sub/deeper"])
def test_resolve_run_dir_refuses_a_file_as_log_dir(tmp_path, below):
    file = tmp_path / "not-a-folder"
    file.write_text("x")
    log_dir = file / below if below else file
    with pytest.raises(UsageError, match="is a file") as error:
        resolve_run_dir(Config(log_dir=str(log_dir), run_name="r"), "single_gpu", 0)
    assert str(file) in str(error.value)
    assert (sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]
            and file.read_text() == "x")


def test_resolve_run_dir_refuses_an_unwritable_log_dir(tmp_path, monkeypatch):
    # the tests may run as root, for whom everything is writable: pretend the folder is read-only
    monkeypatch.setattr(common.logger.os, "access",
                        lambda path, mode: os.fspath(path) != str(tmp_path))
    with pytest.raises(UsageError, match="not writable"):
        resolve_run_dir(Config(log_dir=str(tmp_path / "runs"), run_name="r"), "single_gpu", 0)


def test_resolve_run_dir_with_a_relative_log_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_run_dir(Config(log_dir="runs", run_name="r"), "single_gpu", 0).as_posix() == \
        "runs/r"


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return pyramidnet(8, 12, "basic")


def fresh(seed=1):
    torch.manual_seed(seed)
    return pyramidnet(8, 12, "basic")


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("wrap", ["plain", "checkpoint", "module", "checkpoint-module"])
def test_load_model_weights_accepts(tmp_path, tiny, wrap):
    with torch.no_grad():
        tiny.bn1.running_mean.add_(1.0)  # buffers travel too
    state = tiny.state_dict()
    if "module" in wrap:
        state = {f"module.{k}": v for k, v in state.items()}
    if "checkpoint" in wrap:
        optimizer = torch.optim.SGD(tiny.parameters(), lr=0.1, momentum=0.9)
        state = {"model": state, "optimizer": optimizer.state_dict(), "epoch": 3}
    path = tmp_path / "model.pt"
    torch.save(state, path)
    model = fresh()
    assert not same_weights(model, tiny)
    load_model_weights(model, str(path))
    assert same_weights(model, tiny)


def refused(model, path, pattern):
    with pytest.raises(UsageError, match=pattern) as error:
        load_model_weights(model, str(path))
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_load_model_weights_refuses_missing_files(tmp_path):
    refused(fresh(), tmp_path / "nothing.pt", "no file")
    refused(fresh(), tmp_path, "no file")  # a folder


def test_load_model_weights_refuses_non_torch_files(tmp_path):
    path = tmp_path / "random.pt"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    refused(fresh(), path, "not a PyTorch weights file")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    refused(fresh(), empty, "not a PyTorch weights file")


@pytest.mark.parametrize("content", [
    [torch.zeros(3)], torch.zeros(3), {"weight": 3}, {"model": [1, 2]},
    {"a": torch.zeros(1), "b": "text"}, 42])
def test_load_model_weights_refuses_files_without_a_state_dict(tmp_path, content):
    path = tmp_path / "model.pt"
    torch.save(content, path)
    refused(fresh(), path, "holds no model weights")


def test_load_model_weights_refuses_other_architectures(tmp_path):
    for depth, alpha, block in [(14, 12, "basic"), (8, 24, "basic"), (11, 12, "bottleneck")]:
        path = tmp_path / f"{depth}-{alpha}-{block}.pt"
        torch.save(pyramidnet(depth, alpha, block).state_dict(), path)
        model = fresh()
        refused(model, path, "do not fit this model.*--depth")
    mnist = tmp_path / "mnist.pt"  # the same architecture on one input channel: --dataset mnist
    torch.save(pyramidnet(8, 12, "basic", in_channels=1).state_dict(), mnist)
    refused(fresh(), mnist, "do not fit this model.*--dataset")
    empty = tmp_path / "empty.pt"
    torch.save({}, empty)
    refused(fresh(), empty, "do not fit")


def test_load_model_weights_refuses_pickled_objects(tmp_path):
    path = tmp_path / "whole-model.pt"
    torch.save(SimpleNamespace(weights=torch.zeros(1)), path)  # not loadable with weights_only=True
    refused(fresh(), path, "not a PyTorch weights file")
