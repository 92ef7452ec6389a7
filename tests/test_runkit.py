"""runkit.py's API on its own, in this process (the train files' runs meet the same code in the
other files): one-line errors and flag types; the stop signals and their exit statuses; the run
folder (its marker, its lock, --overwrite); checkpoints (atomic, sealed with a checksum, loaded with
weights_only, every refusal one line); the random generators' states; the step timer on the CPU's
clock (warm-up and profiled steps untimed); the run log (TensorBoard flushed at every call,
results.json); the augmentation's draws; the model's parameters and FLOPs counted on the model
object; the GPU peaks behind MFU."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import runkit
from conftest import REPO, scalar_events

CPU = torch.device("cpu")


def tiny_state(value: float = 1.0) -> dict:
    """A checkpoint's state as a train.py writes it, with a model of two tensors."""
    return {"config": {"depth": 8, "lr": 0.1, "dataset": "synthetic"},
            "model": {"w": torch.full((3, 2), value), "steps": torch.tensor(4)},
            "optimizer": {"state": {}, "param_groups": []}, "scheduler": {}, "scaler": {},
            "progress": {"epoch": 0, "batch": 4, "step": 4, "best_acc": None, "best_epoch": None,
                         "tested_step": None},
            "rng": [runkit.rng_states()]}


def one_line(error: pytest.ExceptionInfo, *named: str) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    for text in named:
        assert text in message, (text, message)
    return message


# ---------------------------------------------------------------------------------- one-line errors
def said(capsys, raised: BaseException, env: dict | None = None, monkeypatch=None) -> tuple:
    """(exit status, what stderr got) of `raised` inside one_line_errors()."""
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        with runkit.one_line_errors():
            raise raised
    return exit_.value.code, capsys.readouterr().err


def test_each_kind_of_error_is_one_line_and_its_exit_status(capsys, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert said(capsys, runkit.UsageError("give --lr")) == (2, "error: give --lr\n")
    assert said(capsys, runkit.RunError("the loss is NaN")) == (1, "error: the loss is NaN\n")
    assert said(capsys, PermissionError(13, "Permission denied", "/runs/x")) == (
        1, "error: /runs/x: Permission denied\n")
    assert said(capsys, OSError(28, "No space left on device", "/runs/x/checkpoint.pt")) == (
        1, "error: /runs/x/checkpoint.pt: No space left on device\n")
    assert said(capsys, KeyboardInterrupt()) == (130, "interrupted\n")
    with pytest.raises(ValueError):  # a bug is a traceback, not a line that hides it
        with runkit.one_line_errors():
            raise ValueError("a bug")


def test_under_torchrun_a_usage_error_is_said_once_a_node(capsys, monkeypatch):
    """Every worker meets the same mistake: the node's first says it; one a rank alone meets
    (its own GPU) each says."""
    env = {"TORCHELASTIC_RUN_ID": "job", "LOCAL_RANK": "1"}
    assert said(capsys, runkit.UsageError("x"), env, monkeypatch) == (2, "")
    assert said(capsys, runkit.UsageError("mine", rank_specific=True)) == (2, "error: mine\n")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert said(capsys, runkit.UsageError("x")) == (2, "error: x\n")


def test_the_parser_says_a_mistake_in_one_line_and_takes_no_abbreviation():
    parser = runkit.ArgumentParser(description="d")
    parser.add_argument("--batch_size", type=runkit.count(1), default=128)
    parser.add_argument("--lr", type=runkit.number(above=0), default=0.1)
    parser.add_argument("-e", "--evaluate")
    assert parser.parse_args(["--batch_size", "3", "--lr=1e-3"]).batch_size == 3
    for argv, named in ((["--batch"], "unrecognized arguments: --batch"),
                        (["--batch_size", "0"], "invalid whole_number value: '0'"),
                        (["--batch_size", "2.5"], "invalid whole_number value"),
                        (["--lr", "nan"], "invalid finite_number value"),
                        (["--lr", "0"], "invalid finite_number value"),
                        (["-e"], "(its value after it: -e PATH; --lr=-1 for one that starts")):
        with pytest.raises(runkit.UsageError) as refused:
            parser.parse_args(argv)
        assert one_line(refused, named).endswith("(see --help)")


def test_the_flag_types_take_their_range_and_nothing_else():
    assert runkit.count(0, 10)("10") == 10 and runkit.number(least=0, below=1)("0") == 0.0
    for kind, text in ((runkit.count(1), "0"), (runkit.count(0, 10), "11"),
                       (runkit.number(least=0, below=1), "1"), (runkit.number(), "inf"),
                       (runkit.number(above=0), "-0.0")):
        with pytest.raises(ValueError):
            kind(text)
    runkit.refuse_if([(False, "never"), (0, "nor this")])
    with pytest.raises(runkit.UsageError, match="^the first$"):
        runkit.refuse_if([(False, "no"), (True, "the first"), (True, "the second")])


# ------------------------------------------------------------------------------------------ signals
@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGINT", 130), ("SIGUSR1", 138)])
def test_a_stop_signal_is_noted_never_acted_on_and_the_handlers_are_restored(name, code):
    """The handler notes the signal (the loop stops at its next window) and the exit status is
    128 + its number, as if killed by it; the first signal is the one kept; restore() puts back
    the handlers it found."""
    before = {number: signal.getsignal(number) for number in runkit.StopSignals.NAMES}
    signals = runkit.StopSignals()
    try:
        assert signals.received is None
        signal.raise_signal(getattr(signal, name))
        assert signals.received == name and runkit.StopSignals.CODES[name] == code
        signal.raise_signal(signal.SIGTERM if name != "SIGTERM" else signal.SIGUSR1)
        assert signals.received == name
    finally:
        signals.restore()
    assert {number: signal.getsignal(number) for number in runkit.StopSignals.NAMES} == before


def test_a_second_ctrl_c_interrupts_at_once():
    signals = runkit.StopSignals()
    try:
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signals.restore()
    assert runkit.StopSignals.CODES == {"SIGTERM": 143, "SIGINT": 130, "SIGHUP": 129,
                                        "SIGUSR1": 138}


HANGUP = """
import os, signal, sys, runkit
signals = runkit.StopSignals()
os.kill(os.getpid(), signal.SIGHUP)
print("to a terminal that is gone", flush=True)
print("nor this", file=sys.stderr, flush=True)
sys.exit(signals.CODES[signals.received])
"""


def test_a_closed_terminal_is_a_stop_whose_lines_go_nowhere():
    """SIGHUP: the terminal is gone, so a line printed to it would fail the run; the stop is noted
    and the lines after it go to /dev/null (a process of its own: the handler points this
    process's stdout elsewhere)."""
    done = subprocess.run([sys.executable, "-c", HANGUP], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (129, "", "")


def test_the_stop_line_says_where_the_run_is_and_how_to_go_on(tmp_path):
    progress = {"epoch": 0, "batch": 3, "step": 3}
    checkpoint = tmp_path / "my run" / "checkpoint.pt"
    assert runkit.stopped_line("SIGTERM", progress, 8, checkpoint) == (
        f"stopped by SIGTERM at step 3; checkpoint {checkpoint}: continue with --resume auto "
        "--run_name 'my run'")  # as a shell takes it (tests/test_messages.py: other names)
    assert "(the epoch trained, its evaluation owed)" in runkit.stopped_line(
        "SIGUSR1", {**progress, "batch": 8}, 8, checkpoint)
    assert runkit.stopped_line("SIGINT", progress, 8, None).endswith(
        "a --benchmark run keeps none")


# ------------------------------------------------------------------------------- launch and devices
@pytest.mark.parametrize("env, named", [
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": ""}, "LOCAL_WORLD_SIZE=''"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "abc"}, "MASTER_PORT='abc'"),
    ({"RANK": "0"}, "RANK and WORLD_SIZE go together"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is outside WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "65536"}, "MASTER_PORT=65536"),
])
def test_a_launchers_variable_no_process_could_run_with_is_named(monkeypatch, env, named):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(runkit.UsageError) as refused:
        runkit.check_launch_environment()
    one_line(refused, named)


def test_a_collective_whose_peer_died_is_one_line_naming_rank_and_step(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(runkit.RunError) as failed:
        runkit.raise_group_failure(RuntimeError("[../gloo/transport] Connection closed by peer\n"
                                                "more"), step=7)
    one_line(failed, "rank 1 stopped at step 7: the process group failed", "closed by peer")
    runkit.raise_group_failure(RuntimeError("shape mismatch"), step=7)  # its caller's to raise


def test_without_cuda_the_cpu_and_a_share_of_the_cores(monkeypatch, capsys):
    assert runkit.cuda_device(0) == CPU
    assert capsys.readouterr().err == ""  # the run's log warns, once the refusals are behind
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    for processes, default in (("1", 4), ("8", 1), ("16", 0)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", processes)
        assert runkit.workers(None) == default
    assert runkit.workers(32) == 32
    with pytest.raises(runkit.UsageError) as refused:
        runkit.workers(1000)  # a typo for -j 10
    one_line(refused, "-j 1000", "give at most 32")


# ------------------------------------------------------------------------------------- augmentation
class Indexed(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, index):
        return torch.zeros(1), index % 3


def draw(image):
    return torch.rand(3)  # a transform's random draw


def test_each_images_draws_depend_on_the_seed_the_epoch_and_the_index_only():
    """dataset[i] draws the same in any order, from any worker's copy, and leaves the caller's
    generator as it was; another epoch or seed draws otherwise."""
    data = runkit.Augmented(Indexed(), draw, seed=3)
    data.set_epoch(2)
    forward = [data[i][0] for i in range(40)]
    torch.manual_seed(0)
    before = torch.get_rng_state()
    backward = [data[i][0] for i in reversed(range(40))][::-1]
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(forward, backward))
    assert [data[i][1] for i in range(4)] == [0, 1, 2, 0] and len(data) == 40
    assert len({tuple(image.tolist()) for image in forward}) == 40
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)
    assert torch.equal(torch.cat([images for images, _ in loader]), torch.stack(forward))
    for seed, epoch in ((3, 3), (4, 2)):
        other = runkit.Augmented(Indexed(), draw, seed=seed)
        other.set_epoch(epoch)
        assert all(not torch.equal(other[i][0], forward[i]) for i in range(40))


def test_the_synthetic_images_are_the_seeds_and_learnable():
    images, labels = runkit.synthetic_images(300, seed=1, split="train")
    assert images.shape == (300, 3, 32, 32) and images.dtype == torch.uint8
    assert set(labels.tolist()) == set(range(10))
    again, same = runkit.synthetic_images(300, seed=1, split="train")
    assert torch.equal(images, again) and torch.equal(labels, same)
    test, test_labels = runkit.synthetic_images(100, seed=1, split="test")
    assert not torch.equal(test, images[:100])
    assert not torch.equal(runkit.synthetic_images(300, seed=2, split="train")[0], images)
    # the same class patterns in both splits: the nearest class mean finds the test labels
    means = torch.stack([images[labels == c].double().mean(0) for c in range(10)])
    nearest = ((test.double()[:, None] - means[None]) ** 2).flatten(2).sum(2).argmin(1)
    assert (nearest == test_labels).double().mean() > 0.9


# ----------------------------------------------------------------------------------- the run folder
def test_a_new_run_folder_is_marked_and_locked_by_its_process(tmp_path):
    folder = runkit.claim_run_folder(tmp_path / "runs" / "a", None, False)
    try:
        assert sorted(path.name for path in folder.iterdir()) == sorted([runkit.MARKER,
                                                                         runkit.LOCK])
        assert (folder / runkit.LOCK).read_text() == f"{os.getpid()}\n"
        with pytest.raises(runkit.UsageError) as refused:
            runkit.claim_run_folder(folder, None, False)
        one_line(refused, f"run folder {folder} exists already", "--overwrite")
    finally:
        runkit._held.pop().close()


HOLDER = """
import sys, time, runkit
from pathlib import Path
runkit.claim_run_folder(Path(sys.argv[1]), "auto", False)
print("holding", flush=True)
time.sleep(120)
"""


def test_a_folder_locked_by_a_live_process_is_refused_and_freed_when_it_dies(tmp_path):
    """A second writer (a resume, an --overwrite) of a folder a live run holds is refused naming
    its pid; killed (kill -9, the OOM killer), its lock dies with it."""
    folder = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline() == "holding\n"
        (folder / "events.out.tfevents.1").write_text("a live run's")
        for resume, overwrite in (("auto", False), (None, True)):
            with pytest.raises(runkit.UsageError) as refused:
                runkit.claim_run_folder(folder, resume, overwrite)
            one_line(refused, "in use by a run still running", f"pid {holder.pid}")
        assert (folder / "events.out.tfevents.1").read_text() == "a live run's"
    finally:
        holder.kill()
        holder.wait()
    runkit.claim_run_folder(folder, None, True)
    runkit._held.pop().close()
    assert sorted(path.name for path in folder.iterdir()) == sorted([runkit.MARKER, runkit.LOCK])


def test_overwrite_empties_only_a_run_folder_and_a_resume_keeps_it(tmp_path):
    """--overwrite empties a folder a run made (its marker), and refuses any other folder that
    holds something; a resume keeps every file but the temporary ones a killed writer left."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's own")
    with pytest.raises(runkit.UsageError) as refused:
        runkit.claim_run_folder(mine, None, True)
    one_line(refused, "is not a run folder", runkit.MARKER, "left as it is")
    assert (mine / "notes.txt").read_text() == "a user's own"
    run = runkit.claim_run_folder(tmp_path / "run", None, False)
    runkit._held.pop().close()
    for name in ("checkpoint.pt", ".checkpoint.pt.123.abcd.tmp", "results.json"):
        (run / name).write_text(name)
    (run / "sub").mkdir()
    runkit.claim_run_folder(run, "auto", False)
    runkit._held.pop().close()
    assert sorted(path.name for path in run.iterdir()) == sorted(
        [runkit.MARKER, runkit.LOCK, "checkpoint.pt", "results.json", "sub"])
    runkit.claim_run_folder(run, None, True)
    runkit._held.pop().close()
    assert sorted(path.name for path in run.iterdir()) == sorted([runkit.MARKER, runkit.LOCK])
    (tmp_path / "link").symlink_to(run)
    with pytest.raises(runkit.UsageError) as refused:
        runkit.claim_run_folder(tmp_path / "link", "auto", False)
    one_line(refused, "is a link or a file")


def test_a_checkpoint_resumed_into_a_new_folder_brings_its_best_weights(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    (first / "checkpoint.pt").write_bytes(b"c")
    (first / "best.pt").write_bytes(b"the best epoch's")
    new = runkit.claim_run_folder(tmp_path / "new", str(first / "checkpoint.pt"), False)
    runkit._held.pop().close()
    assert (new / "best.pt").read_bytes() == b"the best epoch's"


def test_two_runs_started_in_one_second_get_folders_of_their_own():
    name = runkit.default_run_name("dist_parallel", 4)
    assert name.startswith("dist_parallel-4gpu-") and name.endswith(f"-{os.getpid()}")
    assert runkit.default_run_name("single_gpu", 0).startswith("single_gpu-cpu-")


# -------------------------------------------------------------------------------------- checkpoints
def test_a_checkpoint_is_sealed_and_loads_with_weights_only(tmp_path):
    path = runkit.save_checkpoint(tmp_path / "checkpoint.pt", tiny_state())
    saved = torch.load(path, weights_only=True)  # tensors and plain values: no code runs
    assert saved["format"] == runkit.FORMAT
    assert saved["checksum"] == runkit.checksum({k: v for k, v in saved.items() if k != "checksum"})
    loaded = runkit.checkpoint_to_resume(str(path), tmp_path, {"depth": 8}, ["depth"])
    assert loaded["file"] == str(path) and torch.equal(loaded["model"]["w"], torch.ones(3, 2))
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def test_the_checksum_sees_every_bit_and_every_key():
    state = tiny_state()
    reference = runkit.checksum(state)
    assert runkit.checksum(tiny_state()) == reference
    flipped = tiny_state()
    flipped["model"]["w"].view(torch.int32)[0, 0] ^= 1  # one bit of one weight
    other_dtype = tiny_state()
    other_dtype["model"]["w"] = other_dtype["model"]["w"].double()
    renamed = tiny_state()
    renamed["model"]["v"] = renamed["model"].pop("w")
    zero = tiny_state()
    zero["model"]["w"][0, 0] = -0.0 * 1  # 1.0 -> -0.0
    for changed in (flipped, other_dtype, renamed, zero, {**state, "progress": {"step": 5}}):
        assert runkit.checksum(changed) != reference


def refused(path, config=None, must_match=(), folder=None) -> str:
    with pytest.raises(runkit.UsageError) as refusal:
        runkit.checkpoint_to_resume(str(path), folder or Path(path).parent,
                                    config or {"depth": 8}, must_match)
    return one_line(refusal, "--resume")


def test_each_checkpoint_that_cannot_be_resumed_is_refused_in_one_line(tmp_path):
    path = runkit.save_checkpoint(tmp_path / "checkpoint.pt", tiny_state())
    whole = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(whole[:len(whole) // 2])
    assert "is no intact checkpoint" in refused(tmp_path / "cut.pt")
    assert "is no intact checkpoint" in refused(tmp_path / "missing.pt")
    torch.save({"model": {}, "epoch": 3}, tmp_path / "old.pt")  # an earlier version's
    assert "in the format None; this version reads" in refused(tmp_path / "old.pt")
    torch.save(torch.ones(2), tmp_path / "tensor.pt")  # no dict at all
    assert "in the format None; this version reads" in refused(tmp_path / "tensor.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    assert "a model.pt holds weights: give it to --evaluate" in refused(tmp_path / "model.pt")
    sealed = torch.load(path, weights_only=True)
    sealed["model"]["w"][1, 1] = 2.0  # a byte flipped on a disk, after sealing
    torch.save(sealed, tmp_path / "damaged.pt")
    assert "is damaged: its contents do not match their checksum" in refused(
        tmp_path / "damaged.pt")
    said = refused(path, {"depth": 20, "lr": 0.1, "dataset": "cifar10"},
                   ["depth", "lr", "dataset"])
    assert ("was written by another run: --depth 8 (now 20), --dataset synthetic (now cifar10); "
            "resume with the flags it was written with") in said


def test_resume_auto_starts_afresh_only_where_no_earlier_run_left_work(tmp_path):
    folder = tmp_path / "run"
    assert runkit.checkpoint_to_resume(None, folder, {}, []) is None
    assert runkit.checkpoint_to_resume("auto", folder, {}, []) is None  # nothing there yet
    folder.mkdir()
    (folder / "best.pt").write_bytes(b"an earlier run's")
    said = refused("auto", folder=folder)
    assert "has no checkpoint.pt but an earlier run's ['best.pt']" in said


def test_an_ended_run_says_so(capsys):
    progress = {"epoch": 1, "batch": 0, "step": 8, "tested_step": 8}
    ended = {"progress": progress, "file": "runs/a/checkpoint.pt", "config": {"epochs": 1}}
    assert runkit.has_ended(ended, epochs=1, max_steps=0)
    assert "runs/a/checkpoint.pt: this run has ended (step 8)" in capsys.readouterr().out
    assert not runkit.has_ended(ended, epochs=2, max_steps=0)
    assert runkit.has_ended(ended, epochs=2, max_steps=8)
    owed = {**ended, "progress": {**progress, "tested_step": None}}  # stopped before its test
    assert not runkit.has_ended(owed, epochs=1, max_steps=0) and not runkit.has_ended(None, 1, 0)
    with pytest.raises(runkit.UsageError) as refused:  # a run to 2 epochs resumed to train 1
        runkit.has_ended({**owed, "config": {"epochs": 2}}, epochs=1, max_steps=0)
    one_line(refused, "--epochs 1: the run was to train 2", "never shorter")
    assert runkit.resumed_line({**owed, "config": {"epochs": 2}}, epochs=3) == (
        "resumed at step 8 from runs/a/checkpoint.pt; --epochs 2 made 3, the rate's schedule "
        "with it")


def test_diverged_weights_never_replace_a_good_checkpoint(tmp_path):
    path = runkit.save_checkpoint(tmp_path / "checkpoint.pt", tiny_state())
    before = path.read_bytes()
    with pytest.raises(runkit.RunError) as diverged:
        runkit.save_checkpoint(path, tiny_state(math.nan))
    one_line(diverged, "the weights are NaN/inf at step 4", "left as it was")
    assert path.read_bytes() == before


def test_an_interrupted_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path,
                                                                              monkeypatch):
    path = runkit.write_atomically(tmp_path / "checkpoint.pt", lambda file: file.write(b"good"))
    names = []

    def dies_half_way(file):
        names.append(Path(file.name).name)
        file.write(b"half a")
        raise KeyboardInterrupt  # the process ended mid-write

    with pytest.raises(KeyboardInterrupt):
        runkit.write_atomically(path, dies_half_way)
    assert path.read_bytes() == b"good" and list(tmp_path.iterdir()) == [path]
    with pytest.raises(KeyboardInterrupt):
        runkit.write_atomically(path, dies_half_way)
    assert len(set(names)) == 2 and all(f".{os.getpid()}." in name for name in names)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(28, "No space left on device")))
    with pytest.raises(OSError) as full:
        runkit.write_atomically(path, lambda file: file.write(b"x"))
    assert full.value.filename == str(path) and path.read_bytes() == b"good"


def test_the_random_generators_are_put_back_as_they_were():
    state = runkit.rng_states()
    drawn = torch.rand(5)
    runkit.set_rng_state(state)
    assert torch.equal(torch.rand(5), drawn)
    assert set(state) == {"torch", "cuda"} and state["cuda"] == []


def test_evaluate_takes_a_model_pt_or_a_checkpoints_weights(tmp_path):
    model = nn.Linear(2, 2)
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "model.pt")
    runkit.save_checkpoint(tmp_path / "checkpoint.pt", {**tiny_state(),
                                                        "model": model.state_dict()})
    for name in ("model.pt", "checkpoint.pt"):
        other = nn.Linear(2, 2)
        runkit.load_weights(str(tmp_path / name), other.load_state_dict)
        assert torch.equal(other.weight, model.weight)
    with pytest.raises(runkit.UsageError) as refused:
        runkit.load_weights(str(tmp_path / "model.pt"), nn.Linear(3, 2).load_state_dict)
    one_line(refused, "holds no weights of this model", "give a model.pt or checkpoint.pt")


# ------------------------------------------------------------------------------------------- timing
def test_the_step_timer_leaves_out_the_warm_up_and_times_each_step_once():
    """On the CPU: the first `warmup_steps` of this attempt untimed, each later step timed from
    asking for its batch to step_done, its data wait inside it; a window's figures once."""
    timer = runkit.StepTimer(CPU, warmup_steps=2, step=10)
    batches = []
    for batch in timer.timed(range(5)):
        batches.append(batch)
        timer.step_done()
        if batch == 2:
            steps, seconds, data = timer.window()
            assert steps == 1.0 and 0 < data <= seconds
    assert batches == [0, 1, 2, 3, 4] and (timer.step, timer.steps) == (15, 5)
    steps, seconds, data = timer.window()
    assert steps == 2.0 and len(timer.step_seconds) == 3 and timer.window() == [0.0, 0, 0]
    assert sum(timer.step_seconds) >= seconds > 0 and timer.first_step_s > 0


def test_profiled_steps_are_traced_and_never_timed(tmp_path):
    """profile=(first, last, path): the run's steps `first` to `last` (counted over the whole
    run: a resumed attempt too) recorded by torch.profiler, each in a "step N" range, the trace
    written after the last; none of them timed."""
    trace = tmp_path / "trace_rank0.json"
    timer = runkit.StepTimer(CPU, warmup_steps=0, step=2, profile=(5, 6, trace))
    for _ in timer.timed(range(6)):
        torch.ones(8).sum()
        timer.step_done()
    assert timer.step == 8 and timer.profile[2] is None
    steps, _, _ = timer.window()
    assert steps == 4.0  # steps 3, 4, 7 and 8
    names = {event["name"] for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"step 5", "step 6"} <= names and not {"step 4", "step 7"} & names


def test_without_gpus_no_readings_no_peaks():
    monitor = runkit.GpuMonitor([])
    assert monitor.window() == {} and monitor.mean() is None
    monitor.close()
    assert runkit.peak_memory_gb([]) == {}


# ------------------------------------------------------------------------------------------ run log
def test_the_run_log_says_each_window_and_writes_results(tmp_path, capsys):
    """A window's line and its tags; NaN ends the run in one line; results.json holds the
    config, the environment and the summary; with no folder (a rank but 0) nothing at all."""
    log = runkit.RunLog(tmp_path, {"depth": 8})
    log.window(4, 0, [8.0, 12.0, 32.0, 2.0, 0.5, 0.1], 16, "Epoch 1/1 [4/8]", **{"train/lr": 0.1})
    assert capsys.readouterr().out == ("Epoch 1/1 [4/8] loss 0.250 acc 37.50% batch 0.250s data "
                                       "20.0% 64 img/s\n")
    with pytest.raises(runkit.RunError) as diverged:
        log.window(8, 0, [math.nan, 0.0, 32.0, 0.0, 0.0, 0.0], 16, "Epoch 1/1 [8/8]")
    one_line(diverged, "the training loss became NaN/inf by step 8", "try a lower --lr")
    log.results({"step": 8}, mode="single_gpu", world_size=1)
    log.close()
    events = scalar_events(tmp_path)
    assert {tag: [event.step for event in points] for tag, points in events.items()} == \
        dict.fromkeys(["train/loss", "train/acc_pct", "time/step_s", "time/data_wait_s",
                       "time/data_wait_pct", "throughput/images_per_s", "train/lr"], [4])
    assert {tag: points[0].value for tag, points in events.items()} == pytest.approx({
        "train/loss": 0.25, "train/acc_pct": 37.5, "time/step_s": 0.25, "time/data_wait_s": 0.05,
        "time/data_wait_pct": 20.0, "throughput/images_per_s": 64.0, "train/lr": 0.1})
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["mode"], results["world_size"], results["config"], results["summary"]) == \
        ("single_gpu", 1, {"depth": 8}, {"step": 8})
    assert {"torch", "cuda", "cudnn", "gpus", "cpu", "host"} <= set(results["env"])
    capsys.readouterr()
    silent = runkit.RunLog(None, {})
    silent.line("nothing")
    silent.scalars(1, {"train/loss": 1.0})
    silent.results({})
    assert capsys.readouterr().out == ""


def test_each_window_is_on_disk_when_it_is_logged(tmp_path):
    """What TensorBoard's own reader finds the moment scalars() returns, before any close(): a
    run killed then (kill -9, out of memory) keeps every point it logged."""
    log = runkit.RunLog(tmp_path, {})
    for step in range(1, 11):
        log.scalars(step, {"train/loss": float(step), "train/lr": 0.1})
        assert [event.step for event in scalar_events(tmp_path).get("train/loss", [])] == \
            list(range(1, step + 1))
    log.close()


def killed_attempt(run_dir: Path, steps=(2, 4, 6)) -> None:
    """An attempt that logged `steps` and was killed (its points are on disk as it flushed them)."""
    first = runkit.RunLog(run_dir, {})
    for step in steps:
        first.scalars(step, {"train/loss": float(step)})
    first.writer.close()


def test_a_resumed_log_purges_what_the_killed_attempt_logged_after_its_checkpoint(tmp_path):
    """Resumed from step 4's checkpoint: TensorBoard's reader drops the killed attempt's step 6
    and shows the resumed one's, so a curve never goes back."""
    killed_attempt(tmp_path)
    for path in tmp_path.glob("events.out.tfevents.*"):  # written a while before the resume
        path.rename(path.with_name("events.out.tfevents.1000000000.host"))
    resumed = runkit.RunLog(tmp_path, {}, {"progress": {"step": 4}})
    resumed.scalars(6, {"train/loss": 60.0})
    resumed.close()
    events = scalar_events(tmp_path)["train/loss"]
    assert [(event.step, event.value) for event in events] == [(2, 2.0), (4, 4.0), (6, 60.0)]


def test_an_attempt_resumed_within_the_same_second_keeps_the_killed_ones_points(tmp_path):
    killed_attempt(tmp_path)
    resumed = runkit.RunLog(tmp_path, {}, {"progress": {"step": 4}})
    resumed.scalars(6, {"train/loss": 60.0})
    resumed.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    events = scalar_events(tmp_path)["train/loss"]
    assert [(event.step, event.value) for event in events] == [(2, 2.0), (4, 4.0), (6, 60.0)]


def test_the_speed_summary_is_the_windows_figures(tmp_path):
    log = runkit.RunLog(None, {})
    log.window(4, 0, [8.0, 12.0, 32.0, 2.0, 0.5, 0.1], 16, "")
    log.window(8, 1, [4.0, 16.0, 32.0, 2.0, 1.5, 0.1], 16, "")
    timer = runkit.StepTimer(CPU, 0, 0)
    timer.step_seconds = [0.25, 0.25, 0.5, 1.0]
    summary = runkit.speed_summary(log, timer, 16, 2, flops=1000, peak=(None, "CPU"),
                                   monitor=runkit.GpuMonitor([]), gpus=[])
    assert summary == pytest.approx({
        "images_per_sec": 32.0, "images_per_sec_per_gpu": 16.0, "batch_time_p50": 0.375,
        "batch_time_p90": 0.85, "timed_steps": 4, "data_wait_frac": 0.1, "flops_per_image": 1000,
        "mfu": None, "mfu_note": "CPU", "first_step_s": None, "gpu_util_mean": None,
        "peak_mem_gb": None, "peak_mem_reserved_gb": None, "train_loss": 0.125,
        "train_acc": 0.5, "profiled_steps": None})  # the last epoch's windows: loss and accuracy
    with_peak = runkit.speed_summary(log, timer, 16, 2, 1000, (1e-9, None), runkit.GpuMonitor([]),
                                     [])
    assert with_peak["mfu"] == pytest.approx(16.0 * 1000 / 1e3) and with_peak["mfu_note"] is None


# -------------------------------------------------------------------------------------- model facts
def test_flops_and_parameters_are_counted_on_the_model_that_runs():
    """FlopCounterMode over one forward and backward of the model itself: two linear layers of
    12x5 and 5x3 are 2*(60+15) forward, and backward the second's input and weight gradients
    (2*15 each) and the first's weight gradient (2*60; the images need none). The model is left
    in its mode, with no gradient and no statistic moved."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5, bias=False), nn.BatchNorm1d(5),
                          nn.Linear(5, 3, bias=False))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    flops = runkit.flops_per_image(model, torch.randn(4, 3, 2, 2))
    batchnorm = flops - 2 * (60 + 15) - 2 * (2 * 15) - 2 * 60
    assert 0 <= batchnorm < 2 * 5 * 10  # a few per channel: normalising is no matrix product
    assert runkit.flops_per_image(model[:2], torch.randn(4, 3, 2, 2)) == 2 * 60 + 2 * 60
    assert model.training and all(param.grad is None for param in model.parameters())
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert runkit.parameter_count(model) == 60 + 10 + 15


@pytest.mark.parametrize("name, amp, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 80GB HBM3", "off", 494.7),
    ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H200", "fp16", 989.4),
    ("NVIDIA H200 NVL", "bf16", 835.5), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA L4", "bf16", 121.0), ("NVIDIA L40S", "bf16", 362.05)])
def test_the_peak_behind_mfu_is_the_gpus_own(monkeypatch, name, amp, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert runkit.peak_tflops(torch.device("cuda", 0), amp) == (peak, None)


def test_no_peak_no_mfu_and_the_reason(monkeypatch):
    assert runkit.peak_tflops(CPU, "off") == (None, "CPU: MFU is measured against a GPU's peak")
    for name, why in (("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a MIG slice"),
                      ("NVIDIA GeForce RTX 4090", "no peak known for NVIDIA GeForce RTX 4090")):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        value, note = runkit.peak_tflops(torch.device("cuda", 0), "bf16")
        assert value is None and note.startswith(why)
