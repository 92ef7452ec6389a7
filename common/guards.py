"""Guards around the torch.distributed calls each process-group mode makes in its own train.py: each
turns what goes wrong at a call into one line that says what to do, bounds a wait, or keeps the
ranks together when only rank 0 may act. The calls themselves stay in the train.py files."""
from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from common.config import RunError, UsageError
from common import launch_env
from common.launch_env import WorkerLaunch
from common.rules import refuse_launch


def check_launch(cfg, mode: str, world_size: int) -> None:
    """What can be refused before the process group is joined: a rendezvous that cannot work, and
    `refuse_launch`'s rules. The self-launch checks first, then every worker again (after its
    launch variables: common/launch_env.py)."""
    if cfg.init_method.startswith("file://"):
        check_rendezvous_file(Path(cfg.init_method[len("file://"):]), cfg.dist_timeout)
    refuse_launch(mode, world_size, cuda=torch.cuda.is_available(), batch_size=cfg.batch_size,
                  backend=cfg.backend, sync_bn=getattr(cfg, "sync_bn", False), compile=cfg.compile,
                  evaluate=bool(cfg.evaluate), compile_mode=cfg.compile_mode,
                  bucket_cap_mb=getattr(cfg, "bucket_cap_mb", None),
                  memory_snapshot=cfg.memory_snapshot)


def check_master_address(launch: WorkerLaunch) -> None:
    """A loopback MASTER_ADDR with more than one node makes every other node look for the
    master on itself. Set by hand, it is refused. Under torchrun it came from the rendezvous
    (the first agent's own name, or --local_addr), which cannot tell two agents on one host
    from two hosts: rank 0 warns instead."""
    address, nodes = launch.master_addr or "", launch.nodes
    if nodes <= 1 or not _is_loopback(address):
        return
    if launch.by_torchrun:
        if launch.rank == 0:
            print(f"warning: MASTER_ADDR is {address} for a job on {nodes} nodes: fine on "
                  "one host; across machines give torchrun --local_addr <reachable "
                  "address> on the first node", file=sys.stderr)
        return
    raise UsageError(f"MASTER_ADDR {address} is a loopback address but the job spans {nodes} "
                     "nodes: set it to the first node's reachable host name or IP")


def _is_loopback(address: str) -> bool:
    if address.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_rendezvous_file(path: Path, timeout_s: float) -> None:
    """A file:// rendezvous must be able to work: its folder must exist (torch's FileStore would
    wait for a file it can never create, past any timeout), and the file must be new. One older than
    the timeout cannot belong to this launch (its first process would have given up by now): it is
    left from a run that crashed, and would make this one hang."""
    if not path.parent.is_dir():
        raise UsageError(f"the file rendezvous folder {path.parent} does not exist: "
                         "create it on a filesystem every process shares, or give a "
                         "file:// path in an existing folder")
    if path.exists() and time.time() - path.stat().st_mtime > timeout_s:
        raise UsageError(f"the rendezvous file {path} is left over from an earlier run: delete it "
                         "(or give a new file:// path) and launch again")


def nccl_error_handling(environ) -> None:
    """How NCCL's watchdog thread handles a collective that failed or outlived --dist_timeout.
    torchrun gives every worker TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless told otherwise, and torch's
    own default is 3; both make the watchdog take the whole process down from its own thread ("To
    avoid data inconsistency, we are taking the entire process down"), before the main thread can
    say which rank stopped at which step. 2 (CleanUpOnly) aborts the communicators and no more: the
    collective the main thread waits on returns, the next one raises ("NCCL communicator was
    aborted"), and group_failure turns that into one line; the process still ends, non-zero. A value
    other than torchrun's 1, set by the user, is kept."""
    if environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1") == "1":
        environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"


def store_of_this_attempt(init_method: str, launch: WorkerLaunch,
                          timeout: datetime.timedelta) -> dist.Store | None:
    """Under torchrun, the store at MASTER_ADDR:MASTER_PORT outlives a restart of the workers, and
    with it the keys the previous attempt's process group wrote (gloo's peer addresses): a restarted
    worker could read a dead peer's address. Each attempt gets keys of its own, under
    TORCHELASTIC_RESTART_COUNT. None outside torchrun or with another rendezvous than env://
    (init_process_group then rendezvouses itself)."""
    if init_method != "env://" or launch.restart is None:
        return None
    store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                          is_master=launch.rank == 0 and not launch.agent_store, timeout=timeout)
    return dist.PrefixStore(f"attempt_{launch.restart}", store)


def rendezvous_error(error: Exception, init_method: str, launch: WorkerLaunch,
                     timeout_s: float) -> UsageError:
    """Joining the group failed on this rank: the line that says why, printed by
    this rank (others may not fail)."""
    return UsageError(_rendezvous_advice(" ".join(str(error).split()), init_method, launch,
                                         timeout_s),
                      rank_specific=True)


def _rendezvous_advice(text: str, init_method: str, launch: WorkerLaunch, timeout_s: float) -> str:
    rank, host, port = launch.rank, launch.master_addr or "?", launch.master_port or "?"
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rpartition(":")
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return (f"port {port} is already in use on {host} (another job, or a run still "
                f"shutting down): give a free MASTER_PORT (or tcp://{host}:<free port>), "
                "e.g. one from 29500-29999")
    if init_method.startswith("file://"):
        return (f"rank {rank}: the file rendezvous {init_method} failed ({text[:120]}): give "
                "every process the same path on a shared filesystem, delete a file left by an "
                "earlier run, and launch again")
    if "gloo" in text.lower() or "nccl" in text.lower():  # the store was reached; a peer was not
        return (f"rank {rank} reached the master but not every other rank ({text[:120]}): a rank "
                "died while joining, or the nodes cannot open connections to each other (firewall)")
    if "timed out" in text or "timeout" in text.lower() or "refused" in text.lower():
        return (f"rank {rank} could not reach the master at {host}:{port} within {timeout_s:g} "
                "s: check MASTER_ADDR/MASTER_PORT, that rank 0 is running, and that the port is "
                "open between the nodes")
    return f"rank {rank}: joining the process group failed: {text[:200]}"


# Raised by a collective whose peer died or stalled: gloo "Connection closed by peer", NCCL errors,
# watchdog and store timeouts.
_GROUP_FAILURES = ("closed by peer", "connection reset", "broken pipe", "gloo", "nccl", "timed out",
                   "timeout", "watchdog", "process group", "processgroup")


def group_failure(error: BaseException, rank: int, step: int) -> RunError | None:
    """A RunError naming this rank and the step when `error` came from
    the process group, else None."""
    text = " ".join(str(error).split())
    if not (isinstance(error, dist.DistError)
            or any(key in text.lower() for key in _GROUP_FAILURES)):
        return None
    return RunError(f"rank {rank} stopped at step {step}: the process group failed ({text[:160]}); "
                    "another rank has died or stalled, and its own output says why")


def raise_group_failure(error: BaseException, rank: int, step: int) -> None:
    """`error` raised as group_failure's one line when it came from the process group; otherwise
    nothing, and the caller raises `error` as it is."""
    failure = group_failure(error, rank, step)
    if failure is not None:
        raise failure from None


@contextlib.contextmanager
def local_rank0_first():
    """The body runs first on each node's local rank 0 (a download, say), then on the others, which
    find its files: the others wait at a barrier that local rank 0 reaches after the body."""
    local_rank = launch_env.local_rank()  # checked by CheckedLaunch; None: a pod's only process
    local_rank = dist.get_rank() if local_rank is None else local_rank
    if local_rank != 0:
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def compile_leader(device: torch.device, timeout_s: float) -> tuple | None:
    """Which rank compiles first for this one, for CompileClock.follow (common/compiling.py): the
    ranks of one torchrun node (GROUP_RANK, its host) on the same device compile the same graphs
    into one cache, so the first of them compiles each graph while the others wait, then read it
    from the cache. Ranks on different GPUs are not grouped: inductor's FX-graph cache keys hold the
    device index (torch/_inductor/codecache.py, extract_tensor_metadata_for_cache_key) and Triton's
    cache is per device (runtime/cache_dir_utils.py, triton_cache_dir), so a rank on cuda:1 cannot
    read what cuda:0 compiled. Returns (a store on the first rank's loopback, whether this rank is
    the first, `timeout_s`), or None where this rank compiles alone (a launch by hand says nothing
    of its node). Two all_gather_object calls: every rank makes them."""
    node = launch_env.torchrun_node()  # GROUP_RANK, torchrun's: the node its workers share
    place = None if node is None else (node, socket.gethostname(), str(device))
    places = [None] * dist.get_world_size()
    dist.all_gather_object(places, place)
    sharing = [rank for rank, other in enumerate(places) if place is not None and other == place]
    first = sharing[0] if len(sharing) > 1 else None
    timeout = datetime.timedelta(seconds=timeout_s)
    store = None
    # the node's own store, on its loopback, at a port the system picks
    if first == dist.get_rank():
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=timeout)
    ports = [None] * dist.get_world_size()
    dist.all_gather_object(ports, store.port if store is not None else None)
    if first is None:
        return None
    if store is None:
        store = dist.TCPStore("127.0.0.1", ports[first], is_master=False, timeout=timeout)
    return store, first == dist.get_rank(), timeout_s


def broadcast_from_rank0(load):
    """`load()` on rank 0 only (it reads the file, which other nodes may not see), its result sent
    to every rank. A UsageError on rank 0 is raised on every rank, so all of them exit."""
    result = [None, None]
    if dist.get_rank() == 0:
        try:
            result[0] = load()
        except UsageError as error:
            result[1] = str(error)
    dist.broadcast_object_list(result, src=0)
    _refused_on_rank0(result[1])
    return result[0]


@contextlib.contextmanager
def exit_together_if_rank0_refused():
    """Around what every rank does but only rank 0 can be refused at (it alone claims the run
    folder): a UsageError there is raised on every rank, so all of them exit instead of waiting for
    rank 0 at the next collective. Every rank: a collective (a broadcast) at the end."""
    error = [None]
    try:
        yield
    except UsageError as refused:
        if dist.get_rank() != 0:
            raise
        error = [str(refused)]
    dist.broadcast_object_list(error, src=0)
    _refused_on_rank0(error[0])


def _refused_on_rank0(message: str | None) -> None:
    if message is not None:
        if dist.get_rank() == 0:
            raise UsageError(message)
        raise SystemExit(2)  # rank 0 prints the line
