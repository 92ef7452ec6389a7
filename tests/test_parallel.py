"""data_parallel/ and dist_parallel/ proven against single_gpu/ and against each other, on the CPU.

What these tests prove, each launch run the way a user runs it (a subprocess, gloo between CPU processes):

- one process of every mode is the same computation: single_gpu, data_parallel and one-process dist_parallel end
  with bit-identical weights, losses and accuracies;
- two DDP processes compute what a single process computes when it averages the losses of the two per-rank
  shares of every global batch (BatchNorm normalising each share separately): DDP's gradient all-reduce is exact;
- the ranks end with bit-identical parameters, and the sync check would name a parameter that differed;
- two torchrun agents ("nodes") on one host form one job, and only global rank 0 writes;
- evaluation is exact for 1, 2 and 3 processes (51 test images, which 2 and 3 do not divide), and the test
  numbers a 2-process run reports are those of the weights it saves;
- the self-launch is `torchrun --standalone`: bit-identical weights;
- a launch that cannot work is refused with one line before any worker starts.

Launches are few (each costs seconds) and shared through module-scoped fixtures; every process computes on one
intra-op thread, so that bit-identical comparisons do not depend on the number of cores.

What only multi-GPU hardware can prove, and these tests therefore do not:

- SyncBatchNorm: statistics over the global batch, all-reduced across ranks in every BatchNorm forward, and its
  equivalence to one process normalising the whole batch. PyTorch's SyncBatchNorm refuses CPU modules, so here
  `--sync_bn` is only shown to be refused.
- NCCL: the default backend with CUDA, which needs one GPU per rank; here `--backend nccl` is only shown to be
  refused. Gloo's all-reduce is proven exact above; NCCL's (ring/tree order, fp32 sums) is not.
- nn.DataParallel's scatter, replicas and gather over several GPUs: on the CPU it wraps nothing.
- One GPU per rank: `own_gpu` mapping LOCAL_RANK to a device, `torch.cuda.set_device`, and per-rank telemetry.
- A dead NCCL peer: that NCCL's watchdog, set to abort the communicators without killing the process, lets
  the main thread print its one line. Here only the setting is checked (and reasoned from PyTorch's source).
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler

from common.config import Config, UsageError
from common.data import load_datasets, make_loader
from common.devices import seed_everything
from common.distributed import check_master_address, check_sync, nccl_error_handling, verify_sync
from common.optim import build_optimizer, lr_schedule
from conftest import REPO, TINY, read_results, refuse_in_process, run_script, two_at_a_time
from models import pyramidnet

DIST = "dist_parallel/train.py"
SEED = 0  # the scripts' default --seed
# Deterministic data (no crop/flip) and a few steps: what the in-test reference reproduces.
FEW_PLAIN_STEPS = ["--no_augment", "--max_steps", "4", "--save_model"]
# Every process of every launch, and the in-test reference, computes on one intra-op thread: the thread count
# changes the order of float sums in a convolution, so bit-identical comparisons must not depend on the cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------------------------------------------- helpers
def run_ok(script: str, run_dir: Path, *flags) -> subprocess.CompletedProcess:
    """`python script TINY flags` writing to run_dir, one thread per process; it must succeed."""
    done = run_script(script, *TINY, *flags, "--log_dir", run_dir.parent, "--run_name", run_dir.name,
                      env=ONE_THREAD)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def torchrun(*launcher_and_script_args, **popen) -> subprocess.Popen:
    """`torchrun ...`, as `python -m torch.distributed.run` so it is this interpreter's torch."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *map(str, launcher_and_script_args)],
                            cwd=REPO, env=full_env, text=True, **popen)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_bit_identical(ours: dict, theirs: dict, what: str) -> None:
    assert ours.keys() == theirs.keys(), what
    differ = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not differ, f"{what}: {differ}"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("warning:")]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def _wait(process: subprocess.Popen, timeout: float) -> int | str:
    """The exit code, or "timed out" (the process is left for _stop), so the caller can show the logs."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference_training(world_size: int, steps: int) -> dict[str, torch.Tensor]:
    """What `world_size` DDP processes compute, in this one process without DDP: each global batch of 32 is the
    ranks' shares (rank r's DistributedSampler indices, batches of 32 / world_size), each share goes through its
    own forward pass (so BatchNorm normalises it alone, as on its rank), and the loss is the mean of the ranks'
    losses (DDP averages the ranks' gradients). Same seed, same order of RNG use, same optimizer and schedule as
    train.py; no augmentation, so the data is deterministic. One intra-op thread, as in every launch here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_reference(world_size, steps)
    finally:
        torch.set_num_threads(threads)


def _train_reference(world_size: int, steps: int) -> dict[str, torch.Tensor]:
    cfg = Config(dataset="synthetic", synthetic_size=256, depth=8, alpha=12, batch_size=32, epochs=1,
                 augment=False, seed=SEED)
    seed_everything(cfg.seed)  # train.py: seed, then the loaders (no global RNG drawn), then the model
    train_set, _ = load_datasets(cfg.dataset, "", cfg.synthetic_size, cfg.seed)
    loaders = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(len(train_set)), num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=cfg.seed)
        loader = make_loader("gpu", train_set, sampler, cfg.batch_size // world_size, torch.device("cpu"),
                             train=True, augment=False, num_workers=0, seed=cfg.seed, rank=rank)
        loader.set_epoch(0)
        loaders.append(loader)
    model = pyramidnet(cfg.depth, cfg.alpha, cfg.block)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    scheduler = lr_schedule(optimizer, cfg, len(loaders[0]))
    model.train()
    for _, shares in zip(range(steps), zip(*loaders)):
        optimizer.zero_grad(set_to_none=True)
        loss = sum(F.cross_entropy(model(images), labels) for images, labels in shares) / world_size
        loss.backward()
        optimizer.step()
        scheduler.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------------------- shared runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("parallel")


@pytest.fixture(scope="module")
def one_process_each(runs) -> dict[str, Path]:
    """The same 6 steps (with augmentation) in single_gpu, data_parallel and one-process dist_parallel."""
    launches = {"single_gpu": ("single_gpu/train.py",), "data_parallel": ("data_parallel/train.py",),
                "dist_parallel": (DIST, "--nproc_per_node", "1")}
    dirs = {mode: runs / f"one-{mode}" for mode in launches}
    two_at_a_time(*(functools.partial(run_ok, script, dirs[mode], "--max_steps", "6", "--save_model", *flags)
                    for mode, (script, *flags) in launches.items()))
    return dirs


@pytest.fixture(scope="module")
def single_plain(runs) -> Path:
    """single_gpu over FEW_PLAIN_STEPS: what the reference must reproduce with one rank."""
    run_dir = runs / "single-plain"
    run_ok("single_gpu/train.py", run_dir, *FEW_PLAIN_STEPS)
    return run_dir


@pytest.fixture(scope="module")
def ddp2(runs) -> tuple[Path, subprocess.CompletedProcess]:
    """Two gloo processes started by `python dist_parallel/train.py --nproc_per_node 2`, FEW_PLAIN_STEPS."""
    run_dir = runs / "ddp2"
    return run_dir, run_ok(DIST, run_dir, "--nproc_per_node", "2", *FEW_PLAIN_STEPS)


# ---------------------------------------------------------------------------------------------------- 1. one process
def test_one_process_of_every_mode_ends_bit_identical(one_process_each):
    """Same seed, same data order, same augmentation, same arithmetic: DataParallel on the CPU and DDP with one
    rank change nothing, so every weight and buffer is bit-identical after 6 steps and the reported train loss
    and test accuracy are equal (not merely close)."""
    reference = weights(one_process_each["single_gpu"])
    summaries = {mode: read_results(run_dir)["summary"] for mode, run_dir in one_process_each.items()}
    for mode in ("data_parallel", "dist_parallel"):
        assert_bit_identical(weights(one_process_each[mode]), reference, mode)
        for key in ("train_loss", "train_acc", "test_loss", "test_acc", "steps"):
            assert summaries[mode][key] == summaries["single_gpu"][key], (mode, key)
    assert summaries["single_gpu"]["steps"] == 6
    dist_results = read_results(one_process_each["dist_parallel"])
    assert dist_results["world_size"] == 1 and dist_results["mode"] == "dist_parallel"
    assert dist_results["summary"]["params_in_sync"] is True
    assert dist_results["summary"]["buffers_max_abs_diff"] == 0  # one rank: nothing to differ from


# ---------------------------------------------------------------------------------------------------- 2. two ranks
def test_the_reference_reproduces_a_one_process_run(single_plain):
    """The in-test reference, with one rank, is single_gpu's training bit for bit: its seeding, data order,
    normalisation, optimizer and schedule are train.py's, so the two-rank comparison below tests DDP alone."""
    ours = reference_training(world_size=1, steps=4)
    assert_bit_identical(ours, {name: weights(single_plain)[name] for name in ours}, "reference vs single_gpu")


def test_two_processes_match_the_single_process_reference(ddp2):
    """DDP over 2 gloo processes, 4 steps: every parameter equals (to float tolerance: a different summation
    order) a single process averaging the two ranks' share losses, each share normalised by BatchNorm alone.
    So the gradient all-reduce averages exactly the ranks' gradients, and each rank saw its DistributedSampler
    share. Buffers are not compared: each rank's running statistics come from its own share."""
    run_dir, _ = ddp2
    ours = reference_training(world_size=2, steps=4)
    theirs = weights(run_dir)
    assert set(ours) <= set(theirs)
    for name, value in ours.items():
        torch.testing.assert_close(theirs[name], value, rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_two_processes_end_in_sync_with_differing_batchnorm_statistics(ddp2):
    """The end-of-run sync check: parameters bit-identical on both ranks; BatchNorm running statistics differ
    (each rank's BatchNorm saw only its share), and the report says so."""
    run_dir, done = ddp2
    results = read_results(run_dir)
    assert results["world_size"] == 2 and results["summary"]["steps"] == 4
    assert results["summary"]["params_in_sync"] is True
    assert results["summary"]["buffers_max_abs_diff"] > 0
    assert "parameter tensors identical on 2 ranks" in done.stdout
    assert "global batch 32 = 2 x 16 over gloo" in done.stdout


# ---------------------------------------------------------------------------------------------------- 3. two nodes
def _two_agents(tmp_path: Path, *extra_launcher_args) -> tuple[list[int], list[str], list[str]]:
    """Two torchrun agents of one process each, rendezvousing over c10d on this host: (exit codes, stdouts,
    stderrs). Both write to the same run folder: only global rank 0 may write there."""
    port, logs = free_port(), [(tmp_path / f"node{node}.out", tmp_path / f"node{node}.err") for node in range(2)]
    with contextlib.ExitStack() as stack:
        agents = []
        for node, (out, err) in enumerate(logs):  # files, not pipes: neither agent can block on a full pipe
            agents.append(torchrun(
                "--nnodes", 2, "--node_rank", node, "--nproc_per_node", 1, "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"two-nodes-{port}", *extra_launcher_args,
                DIST, *TINY, "--max_steps", 2, "--log_dir", tmp_path / "runs", "--run_name", "nodes",
                stdout=stack.enter_context(out.open("w")), stderr=stack.enter_context(err.open("w"))))
            stack.callback(_stop, agents[-1])  # on a timeout or an error here: no agent left behind
        codes = [_wait(agent, timeout=120) for agent in agents]
    return codes, [out.read_text() for out, _ in logs], [err.read_text() for _, err in logs]


def _assert_one_job_written_by_rank_0(tmp_path, codes, outs, errs):
    assert codes == [0, 0], "\n".join(outs + errs)
    written = list((tmp_path / "runs").rglob("results.json"))
    assert written == [tmp_path / "runs" / "nodes" / "results.json"]
    results = read_results(written[0].parent)
    assert results["world_size"] == 2 and results["summary"]["params_in_sync"] is True
    assert sum("results in" in out for out in outs) == 1  # one agent's worker is rank 0; the other is silent


def test_two_torchrun_nodes_on_one_host(tmp_path):
    """`torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:PORT`, twice, as the README's
    multi-node launch on one host: one job of world size 2 whose results.json only global rank 0 writes."""
    _assert_one_job_written_by_rank_0(tmp_path, *_two_agents(tmp_path))


# ---------------------------------------------------------------------------------------------------- 4. evaluation
@pytest.fixture(scope="module")
def evaluations(ddp2, runs) -> dict[int, dict]:
    """The test loss and accuracy of the 2-process run's model.pt: `--evaluate` with 1 (single_gpu) and 3
    processes, and for 2 the run's own evaluation of those weights as it ended (the same evaluate(); the
    --evaluate path through a process group is the 3-process launch): {processes: summary}."""
    model = ddp2[0] / "model.pt"
    launches = {1: ("single_gpu/train.py",), 3: (DIST, "--nproc_per_node", "3", "--batch_size", "30")}  # 30: 3 ranks
    done_by = dict(zip(launches, two_at_a_time(*(
        functools.partial(run_ok, script, runs / f"evaluate{processes}", "--evaluate", model, *flags)
        for processes, (script, *flags) in launches.items()))))
    summaries = {2: read_results(ddp2[0])["summary"]}
    assert "test loss" in ddp2[1].stdout and "(51 images)" in ddp2[1].stdout
    for processes, done in done_by.items():
        run_dir = runs / f"evaluate{processes}"
        printed = [line for line in done.stdout.splitlines() if line.startswith(f"{model}: test loss")]
        assert len(printed) == 1 and printed[0].endswith("(51 images)"), (processes, done.stdout)
        results = read_results(run_dir)
        assert results["world_size"] == processes and results["summary"]["steps"] == 0
        summaries[processes] = results["summary"]
    return summaries


def test_evaluation_is_exact_for_one_two_and_three_processes(evaluations):
    """The same weights evaluated by 1, 2 and 3 processes: each rank takes every world_size-th of the 51 test
    images (no DistributedSampler padding, which would count some twice) and the sums are all-reduced, so the
    accuracy is identical and the loss equal up to the order of float64 sums. Each printed "(51 images)"."""
    for processes in (2, 3):
        assert evaluations[processes]["test_acc"] == evaluations[1]["test_acc"], processes
        assert evaluations[processes]["test_loss"] == pytest.approx(evaluations[1]["test_loss"], rel=1e-6)


def test_reported_test_numbers_are_those_of_the_saved_weights(ddp2, evaluations):
    """What a 2-process training run reports as its test loss and accuracy is the evaluation of the model.pt it
    saved, as in single_gpu (where --evaluate reproduces the report): the report describes the weights a user
    keeps, not a mix of the ranks' BatchNorm running statistics."""
    reported = read_results(ddp2[0])["summary"]
    assert reported["test_acc"] == evaluations[1]["test_acc"]
    assert reported["test_loss"] == pytest.approx(evaluations[1]["test_loss"], rel=1e-6)


# ---------------------------------------------------------------------------------------------------- 5. launchers
def test_self_launch_equals_torchrun_standalone(ddp2, tmp_path):
    """`python dist_parallel/train.py --nproc_per_node 2` and `torchrun --standalone --nproc_per_node 2
    dist_parallel/train.py` with the same flags give bit-identical weights and the same reported numbers."""
    self_launched, _ = ddp2
    run_dir = tmp_path / "torchrun"
    agent = torchrun("--standalone", "--nproc_per_node", 2, DIST, *TINY, *FEW_PLAIN_STEPS,
                     "--log_dir", run_dir.parent, "--run_name", run_dir.name,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = agent.communicate(timeout=300)
    assert agent.returncode == 0, out + err
    assert_bit_identical(weights(run_dir), weights(self_launched), "torchrun vs self-launch")
    ours, theirs = read_results(run_dir)["summary"], read_results(self_launched)["summary"]
    for key in ("train_loss", "train_acc", "test_loss", "test_acc", "steps", "buffers_max_abs_diff"):
        assert ours[key] == theirs[key], key


# ---------------------------------------------------------------------------------------------------- 6. bad launches
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="refused only on a machine without CUDA")


@pytest.mark.parametrize("flags, named", [
    pytest.param(["--nproc_per_node", "3", "--batch_size", "32"], "does not divide", id="batch-not-dividing"),
    pytest.param(["--nproc_per_node", "2", "--sync_bn"], "SyncBatchNorm", id="sync-bn-on-cpu", marks=needs_no_gpu),
    pytest.param(["--nproc_per_node", "2", "--backend", "nccl"], "nccl", id="nccl-without-gpus",
                 marks=needs_no_gpu),
])
def test_a_launch_that_cannot_work_is_refused_before_workers_start(tmp_path, flags, named):
    """One `error: ...` line naming the problem, a non-zero exit, no traceback, no worker output, and no run
    folder: the self-launch checks what it can before starting torch's elastic launcher. (In this process through
    the script's main(); tests/test_bad_input.py refuses a dist_parallel launch as a subprocess.)"""
    done = refuse_in_process(DIST, *TINY, "--log_dir", tmp_path / "runs", "--run_name", "refused", *flags)
    assert done.returncode != 0
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: "), done.stderr
    assert named in errors[0], errors[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------------- 7. distributed.py
def test_a_loopback_master_address_is_refused_only_across_nodes():
    """MASTER_ADDR 127.0.0.1 with 4 processes, 2 per node (2 nodes) would leave the second node waiting for a
    master on itself: refused, naming the address and the node count. With all 4 on one node it is right."""
    across_nodes = {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(UsageError, match=r"127\.0\.0\.1.*2 nodes"):
        check_master_address(across_nodes)
    check_master_address({**across_nodes, "LOCAL_WORLD_SIZE": "4"})
    check_master_address({**across_nodes, "MASTER_ADDR": "10.1.2.3"})
    with pytest.raises(UsageError):
        check_master_address({**across_nodes, "MASTER_ADDR": "localhost"})


def test_nccl_errors_reach_the_main_thread():
    """torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 for its workers, and with it (as with torch's default, 3)
    NCCL's watchdog kills the process before the one-line group failure can be printed: the workers switch to 2
    (abort the communicators, raise in the main thread). A value the user chose otherwise is kept. Whether the line
    then reaches the user needs two GPUs and a dead peer: see this module's docstring."""
    for given in [{}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}]:
        nccl_error_handling(given)
        assert given == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    for chosen in ["0", "3"]:
        environ = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": chosen}
        nccl_error_handling(environ)
        assert environ == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": chosen}


def _sync_check_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of the sync-check test: three checks of a tiny model, written to out_dir/rank<r>.json."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # the same weights on both ranks
        model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
        reports = {"identical": check_sync(model)}
        with torch.no_grad():
            model[1].running_mean += rank  # statistics may differ between ranks...
        reports["buffers differ"] = check_sync(model)
        with torch.no_grad():
            if rank == 1:  # ...parameters may not, not even by one ulp
                model[0].bias[1] = torch.nextafter(model[0].bias[1], torch.tensor(float("inf")))
        reports["a parameter differs"] = check_sync(model)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                verify_sync(model, sync_bn=False, is_main=rank == 0)
                code = 0
            except SystemExit as exit:
                code = exit.code
        reports["verify"] = {"code": code, "printed": printed.getvalue()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


def test_the_sync_check_names_a_parameter_that_differs_between_ranks(tmp_path):
    """A real 2-process gloo group (torch.multiprocessing.spawn, file:// rendezvous): check_sync reports
    identical ranks as in sync, differing BatchNorm statistics by how much, and a one-ulp difference in one
    parameter by name; verify_sync then prints the name on rank 0 and ends every rank with a non-zero exit."""
    torch.multiprocessing.spawn(_sync_check_worker, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)),
                                nprocs=2)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        identical, buffers, param = report["identical"], report["buffers differ"], report["a parameter differs"]
        assert identical["params_in_sync"] and identical["buffers_max_abs_diff"] == 0 and identical["ranks"] == 2
        assert buffers["params_in_sync"] and buffers["buffers_max_abs_diff"] == 1.0
        assert buffers["worst_buffer"] == "1.running_mean"
        assert not param["params_in_sync"] and param["mismatched"] == ["0.bias"], rank  # same verdict everywhere
        assert report["verify"]["code"] not in (0, None), rank
    main = reports[0]["verify"]
    assert "parameters differ between ranks: 0.bias" in main["printed"]
    assert str(main["code"]).startswith("error: ")  # rank 0's SystemExit message, printed by Python on exit
    assert reports[1]["verify"]["printed"] == ""  # only rank 0 reports


# ---------------------------------------------------------------------------------------------------- 8. sampler
def test_distributed_sampler_shards_cover_the_training_set_and_change_every_epoch():
    """The 2-process run's shards: each epoch the two ranks' 128 indices are disjoint and together are the 256
    training images; set_epoch reshuffles (without it every epoch repeats epoch 0's order); and the loader's
    set_epoch, which train.py calls every epoch, reaches the sampler."""
    def shards(epoch: int) -> list[list[int]]:
        out = []
        for rank in range(2):
            sampler = DistributedSampler(range(256), num_replicas=2, rank=rank, shuffle=True, seed=SEED)
            sampler.set_epoch(epoch)
            out.append(list(sampler))
        return out

    for epoch in range(3):
        first, second = shards(epoch)
        assert len(first) == len(second) == 128
        assert not set(first) & set(second) and sorted(first + second) == list(range(256))
    assert shards(0) != shards(1) != shards(2)
    unset = DistributedSampler(range(256), num_replicas=2, rank=0, shuffle=True, seed=SEED)
    assert list(unset) == list(unset) == shards(0)[0]

    train_set, _ = load_datasets("synthetic", "", 256, SEED)
    sampler = DistributedSampler(range(256), num_replicas=2, rank=1, shuffle=True, seed=SEED)
    loader = make_loader("gpu", train_set, sampler, 16, torch.device("cpu"), train=True, augment=False,
                         num_workers=0, seed=SEED, rank=1)
    loader.set_epoch(1)
    labels = torch.cat([labels for _, labels in loader])
    assert labels.tolist() == [train_set.targets[i] for i in shards(1)[1]]
