"""data_parallel/ and dist_parallel/ proven against single_gpu/ and against each other, on the CPU.

Most of it is `python compare.py --verify`, run once as a user runs it (the CPU matrix:
tiny model, N = 2 gloo processes, 12 steps), whose checks are read back here, each
beside the run folders it judged:

- one process of every mode is the same computation: single_gpu, data_parallel and one-process
  dist_parallel end with bit-identical weights, losses and accuracies;
- two DDP processes compute what a single process computes when it averages the losses of the two
  per-rank shares of every global batch, each share normalised by BatchNorm alone
  (comparison.verify_reference.reference_training, the reference the verification itself uses):
  bit-identical, as halving and a sum of two are exact;
- the ranks end with bit-identical parameters and differing BatchNorm statistics;
- evaluation is exact for 1, 2 and 3 processes (53 test images, which neither 2 nor 3 divides), and
  the test numbers a 2-process run reports are those of the weights it saves;
- a run stopped halfway and resumed ends bit-identical to the uninterrupted one, and the self-launch
  (`python dist_parallel/train.py --nproc_per_node 2`, which ran the two halves) is `torchrun
  --standalone` (which ran the uninterrupted run);
- each check fails on purpose when what it checks is broken (judged again in-process on the run's
  own files, perturbed: a weight one float32 ulp off fails check 1), and when a run it needs failed,
  naming the run's log; then compare.py exits non-zero and names the check in its last line.

Besides: a launch that cannot work is refused with one line before any worker starts. Two
torchrun "nodes" on one host, the guards, the sync check and DistributedSampler's shards
are in tests/test_process_group.py.

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
- One GPU per rank: setup taking the LOCAL_RANK-th of `CheckedLaunch.node_gpus`,
  `torch.cuda.set_device`, and per-rank telemetry.
- A dead NCCL peer: that NCCL's watchdog, set to abort the communicators without killing the
  process, lets the main thread print its one line. Here only the setting is checked (and
  reasoned from PyTorch's source).
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
from comparison.verify_checks import config_of
from comparison.verify_reference import reference_training
from conftest import REPO, TINY, read_results, refuse_in_process, run_script

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

DIST = "dist_parallel/train.py"
SEED = 0  # the scripts' default --seed
# 8 steps per epoch on the CPU: resumed at step 6, crossing epoch 1. The channels stored aligned and
# the batches NHWC, as a GPU's defaults have them: every mode's padded storage, fsdp's (out, kh, kw,
# in) weights and the checkpoints that cross between them are held to the checks' bit-for-bit
# tolerances (and the aligned model to the unaligned one's training by
# tests/test_aligned_channels.py).
VERIFY = ["--verify", "--max_steps", "12", "--align_channels", "8", "--channels_last"]
# the verification's runs, as its plan numbers them (their names are
# those of their logs and folders)
RUNS = {
    "single_gpu": "01-single_gpu-1cpu-train", "data_parallel": "02-data_parallel-1cpu-train",
    "dist_parallel": "03-dist_parallel-1cpu-gloo-train", "ddp2": "04-dist_parallel-2cpu-gloo-train",
    "first_half": "05-dist_parallel-2cpu-gloo-first_half",
    "evaluate1": "06-single_gpu-1cpu-evaluate", "fsdp": "07-fsdp-1cpu-gloo-train",
    "fsdp2": "08-fsdp-2cpu-gloo-train", "fsdp_first_half": "09-fsdp-2cpu-gloo-first_half",
    "fsdp_evaluate1": "10-single_gpu-1cpu-evaluate", "fsdp_evaluate3": "11-fsdp-3cpu-gloo-evaluate",
    # dist_parallel continuing fsdp's first half
    "resumed": "12-dist_parallel-2cpu-gloo-resumed_from_fsdp",
    # and the other way, without resharding
    "fsdp_resumed": "13-fsdp-2cpu-gloo-zero2-resumed_from_dist_parallel",
}
# The rows of verify.json: check 1, dist_parallel's checks 2 to 5
# (SyncBatchNorm's beside its 2), then fsdp's.
ROWS = ["1.", "2.", "2.", "3.", "4.", "5.", "2.", "3.", "4.", "5."]
# Every process of every launch computes on one intra-op thread: the thread count changes the order
# of float sums in a convolution, so bit-identical comparisons must not depend on the cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------------------------------ helpers
def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


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
    return run_script("compare.py", *VERIFY, "--out", out, timeout=600), out


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
    assert all("fsdp" in row["check"] for row in rows[6:])
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
    reduced over a group of one) change nothing, so every weight and buffer is bit-identical after
    12 steps (two epochs) and the reported train loss and test accuracy are equal (not merely
    close). Read from the run folders, and as check 1 says."""
    _, out = verified
    reference = weights(run_dir(out, "single_gpu"))
    summaries = {mode: read_results(run_dir(out, mode))["summary"]
                 for mode in ("single_gpu", "data_parallel", "dist_parallel", "fsdp")}
    for mode in ("data_parallel", "dist_parallel", "fsdp"):
        assert_bit_identical(weights(run_dir(out, mode)), reference, mode)
        for key in ("train_loss", "train_acc", "test_loss", "test_acc", "steps"):
            assert summaries[mode][key] == summaries["single_gpu"][key], (mode, key)
    assert summaries["single_gpu"]["steps"] == 12
    dist_results = read_results(run_dir(out, "dist_parallel"))
    assert dist_results["world_size"] == 1 and dist_results["mode"] == "dist_parallel"
    assert dist_results["summary"]["params_in_sync"] is True
    assert dist_results["summary"]["buffers_max_abs_diff"] == 0  # one rank: nothing to differ from
    row = checks(out)[0]
    assert row["figures"]["max_abs_difference"] == \
        {"data_parallel": 0.0, "dist_parallel": 0.0, "fsdp": 0.0}
    assert row["tolerance"] == "0 (bitwise)"


# ------------------------------------------------------------------------------------- 2. two ranks
def test_the_reference_reproduces_a_one_process_run(verified):
    """The product's reference, with one rank and the single_gpu run's own config, is that run's
    training bit for bit: its seeding, data order, augmentation, normalisation, optimizer and
    schedule are train.py's, so the two-rank comparison of check 2 tests DDP alone."""
    _, out = verified
    cfg = config_of(read_results(run_dir(out, "single_gpu"))["config"])
    ours = reference_training(cfg, world_size=1, device=torch.device("cpu"))
    theirs = weights(run_dir(out, "single_gpu"))
    assert_bit_identical(ours, {name: theirs[name] for name in ours}, "reference vs single_gpu")


def test_two_processes_match_the_single_process_reference(verified):
    """DDP over 2 gloo processes, 12 steps: every parameter equals, bit for bit, a single process
    averaging the two ranks' share losses, each share normalised by BatchNorm alone (check 2,
    computed by compare.py with comparison.verify_reference.reference_training). So the gradient
    all-reduce averages exactly the ranks' gradients, and each rank saw its DistributedSampler
    share. Buffers are not compared: each rank's running statistics come from its own share."""
    _, out = verified
    row = checks(out)[1]
    assert row["verdict"] == "pass" and row["runs"].startswith(f"`{RUNS['ddp2']}`")
    assert row["figures"] == {"max_abs_difference": 0.0, "tolerance": 0.0}


def test_two_processes_end_in_sync_with_differing_batchnorm_statistics(verified):
    """The end-of-run sync check: parameters bit-identical on both ranks; BatchNorm running
    statistics differ (each rank's BatchNorm saw only its share), and the report says so."""
    _, out = verified
    results = read_results(run_dir(out, "ddp2"))
    assert results["world_size"] == 2 and results["summary"]["steps"] == 12
    assert results["summary"]["params_in_sync"] is True
    assert results["summary"]["buffers_max_abs_diff"] > 0
    assert "parameter tensors identical on 2 ranks" in log(out, "ddp2")
    assert "global batch 32 = 2 x 16 over gloo" in log(out, "ddp2")
    row = checks(out)[4]
    assert row["verdict"] == "pass" and set(row["figures"]["params_in_sync"]) == {
        RUNS["ddp2"], RUNS["first_half"], RUNS["resumed"]}


# ----------------------------------------------------------------------------------------- 2b. fsdp
def test_fsdp_on_two_processes_computes_what_ddp_computes(verified):
    """FSDP2 over 2 gloo processes, 12 steps: the reference's parameters bit for bit (check 2), as
    DDP's are: each rank's gradient slice is the average of the two ranks' (halved, then summed:
    exact). Resharding after forward or not changes nothing either: ZeRO-2 continuing DDP's
    checkpoint ends on the ZeRO-3 run's weights (check 5)."""
    _, out = verified
    rows = dict(zip(("reference", "evaluation", "sync", "resume"), checks(out)[6:]))
    assert rows["reference"]["runs"].startswith(f"`{RUNS['fsdp2']}`")
    for name in ("reference", "resume"):
        assert (rows[name]["verdict"] == "pass"
                and rows[name]["figures"]["max_abs_difference"] == 0.0), name
    assert_bit_identical(weights(run_dir(out, "fsdp2")), weights(run_dir(out, "ddp2")),
                         "fsdp vs dist_parallel")
    assert read_results(run_dir(out, "fsdp2"))["config"]["reshard_after_forward"] is True
    assert set(rows["sync"]["figures"]["params_in_sync"]) == {
        RUNS["fsdp2"], RUNS["fsdp_first_half"], RUNS["fsdp_resumed"]}
    assert ("all 31 parameter tensors, each gathered whole from its "
            "slices, identical on 2 ranks" in log(out, "fsdp2"))


def test_each_mode_continues_the_others_checkpoint(verified):
    """Check 5 with both modes: dist_parallel's first half (DDP, whole tensors on every rank)
    continued by fsdp without resharding, and fsdp's first half (each rank a slice, gathered onto
    rank 0's CPU) continued by dist_parallel, each with --resume auto in the other's run folder.
    Both end on the uninterrupted runs' weights, and their last checkpoints, one written by FSDP and
    one by DDP, are the same file's contents: the same entries, the optimizer's state keyed by
    position as torch keys it, every tensor bit for bit."""
    _, out = verified
    zero2 = run_dir(out, "first_half")  # where fsdp continued dist_parallel's first half
    results = read_results(zero2)
    assert results["mode"] == "fsdp" and results["config"]["reshard_after_forward"] is False
    assert f"resumed at step 6 (epoch 1, batch 6) from {zero2 / 'checkpoint.pt'}" in \
        log(out, "fsdp_resumed")
    assert log(out, "resumed").splitlines()[0].endswith(
        f"--run_name {RUNS['fsdp_first_half']} --resume auto --save_model")
    assert_bit_identical(weights(zero2), weights(run_dir(out, "fsdp2")),
                         "ZeRO-2 from DDP's half vs fsdp")
    by_fsdp, by_ddp = (torch.load(run_dir(out, role) / "checkpoint.pt", weights_only=True)
                       for role in ("first_half", "fsdp_first_half"))
    assert by_ddp.keys() == by_fsdp.keys() and by_ddp["step"] == by_fsdp["step"] == 12
    assert_bit_identical(by_fsdp["model"], by_ddp["model"], "model")
    assert by_fsdp["optimizer"]["param_groups"] == by_ddp["optimizer"]["param_groups"]
    assert list(by_fsdp["optimizer"]["state"]) == \
        list(range(31)) == list(by_ddp["optimizer"]["state"])
    for index, state in by_ddp["optimizer"]["state"].items():
        assert_bit_identical(by_fsdp["optimizer"]["state"][index], state,
                             f"optimizer state {index}")
    assert all(tensor.device.type == "cpu" for tensor in by_fsdp["model"].values())


# ------------------------------------------------------------------------------------- 3. two nodes
# ------------------------------------------------------------------------------------ 4. evaluation
@pytest.mark.parametrize("mode, trained, evaluations, row", [
    ("dist_parallel", "ddp2", ((1, "evaluate1"),), 3),
    ("fsdp", "fsdp2", ((1, "fsdp_evaluate1"), (3, "fsdp_evaluate3")), 7)])
def test_evaluation_is_exact_for_one_two_and_three_processes(
        verified, mode, trained, evaluations, row):
    """Each 2-process run's model.pt evaluated by 1 (single_gpu --evaluate), 2 (the run's own
    end-of-run evaluation) and, fsdp's, 3 processes (--evaluate; a batch of 51 over 3 ranks, 17
    each: shards of 18, 18 and 17, so one rank runs a batch fewer and fsdp gives it an empty one to
    keep the ranks' gathers in step; the evaluation is the same lines in both modes' train.py): each
    rank takes every world_size-th of the 53 test images (no DistributedSampler padding, which would
    count some twice) and the sums are all-reduced, so the accuracy is identical and the loss equal
    up to the order of float64 sums. Each printed "(53 images)"."""
    _, out = verified
    model = run_dir(out, trained) / "model.pt"
    summaries = {2: read_results(run_dir(out, trained))["summary"]}
    assert any("test loss" in line and line.endswith("(53 images)") or "(53 images) epoch" in line
               for line in log(out, trained).splitlines())
    for processes, role in evaluations:
        printed = [line for line in log(out, role).splitlines()
                   if line.startswith(f"{model}: test loss")]
        assert len(printed) == 1 and printed[0].endswith("(53 images)"), log(out, role)
        results = read_results(run_dir(out, role))
        assert results["world_size"] == processes and results["summary"]["steps"] == 0
        summaries[processes] = results["summary"]
    for processes in summaries:
        assert summaries[processes]["test_acc"] == summaries[1]["test_acc"], processes
        assert summaries[processes]["test_loss"] == \
            pytest.approx(summaries[1]["test_loss"], rel=1e-6)
    found = checks(out)[row]
    assert found["check"].startswith(f"3. {mode}") and found["verdict"] == "pass"
    assert (found["figures"]["test_images"] == 53
            and set(found["figures"]["images"].values()) == {53})
    if mode == "fsdp":
        assert log(out, "fsdp_evaluate3").splitlines()[0].endswith("--batch_size 51")


def test_reported_test_numbers_are_those_of_the_saved_weights(verified):
    """What a 2-process training run reports as its test loss and accuracy is the evaluation of the
    model.pt it saved, as in single_gpu (where --evaluate reproduces the report): the report
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
    second half continues fsdp's first, in its folder): bit-identical weights and the same reported
    numbers. So the self-launch is torchrun, and a stop and resume changes nothing (check 5)."""
    _, out = verified
    assert "-m torch.distributed.run --standalone --nproc_per_node 2 " in \
        log(out, "ddp2").splitlines()[0]
    for half in ("first_half", "resumed"):
        command = log(out, half).splitlines()[0]
        assert (command.startswith(f"$ {sys.executable} {REPO / DIST} ")
                and " --nproc_per_node 2 " in command)
    assert "resumed at step 6 (epoch 1, batch 6)" in log(out, "resumed")
    # the second half continued fsdp's first half's run folder
    resumed = run_dir(out, "fsdp_first_half")
    assert_bit_identical(weights(resumed), weights(run_dir(out, "ddp2")),
                         "resumed self-launch vs torchrun")
    ours, theirs = read_results(resumed)["summary"], read_results(run_dir(out, "ddp2"))["summary"]
    for key in ("train_loss", "train_acc", "test_loss", "test_acc", "steps",
                "buffers_max_abs_diff"):
        assert ours[key] == theirs[key], key
    assert checks(out)[5]["verdict"] == "pass"


# -------------------------------------------------------------------------------- 6. failing checks
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


def nudge(model: Path, name: str, by: float | None = None) -> None:
    """One element of one tensor in a model.pt moved by `by`, or by one float32 ulp."""
    state = torch.load(model, weights_only=True)
    value = state[name].view(-1)
    value[0] = value[0] + by if by else torch.nextafter(value[0], torch.tensor(float("inf")))
    torch.save(state, model)


def test_each_check_fails_when_what_it_checks_is_broken(verified, tmp_path):
    """The verdicts judged again in-process on a copy of the run's files, each check broken on
    purpose: one weight of data_parallel's model.pt one ulp off (check 1); one parameter of each
    2-process model.pt off by 1e-4 (checks 2 and 5 of both modes, against the reference and the
    resumed run, and check 6, which ends on DDP's weights); each 3-process evaluation one image
    better (check 3); a run of each mode that reported its ranks out of sync (check 4). Each row
    fails with the figure that broke it."""
    _, out = verified
    copied = shutil.copytree(out, tmp_path / "out")
    verification, outcomes = verification_of(copied)
    nudge(copied / "runs" / RUNS["data_parallel"] / "model.pt", "conv1.weight")
    for trained in ("ddp2", "fsdp2"):
        nudge(copied / "runs" / RUNS[trained] / "model.pt", "fc.bias", by=1e-4)
    for evaluation in ("evaluate1", "fsdp_evaluate3"):
        outcomes[RUNS[evaluation]].results["summary"]["test_acc"] += 1 / 53
    for apart in ("resumed", "fsdp_resumed"):
        outcomes[RUNS[apart]].results["summary"]["params_in_sync"] = False
    rows = verification.judge(outcomes)
    assert [row.verdict for row in rows] == ["FAIL", "FAIL", "not run", *["FAIL"] * 7]
    one_ulp = rows[0].figures["max_abs_difference"]["data_parallel"]
    assert 0 < one_ulp < 1e-6 and rows[0].figures["max_abs_difference"]["dist_parallel"] == 0
    for check in (1, 5, 6, 9):  # checks 2 and 5 of dist_parallel and of fsdp
        assert rows[check].figures["max_abs_difference"] == \
            pytest.approx(1e-4, rel=1e-2), rows[check].check
    for check in (3, 7):
        assert f"largest difference {100 / 53:.3g} points" in rows[check].measured
    assert f"(not in {RUNS['resumed']})" in rows[4].measured
    assert f"(not in {RUNS['fsdp_resumed']})" in rows[8].measured


def test_a_failed_run_fails_the_checks_that_need_it_naming_its_log(verified):
    """dist_parallel's 2-process run failed (the run that reads its model.pt then does not start):
    its checks 2 to 5 fail with its error and its log; check 1 and fsdp's checks still pass; the
    summary names every failed check."""
    _, out = verified
    verification, outcomes = verification_of(out)
    error = ("exit status 1: error: the ranks hold different parameters (named above): "
             "their training diverged")
    outcomes[RUNS["ddp2"]] = Outcome(outcomes[RUNS["ddp2"]].run, "failed", 3.0, error,
                                     log=Path("unused"))
    for role in ("evaluate1",):
        outcomes[RUNS[role]] = Outcome(outcomes[RUNS[role]].run, "not run",
                                       error=f"needs {RUNS['ddp2']}")
    rows = verification.judge(outcomes)
    assert [row.verdict for row in rows] == \
        ["pass", "FAIL", "not run", "FAIL", "FAIL", "FAIL", *["pass"] * 4]
    for row in (rows[1], rows[4], rows[5]):
        assert row.why == f"`{RUNS['ddp2']}` failed: {error} (log: `logs/{RUNS['ddp2']}.log`)"
    assert rows[3].why.startswith(f"`{RUNS['evaluate1']}` not run")
    assert summary_line(rows) == ("FAILED: 4 of 9 checks (1 not run): " + "; ".join(
        rows[i].check for i in (1, 3, 4, 5)))


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
                           "ends with the same weights")
    row = checks(out)[0]
    log = "logs/01-single_gpu-1cpu-train.log"
    assert row["verdict"] == "FAIL" and row["why"] == (
        f"`01-single_gpu-1cpu-train` failed: exit status 3: error: injected failure (log: `{log}`)")
    assert (out / log).read_text().startswith(f"$ {sys.executable} "
                                              f"{REPO / 'single_gpu' / 'train.py'} ")
    assert [r["verdict"] for r in checks(out)[1:]] == ["not run"] * 9
    assert f"**FAIL**: {row['why']}" in (out / "verify.md").read_text()


# ---------------------------------------------------------------------------------- 7. bad launches
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="refused only on a machine without CUDA")


@pytest.mark.parametrize("flags, named", [
    pytest.param(["--nproc_per_node", "3", "--batch_size", "32"], "does not divide",
                 id="batch-not-dividing"),
    pytest.param(["--nproc_per_node", "2", "--sync_bn"], "SyncBatchNorm", id="sync-bn-on-cpu",
                 marks=needs_no_gpu),
    pytest.param(["--nproc_per_node", "2", "--backend", "nccl"], "nccl", id="nccl-without-gpus",
                 marks=needs_no_gpu),
])
def test_a_launch_that_cannot_work_is_refused_before_workers_start(tmp_path, flags, named):
    """One `error: ...` line naming the problem, a non-zero exit, no traceback, no worker output,
    and no run folder: the self-launch checks what it can before starting torch's elastic
    launcher. (In this process through the script's main(); tests/test_bad_input.py refuses a
    dist_parallel launch as a subprocess.)"""
    done = refuse_in_process(DIST, *TINY, "--log_dir", tmp_path / "runs", "--run_name", "refused",
                             *flags)
    assert done.returncode != 0
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: "), done.stderr
    assert named in errors[0], errors[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------- 8. guards and the sync check
