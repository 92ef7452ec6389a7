"""Process groups on the CPU beside compare.py --verify (tests/test_parallel.py): two torchrun
agents ("nodes") on one host form one job whose results only global rank 0 writes; the sync check
(dist_parallel's in_sync, results.json's params_in_sync) on one real spawned gloo group; the
epoch's order, DistributedSampler's shards and the single process's alike."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from conftest import REPO, TINY, free_port, read_results, train_file

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
    assert results["world_size"] == 2 and results["params_in_sync"] is True
    # one agent's worker is rank 0; the other is silent
    assert sum("results in" in out for out in outs) == 1


@pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`
def test_two_torchrun_nodes_on_one_host(tmp_path):
    """`torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:PORT`, twice, as
    docs/modes.md's multi-node launch on one host: one job of world size 2 whose
    results.json only global rank 0 writes."""
    _assert_one_job_written_by_rank_0(tmp_path, *_two_agents(tmp_path))


# ---------------------------------------------------------------------------------- the sync check
def _sync_check_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    """One rank of a real 2-process gloo group: dist_parallel's in_sync on a tiny model three
    times, written to out_dir/rank<r>.json."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        in_sync = train_file("dist_parallel").in_sync
        torch.manual_seed(0)  # the same weights on both ranks
        model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
        reports = {"identical": in_sync(model)}
        with torch.no_grad():
            model[1].running_mean += rank  # statistics may differ between ranks...
        reports["buffers differ"] = in_sync(model)
        with torch.no_grad():
            if rank == 1:  # ...parameters may not, not even by one ulp
                model[0].bias[1] = torch.nextafter(model[0].bias[1], torch.tensor(float("inf")))
        reports["a parameter differs"] = in_sync(model)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def group_reports(tmp_path_factory) -> Path:
    """One spawned group (torch.multiprocessing.spawn, file:// rendezvous): each rank writes
    rank<r>.json."""
    out = tmp_path_factory.mktemp("group")
    torch.multiprocessing.spawn(_sync_check_worker, args=(2, str(out / "rendezvous"), str(out)),
                                nprocs=2)
    return out


@pytest.mark.second_tier
def test_the_sync_check_sees_one_ulp_of_one_parameter_and_how_far_the_statistics_are(
        group_reports):
    """On a real 2-process gloo group: identical ranks in sync; BatchNorm statistics that differ,
    by how much; a one-ulp difference in one parameter out of sync, the same verdict on every
    rank."""
    for rank in range(2):
        report = json.loads((group_reports / f"rank{rank}.json").read_text())
        assert report["identical"] == {"params_in_sync": True, "buffers_max_abs_diff": 0.0}
        assert report["buffers differ"] == {"params_in_sync": True, "buffers_max_abs_diff": 1.0}
        assert report["a parameter differs"]["params_in_sync"] is False, rank


# --------------------------------------------------------------------------------- the epoch order
def shards(epoch: int, replicas: int = 2, size: int = 256) -> list[list[int]]:
    out = []
    for rank in range(replicas):
        sampler = DistributedSampler(range(size), num_replicas=replicas, rank=rank, shuffle=True,
                                     seed=SEED)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_distributed_sampler_shards_cover_the_training_set_and_change_every_epoch():
    """Each epoch the two ranks' 128 indices are disjoint and together are the 256 training
    images; set_epoch reshuffles (without it every epoch repeats epoch 0's order)."""
    for epoch in range(3):
        first, second = shards(epoch)
        assert len(first) == len(second) == 128
        assert not set(first) & set(second) and sorted(first + second) == list(range(256))
    assert shards(0) != shards(1) != shards(2)
    unset = DistributedSampler(range(256), num_replicas=2, rank=0, shuffle=True, seed=SEED)
    assert list(unset) == list(unset) == shards(0)[0]


@pytest.mark.parametrize("mode", ["single_gpu", "data_parallel"])
def test_one_process_sees_the_epochs_in_distributed_samplers_order_of_one_replica(mode):
    """What makes one-process runs of the modes see the same batches: single_gpu's (and
    data_parallel's) RandomSampler, set to an epoch as the loop sets it, draws
    DistributedSampler's order with one replica."""
    module = train_file(mode)
    args = module.get_args([*TINY, "--seed", str(SEED)])
    train_set, test_set, _ = module.get_datasets(args)
    module.data_defaults(args, len(train_set))
    loader, _ = module.get_loaders(args, train_set, test_set, torch.device("cpu"))
    for epoch in (0, 1, 2):
        module.epoch_batches(loader, epoch, {"batch": 0})
        assert list(loader.sampler) == shards(epoch, replicas=1)[0], epoch
