"""`python compare.py --verify` on the CPU, run once as a user runs it (the CPU matrix: tiny
model, N = 2 gloo processes, 12 steps), its checks read back here, each beside the run folders it
judged (the train files' own equalities, run without compare.py, are in tests/test_parallel.py):

- one process of every mode is the same computation: single_gpu, data_parallel and one-process
  dist_parallel and fsdp end with bit-identical weights, BatchNorm statistics and momentum,
  losses and accuracies;
- two DDP processes and two FSDP2 processes end bit for bit alike, weights and momentum: DDP's
  bucketed all-reduce and FSDP's reduce-scatter are the same average (halving and a sum of two are
  exact);
- the ranks end with bit-identical parameters;
- evaluation is exact for 1, 2 and 3 processes (53 test images, which neither 2 nor 3 divides), and
  the test numbers a 2-process run reports are those of the weights it saves;
- a run stopped halfway and resumed ends bit-identical to the uninterrupted one, each mode
  continuing the other's checkpoint, and the self-launch (`python dist_parallel/train.py
  --nproc_per_node 2`, which ran the two halves) is `torchrun --standalone` (which ran the
  uninterrupted run);
- pipeline_parallel on two stages, two micro-batches a step, ends with the weights and momentum of
  DDP's two processes bit for bit, and its BatchNorm statistics, updated once a micro-batch, apart
  from DDP's rank 0's, by the figure its row gives;
- each check fails on purpose when what it checks is broken (judged again in-process on the run's
  own files, perturbed: a weight one float32 ulp off fails check 1), and when a run it needs failed,
  naming the run's log; then compare.py exits non-zero and names the check in its last line.

Besides: a launch that cannot work is refused with one line before any worker starts.

Launches are few (each costs seconds) and shared through module-scoped fixtures;
every process computes on one intra-op thread, so that bit-identical comparisons do
not depend on the number of cores.

What only multi-GPU hardware can prove, and these tests therefore do not:

- SyncBatchNorm: statistics over the global batch, all-reduced across ranks in every BatchNorm
  forward, and its equivalence to one process normalising the whole batch (`compare.py --verify
  --sync_bn on` checks it on GPUs). PyTorch's SyncBatchNorm refuses CPU modules, so here
  `--sync_bn` is only shown to be refused.
- NCCL: the default backend with CUDA, which needs one GPU per rank; here `--backend
  nccl` is only shown to be refused. Gloo's all-reduce is proven exact above; NCCL's
  (ring/tree order, fp32 sums) is not.
- nn.DataParallel's scatter, replicas and gather over several GPUs: on the CPU it wraps nothing.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import compare
from comparison.report.outcome import Outcome
from comparison.verify import Verification, summary_line
from comparison.verify_checks import first_step_written, training_state
from conftest import REPO, read_results, run_script
from processes import TINY

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

DIST = "dist_parallel/train.py"
SEED = 0  # the scripts' default --seed
# 8 steps per epoch on the CPU: resumed at step 6, crossing epoch 1. The batches NCHW, the CPU's
# default: the pipeline refuses --channels_last (its check would say "not run"), and its run is
# among these.
VERIFY = ["--verify", "--max_steps", "12"]
# the verification's runs, as its plan numbers them (their names are
# those of their logs and folders)
RUNS = {
    "single_gpu": "01-single_gpu-1cpu-train", "data_parallel": "02-data_parallel-1cpu-train",
    "dist_parallel": "03-dist_parallel-1cpu-gloo-train", "ddp2": "04-dist_parallel-2cpu-gloo-train",
    "first_half": "05-dist_parallel-2cpu-gloo-first_half",
    "evaluate1": "06-single_gpu-1cpu-evaluate", "evaluate3": "07-dist_parallel-3cpu-gloo-evaluate",
    "fsdp": "08-fsdp-1cpu-gloo-train", "fsdp2": "09-fsdp-2cpu-gloo-train",
    "fsdp_first_half": "10-fsdp-2cpu-gloo-first_half",
    "fsdp_evaluate1": "11-single_gpu-1cpu-evaluate", "fsdp_evaluate3": "12-fsdp-3cpu-gloo-evaluate",
    # dist_parallel continuing fsdp's first half
    "resumed": "13-dist_parallel-2cpu-gloo-resumed_from_fsdp",
    # and the other way, without resharding
    "fsdp_resumed": "14-fsdp-2cpu-gloo-zero2-resumed_from_dist_parallel",
    "pipeline": "15-pipeline_parallel-2cpu-gloo-train",  # 2 stages, 2 micro-batches a step
}
# The rows of verify.json: check 1, check 2 (SyncBatchNorm's beside it), then dist_parallel's
# checks 3 to 5, then fsdp's, then the pipeline's check 6.
ROWS = ["1.", "2.", "2.", "3.", "4.", "5.", "3.", "4.", "5.", "6."]
# Every process of every launch computes on one intra-op thread: the thread count changes the order
# of float sums in a convolution, so bit-identical comparisons must not depend on the cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------------------------------ helpers
def state(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every weight, BatchNorm statistic and momentum buffer of the run's last checkpoint.pt."""
    return training_state(run_dir / "checkpoint.pt")


def assert_bit_identical(ours: dict, theirs: dict, what: str) -> None:
    assert ours.keys() == theirs.keys(), what
    differ = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not differ, f"{what}: {differ}"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("warning:")]


# --------------------------------------------------------------------------------- the verification
@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`python compare.py --verify --max_steps 12 --out OUT` on this CPU,
    once: (the finished process, OUT)."""
    out = tmp_path_factory.mktemp("verify") / "out"
    return run_script("compare.py", *VERIFY, "--out", out, timeout=900), out


def run_dir(out: Path, role: str) -> Path:
    return out / "runs" / RUNS[role]


def log(out: Path, role: str) -> str:
    return (out / "logs" / f"{RUNS[role]}.log").read_text()


def checks(out: Path) -> list[dict]:
    return json.loads((out / "verify.json").read_text())["checks"]


def test_the_verification_passes_on_the_cpu(verified):
    """Every check that can run on the CPU runs and passes; SyncBatchNorm's says why it cannot; the
    table is in verify.md and verify.json, the verdict in the exit status and the last line."""
    done, out = verified
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "verify: passed: all 9 checks (1 not run)"
    rows = checks(out)
    assert [row["check"][:2] for row in rows] == ROWS
    assert [row["verdict"] for row in rows] == ["pass", "pass", "not run", *["pass"] * 7]
    assert all("fsdp" in row["check"] for row in rows[6:9])
    assert "SyncBatchNorm" in rows[2]["check"] and "GPUs" in rows[2]["why"]
    record = json.loads((out / "verify.json").read_text())
    assert record["passed"] and [run["name"] for run in record["runs"]] == list(RUNS.values())
    assert all(run["status"] == "ok" for run in record["runs"])
    report = (out / "verify.md").read_text()
    assert ("| check | runs | measured | tolerance | verdict |" in report
            and "## Why these tolerances" in report)
    for row in rows:
        assert f"| {row['check']} |" in report
    assert sum(f"| {row['tolerance']} | pass |" in report for row in rows) == 9


# ----------------------------------------------------------------------------------- 1. one process
def test_one_process_of_every_mode_ends_bit_identical(verified):
    """Same seed, same data order, same augmentation, same arithmetic: DataParallel on the CPU, DDP
    with one rank and FSDP with one rank (every parameter a DTensor of one slice, gathered and
    reduced over a group of one) change nothing, so every weight, buffer and momentum is
    bit-identical after 12 steps (two epochs) and the reported train loss and test accuracy are
    equal (not merely close). Read from the run folders, and as check 1 says."""
    _, out = verified
    reference = state(run_dir(out, "single_gpu"))
    summaries = {mode: read_results(run_dir(out, mode))["summary"]
                 for mode in ("single_gpu", "data_parallel", "dist_parallel", "fsdp")}
    for mode in ("data_parallel", "dist_parallel", "fsdp"):
        assert_bit_identical(state(run_dir(out, mode)), reference, mode)
        for key in ("train_loss", "train_acc", "test_loss", "test_acc", "step"):
            assert summaries[mode][key] == summaries["single_gpu"][key], (mode, key)
    assert summaries["single_gpu"]["step"] == 12
    assert any(name.startswith("momentum.") for name in reference)
    dist_results = read_results(run_dir(out, "dist_parallel"))
    assert dist_results["world_size"] == 1 and dist_results["mode"] == "dist_parallel"
    assert dist_results["params_in_sync"] is True
    assert dist_results["buffers_max_abs_diff"] == 0  # one rank: nothing to differ from
    row = checks(out)[0]
    assert row["figures"]["max_abs_difference"] == \
        {"data_parallel": 0.0, "dist_parallel": 0.0, "fsdp": 0.0}
    assert row["tolerance"] == "0 (bitwise)"


# ------------------------------------------------------------------------------------- 2. two ranks
def test_ddp_and_fsdp_on_two_processes_end_bit_identical(verified):
    """DDP over 2 gloo processes (every rank the whole model, the gradients all-reduced in buckets,
    halved first) and FSDP2 over 2 (each rank a slice, the gradients reduce-scattered, halved
    first), 12 steps: every weight, BatchNorm statistic and momentum of their last checkpoints
    bit for bit (check 2). Resharding after forward or not changes nothing either: ZeRO-2
    continuing DDP's checkpoint ends on the ZeRO-3 run's state (check 5)."""
    _, out = verified
    assert_bit_identical(state(run_dir(out, "fsdp2")), state(run_dir(out, "ddp2")),
                         "fsdp vs dist_parallel")
    row = checks(out)[1]
    assert row["verdict"] == "pass" and row["runs"] == f"`{RUNS['ddp2']}`, `{RUNS['fsdp2']}`"
    assert row["figures"] == {"max_abs_difference": 0.0, "tolerance": 0.0}
    assert read_results(run_dir(out, "fsdp2"))["config"]["reshard_after_forward"] is True
    resume = checks(out)[8]
    assert resume["verdict"] == "pass" and resume["figures"]["max_abs_difference"] == 0.0


def test_two_processes_end_in_sync(verified):
    """The end-of-run sync check of every 2-process run: parameters bit-identical on both ranks."""
    _, out = verified
    results = read_results(run_dir(out, "ddp2"))
    assert results["world_size"] == 2 and results["summary"]["step"] == 12
    assert results["params_in_sync"] is True
    for row, runs in ((4, ("ddp2", "first_half", "resumed")),
                      (7, ("fsdp2", "fsdp_first_half", "fsdp_resumed"))):
        found = checks(out)[row]
        assert found["verdict"] == "pass" and found["figures"]["params_in_sync"] == {
            RUNS[role]: True for role in runs}


def test_each_mode_continues_the_others_checkpoint(verified):
    """Check 5 with both modes: dist_parallel's first half (DDP, whole tensors on every rank)
    continued by fsdp without resharding, and fsdp's first half (each rank a slice, gathered onto
    rank 0's CPU) continued by dist_parallel, each with --resume auto in the other's run folder,
    each writing its steps from step 7 on into an event file of its own. Both end on the
    uninterrupted runs' state, and their last checkpoints, one written by FSDP and one by DDP, are
    the same file's contents: the same entries, the optimizer's state keyed by position as torch
    keys it, every tensor bit for bit."""
    _, out = verified
    zero2 = run_dir(out, "first_half")  # where fsdp continued dist_parallel's first half
    results = read_results(zero2)
    assert results["mode"] == "fsdp" and results["config"]["reshard_after_forward"] is False
    assert first_step_written(zero2) > 6 and first_step_written(run_dir(out, "fsdp_first_half")) > 6
    assert log(out, "resumed").splitlines()[0].endswith(
        f"--run_name {RUNS['fsdp_first_half']} --resume auto --nproc_per_node 2")
    assert_bit_identical(state(zero2), state(run_dir(out, "fsdp2")),
                         "ZeRO-2 from DDP's half vs fsdp")
    by_fsdp, by_ddp = (torch.load(run_dir(out, role) / "checkpoint.pt", weights_only=True)
                       for role in ("first_half", "fsdp_first_half"))
    assert by_ddp.keys() == by_fsdp.keys()
    assert by_ddp["progress"]["step"] == by_fsdp["progress"]["step"] == 12
    assert_bit_identical(by_fsdp["model"], by_ddp["model"], "model")
    assert by_fsdp["optimizer"]["param_groups"] == by_ddp["optimizer"]["param_groups"]
    parameters = len(by_ddp["optimizer"]["param_groups"][0]["params"])
    assert list(by_fsdp["optimizer"]["state"]) == \
        list(range(parameters)) == list(by_ddp["optimizer"]["state"])
    for index, entry in by_ddp["optimizer"]["state"].items():
        assert_bit_identical(by_fsdp["optimizer"]["state"][index], entry,
                             f"optimizer state {index}")
    assert all(tensor.device.type == "cpu" for tensor in by_fsdp["model"].values())


# ------------------------------------------------------------------------------------ 3. evaluation
@pytest.mark.parametrize("mode, trained, evaluations, row", [
    ("dist_parallel", "ddp2", ((1, "evaluate1"), (3, "evaluate3")), 3),
    ("fsdp", "fsdp2", ((1, "fsdp_evaluate1"), (3, "fsdp_evaluate3")), 6)])
def test_evaluation_is_exact_for_one_two_and_three_processes(
        verified, mode, trained, evaluations, row):
    """Each 2-process run's checkpoint evaluated by 1 (single_gpu --evaluate), 2 (the run's own
    end-of-run evaluation) and 3 processes (--evaluate; a batch of 51 over 3 ranks, 17 each: shards
    of 18, 18 and 17, so one rank runs a batch fewer, and fsdp gives it an empty one to keep the
    ranks' gathers in step): each rank takes every world_size-th of the 53 test images (no
    DistributedSampler padding, which would count some twice) and the sums are all-reduced, so the
    accuracy is identical and the loss equal up to the order of float64 sums. Each printed
    "(53 images)"."""
    _, out = verified
    checkpoint = run_dir(out, trained) / "checkpoint.pt"
    summaries = {2: read_results(run_dir(out, trained))["summary"]}
    assert any("test loss" in line and "(53 images)" in line
               for line in log(out, trained).splitlines())
    for processes, role in evaluations:
        printed = [line for line in log(out, role).splitlines()
                   if line.startswith(f"{checkpoint}: test loss")]
        assert len(printed) == 1 and printed[0].endswith("(53 images)"), log(out, role)
        results = read_results(run_dir(out, role))
        assert results["world_size"] == processes and results["summary"]["test_images"] == 53
        summaries[processes] = results["summary"]
    for processes in summaries:
        assert summaries[processes]["test_acc"] == summaries[1]["test_acc"], processes
        assert summaries[processes]["test_loss"] == \
            pytest.approx(summaries[1]["test_loss"], rel=1e-6)
    found = checks(out)[row]
    assert found["check"].startswith(f"3. {mode}") and found["verdict"] == "pass"
    assert (found["figures"]["test_images"] == 53
            and set(found["figures"]["images"].values()) == {53})
    assert log(out, evaluations[-1][1]).splitlines()[0].endswith("--batch_size 51")


def test_reported_test_numbers_are_those_of_the_saved_weights(verified):
    """What a 2-process training run reports as its test loss and accuracy is the evaluation of the
    weights it saved, as in single_gpu (where --evaluate reproduces the report): the report
    describes the weights a user keeps, not a mix of the ranks' BatchNorm running statistics."""
    _, out = verified
    reported = read_results(run_dir(out, "ddp2"))["summary"]
    evaluated = read_results(run_dir(out, "evaluate1"))["summary"]
    assert reported["test_acc"] == evaluated["test_acc"]
    assert reported["test_loss"] == pytest.approx(evaluated["test_loss"], rel=1e-6)


# ---------------------------------------------------------------------------------------- 5. resume
def test_a_resumed_self_launch_ends_bit_identical_to_torchrun(verified):
    """The 2-process run under `torchrun --standalone`, and the same run as two halves each started
    by `python <mode>/train.py --nproc_per_node 2` (the second with --resume auto; dist_parallel's
    second half continues fsdp's first, in its folder): bit-identical state and the same reported
    numbers. So the self-launch is torchrun, and a stop and resume changes nothing (check 5)."""
    _, out = verified
    assert "-m torch.distributed.run --standalone --nproc_per_node 2 " in \
        log(out, "ddp2").splitlines()[0]
    for half in ("first_half", "resumed"):
        command = log(out, half).splitlines()[0]
        assert (command.startswith(f"$ {sys.executable} {REPO / DIST} ")
                and command.endswith(" --nproc_per_node 2"))
    # the second half continued fsdp's first half's run folder
    resumed = run_dir(out, "fsdp_first_half")
    assert_bit_identical(state(resumed), state(run_dir(out, "ddp2")),
                         "resumed self-launch vs torchrun")
    ours, theirs = read_results(resumed), read_results(run_dir(out, "ddp2"))
    for key in ("train_loss", "train_acc", "test_loss", "test_acc", "step"):
        assert ours["summary"][key] == theirs["summary"][key], key
    assert ours["params_in_sync"] == theirs["params_in_sync"] is True
    assert checks(out)[5]["verdict"] == "pass"


# -------------------------------------------------------------------------------------- 6. pipeline
def test_the_pipeline_ends_with_ddps_weights_and_momentum_bit_for_bit(verified):
    """pipeline_parallel on two stages under torchrun, `--microbatches 2` (micro-batch m DDP's rank
    m's images), 12 steps: every weight and momentum buffer of its checkpoint is DDP's 2-process
    run's, bit for bit (check 6). Its BatchNorm statistics are not, and the row says by how much
    and why: each BatchNorm of the pipeline was updated once a micro-batch, twice a step; DDP's
    once a step, rank 0's saved."""
    _, out = verified
    command = log(out, "pipeline").splitlines()[0]
    assert "-m torch.distributed.run --standalone --nproc_per_node 2 " in command
    assert f"{REPO / 'pipeline_parallel' / 'train.py'} " in command
    assert command.endswith(" --microbatches 2")
    pipe, ddp = state(run_dir(out, "pipeline")), state(run_dir(out, "ddp2"))
    statistics = [name for name in ddp if name.endswith((".running_mean", ".running_var",
                                                         ".num_batches_tracked"))]
    assert statistics and pipe.keys() == ddp.keys()
    assert_bit_identical({n: v for n, v in pipe.items() if n not in statistics},
                         {n: v for n, v in ddp.items() if n not in statistics}, "pipeline vs DDP")
    tracked = [name for name in statistics if name.endswith(".num_batches_tracked")]
    updates = {run: {int(tensors[name]) for name in tracked}
               for run, tensors in (("pipeline", pipe), ("ddp", ddp))}
    assert updates == {"pipeline": {24}, "ddp": {12}}  # 12 steps, of 2 micro-batches each
    apart = max((pipe[n] - ddp[n]).abs().max().item() for n in statistics if n not in tracked)
    row = checks(out)[9]
    assert row["verdict"] == "pass" and row["runs"] == f"`{RUNS['ddp2']}`, `{RUNS['pipeline']}`"
    assert row["figures"]["max_abs_difference"] == 0.0 and row["tolerance"] == "0 (bitwise)"
    assert 0 < apart == row["figures"]["batchnorm_statistics_max_abs_difference"]
    assert (f"differ by up to {apart:.3g}, as each BatchNorm was updated 24 times in the "
            "pipeline (once a micro-batch) and 12 in DDP") in row["measured"]
    assert "- Check 6: " in (out / "verify.md").read_text()


# -------------------------------------------------------------------------------- 7. failing checks
def verification_of(out: Path) -> tuple[Verification, dict[str, Outcome]]:
    """The fixture's verification planned again in this process, over `out`, with each run's outcome
    read back from its run folder and log: what compare.py judged, to judge again."""
    cc, train, dist_flags, cuda = compare.configure(VERIFY)
    verification = Verification(cc, train, dist_flags, cuda, out)
    outcomes = {launch.name: Outcome(launch.run, "ok",
                                     results=read_results(out / "runs" / launch.run_dir),
                                     log=out / "logs" / f"{launch.name}.log")
                for launch in verification.launches.values()}
    return verification, outcomes


def nudge(checkpoint: Path, name: str, by: float | None = None) -> None:
    """One element of one weight in a checkpoint.pt moved by `by`, or by one float32 ulp."""
    saved = torch.load(checkpoint, weights_only=True)
    tensor = saved["model"][name]
    value = tensor.flatten().clone()  # a convolution's channels_last weight has no flat view
    value[0] = value[0] + by if by else torch.nextafter(value[0], torch.tensor(float("inf")))
    saved["model"][name] = value.reshape(tensor.shape)
    torch.save(saved, checkpoint)


def test_each_check_fails_when_what_it_checks_is_broken(verified, tmp_path):
    """The verdicts judged again in-process on a copy of the run's files, each check broken on
    purpose: one weight of data_parallel's checkpoint one ulp off (check 1); one parameter of each
    2-process checkpoint off by 1e-4 (check 5 of both modes, against the resumed run; check 6,
    the pipeline against DDP's; check 2, which holds the two to each other, only once one of them
    alone is off);
    each 3-process evaluation one image better (check 3); a run of each mode that reported its
    ranks out of sync (check 4); a resumed run whose event file shows it began afresh (check 5).
    Each row fails with the figure that broke it."""
    _, out = verified
    copied = shutil.copytree(out, tmp_path / "out")
    verification, outcomes = verification_of(copied)
    nudge(copied / "runs" / RUNS["data_parallel"] / "checkpoint.pt", "conv1.weight")
    for trained in ("ddp2", "fsdp2"):
        nudge(copied / "runs" / RUNS[trained] / "checkpoint.pt", "fc.bias", by=1e-4)
    for evaluation in ("evaluate3", "fsdp_evaluate3"):
        outcomes[RUNS[evaluation]].results["summary"]["test_acc"] += 1 / 53
    for apart in ("resumed", "fsdp_resumed"):
        outcomes[RUNS[apart]].results["params_in_sync"] = False
    rows = verification.judge(outcomes)
    assert [row.verdict for row in rows] == ["FAIL", "pass", "not run", *["FAIL"] * 7]
    one_ulp = rows[0].figures["max_abs_difference"]["data_parallel"]
    assert 0 < one_ulp < 1e-6 and rows[0].figures["max_abs_difference"]["dist_parallel"] == 0
    assert rows[1].figures["max_abs_difference"] == 0  # both 2-process runs moved alike
    for check in (5, 8, 9):  # check 5 of dist_parallel and of fsdp, check 6
        assert rows[check].figures["max_abs_difference"] == \
            pytest.approx(1e-4, rel=1e-2), rows[check].check
    for check in (3, 6):
        assert f"largest difference {100 / 53:.3g} points" in rows[check].measured
    assert f"(not in {RUNS['resumed']})" in rows[4].measured
    assert f"(not in {RUNS['fsdp_resumed']})" in rows[7].measured
    # check 2 alone: only DDP's checkpoint moved
    nudge(copied / "runs" / RUNS["ddp2"] / "checkpoint.pt", "fc.bias", by=1e-4)
    moved = verification.modes_agree(verification.settings[0], outcomes)
    assert moved.verdict == "FAIL" and moved.figures["max_abs_difference"] == \
        pytest.approx(1e-4, rel=1e-2)
    # a second half that began afresh: its own event file starts at step 5
    zero2 = copied / "runs" / RUNS["first_half"]
    for events in zero2.glob("events.out.tfevents.*"):
        shutil.copy(next(run_dir(copied, "fsdp2").glob("events.out.tfevents.*")), events)
    afresh = verification.resumed(verification.settings[0], "fsdp", outcomes)
    assert afresh.verdict == "FAIL" and "did not continue the first half" in afresh.why


def test_a_failed_run_fails_the_checks_that_need_it_naming_its_log(verified):
    """dist_parallel's 2-process run failed (the runs that read its checkpoint then do not start):
    check 2, dist_parallel's checks 3 to 5 and check 6 fail with its error and its log; check 1
    and fsdp's checks still pass; the summary names every failed check."""
    _, out = verified
    verification, outcomes = verification_of(out)
    error = "exit status 1: error: the process group failed"
    outcomes[RUNS["ddp2"]] = Outcome(outcomes[RUNS["ddp2"]].run, "failed", 3.0, error,
                                     log=Path("unused"))
    for role in ("evaluate1", "evaluate3"):
        outcomes[RUNS[role]] = Outcome(outcomes[RUNS[role]].run, "not run",
                                       error=f"needs {RUNS['ddp2']}")
    rows = verification.judge(outcomes)
    assert [row.verdict for row in rows] == \
        ["pass", "FAIL", "not run", "FAIL", "FAIL", "FAIL", *["pass"] * 3, "FAIL"]
    for row in (rows[1], rows[4], rows[5], rows[9]):
        assert row.why == f"`{RUNS['ddp2']}` failed: {error} (log: `logs/{RUNS['ddp2']}.log`)"
    assert rows[3].why.startswith(f"`{RUNS['evaluate1']}` not run")
    assert summary_line(rows) == ("FAILED: 5 of 9 checks (1 not run): " + "; ".join(
        rows[i].check for i in (1, 3, 4, 5, 9)))


# Runs that fail, from outside (a sitecustomize module every Python process on
# PYTHONPATH imports): single_gpu and data_parallel exit at once, as a run that cannot
# start does, before they import torch.
FAILING_RUNS = textwrap.dedent("""
    import os, sys
    if sys.argv and sys.argv[0].endswith(("single_gpu/train.py", "data_parallel/train.py")):
        print("error: injected failure", file=sys.stderr, flush=True)
        os._exit(3)
""")


def test_the_verification_fails_naming_the_check_and_the_log_when_its_runs_fail(
        tmp_path, monkeypatch, capsys):
    """compare.py --verify (called as its __main__ calls it) on single_gpu and data_parallel alone,
    both made to fail: check 1 fails with the first run's error and log, the others say they did
    not run, the exit status is 1 and the last line names the check. (Each check failing on its
    figures: the in-process tests above.)"""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAILING_RUNS)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    out = tmp_path / "out"
    code = compare.main([*VERIFY, "--modes", "single_gpu", "data_parallel", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert code == 1, printed
    assert printed[-1] == ("verify: FAILED: 1 of 1 checks (9 not run): 1. one device: every mode "
                           "ends with the same weights and momentum")
    row = checks(out)[0]
    log = "logs/01-single_gpu-1cpu-train.log"
    assert row["verdict"] == "FAIL" and row["why"] == (
        f"`01-single_gpu-1cpu-train` failed: exit status 3: error: injected failure (log: `{log}`)")
    assert (out / log).read_text().startswith(f"$ {sys.executable} "
                                              f"{REPO / 'single_gpu' / 'train.py'} ")
    assert [r["verdict"] for r in checks(out)[1:]] == ["not run"] * 9
    assert f"**FAIL**: {row['why']}" in (out / "verify.md").read_text()


# ---------------------------------------------------------------------------------- 8. bad launches
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="refused only on a machine without CUDA")


@pytest.mark.parametrize("flags, named", [
    pytest.param(["--nproc_per_node", "3", "--batch_size", "32"], "does not split",
                 id="batch-not-dividing"),
    pytest.param(["--nproc_per_node", "2", "--sync_bn"], "SyncBatchNorm", id="sync-bn-on-cpu",
                 marks=needs_no_gpu),
    pytest.param(["--nproc_per_node", "2", "--backend", "nccl"], "nccl", id="nccl-without-gpus",
                 marks=needs_no_gpu),
])
def test_a_launch_that_cannot_work_is_refused_before_workers_start(tmp_path, flags, named):
    """One `error: ...` line naming the problem, a non-zero exit, no traceback, and no run folder:
    `python dist_parallel/train.py` refuses it as a user meets it."""
    done = run_script(DIST, *TINY, "--log_dir", tmp_path / "runs",
                      "--run_name", "refused", *flags)
    assert done.returncode != 0
    errors = [line for line in error_lines(done.stderr) if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert named in errors[0], errors[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs" / "refused").exists()
