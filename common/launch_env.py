"""The variables a launcher sets, read and checked in one place. A process-group worker's
(`worker_launch`): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as
torchrun, the self-launch, a Kubeflow PyTorchJob or a user's shell set them, and what torch's agent
adds (GROUP_RANK, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RUN_ID);
the self-launch's, which it hands to torch's agent (`agent_launch`: PET_NNODES,
PET_SIGNALS_TO_HANDLE, PET_SHUTDOWN_TIMEOUT, TORCH_ELASTIC_SHUTDOWN_TIMEOUT); and the processes a
node's cores are shared among (`processes_on_this_node`). A value that is empty, not a whole
number, or out of its range is refused in one line that names the variable, its value and what to
give, before it reaches an int() or torch. A leaf module: it imports only common/errors.py."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from common.errors import UsageError

PORTS = 65535  # the last TCP port


@dataclass(frozen=True)
class WorkerLaunch:
    """Where this process sits in its job, as its launcher said."""
    rank: int  # RANK: its place among all the job's processes
    world_size: int  # WORLD_SIZE: how many processes the job has
    local_rank: int | None  # LOCAL_RANK: its place on its node (none in a PyTorchJob pod)
    local_world_size: int | None  # LOCAL_WORLD_SIZE: how many processes its node has
    node: int | None  # GROUP_RANK: its node's place among torchrun's nodes
    master_addr: str | None  # MASTER_ADDR, MASTER_PORT: rank 0's store, for env://
    master_port: int | None
    restart: int | None  # TORCHELASTIC_RESTART_COUNT: None where torch's agent did not start it
    agent_store: bool  # TORCHELASTIC_USE_AGENT_STORE: the agent hosts the store at MASTER_PORT
    by_torchrun: bool  # TORCHELASTIC_RUN_ID: torch's agent (torchrun, the self-launch) started it

    @property
    def nodes(self) -> int:
        """The job's nodes, as far as the variables tell: one where LOCAL_WORLD_SIZE is not set."""
        return self.world_size // (self.local_world_size or self.world_size)


def _refused(name: str, value: str, what: str, fix: str) -> UsageError:
    # each process reads its own environment: each says what is wrong with it
    return UsageError(f"{name}={value!r} in the environment is not {what}: {fix}",
                      rank_specific=True)


def _whole(environ, name: str, what: str, fix: str, least: int = 0,
           most: int | None = None) -> int | None:
    """The whole number `name` holds, from `least` to `most`; None where it is not set."""
    value = environ.get(name)
    if value is None:
        return None
    text = value.strip()
    number = int(text) if text.isascii() and text.isdigit() else None
    if number is not None and least <= number and (most is None or number <= most):
        return number
    if most is None:
        span = f"a whole number {least} or more"
    elif most == least:
        span = f"here only {least}"
    else:
        span = f"a whole number from {least} to {most}"
    raise _refused(name, value, f"{what} ({span})", fix)


def _half_set(missing: str, given: str) -> UsageError:
    return UsageError(f"{missing} is not set but {given} is: set both (and MASTER_ADDR, "
                      "MASTER_PORT) in each process, or neither to let train.py start its own "
                      "workers", rank_specific=True)


def worker_launch(environ=os.environ, env_rendezvous: bool = True) -> WorkerLaunch:
    """The launch of a process-group worker (RANK and WORLD_SIZE are set), every value checked:
    RANK within WORLD_SIZE, LOCAL_RANK within LOCAL_WORLD_SIZE (or WORLD_SIZE), LOCAL_WORLD_SIZE
    within WORLD_SIZE; with an `env_rendezvous` (--init_method env://), MASTER_ADDR and a
    MASTER_PORT that is a port. The first one that is wrong is refused in one line."""
    world_size = _whole(environ, "WORLD_SIZE", "the job's number of processes", least=1,
                        fix="set it to the processes of the whole job, the same in each")
    if world_size is None:
        raise _half_set("WORLD_SIZE", "RANK")
    rank = _whole(environ, "RANK", f"this process's place among the job's WORLD_SIZE={world_size}",
                  most=world_size - 1, fix="give each process its own RANK")
    if rank is None:
        raise _half_set("RANK", "WORLD_SIZE")
    local_world_size = _whole(environ, "LOCAL_WORLD_SIZE", f"the number of processes on this "
                              f"node, of the job's WORLD_SIZE={world_size}", least=1,
                              most=world_size,
                              fix="set it to this node's processes, or unset it")
    local_processes = local_world_size or world_size
    bound = "LOCAL_WORLD_SIZE" if local_world_size else "WORLD_SIZE"
    local_rank = _whole(environ, "LOCAL_RANK", f"this process's place among its node's "
                        f"{bound}={local_processes}", most=local_processes - 1,
                        fix="set it per process, or unset it (each process then takes RANK "
                            "modulo the node's GPUs)")
    node = torchrun_node(environ)
    restart = _whole(environ, "TORCHELASTIC_RESTART_COUNT", "a count of restarts",
                     fix="torch's agent sets it: unset yours")
    master_addr, master_port = environ.get("MASTER_ADDR"), None
    if env_rendezvous:
        master_addr, master_port = _master(environ)
    return WorkerLaunch(rank=rank, world_size=world_size, local_rank=local_rank,
                        local_world_size=local_world_size, node=node, master_addr=master_addr,
                        master_port=master_port, restart=restart,
                        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                        by_torchrun="TORCHELASTIC_RUN_ID" in environ)


def torchrun_node(environ=os.environ) -> int | None:
    """GROUP_RANK: this worker's node among torchrun's (None: no torchrun said), checked."""
    return _whole(environ, "GROUP_RANK", "this node's place among torchrun's nodes",
                  fix="torchrun sets it: unset yours")


def local_rank(environ=os.environ) -> int | None:
    """LOCAL_RANK alone (None: no launcher said), for what runs once the group is made: checked
    within the node by worker_launch before."""
    return _whole(environ, "LOCAL_RANK", "this process's place on its node",
                  fix="set it per process, or unset it")


def _master(environ) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT, which env:// reads: where rank 0's store listens."""
    fix = ("set MASTER_ADDR to rank 0's host name or IP address and MASTER_PORT to a free port "
           "there (e.g. 29500) in every process, or give --init_method tcp://HOST:PORT")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in environ]
    if missing:
        raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, "
                         f"and --init_method env:// reads {'it' if len(missing) == 1 else 'them'}: "
                         f"{fix}", rank_specific=True)
    address = environ["MASTER_ADDR"]
    if not address.strip() or any(character.isspace() for character in address):
        raise _refused("MASTER_ADDR", address, "a host name or IP address", fix)
    port = _whole(environ, "MASTER_PORT", "a TCP port", least=1, most=PORTS,
                  fix="give a port that is free on rank 0's host, the same in every process, "
                      "e.g. 29500")
    return address, port


def processes_on_this_node(environ=os.environ) -> int:
    """The training processes this node's cores are shared among: LOCAL_WORLD_SIZE, or WORLD_SIZE
    on a launch without it (one node). 1 where neither is a whole number above 0: in a one-process
    mode they are some other job's (a process-group worker has refused them already, in
    worker_launch, before it builds a loader)."""
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        value = environ.get(name, "").strip()
        if value:
            return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else 1
    return 1


@dataclass(frozen=True)
class AgentLaunch:
    """What the self-launch hands torch's agent from the environment."""
    nodes: int | None  # the most nodes of PET_NNODES ("2", or "MIN:MAX"), as Kubeflow sets it
    signals: str | None  # PET_SIGNALS_TO_HANDLE: the signals the agent passes on to the workers
    shutdown_timeout: bool  # whether TORCH_ELASTIC_SHUTDOWN_TIMEOUT is set (PET_SHUTDOWN_TIMEOUT
    # reaches the agent's parser, as --shutdown_timeout's default)


def agent_launch(environ=os.environ) -> AgentLaunch:
    """The self-launch's variables, each checked: torch's agent would stop on a bad one with its own
    usage text or a traceback (PET_SHUTDOWN_TIMEOUT, TORCH_ELASTIC_SHUTDOWN_TIMEOUT), or warn and
    pass no signal on (a misspelt name in PET_SIGNALS_TO_HANDLE)."""
    nodes = environ.get("PET_NNODES")
    most = None
    if nodes is not None:
        least, colon, most_text = nodes.strip().partition(":")
        parts = [least, most_text] if colon else [least]
        if not all(part.isascii() and part.isdigit() and int(part) > 0 for part in parts):
            raise _refused("PET_NNODES", nodes, "a number of nodes (N, or MIN:MAX, each 1 or "
                                                "more)", "set it so, or unset it")
        most = int(parts[-1])
    signals = environ.get("PET_SIGNALS_TO_HANDLE")
    if signals is not None:
        names = [name.strip() for name in signals.split(",")]
        unknown = [name for name in names if name not in signal.Signals.__members__]
        if unknown:
            raise _refused("PET_SIGNALS_TO_HANDLE", signals, "a list of signals (names such as "
                           "SIGTERM,SIGUSR1, comma-separated)",
                           f"{unknown[0] or 'an empty name'} is no signal of this system; give "
                           "their names, or unset it")
    for name in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        _whole(environ, name, "the seconds torch's agent waits for its workers to stop",
               fix="give a whole number of seconds, or unset it")
    return AgentLaunch(nodes=most, signals=signals,
                       shutdown_timeout="TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in environ)
