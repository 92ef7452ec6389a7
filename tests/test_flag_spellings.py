"""Flags as people type them: every long flag of every script also with hyphens (`--batch-size`,
as PyTorch's ImageNet example and timm write them: aliases in one add_argument), and that
example's short forms where the flag means the same here (-b, -j, -a, -p, -e). The check walks
each parser's own flags, so a flag added later is covered by itself."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import subprocess
import sys

import pytest

import compare
import runkit
from conftest import MODES, REPO, refuse_in_process, train_file

TRAIN_FILES = [f"{mode}/train.py" for mode in MODES]
SCRIPTS = [*TRAIN_FILES, "compare.py", "benchmarks/fast.py", "benchmarks/profile_step.py",
           "benchmarks/roofline.py"]
SHORT_FLAGS = ("-b", "-j", "-a", "-p", "-e")


class Captured(Exception):
    pass


def parser_of(script: str) -> argparse.ArgumentParser:
    """The parser `script` reads its command line with: a train file's, as its get_args builds it
    (caught as it is about to parse); compare.py's and the benchmarks' from their functions."""
    if script == "compare.py":
        return compare.build_compare_parser()
    if script.startswith("benchmarks/"):
        return importlib.import_module(script[:-3].replace("/", ".")).get_parser()
    module, built = train_file(script.split("/")[0]), []

    def catch(parser, args=None, namespace=None):
        built.append(parser)
        raise Captured

    with pytest.MonkeyPatch.context() as patch, contextlib.suppress(Captured):
        patch.setattr(module.runkit.ArgumentParser, "parse_args", catch)
        module.get_args([])
    return built[0]


# what a script's parser needs besides the flag (fast.py: the mode it runs)
REQUIRED = {"benchmarks/fast.py": ["single_gpu"]}


def a_value(parser: argparse.ArgumentParser, script: str, option: str,
            action: argparse.Action) -> list[str]:
    """What to type after the flag of `action` for argparse to take it: nothing for a switch, a
    choice, or the first of a few values its type takes."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    for value in ("8", "1", "0.5", "x"):  # a count (some from 8), a number, a path or a name
        with contextlib.suppress(Exception, SystemExit):
            parser.parse_args([*REQUIRED.get(script, []), option, value])
            return [value]
    raise AssertionError(f"{script} {option}: no value tried is taken")


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
    required = REQUIRED.get(script, [])
    for option, action in flags:
        value = a_value(parser, script, option, action)
        hyphens = option[:2] + option[2:].replace("_", "-")
        as_written = vars(parser.parse_args([*required, option, *value]))
        assert vars(parser.parse_args([*required, hyphens, *value])) == as_written, hyphens
        if value:  # --batch-size=64 as well as --batch-size 64
            assert vars(parser.parse_args([*required, f"{hyphens}={value[0]}"])) == as_written


def test_the_page_says_both_spellings_are_accepted():
    page = (REPO / "docs" / "flags.md").read_text()
    assert "`--batch-size 64` is `--batch_size 64`" in page
    assert all(f"`{short}`" in page for short in SHORT_FLAGS)


@pytest.mark.parametrize("mode", MODES)
def test_the_imagenet_examples_short_forms(mode):
    """`-b 64 -j 2 -a resnet18 -p 5 -e weights.pt` is `--batch_size 64 --num_workers 2 --model
    resnet18 --log_interval 5 --evaluate weights.pt`, in every train.py."""
    get_args = train_file(mode).get_args
    short = vars(get_args(["-b", "64", "-j", "2", "-a", "resnet18", "-p", "5", "-e",
                           "weights.pt"]))
    long = vars(get_args(["--batch_size", "64", "--num_workers", "2", "--model", "resnet18",
                          "--log_interval", "5", "--evaluate", "weights.pt"]))
    assert short == long
    assert vars(get_args(["-b64", "-j2"])) == vars(get_args(["--batch_size", "64",
                                                             "--num_workers", "2"]))


def test_compare_passes_the_short_forms_on_to_every_run():
    """compare.py takes train.py's flags for every run: -b is the global batch there too (-e,
    an evaluation, is not one of them: compare.py sets it itself)."""
    cc, train, _ = compare.parse(["-b", "64", "-j", "0"])
    assert train == ["-b", "64", "-j", "0"]
    assert train_file("single_gpu").get_args(train).batch_size == 64
    with pytest.raises(Exception, match="-e"):
        compare.parse(["-e", "weights.pt"])


@pytest.mark.parametrize("mode", MODES)
def test_hyphenated_flags_reach_the_config_and_no_abbreviation_does(mode):
    get_args = train_file(mode).get_args
    args = get_args(["--batch-size", "64", "--no-nesterov", "--momentum", "0",
                     "--lr-warmup-epochs=2", "--gpu-devices", "0", "1"])
    assert (args.batch_size, args.nesterov, args.lr_warmup_epochs, args.gpu_devices) == \
        (64, False, 2.0, [0, 1])
    for abbreviated in ("--batch", "--batch-s"):  # a later flag could make it mean another
        with pytest.raises(runkit.UsageError, match=f"unrecognized arguments: {abbreviated} 64"):
            get_args([abbreviated, "64"])


def test_a_value_is_never_rewritten():
    """Only the flag before a value changes spelling."""
    args = train_file("single_gpu").get_args(["--compile", "--compile-mode", "reduce-overhead",
                                              "--run-name=a-b_c", "--data-dir", "./my-data"])
    assert (args.compile_mode, args.run_name, args.data_dir) == ("reduce-overhead", "a-b_c",
                                                                 "./my-data")


def test_a_mistyped_hyphenated_flag_is_named_as_typed():
    done = subprocess.run([sys.executable, str(REPO / "compare.py"), "--gpu-counts", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: argument --gpu-counts: 0 "), done.stderr
    done = subprocess.run([sys.executable, str(REPO / "single_gpu" / "train.py"),
                           "--batch-sise", "64"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == \
        "error: unrecognized arguments: --batch-sise 64 (see --help)\n", done.stderr


@pytest.mark.parametrize("argv, said", [
    # argparse names the flag by every spelling it has, the one typed among them
    (["--no-flip=x"], "argument --flip/--no-flip: ignored explicit argument 'x'"),
    (["--no-nesterov=1"], "argument --no_nesterov/--no-nesterov: ignored explicit argument '1'"),
    (["--batch-size", "x"], "argument -b/--batch_size/--batch-size: invalid whole_number value: "
                            "'x'"),
    (["--lr-warmup-epochs=-1"], "argument --lr_warmup_epochs/--lr-warmup-epochs: invalid "
                                "finite_number value: '-1'"),
    # a value that starts with -, or no value at all: how to give it
    (["--weight-decay", "-1e-4"], "--weight-decay/--wd: expected one argument (its value after "
                                  "it: -e PATH; --lr=-1 for one that starts with -)"),
    (["--run_name", "-x"], "argument --run_name/--run-name: expected one argument"),
    (["-b", "-j", "2"], "argument -b/--batch_size/--batch-size: expected one argument"),
])
def test_a_flag_is_named_and_a_missing_value_said_as_it_is(argv, said):
    with pytest.raises(runkit.UsageError) as error:
        train_file("single_gpu").get_args(argv)
    assert said in str(error.value) and str(error.value).endswith("(see --help)"), error.value


@pytest.mark.parametrize("argv", [["-e"], ["-a", "resnet18", "--resume", "ckpt.pt", "-e"],
                                  ["-e", "--resume", "ckpt.pt"]])
def test_e_alone_as_in_the_imagenet_example_says_it_takes_the_weights_path(argv):
    """PyTorch's ImageNet example's `-e` is a switch that evaluates its --resume checkpoint; here
    -e takes the weights' path. Given alone, as there, it is refused in one line that says so."""
    done = refuse_in_process("single_gpu/train.py", *argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: argument -e/--evaluate: expected one argument (its "
                                  "value after it: -e PATH;"), done.stderr


def test_e_alone_is_refused_by_the_script_itself():
    done = subprocess.run([sys.executable, str(REPO / "dist_parallel" / "train.py"), "-e"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(
        "error: argument -e/--evaluate: expected one argument"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
