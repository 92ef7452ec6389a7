"""Flags as people type them: every long flag of every script also with hyphens (`--batch-size`,
as PyTorch's ImageNet example and timm write them), and that example's short forms where the
flag means the same here (-b, -j, -a, -p, -e). The check walks each parser's own flags, so a flag
added later is covered by itself; --help and docs/flags.md show the underscores only."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from common.command_line import SHORT_FLAGS
from common.config import Config, UsageError, parse_config
from conftest import REPO, refuse_in_process

sys.path.insert(0, str(REPO / "docs"))
import flags as flags_page  # docs/flags.py: the parsers the scripts use

SCRIPTS = [*flags_page.SCRIPTS, "benchmarks/overhead.py"]


def parser_of(script: str) -> argparse.ArgumentParser:
    if script == "benchmarks/overhead.py":  # not on the page: its flags are train.py's and a few
        from benchmarks import overhead
        from common.command_line import build_parser

        return build_parser(overhead.OverheadConfig, overhead.__doc__)
    return flags_page.parser_of(script)


def a_value(action: argparse.Action) -> list[str]:
    """What to type after the flag of `action` for argparse to take it: nothing for a switch."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    return ["1"] if action.type in (int, float) else ["x"]


def long_flags(parser: argparse.ArgumentParser):
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and "_" in option:
                yield option, action


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_long_flag_is_also_accepted_with_hyphens(script):
    parser = parser_of(script)
    flags = list(long_flags(parser))
    assert flags, f"{script} has no flag with an underscore"
    for option, action in flags:
        value = a_value(action)
        hyphens = option[:2] + option[2:].replace("_", "-")
        as_written = vars(parser.parse_args([option, *value]))
        assert vars(parser.parse_args([hyphens, *value])) == as_written, hyphens
        if value:  # --batch-size=64 as well as --batch-size 64
            assert vars(parser.parse_args([f"{hyphens}={value[0]}"])) == as_written, hyphens


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_shows_one_spelling(script):
    """The underscores only: no hyphenated flag in --help (nor, so, in docs/flags.md)."""
    text = flags_page.help_text(script) if script in flags_page.SCRIPTS else \
        parser_of(script).format_help()
    assert not re.findall(r"--[a-z0-9]+(?:_[a-z0-9]+)*-[a-z0-9]", text), script
    assert all(option.replace("--", "", 1).count("-") == 0
               for action in parser_of(script)._actions for option in action.option_strings
               if option.startswith("--"))


def test_the_page_says_both_spellings_are_accepted():
    page = (REPO / "docs" / "flags.md").read_text()
    assert "`--batch-size 64` is `--batch_size 64`" in page
    assert all(f"`{short}`" in page for short in SHORT_FLAGS.values())


@pytest.mark.parametrize("script", ["single_gpu/train.py", "data_parallel/train.py",
                                    "dist_parallel/train.py", "fsdp/train.py"])
def test_the_imagenet_examples_short_forms(script):
    """`-b 64 -j 2 -a resnet18 -p 5 -e weights.pt` is `--batch_size 64 --num_workers 2 --model
    resnet18 --log_interval 5 --evaluate weights.pt`, in every train.py."""
    parser = parser_of(script)
    short = vars(parser.parse_args(["-b", "64", "-j", "2", "-a", "resnet18", "-p", "5", "-e",
                                    "weights.pt"]))
    long = vars(parser.parse_args(["--batch_size", "64", "--num_workers", "2", "--model",
                                   "resnet18", "--log_interval", "5", "--evaluate",
                                   "weights.pt"]))
    assert short == long
    assert vars(parser.parse_args(["-b64", "-j2"])) == vars(parser.parse_args(
        ["--batch_size", "64", "--num_workers", "2"]))


def test_compare_passes_the_short_forms_on_to_every_run():
    """compare.py takes train.py's flags for every run: -b is the global batch there too (-e,
    an evaluation, is not one of them: compare.py sets it itself)."""
    parser = parser_of("compare.py")
    assert parser.parse_args(["-b", "64", "-j", "0"]).batch_size == 64
    with pytest.raises(Exception, match="unrecognized arguments: -e"):
        parser.parse_args(["-e", "weights.pt"])


def test_hyphenated_flags_reach_the_config():
    cfg = parse_config(Config, ["--batch-size", "64", "--no-nesterov", "--momentum", "0",
                                "--lr-warmup-epochs=2", "--gpu-devices", "0", "1"])
    assert (cfg.batch_size, cfg.nesterov, cfg.lr_warmup_epochs, cfg.gpu_devices) == \
        (64, False, 2.0, (0, 1))
    assert parse_config(Config, ["--batch", "64"]).batch_size == 64  # an abbreviation, as before
    assert parse_config(Config, ["--batch-s", "64"]).batch_size == 64


def test_a_value_is_never_rewritten():
    """Only the flag before a value, and nothing after a lone `--`, changes spelling."""
    cfg = parse_config(Config, ["--compile", "--compile-mode", "reduce-overhead",
                                "--run-name=a-b_c", "--data-dir", "./my-data"])
    assert (cfg.compile_mode, cfg.run_name, cfg.data_dir) == ("reduce-overhead", "a-b_c",
                                                              "./my-data")


def test_a_mistyped_hyphenated_flag_is_named_as_typed():
    done = subprocess.run([sys.executable, str(REPO / "compare.py"), "--gpu-counts", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == \
        "error: --gpu-counts must be a whole number at least 1, not 0\n", done.stderr
    done = subprocess.run([sys.executable, str(REPO / "single_gpu" / "train.py"),
                           "--batch-sise", "64"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == \
        "error: unrecognized arguments: --batch-sise 64 (see --help)\n", done.stderr


@pytest.mark.parametrize("argv, said", [
    # argparse knows the flag by its underscores: the line names it as typed
    (["--no-flip=x"], "argument --no-flip: ignored explicit argument 'x'"),
    (["--no-nesterov=1"], "argument --no-nesterov: ignored explicit argument '1'"),
    (["--no-", "1"], "ambiguous option: --no- could match --no_nesterov"),
    (["--batch-size", "x"], "argument --batch-size/-b: invalid int value: 'x'"),
    # the config's domains and rules too
    (["--lr-warmup-epochs=-1"], "--lr-warmup-epochs must be a finite number at least 0"),
    (["--batch-size", "8", "--lr", "1e300"], "--lr 1e+300 at --batch-size 8 is a learning rate"),
    # a value that starts with -: the hint names the flag and the value
    (["--weight-decay", "-1e-4"], "(-1e-4 starts with -, which argparse takes for a flag: give it "
                                  "after =, as in --weight-decay=-1e-4)"),
    (["--run_name", "-x"], "as in --run_name=-x"),
    # no value at all: no word of =-value, but what to give
    (["--batch-size"], "argument --batch-size/-b: give its value after --batch-size (see --help)"),
    (["-b", "-j", "2"], "argument --batch_size/-b: give its value after -b (see --help)"),
    (["--batch-s"], "argument --batch-s (--batch_size/-b): give its value after --batch-s"),
])
def test_a_flag_is_named_as_typed_and_a_missing_value_said_as_it_is(argv, said):
    with pytest.raises(UsageError) as error:
        parse_config(Config, argv)
    assert said in str(error.value), str(error.value)
    assert "--flag=-value" not in str(error.value)


@pytest.mark.parametrize("argv", [["-e"], ["-a", "resnet18", "--resume", "ckpt.pt", "-e"],
                                  ["-e", "--resume", "ckpt.pt"]])
def test_e_alone_as_in_the_imagenet_example_says_it_takes_the_weights_path(argv):
    """PyTorch's ImageNet example's `-e` is a switch that evaluates its --resume checkpoint; here
    -e takes the weights' path. Given alone, as there, it is refused in one line that says so and
    what to give, not argparse's "expected one argument" with a hint about values that start with
    -."""
    done = refuse_in_process("single_gpu/train.py", *argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: argument --evaluate/-e: give the path of the weights to "
                                  "evaluate after -e, a model.pt (--save_model) or a "
                                  "checkpoint.pt, as in -e runs/<run>/model.pt (PyTorch's "
                                  "ImageNet example's -e is a switch that evaluates its --resume "
                                  "checkpoint: here give that checkpoint after -e"), done.stderr


def test_e_alone_is_refused_by_the_script_itself():
    done = subprocess.run([sys.executable, str(REPO / "dist_parallel" / "train.py"), "-e"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(
        "error: argument --evaluate/-e: give the path of the weights"), done.stderr
    assert done.stderr.count("\n") == 1 and "=-value" not in done.stderr, done.stderr
