"""The lines a user reads and acts on: each says what is wrong and what to give, and a command it
gives to paste runs as printed.

- a run name that would break a line or a path (a newline, a control character, a separator) is
  refused where it is parsed (tests/test_config.py's table); names a shell would split are quoted
  in every command printed to paste;
- a file-system failure says what is wrong and what to give, for each error a user can fix;
- a damaged CIFAR-10 archive in --data_dir is named as damaged, with what to do;
- a raw pickle given for a checkpoint or model.pt is refused in one line, without
  torch's pickle-protocol warning;
- --evaluate says it evaluates (no schedule, no speed), and weights of
  another model name every model flag;
- a run that has ended says how to train on, and a larger --epochs
  extends it, saying what that does.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import pickle
import shlex
import warnings

import pytest
import torch

import compare
from common.checkpoint import continue_flags, load_checkpoint, stopped_line, write_checkpoint
from common.config import MODEL_FLAGS, Config, RunError, UsageError
from common.data import load_datasets
from common.errors import file_system_error, plural, user_errors
from common.logger import load_model_weights, resolve_run_dir, write_atomically
from common.sync_check import describe_sync
from conftest import (TINY, read_results, read_scalars, refuse_in_process, run_script,
                      train_in_process)
from models import pyramidnet

SINGLE = "single_gpu/train.py"


# -------------------------------------------------------------------------------- commands to paste
@pytest.mark.parametrize("name", ["plain", "my run", "it's", "$HOME", "a;b", "-x"])
def test_the_commands_a_stopped_run_prints_quote_its_name(tmp_path, name):
    run_dir = tmp_path / name
    line = stopped_line("SIGTERM", 7, run_dir / "checkpoint.pt", run_dir)
    assert "\n" not in line
    assert shlex.split(line.split("continue with ", 1)[1]) == \
        ["--resume", "auto", "--run_name", name]
    assert shlex.split(continue_flags(run_dir)) == ["--resume", "auto", "--run_name", name]


def test_a_checkpoint_that_cannot_be_written_says_how_to_continue(tmp_path, monkeypatch):
    run_dir = tmp_path / "run one"
    run_dir.mkdir()

    def full(path, write):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr("common.checkpoint.write_atomically", full)
    with pytest.raises(RunError) as error:
        write_checkpoint(run_dir, {"step": 1}, best=False)
    line = str(error.value)
    assert "\n" not in line and "No space left on device: free some space there" in line, line
    assert shlex.split(line.split("continue with ", 1)[1]) == \
        ["--resume", "auto", "--run_name", "run one"]


def test_the_folder_a_checkpoint_continues_in_is_quoted(tmp_path):
    own = tmp_path / "its runs" / "first run"
    own.mkdir(parents=True)
    (tmp_path / "runs" / "other").mkdir(parents=True)
    cfg = Config(log_dir=str(tmp_path / "runs"), run_name="other",
                 resume=str(own / "checkpoint.pt"))
    with pytest.raises(UsageError) as error:
        resolve_run_dir(cfg, "single_gpu", 0)
    words = shlex.split(str(error.value).split("(or ", 1)[1].split(" to continue")[0])
    assert words == ["--run_name", "first run", "--log_dir", str(tmp_path / "its runs")]


def test_the_comparison_names_its_command_as_a_shell_takes_it(tmp_path):
    out = tmp_path / "out"
    compare.prepare_output(out, ["--out", str(tmp_path / "my out"), "--epochs", "1"])
    marker = (out / compare.MARKER).read_text()
    command = marker.split("`")[1]
    assert shlex.split(command) == \
        ["python", "compare.py", "--out", str(tmp_path / "my out"), "--epochs", "1"]


# ------------------------------------------------------------------------------------- file systems
@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS,
                                    errno.EACCES, errno.EPERM, errno.EIO, errno.ELOOP,
                                    errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG])
def test_each_file_system_error_says_what_is_wrong_and_what_to_give(number):
    line = file_system_error(OSError(number, os.strerror(number), "/runs/r/model.pt"))
    assert line.startswith(f"/runs/r/model.pt: {os.strerror(number)}") and "\n" not in line, line
    advice = line.rsplit(": ", 1)[1]
    assert advice.split()[0] in ("give", "free", "check", "mend", "move"), line
    assert "a folder" not in line or number != errno.EISDIR or "stands where a file" in line, line


def test_a_folder_where_a_file_is_written_is_said_so(tmp_path, capsys):
    """The line it used to print: `Is a directory: give a path that leads to a folder`."""
    in_the_way = tmp_path / "model.pt"
    in_the_way.mkdir()
    with pytest.raises(SystemExit) as exit_status, user_errors():
        write_atomically(in_the_way, lambda f: f.write(b"weights"))
    err = capsys.readouterr().err
    assert exit_status.value.code == 1 and err.count("\n") == 1, err
    assert err == (f"error: {in_the_way}: Is a directory (a folder stands where a file is to be "
                   "read or written): move that folder away, or give the path of a file\n")
    # not the file system's: a traceback
    assert file_system_error(OSError(errno.ECONNRESET, "reset", "x")) is None


# ------------------------------------------------------------------------------------------- data
def test_a_damaged_cifar10_archive_is_named_with_what_to_do(tmp_path, offline):
    archive = tmp_path / "cifar-10-python.tar.gz"
    # gzip's magic, then nothing CIFAR-10's md5 would match
    archive.write_bytes(b"\x1f\x8b" + bytes(1000))
    with pytest.raises(UsageError) as error:
        load_datasets("cifar10", str(tmp_path), 0, 0)
    line = str(error.value)
    assert "\n" not in line and f"archive {archive} is damaged" in line, line
    assert "delete it" in line, line
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in line, line
    assert "--dataset synthetic" in line and "put cifar-10-python.tar.gz" not in line, line
    assert archive.read_bytes()[:2] == b"\x1f\x8b"  # left as it was: the user decides


# -------------------------------------------------------------------------------------- raw pickles
@pytest.mark.parametrize("protocol", [4, 5])
def test_a_raw_pickle_is_refused_without_torchs_protocol_warning(tmp_path, protocol):
    raw = tmp_path / "weights.pkl"
    raw.write_bytes(pickle.dumps({"conv.weight": [1.0, 2.0]}, protocol=protocol))
    model = pyramidnet(8, 12)
    for load in (lambda: load_model_weights(model, str(raw)),
                 lambda: load_checkpoint(raw, Config())):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(UsageError):
                load()
        assert [str(w.message) for w in caught] == []
    with warnings.catch_warnings(record=True) as caught:  # silenced for that load only
        warnings.simplefilter("always")
        with pytest.raises(pickle.UnpicklingError):
            torch.load(raw, weights_only=True)
    assert any("pickle protocol" in str(w.message) for w in caught)



# ------------------------------------------------------------------------------------------ counts
def test_a_count_of_one_is_said_in_the_singular():
    assert [plural(n, noun) for n, noun in ((1, "image"), (2, "image"), (0, "run"), (1, "process"),
                                            (4, "process"), (3, "batch"), (1, "usable core"))] == \
        ["1 image", "2 images", "0 runs", "1 process", "4 processes", "3 batches", "1 usable core"]


def test_a_test_set_of_one_image_and_a_group_of_one_rank_are_said_so(tmp_path):
    """The smallest synthetic set (5 images: a test set of 1) said "(1 images)"; a process group of
    one rank (dist_parallel with --nproc_per_node 1, as benchmarks/fast_path.sh runs it) "identical
    on 1 ranks"; the self-launch on a node of one GPU "the 1 GPUs available"."""
    done = train_in_process(SINGLE, *TINY, "--synthetic_size", "5", "--batch_size", "4",
                            "--max_steps", "1", "--log_dir", tmp_path, "--run_name", "one",
                            "--no_progress")
    assert done.returncode == 0, done.stdout + done.stderr
    epoch = next(line for line in done.stdout.splitlines() if line.startswith("Epoch 1/1 test"))
    assert "(1 image) epoch" in epoch, epoch
    report = {"params_in_sync": True, "params": 4, "ranks": 1, "buffers_max_abs_diff": 0.0}
    assert "identical on 1 rank" in describe_sync(report, sync_bn=False)
    assert "identical on 2 ranks" in describe_sync({**report, "ranks": 2}, sync_bn=False)


def test_the_self_launch_past_a_nodes_one_gpu_says_one_gpu(monkeypatch):
    import common.launcher
    from dist_parallel.train import get_config

    monkeypatch.setattr(common.launcher, "node_gpus", lambda *args: [0])
    with pytest.raises(UsageError, match=r"^--nproc_per_node 2 is more than the 1 GPU available: "):
        common.launcher.self_launch(get_config(["--nproc_per_node", "2"]), "train.py", [],
                                    "dist_parallel")


# -------------------------------------------------------------------------------------------
# --evaluate
def test_an_evaluation_says_what_it_is_and_nothing_of_training(tmp_path):
    """No learning-rate schedule, no epochs, no "speed: no timed steps":
    an evaluation trains nothing."""
    weights = tmp_path / "model.pt"
    torch.save(pyramidnet(8, 12).state_dict(), weights)
    done = run_script("single_gpu/train.py", *TINY, "--evaluate", weights, "--log_dir",
                      tmp_path / "runs", "--run_name", "ev", "--no_progress")
    assert done.returncode == 0, done.stdout + done.stderr
    first, result, where = done.stdout.splitlines()
    assert first.startswith(f"single_gpu: evaluating {weights}, PyramidNet-8 alpha=12 basic, on "
                            "synthetic's test set, every image once, batch 32 on cpu"), first
    assert "nothing is trained" in first and "lr" not in first and "epoch" not in first, first
    assert result.startswith(f"{weights}: test loss ") and result.endswith("(51 images)"), result
    assert where == f"results in {tmp_path / 'runs' / 'ev' / 'results.json'}"
    assert done.stderr == "warning: no CUDA GPU found: running on the CPU\n"


def test_weights_of_another_model_name_every_model_flag(tmp_path):
    """--width_multiple was missing from the list; a run folder's
    results.json gives the very flags."""
    lone = tmp_path / "lone.pt"
    torch.save(pyramidnet(8, 12, width_multiple=8).state_dict(), lone)
    with pytest.raises(UsageError) as error:
        load_model_weights(pyramidnet(8, 12), str(lone))
    assert str(error.value).endswith("give the --model, --depth, --alpha, --block, "
                                     "--width_multiple, --dataset and --image_size it was trained "
                                     "with"), error.value
    assert [f"--{name}" for name in MODEL_FLAGS] == ["--model", "--depth", "--alpha", "--block",
                                                     "--width_multiple", "--dataset",
                                                     "--image_size"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save(pyramidnet(8, 12, width_multiple=8).state_dict(), run_dir / "model.pt")
    trained = {**dataclasses.asdict(Config()), "depth": 8, "alpha": 12.0, "width_multiple": 8,
               "dataset": "synthetic"}
    (run_dir / "results.json").write_text(json.dumps({"config": trained}))
    with pytest.raises(UsageError) as error:
        load_model_weights(pyramidnet(8, 12), str(run_dir / "model.pt"))
    line = str(error.value)
    given = shlex.split(line.split("trained with, ", 1)[1].split(" (from ")[0])
    assert given == ["--model", "pyramidnet", "--depth", "8", "--alpha", "12", "--block", "basic",
                     # --image_size: its default
                     "--width_multiple", "8", "--dataset", "synthetic"], line
    assert line.endswith(f"(from {run_dir / 'results.json'})") and "\n" not in line, line


# ---------------------------------------------------------------------------------- extending a run
def test_a_run_is_extended_by_a_larger_epochs_and_says_how(tmp_path):
    """A run trained to --epochs 1, continued with --epochs 2 --resume auto: it was refused
    ("written by a different run"), with no way forward. Now the ended run says how to train on, and
    the larger --epochs extends it: the learning rate follows the 2-epoch schedule from the
    checkpoint's step on (0.1 x 0.025 in the second epoch, where the 1-epoch schedule would be at
    0.01 x), said at the resume and in results.json."""
    run_dir = tmp_path / "ext"
    flags = [*TINY, "--log_dir", tmp_path, "--run_name", "ext", "--no_progress"]  # 8 steps an epoch
    assert train_in_process(SINGLE, *flags).returncode == 0
    ended = refuse_in_process(SINGLE, *flags, "--resume", "auto")
    assert (ended.returncode == 0 and "(a larger --epochs extends it, with --resume "
                                      "auto)" in ended.stdout)
    done = train_in_process(SINGLE, *flags, "--epochs", "2", "--resume", "auto")
    assert done.returncode == 0, done.stderr
    resumed = next(line for line in done.stdout.splitlines()
                   if line.startswith("resumed at step 8"))
    assert "extended from 1 to 2 epochs" in resumed and "at 0.0025 now" in resumed, resumed
    results = read_results(run_dir)
    assert results["extended"] == [{"at_step": 8, "epochs_from": 1, "epochs_to": 2}]
    assert results["summary"]["steps"] == 16 and results["config"]["epochs"] == 2
    rates = dict(read_scalars(run_dir)["train/lr"])
    assert (rates[4] == rates[8] == pytest.approx(0.025)
            and rates[12] == rates[16] == pytest.approx(0.0025))
    lower = refuse_in_process(SINGLE, *flags, "--epochs", "1", "--resume", "auto")
    assert lower.returncode == 2 and "--epochs 2 (now 1)" in lower.stderr, lower.stderr
    assert "--epochs may be raised" in lower.stderr and lower.stderr.count("\n") == 1, lower.stderr
    # the extended run has ended
    again = refuse_in_process(SINGLE, *flags, "--epochs", "2", "--resume", "auto")
    assert again.returncode == 0 and "all 2 epochs done" in again.stdout, again.stdout


# --------------------------------------------------------------------------------------- compare.py
@pytest.mark.parametrize("dataset, named",
                         [("cifar10", "cifar-10-python.tar.gz"), ("mnist", "MNIST/raw")])
def test_compare_checks_a_dataset_it_cannot_get_once_before_any_run(tmp_path, monkeypatch, capsys,
                                                                     offline, dataset, named):
    """It used to start every configuration, each failing alike after its own download attempt."""
    def no_run(*args, **kwargs):
        raise AssertionError("a run was started")

    monkeypatch.setattr(compare, "start", no_run)
    out, data = tmp_path / "out", tmp_path / "data"
    with pytest.raises(SystemExit) as exit_status:
        compare.main(["--epochs", "1", "--dataset", dataset, "--data_dir", str(data), "--out",
                      str(out)])
    err = capsys.readouterr().err
    assert exit_status.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert named in err and "--dataset synthetic" in err and not out.exists(), err
