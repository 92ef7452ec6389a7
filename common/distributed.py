"""Helpers that only a process group needs: where this process sits in it, launching workers with torch's own
elastic launcher, and the end-of-run check that every rank holds the same weights."""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from common.checkpoint import last_checkpoint
from common.config import Config, RunError, UsageError, flag
from common.data import DATASET_INFO
from common.devices import cuda_devices
from common.logger import report_window
from common.metrics import Sums, check_loss, evaluation_sums, window_sums
from common.performance import autocast, memory_format
from common.state import is_sharded, reshard, whole


@dataclass(frozen=True)
class GroupConfig(Config):  # the flags of every mode with a process group: dist_parallel's and fsdp's
    backend: str | None = flag(None, "nccl (default with CUDA) or gloo", choices=("nccl", "gloo"))
    init_method: str = flag("env://", "rendezvous: env:// (MASTER_ADDR/PORT), tcp://HOST:PORT or file:///PATH",
                            check="rendezvous")
    verify_sync: bool = flag(False, "check every epoch, not only at the end, that all ranks hold the same weights")
    nproc_per_node: int | None = flag(None, "without torchrun: workers to start (default: one per GPU)", at_least=1)
    dist_timeout: float = flag(600.0, "seconds a collective (or joining the group) may wait for the other ranks "
                                      "before the run ends with an error instead of hanging", above=0, at_most=1e9)
    max_restarts: int = flag(0, "started without torchrun: restart the workers up to N times after a failure "
                                "(with --resume auto they continue from the last checkpoint)", at_least=0)


def launched() -> bool:
    """True inside a worker: torchrun, the self-launch, or a manual launch set RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size), from the environment only. A manual launch may omit LOCAL_RANK: one node."""
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise UsageError("RANK, LOCAL_RANK and WORLD_SIZE must be whole numbers", rank_specific=True) from None
    if not 0 <= rank < world_size:
        raise UsageError(f"RANK {rank} is outside 0..WORLD_SIZE-1 ({world_size - 1}); set RANK per process",
                         rank_specific=True)
    return rank, local_rank, world_size


def die_with_launcher() -> None:
    """A worker started by torch's elastic agent (torchrun or the self-launch) dies with it. The agent puts each
    worker in a session of its own, so when the agent itself is killed (`kill -9`, an out-of-memory kill) nothing
    reaches the workers: they would train on as orphans, writing checkpoints beside whatever run is started next in
    their folder. Linux's parent-death signal kills them instead; the last checkpoint, written atomically, is intact."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return
    arm = killed_with(os.getppid())
    if arm is not None:
        arm()


def killed_with(parent: int):
    """A function that, called in a child of process `parent` (between fork and exec, or first thing), has Linux
    send the child SIGKILL when `parent` ends (precisely: the thread of it that started the child); a child whose
    parent ended already exits at once. None where there is no such signal (not Linux). ctypes' lookup is done
    here, so that the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def check_master_address(environ=os.environ) -> None:
    """A loopback MASTER_ADDR with more than one node makes every other node look for the master on itself.
    Set by hand, it is refused. Under torchrun it came from the rendezvous (the first agent's own name, or
    --local_addr), which cannot tell two agents on one host from two hosts: rank 0 warns instead."""
    address = environ.get("MASTER_ADDR", "")
    world_size = int(environ.get("WORLD_SIZE", 1))
    nodes = world_size // max(int(environ.get("LOCAL_WORLD_SIZE", world_size)), 1)
    if nodes <= 1 or not _is_loopback(address):
        return
    if "TORCHELASTIC_RUN_ID" in environ:
        if environ.get("RANK") == "0":
            print(f"warning: MASTER_ADDR is {address} for a job on {nodes} nodes: fine on one host; across "
                  f"machines give torchrun --local_addr <reachable address> on the first node", file=sys.stderr)
        return
    raise UsageError(f"MASTER_ADDR {address} is a loopback address but the job spans {nodes} nodes: set it to the "
                     f"first node's reachable host name or IP")


def _is_loopback(address: str) -> bool:
    if address.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


STOP_REPORT = "PYTORCH_MULTIGPU_STOP_REPORT"  # a file the self-launch gives its workers for their stop line


def launch_workers(script: str, argv: list[str], nproc: int, max_restarts: int = 0) -> int:
    """Start `nproc` workers of `script` on this machine through torch's elastic launcher, exactly as
    `torchrun --standalone --nproc_per_node nproc --max-restarts max_restarts script argv` would (a free port,
    c10d rendezvous; after a worker fails, the whole group is restarted up to max_restarts times). Stopped by a
    signal, it says the run stopped cleanly only when rank 0 reported its stop checkpoint (`report_stop`): torch's
    agent passes the signal on and waits 30 s, then kills the workers, and does not tell how they ended."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(["--standalone", f"--nproc_per_node={nproc}",
                                         f"--max-restarts={max_restarts}", script, *argv])
    with tempfile.TemporaryDirectory(prefix="stop-report-") as folder:
        report = Path(folder) / "stopped"
        os.environ[STOP_REPORT] = str(report)  # the workers inherit this process's environment
        try:
            run(args)
        except SignalException as stop:  # the launcher passed SIGTERM/SIGINT on to the workers
            if report.exists():
                print(f"stopped by {stop.sigval.name}: the workers stopped cleanly ({report.read_text().strip()}); "
                      f"continue with --resume auto", file=sys.stderr)
                return 128 + int(stop.sigval)
            print(f"error: stopped by {stop.sigval.name}, but the workers did not stop cleanly (no stop checkpoint "
                  f"was reported; their output above says why): --resume auto continues from the last checkpoint",
                  file=sys.stderr)
            return 1
        except ChildFailedError as error:
            ranks = ", ".join(str(failure.local_rank) for failure in error.failures.values())
            codes = sorted({failure.exitcode for failure in error.failures.values()})
            print(f"error: worker {ranks} failed (exit code {', '.join(map(str, codes))}); its message is above",
                  file=sys.stderr)
            return max(codes, key=abs) or 1
        finally:
            del os.environ[STOP_REPORT]
    return 0


def report_stop(step: int, checkpoint: Path | None) -> None:
    """Stopped by a signal with the checkpoint written, rank 0 tells the self-launch, which cannot see how its
    workers ended (under torchrun nothing is listening, and nothing is written)."""
    path = os.environ.get(STOP_REPORT)
    if path and dist.get_rank() == 0:
        Path(path).write_text(f"step {step}, checkpoint {checkpoint}\n")


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def check_sync(raw_model: torch.nn.Module) -> dict:
    """Every rank hashes each parameter and buffer; the hashes (and the small BatchNorm buffers) are gathered.
    Parameters must be bit-identical on every rank; running statistics may differ without SyncBatchNorm.
    Every rank computes the same verdict, so every rank can act on it. A model sharded by FSDP keeps each slice on
    one rank only, so there are no copies to drift apart: each rank gathers every parameter whole and hashes that,
    which checks that the ranks assemble the same weights (those a checkpoint saves); the buffers, which FSDP does
    not shard, are compared as under DDP."""
    params = {name: _digest(whole(p)) for name, p in raw_model.named_parameters()}
    buffers = {name: b.detach().cpu() for name, b in raw_model.named_buffers() if b.is_floating_point()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (params, buffers))
    reference_params, reference_buffers = gathered[0]
    mismatched = sorted({name for rank_params, _ in gathered[1:] for name, digest in rank_params.items()
                         if reference_params.get(name) != digest})
    worst_name, worst = None, 0.0
    for _, rank_buffers in gathered[1:]:
        for name, value in rank_buffers.items():
            diff = (value.double() - reference_buffers[name].double()).abs().max().item() if value.numel() else 0.0
            if diff > worst:
                worst_name, worst = name, diff
    return {"params_in_sync": not mismatched, "mismatched": mismatched, "buffers_max_abs_diff": worst,
            "worst_buffer": worst_name, "ranks": len(gathered), "params": len(reference_params),
            "sharded": is_sharded(raw_model)}


def describe_sync(report: dict, sync_bn: bool) -> str:
    whole = ", each gathered whole from its slices," if report.get("sharded") else ""
    params = (f"all {report['params']} parameter tensors{whole} identical on {report['ranks']} ranks"
              if report["params_in_sync"] else
              f"parameters differ between ranks: {', '.join(report['mismatched'][:5])}"
              f"{' ...' if len(report['mismatched']) > 5 else ''}")
    if report["buffers_max_abs_diff"] == 0:
        buffers = "buffers identical"
    else:
        why = "" if sync_bn else " (expected without SyncBatchNorm: each rank's BatchNorm sees only its own share)"
        buffers = (f"BatchNorm running statistics differ by up to {report['buffers_max_abs_diff']:.3g} "
                   f"({report['worst_buffer']}){why}")
    return f"sync check: {params}; {buffers}"


def check_launch(cfg, world_size: int) -> None:
    """What can be refused before any worker starts: the same checks run again in every worker. Evaluation trains
    nothing, so it takes any batch over any number of processes."""
    check_master_address()
    if cfg.init_method.startswith("file://"):
        check_rendezvous_file(Path(cfg.init_method[len("file://"):]), cfg.dist_timeout)
    cuda = torch.cuda.is_available()
    if cfg.backend == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo on CPUs")
    if getattr(cfg, "sync_bn", False) and not cuda:  # dist_parallel's flag
        raise UsageError("--sync_bn needs GPUs: PyTorch's SyncBatchNorm refuses CPU modules; leave it out on CPUs")
    if cfg.batch_size % world_size and not cfg.evaluate:
        raise UsageError(f"--batch_size {cfg.batch_size} does not divide over {world_size} processes: use a "
                         f"multiple of {world_size} (the global batch is split evenly)")


def by_rank(per_gpu: dict) -> dict:
    """Gather each rank's {gpu: value} (one GPU per rank) into {rank: value} on every rank."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, per_gpu)
    return {rank: value for rank, values in enumerate(gathered) for value in values.values()}


def verify_sync(raw_model: torch.nn.Module, sync_bn: bool, is_main: bool) -> dict:
    """check_sync, reported by rank 0; parameters that differ end the run on every rank with a non-zero exit."""
    report = check_sync(raw_model)
    if is_main:
        print(describe_sync(report, sync_bn), flush=True)
    if not report["params_in_sync"]:
        raise SystemExit("error: the ranks hold different parameters (named above): their training diverged"
                         if is_main else 1)
    return report


# ---------------------------------------------------------------------------------------------------- training
def log_window(run, epoch: int, index: int) -> Sums:
    """Read the window's totals (one host sync), report them, stop on a NaN loss, and take note of a stop signal:
    dist_parallel's and fsdp's, as single_gpu's plus the sums over ranks and the ranks' vote to stop."""
    totals = window_sums(run.meter, run.timer)
    stop = totals.new_tensor([run.signals.received is not None])  # a signal to any rank stops every rank here
    totals = torch.cat([totals, stop])
    dist.all_reduce(totals)  # images and correct predictions add up over ranks; so do the stop votes
    totals[3:6] /= dist.get_world_size()  # timings: the mean over ranks
    values = totals.tolist()
    sums = Sums(values[:Sums.SIZE])
    gpu = by_rank(run.telemetry.window())  # every rank's GPU, keyed by rank
    run.totals += sums
    run.gpu_util += [util for util, _ in gpu.values() if util is not None]
    check_loss(sums, run.meter, run.step, last_checkpoint(run.run_dir))  # before NaNs reach the logs
    report_window(run, epoch, index, sums, gpu)
    run.stop = (run.signals.received or "a signal to another rank") if values[Sums.SIZE] else None
    return sums


@torch.no_grad()
def evaluate(cfg: Config, raw_model: torch.nn.Module, loader, device: torch.device) -> tuple[float, float, int]:
    """Test loss and accuracy over every test image exactly once (each rank evaluates its shard), and how many
    images that was: dist_parallel's and fsdp's."""
    raw_model.eval()  # the unwrapped model: DDP's forward would sync buffers, and ranks have unequal shards
    for buffer in raw_model.buffers():  # rank 0's BatchNorm statistics, as DDP's next forward would broadcast:
        dist.broadcast(buffer, src=0)  # the figures are then those of the weights rank 0 saves
    batches = loader
    if is_sharded(raw_model):  # FSDP gathers each unit's parameters in its forward, from every rank: every rank
        batches = equal_forwards(loader, empty_batch(cfg, device))  # must run as many forward passes
    with autocast(cfg, device):
        sums = evaluation_sums(raw_model, batches, device)
    reshard(raw_model)  # FSDP: no backward follows to free the gathered parameters
    dist.all_reduce(sums)  # each rank evaluated its shard: summed, every test image counts once
    loss_sum, correct, images = sums.tolist()
    return loss_sum / images, correct / images, int(images)


def equal_forwards(loader, empty: tuple[torch.Tensor, torch.Tensor]):
    """The loader's batches, then `empty` batches until this rank has run as many as the rank with the most: the
    ranks' evaluation shards differ by up to one image, and so their batch counts by up to one."""
    most = torch.tensor([len(loader)], device=empty[0].device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    yield from loader
    for _ in range(int(most.item()) - len(loader)):
        yield empty


def empty_batch(cfg: Config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of no images, laid out as the loader's: a forward pass that computes nothing but takes part in FSDP's
    gathers."""
    data = DATASET_INFO[cfg.dataset]
    images = torch.empty(0, data.channels, data.size, data.size, device=device, memory_format=memory_format(cfg))
    return images, torch.empty(0, dtype=torch.long, device=device)


SHARING_HINT = " (ranks may share a GPU under --backend gloo; NCCL refuses two ranks on one GPU)"


def own_gpu(gpu_devices, local_rank: int, backend: str | None) -> list[int]:
    """This process's GPU: the local_rank-th of --gpu_devices (default: of every visible GPU); [] without CUDA.
    Under gloo a GPU may be listed more than once (`--gpu_devices 0 0`: two ranks on one GPU); NCCL refuses that."""
    gpus = cuda_devices(gpu_devices, default_all=True, shared=backend == "gloo", sharing_hint=SHARING_HINT)
    if gpus and local_rank >= len(gpus):
        raise UsageError(f"local rank {local_rank} has no GPU of its own ({len(gpus)} available): start at most "
                         f"one process per GPU", rank_specific=True)
    return gpus[local_rank:local_rank + 1]


@contextlib.contextmanager
def node_leader_first(local_rank: int):
    """The body runs first on each node's local rank 0 (a download, say), then on the others, which find its files."""
    if local_rank != 0:
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def self_launch(cfg, script: str, argv, mode: str) -> int:
    """`python train.py` without torchrun: refuse what can be refused, then start one worker per GPU (or
    --nproc_per_node CPU workers) as `torchrun --standalone` would; each worker runs `script` again."""
    from common.logger import resolve_run_dir

    gpus = cuda_devices(cfg.gpu_devices, default_all=True, shared=cfg.backend == "gloo", sharing_hint=SHARING_HINT)
    nproc = cfg.nproc_per_node or len(gpus) or 1
    if gpus and nproc > len(gpus):
        raise UsageError(f"--nproc_per_node {nproc} is more than the {len(gpus)} GPUs available: one process per GPU")
    check_launch(cfg, nproc)
    resolve_run_dir(cfg, mode, nproc)
    os.environ.setdefault("OMP_NUM_THREADS", str(max((os.cpu_count() or 1) // nproc, 1)))  # share the cores
    return launch_workers(script, sys.argv[1:] if argv is None else [str(arg) for arg in argv], nproc,
                          cfg.max_restarts)


# ---------------------------------------------------------------------------------------------------- failures
def init_group(backend: str, init_method: str, rank: int, world_size: int, timeout_s: float,
               gpus: list[int]) -> None:
    """dist.init_process_group, with a timeout on every collective (a dead peer ends the run instead of hanging
    it), NCCL errors that reach the main thread, and one line with the fix for the rendezvous failures users meet:
    a port in use, a master that cannot be reached, a file:// rendezvous left over from a crashed run. Under NCCL
    the group is bound to this process's GPU (`device_id`), so its barriers need not guess the device."""
    nccl_error_handling(os.environ)
    if rank == 0 and os.environ.get(STOP_REPORT):  # a new attempt (--max_restarts): an earlier one's stop is void
        Path(os.environ[STOP_REPORT]).unlink(missing_ok=True)
    timeout = datetime.timedelta(seconds=timeout_s)
    device_id = torch.device("cuda", gpus[0]) if backend == "nccl" and gpus else None
    try:
        if init_method == "env://" and "TORCHELASTIC_RESTART_COUNT" in os.environ:
            dist.init_process_group(backend, store=_attempt_store(rank, world_size, timeout), rank=rank,
                                    world_size=world_size, timeout=timeout, device_id=device_id)
        else:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=timeout, device_id=device_id)
    except (RuntimeError, ValueError) as error:  # DistNetworkError and DistStoreError are RuntimeErrors
        raise rendezvous_error(error, init_method, rank, timeout_s) from None


def nccl_error_handling(environ) -> None:
    """How NCCL's watchdog thread handles a collective that failed or outlived --dist_timeout. torchrun gives every
    worker TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless told otherwise, and torch's own default is 3; both make the
    watchdog take the whole process down from its own thread ("To avoid data inconsistency, we are taking the
    entire process down"), before the main thread can say which rank stopped at which step. 2 (CleanUpOnly) aborts
    the communicators and no more: the collective the main thread waits on returns, the next one raises ("NCCL
    communicator was aborted"), and group_failure turns that into one line; the process still ends, non-zero.
    A value other than torchrun's 1, set by the user, is kept."""
    if environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1") == "1":
        environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"


def _attempt_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """Under torchrun, the store at MASTER_ADDR:MASTER_PORT outlives a restart of the workers, and with it the
    keys the previous attempt's process group wrote (gloo's peer addresses): a restarted worker could read a dead
    peer's address. Each attempt gets keys of its own, under TORCHELASTIC_RESTART_COUNT."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=rank == 0 and not agent_hosts_it, timeout=timeout)
    return dist.PrefixStore(f"attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def check_rendezvous_file(path: Path, timeout_s: float) -> None:
    """A file:// rendezvous must be able to work: its folder must exist (torch's FileStore would wait for a file
    it can never create, past any timeout), and the file must be new. One older than the timeout cannot belong to
    this launch (its first process would have given up by now): it is left from a run that crashed, and would make
    this one hang."""
    if not path.parent.is_dir():
        raise UsageError(f"the file rendezvous folder {path.parent} does not exist: create it on a filesystem every "
                         f"process shares, or give a file:// path in an existing folder")
    if path.exists() and time.time() - path.stat().st_mtime > timeout_s:
        raise UsageError(f"the rendezvous file {path} is left over from an earlier run: delete it (or give a new "
                         f"file:// path) and launch again")


def rendezvous_error(error: Exception, init_method: str, rank: int, timeout_s: float) -> UsageError:
    """Joining the group failed on this rank: the line that says why, printed by this rank (others may not fail)."""
    return UsageError(_rendezvous_advice(" ".join(str(error).split()), init_method, rank, timeout_s),
                      rank_specific=True)


def _rendezvous_advice(text: str, init_method: str, rank: int, timeout_s: float) -> str:
    host, port = os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?")
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rpartition(":")
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return (f"port {port} is already in use on {host} (another job, or a run still shutting down): give a free "
                f"MASTER_PORT (or tcp://{host}:<free port>), e.g. one from 29500-29999")
    if init_method.startswith("file://"):
        return (f"rank {rank}: the file rendezvous {init_method} failed ({text[:120]}): give every process the same "
                f"path on a shared filesystem, delete a file left by an earlier run, and launch again")
    if "gloo" in text.lower() or "nccl" in text.lower():  # the store was reached; a peer was not
        return (f"rank {rank} reached the master but not every other rank ({text[:120]}): a rank died while "
                f"joining, or the nodes cannot open connections to each other (firewall)")
    if "timed out" in text or "timeout" in text.lower() or "refused" in text.lower():
        return (f"rank {rank} could not reach the master at {host}:{port} within {timeout_s:g} s: check "
                f"MASTER_ADDR/MASTER_PORT, that rank 0 is running, and that the port is open between the nodes")
    return f"rank {rank}: joining the process group failed: {text[:200]}"


# Raised by a collective whose peer died or stalled: gloo "Connection closed by peer", NCCL errors, watchdog
# and store timeouts.
_GROUP_FAILURES = ("closed by peer", "connection reset", "broken pipe", "gloo", "nccl", "timed out", "timeout",
                   "watchdog", "process group", "processgroup")


def group_failure(error: BaseException, rank: int, step: int) -> RunError | None:
    """A RunError naming this rank and the step when `error` came from the process group, else None."""
    text = " ".join(str(error).split())
    if not (isinstance(error, dist.DistError) or any(key in text.lower() for key in _GROUP_FAILURES)):
        return None
    return RunError(f"rank {rank} stopped at step {step}: the process group failed ({text[:160]}); another rank "
                    f"has died or stalled, and its own output says why")


def from_rank0(load):
    """`load()` on rank 0 only (it reads the file, which other nodes may not see), its result sent to every rank.
    A UsageError on rank 0 is raised on every rank, so all of them exit."""
    result = [None, None]
    if dist.get_rank() == 0:
        try:
            result[0] = load()
        except UsageError as error:
            result[1] = str(error)
    dist.broadcast_object_list(result, src=0)
    _refused_on_rank0(result[1])
    return result[0]


def on_every_rank(make):
    """`make()` on every rank, where only rank 0 can be refused (it alone claims the run folder): a UsageError
    there is raised on every rank, so all of them exit instead of waiting for rank 0 at the next collective."""
    value, error = None, [None]
    try:
        value = make()
    except UsageError as refused:
        if dist.get_rank() != 0:
            raise
        error = [str(refused)]
    dist.broadcast_object_list(error, src=0)
    _refused_on_rank0(error[0])
    return value


def _refused_on_rank0(message: str | None) -> None:
    if message is not None:
        if dist.get_rank() == 0:
            raise UsageError(message)
        raise SystemExit(2)  # rank 0 prints the line
