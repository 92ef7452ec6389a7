"""Process groups on the CPU beside compare.py --verify (tests/test_parallel.py): two torchrun
agents ("nodes") on one host form one job whose results only global rank 0 writes; the guards around
the group (a loopback master across nodes, NCCL's error handling); the sync check naming a parameter
that differs, and fsdp's gather through the CPU, on one real spawned gloo group;
DistributedSampler's shards. Apart from test_parallel.py so that the suite's two workers can run
these beside its verification."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from common.config import UsageError
from common.data import load_datasets
from common.guards import check_master_address, nccl_error_handling
from common.launch_env import worker_launch
from common.loaders import make_loader
from common.sync_check import check_sync, verify_sync
from conftest import REPO, TINY, at_epoch, free_port, read_results

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

DIST = "dist_parallel/train.py"
SEED = 0  # the scripts' default --seed
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # one intra-op thread per process, as in test_parallel.py


# ------------------------------------------------------------------------------------------ helpers
def torchrun(*launcher_and_script_args, **popen) -> subprocess.Popen:
    """`torchrun ...`, as `python -m torch.distributed.run` so it is this interpreter's torch."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run",
                             *map(str, launcher_and_script_args)],
                            cwd=REPO, env=full_env, text=True, **popen)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def _wait(process: subprocess.Popen, timeout: float) -> int | str:
    """The exit code, or "timed out" (the process is left for _stop), so
    the caller can show the logs."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out"


# ---------------------------------------------------------------------------------------- two nodes
def _two_agents(tmp_path: Path, *extra_launcher_args) -> tuple[list[int], list[str], list[str]]:
    """Two torchrun agents of one process each, rendezvousing over c10d on this host: (exit codes,
    stdouts, stderrs). Both write to the same run folder: only global rank 0 may write there."""
    port, logs = (free_port(), [(tmp_path / f"node{node}.out", tmp_path / f"node{node}.err")
                                for node in range(2)])
    with contextlib.ExitStack() as stack:
        agents = []
        # files, not pipes: neither agent can block on a full pipe
        for node, (out, err) in enumerate(logs):
            agents.append(torchrun(
                "--nnodes", 2, "--node_rank", node, "--nproc_per_node", 1, "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"two-nodes-{port}",
                *extra_launcher_args, DIST, *TINY, "--max_steps", 2, "--log_dir", tmp_path / "runs",
                "--run_name", "nodes", stdout=stack.enter_context(out.open("w")),
                stderr=stack.enter_context(err.open("w"))))
            stack.callback(_stop, agents[-1])  # on a timeout or an error here: no agent left behind
        codes = [_wait(agent, timeout=120) for agent in agents]
    return codes, [out.read_text() for out, _ in logs], [err.read_text() for _, err in logs]


def _assert_one_job_written_by_rank_0(tmp_path, codes, outs, errs):
    assert codes == [0, 0], "\n".join(outs + errs)
    written = list((tmp_path / "runs").rglob("results.json"))
    assert written == [tmp_path / "runs" / "nodes" / "results.json"]
    results = read_results(written[0].parent)
    assert results["world_size"] == 2 and results["summary"]["params_in_sync"] is True
    # one agent's worker is rank 0; the other is silent
    assert sum("results in" in out for out in outs) == 1


def test_two_torchrun_nodes_on_one_host(tmp_path):
    """`torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:PORT`, twice, as
    docs/modes.md's multi-node launch on one host: one job of world size 2 whose
    results.json only global rank 0 writes."""
    _assert_one_job_written_by_rank_0(tmp_path, *_two_agents(tmp_path))


# ------------------------------------------------------------------------------------------- guards
def test_a_loopback_master_address_is_refused_only_across_nodes():
    """MASTER_ADDR 127.0.0.1 with 4 processes, 2 per node (2 nodes) would leave the second
    node waiting for a master on itself: refused, naming the address and the node count. With
    all 4 on one node it is right."""
    across_nodes = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0",
                    "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(UsageError, match=r"127\.0\.0\.1.*2 nodes"):
        check_master_address(worker_launch(across_nodes))
    check_master_address(worker_launch({**across_nodes, "LOCAL_WORLD_SIZE": "4"}))
    check_master_address(worker_launch({**across_nodes, "MASTER_ADDR": "10.1.2.3"}))
    with pytest.raises(UsageError):
        check_master_address(worker_launch({**across_nodes, "MASTER_ADDR": "localhost"}))


def test_nccl_errors_reach_the_main_thread():
    """torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 for its workers, and with it (as with
    torch's default, 3) NCCL's watchdog kills the process before the one-line group failure can be
    printed: the workers switch to 2 (abort the communicators, raise in the main thread). A value
    the user chose otherwise is kept. Whether the line then reaches the user needs two GPUs and a
    dead peer: see this module's docstring."""
    for given in [{}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}]:
        nccl_error_handling(given)
        assert given == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    for chosen in ["0", "3"]:
        environ = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": chosen}
        nccl_error_handling(environ)
        assert environ == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": chosen}


def _sync_check_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of the sync-check test: three checks of a tiny model,
    written to out_dir/rank<r>.json."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
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


def _group_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of a real 2-process gloo group, for the three tests below: the sync checks, the
    gathers, the node's first compile."""
    _sync_check_worker(rank, world_size, init_file + ".sync", out_dir)
    _gather_worker(rank, world_size, init_file + ".gather", out_dir)
    _compile_worker(rank, world_size, init_file + ".compile", out_dir)


@pytest.fixture(scope="module")
def group_reports(tmp_path_factory) -> Path:
    """One spawned group (torch.multiprocessing.spawn, file:// rendezvous) for the sync check's test
    and the gather's: each rank writes rank<r>.json and gathered<r>.json."""
    out = tmp_path_factory.mktemp("group")
    torch.multiprocessing.spawn(_group_worker, args=(2, str(out / "rendezvous"), str(out)),
                                nprocs=2)
    return out


def test_the_sync_check_names_a_parameter_that_differs_between_ranks(group_reports):
    """On a real 2-process gloo group, check_sync reports identical ranks as in sync, differing
    BatchNorm statistics by how much, and a one-ulp difference in one parameter by name; verify_sync
    then prints the name on rank 0 and ends every rank with a non-zero exit."""
    reports = [json.loads((group_reports / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        identical, buffers, param = (report["identical"], report["buffers differ"],
                                     report["a parameter differs"])
        assert (identical["params_in_sync"] and identical["buffers_max_abs_diff"] == 0
                and identical["ranks"] == 2)
        assert buffers["params_in_sync"] and buffers["buffers_max_abs_diff"] == 1.0
        assert buffers["worst_buffer"] == "1.running_mean"
        # same verdict everywhere
        assert not param["params_in_sync"] and param["mismatched"] == ["0.bias"], rank
        assert report["verify"]["code"] not in (0, None), rank
    main = reports[0]["verify"]
    assert "parameters differ between ranks: 0.bias" in main["printed"]
    # rank 0's SystemExit message, printed by Python on exit
    assert str(main["code"]).startswith("error: ")
    assert reports[1]["verify"]["printed"] == ""  # only rank 0 reports


def _gather_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of the gather test: a tiny model sharded by fully_shard, each
    parameter gathered both ways."""
    from torch.distributed.fsdp import fully_shard

    from common.state import _whole_through_the_cpu

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        torch.manual_seed(0)
        # 3 and 5 rows: uneven slices over 2 ranks
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 5))
        reference = {name: param.detach().clone() for name, param in model.named_parameters()}
        fully_shard(model)
        group = dist.group.WORLD
        same = {name: torch.equal(_whole_through_the_cpu(param, group), reference[name])
                and torch.equal(param.full_tensor(), reference[name])
                for name, param in model.named_parameters()}
        Path(out_dir, f"gathered{rank}.json").write_text(json.dumps(same))
    finally:
        dist.destroy_process_group()


def test_sharded_parameters_gather_through_the_cpu_as_full_tensor_gathers_them(group_reports):
    """Gloo cannot all-gather CUDA tensors (the process crashes), so fsdp over gloo on a
    GPU gathers its slices on the CPU: on a real 2-process group the detour assembles
    every parameter, uneven slices too, exactly as DTensor.full_tensor does and as the
    model held it before it was sharded."""
    for rank in range(2):
        same = json.loads((group_reports / f"gathered{rank}.json").read_text())
        assert len(same) == 4 and all(same.values()), (rank, same)


def _compile_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of the first-compile test: both ranks of one torchrun node (GROUP_RANK) compile a
    forward and its backward (AOTAutograd, eager kernels), rank 0 starting half a second late; then
    who would lead on other devices, or in a launch by hand."""
    from common.compiling import CompileClock
    from common.guards import compile_leader

    os.environ["GROUP_RANK"] = "0"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        clock = CompileClock(str(Path(out_dir) / "compile_cache"))
        leader = compile_leader(torch.device("cpu"), timeout_s=60.0)
        clock.follow(leader)
        if rank == 0:
            time.sleep(0.5)
        model = torch.compile(nn.Linear(3, 2), backend="aot_eager")
        model(torch.ones(4, 3)).sum().backward()
        report = {"leads": leader[1], "waited": clock.waited, "seconds": clock.seconds,
                  "events": clock.events}
        clock.close()
        report["other_devices"] = compile_leader(torch.device("cpu" if rank else "meta"), 60.0)
        del os.environ["GROUP_RANK"]
        report["by_hand"] = compile_leader(torch.device("cpu"), 60.0)
        Path(out_dir, f"compiled{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_the_ranks_of_a_node_wait_for_its_first_rank_to_compile_each_graph(group_reports):
    """On a real 2-process gloo group, as two ranks of one torchrun node on the CPU: rank 1 waits
    for rank 0 (half a second late) to compile the forward, then the backward, each of which it
    would then read from the cache (that the wait is not counted as compile time, test_compile.py
    holds on a clock of its own: timing here would depend on the machine's load). Ranks on
    different devices (GPUs: inductor's cache keys hold the device index) and processes started by
    hand (no node known) compile alone."""
    first, second = (json.loads((group_reports / f"compiled{rank}.json").read_text())
                     for rank in range(2))
    assert first["leads"] is True and second["leads"] is False
    # the forward, then the backward at its first call
    assert first["events"] == second["events"] == 2
    assert first["waited"] == 0 and second["waited"] >= 0.4, (first, second)
    # the wait kept out of it: test_compile.py's clock test
    assert first["seconds"] > 0 and second["seconds"] >= 0
    assert first["other_devices"] is \
        second["other_devices"] is first["by_hand"] is second["by_hand"] is None


# --------------------------------------------------------------------------------------- 9. sampler
def test_distributed_sampler_shards_cover_the_training_set_and_change_every_epoch():
    """The 2-process run's shards: each epoch the two ranks' 128 indices are disjoint and together
    are the 256 training images; set_epoch reshuffles (without it every epoch repeats epoch 0's
    order); and a loader set to an epoch as train.py's loop sets it gives that epoch's share."""
    def shards(epoch: int) -> list[list[int]]:
        out = []
        for rank in range(2):
            sampler = DistributedSampler(range(256), num_replicas=2, rank=rank, shuffle=True,
                                         seed=SEED)
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
    loader = make_loader("gpu", train_set, sampler, 16, torch.device("cpu"), train=True,
                         augment=False, num_workers=0, seed=SEED)
    at_epoch(loader, 1)
    labels = torch.cat([labels for _, labels in loader])
    assert labels.tolist() == [train_set.targets[i] for i in shards(1)[1]]
