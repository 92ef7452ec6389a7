"""The lines a user reads and acts on: each says what is wrong and what to give, and a command it
gives to paste runs as printed.

- names a shell would split are quoted in every command printed to paste (the stop line here; the
  refusal of another run's folder: tests/test_run_folder.py);
- a file-system failure is one line naming the file and the cause, for each error a user can fix;
- a damaged CIFAR-10 archive in --data_dir is one line;
- a raw pickle given for a checkpoint or model.pt is refused in one line, without torch's
  pickle-protocol warning before it;
- a count of one is said in the singular;
- --evaluate says what it evaluates and nothing of training, and weights of another model are
  refused in one line;
- a run that has ended says how to train on, and a larger --epochs extends it, as it says.
"""
from __future__ import annotations

import errno
import os
import pickle
import shlex
import warnings
from pathlib import Path

import pytest
import torch

import compare
import runkit
from conftest import (TINY, read_results, read_scalars, refuse_in_process, train_file,
                      train_in_process)

SINGLE = "single_gpu/train.py"
CPU_WARNING = "warning: no CUDA GPU found: running on the CPU\n"


def tiny_pyramidnet(alpha: float = 12) -> torch.nn.Module:
    """TINY's model (depth 8), as every train.py builds it."""
    return train_file("single_gpu").PyramidNet(8, alpha, "basic", 10, 3)


def said(capsys, raised: BaseException) -> tuple[int, str]:
    """(exit status, stderr) of `raised` under the train files' __main__ block."""
    with pytest.raises(SystemExit) as exit_:
        with runkit.one_line_errors():
            raise raised
    return exit_.value.code, capsys.readouterr().err


# -------------------------------------------------------------------------------- commands to paste
@pytest.mark.parametrize("name", ["plain", "my run", "it's", "$HOME", "a;b", "-x"])
def test_the_command_a_stopped_run_prints_quotes_its_name(tmp_path, name):
    progress = {"epoch": 0, "batch": 7, "step": 7}
    line = runkit.stopped_line("SIGTERM", progress, 8, tmp_path / name / "checkpoint.pt")
    assert "\n" not in line
    assert shlex.split(line.split("continue with ", 1)[1]) == \
        ["--resume", "auto", "--run_name", name]


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
def test_each_file_system_error_is_one_line_naming_the_file_and_the_cause(capsys, number):
    error = OSError(number, os.strerror(number), "/runs/r/model.pt")  # PermissionError for two
    code, err = said(capsys, error)
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: "), err
    assert "/runs/r/model.pt" in err and os.strerror(number) in err, err


def test_a_folder_where_a_file_is_written_is_said_so_and_a_bug_stays_a_traceback(tmp_path,
                                                                                 capsys):
    in_the_way = tmp_path / "model.pt"
    in_the_way.mkdir()
    with pytest.raises(SystemExit) as exit_status, runkit.one_line_errors():
        runkit.write_atomically(in_the_way, lambda f: f.write(b"weights"))
    assert exit_status.value.code == 1
    assert capsys.readouterr().err == f"error: {in_the_way}: Is a directory\n"
    with pytest.raises(ConnectionResetError), runkit.one_line_errors():  # no file: not the user's
        raise ConnectionResetError(errno.ECONNRESET, "reset")


# ------------------------------------------------------------------------------------------- data
def test_a_damaged_cifar10_archive_is_one_line(tmp_path, offline):
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"\x1f\x8b" + bytes(1000))  # gzip's magic, then nothing CIFAR-10's md5 has
    done = refuse_in_process(SINGLE, *TINY, "--dataset", "cifar10", "--data_dir", tmp_path,
                             "--log_dir", tmp_path / "runs")
    assert done.returncode in (1, 2) and done.stderr.count("error: ") == 1, done.stderr
    assert "Traceback" not in done.stderr and "--dataset synthetic" in done.stderr, done.stderr
    assert archive.read_bytes()[:2] == b"\x1f\x8b"  # left as it was: the user decides


# -------------------------------------------------------------------------------------- raw pickles
@pytest.mark.parametrize("protocol", [4, 5])
def test_a_raw_pickle_is_refused_without_torchs_protocol_warning(tmp_path, protocol):
    raw = tmp_path / "weights.pkl"
    raw.write_bytes(pickle.dumps({"conv.weight": [1.0, 2.0]}, protocol=protocol))
    for load in (lambda: runkit.load_weights(str(raw), tiny_pyramidnet().load_state_dict),
                 lambda: runkit.checkpoint_to_resume(str(raw), tmp_path, {}, [])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(runkit.UsageError) as refused:
                load()
        assert str(raw) in str(refused.value) and "\n" not in str(refused.value)
        assert [str(w.message) for w in caught] == []
    with warnings.catch_warnings(record=True) as caught:  # silenced for those loads only
        warnings.simplefilter("always")
        with pytest.raises(pickle.UnpicklingError):
            torch.load(raw, weights_only=True)
    assert any("pickle protocol" in str(w.message) for w in caught)


# ------------------------------------------------------------------------------------------ counts
def test_a_test_set_of_one_image_is_said_so(tmp_path):
    """The smallest synthetic set (5 images: a test set of 1) said "(1 images)"."""
    done = train_in_process(SINGLE, *TINY, "--synthetic_size", "5", "--batch_size", "4",
                            "--max_steps", "1", "--log_dir", tmp_path, "--run_name", "one")
    assert done.returncode == 0, done.stdout + done.stderr
    epoch = next(line for line in done.stdout.splitlines() if line.startswith("Epoch 1/1 test"))
    assert epoch.endswith("(1 image)"), epoch


@pytest.mark.parametrize("mode", ["dist_parallel", "fsdp", "pipeline_parallel"])
def test_the_self_launch_past_a_nodes_one_gpu_says_one_gpu(monkeypatch, mode):
    module = train_file(mode)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(runkit.UsageError, match=r"^--nproc_per_node 2: this node has 1 GPU; "):
        module.launch_workers(module.get_args(["--nproc_per_node", "2"]), ["train.py"])


# ---------------------------------------------------------------------------------------- evaluate
@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "model.pt"
    torch.save(tiny_pyramidnet().state_dict(), path)
    return path


def test_an_evaluation_says_what_it_is_and_nothing_of_training(weights, tmp_path):
    """No epochs, no learning rate, no speed: an evaluation trains nothing."""
    done = refuse_in_process(SINGLE, *TINY, "--evaluate", weights, "--log_dir", tmp_path,
                             "--run_name", "ev")
    assert done.returncode == 0, done.stdout + done.stderr
    result, where = done.stdout.splitlines()
    assert result.startswith(f"{weights}: test loss ") and result.endswith("(51 images)"), result
    assert where == f"results in {tmp_path / 'ev' / 'results.json'}"
    assert done.stderr == CPU_WARNING
    assert read_results(tmp_path / "ev")["summary"]["test_images"] == 51


def test_weights_of_another_model_are_refused_in_one_line(weights, tmp_path):
    done = refuse_in_process(SINGLE, *TINY, "--alpha", "24", "--evaluate", weights, "--log_dir",
                             tmp_path, "--run_name", "other")
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.removeprefix(CPU_WARNING)
    assert line.count("\n") == 1 and line.startswith(f"error: --evaluate: {weights} holds no "
                                                     "weights of this model"), done.stderr
    assert "give a model.pt or checkpoint.pt a run of these model flags wrote" in line


# ---------------------------------------------------------------------------------- extending a run
def test_a_run_is_extended_by_a_larger_epochs_as_the_ended_run_says(tmp_path):
    """A run trained to --epochs 1, run again with --resume auto: it says it has ended and that a
    larger --epochs trains on; with --epochs 2 it does (it was refused: "written by another run"),
    the learning rate on the 2-epoch schedule (0.1 x 0.025 in the second epoch, where the 1-epoch
    one is at 0.01 x)."""
    run_dir = tmp_path / "ext"
    flags = [*TINY, "--log_dir", tmp_path, "--run_name", "ext"]  # 8 steps an epoch
    assert train_in_process(SINGLE, *flags).returncode == 0
    ended = refuse_in_process(SINGLE, *flags, "--resume", "auto")
    assert ended.returncode == 0 and "a larger --epochs" in ended.stdout, ended.stdout
    done = train_in_process(SINGLE, *flags, "--epochs", "2", "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("resumed at step 8") for line in done.stdout.splitlines())
    results = read_results(run_dir)
    assert results["summary"]["step"] == 16 and results["config"]["epochs"] == 2
    rates = dict(read_scalars(run_dir)["train/lr"])
    # train/lr at a window: the rate of the next step
    assert rates[4] == pytest.approx(0.025) and rates[12] == pytest.approx(0.0025)
    again = refuse_in_process(SINGLE, *flags, "--epochs", "2", "--resume", "auto")
    assert again.returncode == 0 and "this run has ended (step 16)" in again.stdout, again.stdout


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
