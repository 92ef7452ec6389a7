"""The workers of a process-group mode (dist_parallel, fsdp) and what starts them: the self-launch
(`python train.py` without torchrun) through torch's own elastic launcher, which GPU each worker
takes, workers that die with their launcher, the report of a clean stop, which the launcher cannot
see for itself, and the safety net around the lines that join the process group (CheckedLaunch)."""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path


from common.checkpoint import (LAST, STOP_REPORT, STOPPED, TRAINING, StopSignals, continue_flags,
                               last_checkpoint_note, refuse_fresh_start, silence_lost_outputs,
                               tell_self_launch)
from common.config import UsageError, workers_refusal
from common.errors import plural
from common.devices import cuda_devices
from common.guards import (check_launch, check_master_address, nccl_error_handling,
                           rendezvous_error, store_of_this_attempt)
from common.launch_env import AgentLaunch, WorkerLaunch, agent_launch, worker_launch
from common.logger import resolve_run_dir

def die_with_launcher() -> None:
    """A worker started by torch's elastic agent (torchrun or the self-launch) is tied to it. It
    dies with the agent: the agent puts each worker in a session of its own, so when the agent
    itself is killed (`kill -9`, an out-of-memory kill) nothing reaches the workers, which would
    train on as orphans, writing checkpoints beside whatever run is started next in their
    folder; Linux's parent-death signal kills them instead (the last checkpoint, written
    atomically, is intact). And a new attempt of the workers (--max_restarts) voids an earlier
    attempt's report of a clean stop."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return
    arm = killed_with(os.getppid())
    if arm is not None:
        arm()
    if os.environ.get("RANK") == "0" and os.environ.get(STOP_REPORT):
        for name in (STOPPED, TRAINING):
            (Path(os.environ[STOP_REPORT]) / name).unlink(missing_ok=True)


def killed_with(parent: int):
    """A function that, called in a child of process `parent` (between fork and exec, or first
    thing), has Linux send the child SIGKILL when `parent` ends (precisely: the thread of it that
    started the child); a child whose parent ended already exits at once. None where there is no
    such signal (not Linux). ctypes' lookup is done here, so that the child only makes the call."""
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


def launch_workers(script: str, argv: list[str], nproc: int, max_restarts: int = 0,
                   run_dir: Path | None = None, agent: AgentLaunch | None = None) -> int:
    """Start `nproc` workers of `script` on this machine through torch's elastic launcher, exactly
    as `torchrun --standalone --nproc_per_node nproc --max-restarts max_restarts script argv` would
    (a free port, c10d rendezvous; after a worker fails, the whole group is restarted up to
    max_restarts times), and say in one line how they ended when they did not all succeed
    (stop_line, failure_line). SIGUSR1 is passed on to the workers with SIGTERM, SIGINT, SIGHUP and
    SIGQUIT (torch's agent would die of it, its workers with it), and the workers have
    SHUTDOWN_TIMEOUT_S to stop cleanly after one, unless the user chose otherwise (`agent`: the
    agent's variables, agent_launch)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    agent = agent or agent_launch()
    with own_topology():  # one node, standalone: what the flags say, not an agent's PET_*
        parser = get_args_parser()
    args = parser.parse_args(["--standalone", f"--nproc_per_node={nproc}",
                              f"--max-restarts={max_restarts}", script, *argv])
    # not in old torch
    if hasattr(args, "signals_to_handle") and agent.signals is None:
        # unless the user chose (torchrun --signals-to-handle's variable)
        args.signals_to_handle = AGENT_SIGNALS
    if getattr(args, "shutdown_timeout", 0) is None and not agent.shutdown_timeout:
        # unless the user chose (its variable, or PET_SHUTDOWN_TIMEOUT)
        args.shutdown_timeout = SHUTDOWN_TIMEOUT_S
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    with tempfile.TemporaryDirectory(prefix="stop-report-") as folder:
        os.environ[STOP_REPORT] = folder  # the workers inherit this process's environment
        agent_log.addFilter(said_here)
        try:
            run(args)
        except SignalException as stop:  # the launcher passed the signal on to the workers
            if stop.sigval == signal.SIGHUP:  # the terminal may be gone
                silence_lost_outputs()
            line, code = stop_line(stop.sigval, Path(folder), run_dir)
            print(line, file=sys.stderr)
            return code
        except ChildFailedError as error:
            line, code = failure_line({failure.local_rank: failure.exitcode
                                       for failure in error.failures.values()}, Path(folder))
            print(line, file=sys.stderr)
            return code
        finally:
            del os.environ[STOP_REPORT]
            agent_log.removeFilter(said_here)
    return 0


# The signals torch's agent passes on to its workers: its default (SIGTERM, SIGINT, SIGHUP,
# SIGQUIT) and SIGUSR1, which would otherwise kill the agent, and its workers with it, before
# they can write a stop checkpoint.
AGENT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# How long torch's agent waits, once it has passed a signal on, for the workers to reach their next
# log window and write the stop checkpoint before it kills them: its own 30 s is little on a loaded
# node (a window of the default 50 steps, the RNG states gathered, the checkpoint written and
# fsynced); slurm/*.sbatch give 90 s too.
SHUTDOWN_TIMEOUT_S = 90


def said_here(record: logging.LogRecord) -> bool:
    """torch's agent logs "failed (exitcode: N)" for each worker that did not exit 0, a
    stop by a signal included; the self-launch says what happened to its workers itself,
    once (stop_line, failure_line)."""
    return not str(record.msg).startswith("failed (exitcode")


def stop_line(signum: int, report: Path, run_dir: Path | None) -> tuple[str, int]:
    """What the self-launch says, and its exit status, when a signal stopped it: the workers stopped
    cleanly when rank 0 told what it left (StopSignals: its stop checkpoint, or an evaluation cut
    short); before rank 0 was listening for signals (the workers were starting), nothing was
    trained; else torch's agent, which waits SHUTDOWN_TIMEOUT_S after passing the signal on, killed
    workers that had not stopped."""
    name = signal.Signals(signum).name
    stopped = report / STOPPED
    if stopped.exists():
        what, then = stopped.read_text().splitlines()[:2]
        return f"stopped by {name}: the workers stopped cleanly ({what}); {then}", 128 + signum
    if not (report / TRAINING).exists():
        return (f"stopped by {name} before training began (the workers were starting); "
                f"{unchanged(run_dir)}", 128 + signum)
    note = last_checkpoint_note(run_dir)
    return (f"error: stopped by {name}, but the workers did not stop cleanly (rank 0 reported no "
            f"stop checkpoint; their output above may say why); {note}", 1)


def unchanged(run_dir: Path | None) -> str:
    """What there is to resume after a stop before training began, in the run's folder `run_dir`
    (None: a default name, which the next launch does not share)."""
    if run_dir is not None and (run_dir / LAST).exists():
        return f"its last checkpoint {run_dir / LAST} is as it was: continue with --resume auto"
    if run_dir is not None and run_dir.is_dir():  # claimed as training was about to begin: empty
        return f"nothing to resume: run the command again, with --resume auto ({run_dir} exists)"
    return "nothing to resume: run the command again"


def failure_line(exit_codes: dict[int, int], report: Path) -> tuple[str, int]:
    """What the self-launch says, and its exit status, when workers failed ({worker: exit code}; -N:
    killed by signal N): a stop by a signal that reached one worker (its vote stopped all: rank 0
    told what it left) is a stop like any other; a worker that ended with a status of its own has
    said why (a usage error exits 2, as everywhere); a worker killed by a signal said nothing, so
    the line names the signal. Workers that torch's agent ended with SIGTERM once another had failed
    are left out, as effects, not causes."""
    exited = {worker: code for worker, code in exit_codes.items() if code > 0}
    killed = {worker: -code for worker, code in exit_codes.items() if code < 0}
    stops = {code - 128 for code in exited.values()} & set(StopSignals.NAMES)
    if ((report / STOPPED).exists() and len(stops) == 1
        and set(exited.values()) == {128 + min(stops)}):
        return stop_line(min(stops), report, None)
    causes = {worker: number for worker, number in killed.items() if number != signal.SIGTERM}
    if exited:
        workers = ", ".join(map(str, sorted(exited)))
        codes = ", ".join(map(str, sorted(set(exited.values()))))
        line = f"error: worker {workers} failed (exit status {codes}); its message is above"
        return "; ".join([line, *killed_by(causes)]), max(exited.values())
    causes = causes or killed
    hint = ("; TORCH_DISTRIBUTED_DEBUG=DETAIL is set, which crashes DDP's constructor on torch "
            "2.14.1: unset it (docs/guide.md#debugging-a-hang)" if signal.SIGSEGV in causes.values()
            and os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL" else "")
    own = "their" if len(causes) > 1 else "its"
    return (f"error: {'; '.join(killed_by(causes))}, with no message of {own} own{hint}",
            128 + min(causes.values()))


def killed_by(signals: dict[int, int]) -> list[str]:
    """{worker: signal number} said by signal: "worker 1 was killed by SIGSEGV (signal 11)"."""
    said = []
    for number in sorted(set(signals.values())):
        workers = [str(worker) for worker, other in sorted(signals.items()) if other == number]
        were = ("workers " + ", ".join(workers) + " were" if len(workers) > 1
                else f"worker {workers[0]} was")
        said.append(f"{were} killed by {signal.Signals(number).name} (signal {number})")
    return said


def tell_self_launch_stopped(step: int, checkpoint: Path | None) -> None:
    """Stopped by a signal with the checkpoint written, rank 0 tells
    the self-launch what it left."""
    # the run's name too: without it a default-named run's next launch would start a new run
    then = (f"continue with {continue_flags(checkpoint.parent)}" if checkpoint
            else "a --benchmark run keeps no checkpoint")
    tell_self_launch(STOPPED, f"step {step}, checkpoint {checkpoint}\n{then}")


SHARING_HINT = " (ranks may share a GPU under --backend gloo; NCCL refuses two ranks on one GPU)"


def node_gpus(gpu_devices, backend: str | None) -> list[int]:
    """The GPUs of this node, of which one is this process's (local_rank_of): --gpu_devices
    (default: every visible GPU); [] without CUDA. Under gloo a GPU may be listed more than once
    (`--gpu_devices 0 0`: two ranks on one GPU); NCCL refuses that."""
    return cuda_devices(gpu_devices, default_all=True, shared=backend == "gloo",
                        sharing_hint=SHARING_HINT)


def local_rank_of(rank: int, local_rank: int | None, gpus: int) -> int:
    """This process's place on its node, hence its GPU (the local_rank-th of the node's `gpus`):
    LOCAL_RANK where its launcher set it (torchrun, the self-launch). Where none did, as in a
    Kubeflow PyTorchJob pod (one process, RANK and WORLD_SIZE but no LOCAL_RANK) or a process
    started by hand, what the node has: RANK modulo its GPUs. A pod sees its own GPUs, so RANK 3 of
    one-GPU pods takes GPU 0 of its pod; ranks started by hand, node by node, take one GPU each.
    Without GPUs there is nothing to pick (RANK itself). A LOCAL_RANK past the node's GPUs is
    refused: two processes would share a GPU."""
    if local_rank is None:
        return rank % gpus if gpus else rank
    if gpus and local_rank >= gpus:
        raise UsageError(f"local rank {local_rank} has no GPU of its own ({gpus} available): "
                         f"start at most one process per GPU", rank_specific=True)
    return local_rank


class CheckedLaunch:
    """What a process-group mode's setup() does only for when something goes wrong, beside the lines
    that join the group, which read as PyTorch's tutorial writes them: safe to skip on a first read.

    Made first, before setup() reads the environment: this worker dies with its torchrun agent
    (die_with_launcher); every variable its launcher set is read and checked (`launch`:
    common/launch_env.py), and a bad one, a loopback master across nodes, and what no worker can
    run with (check_launch) are refused in one line; `node_gpus` is this node's GPUs
    and `local_rank` this process's place among them (LOCAL_RANK, else RANK modulo the GPUs:
    local_rank_of), checked to have one of its own; `timeout` is --dist_timeout, how long a
    collective may wait. Then `with launch:` around init_process_group: NCCL's errors set to reach
    the main thread, a store of this attempt's own after a torchrun restart (`store`;
    `init_method` is None then), and a failed rendezvous said in one line, with the fix for the
    failures users meet (a port in use, a master that cannot be reached, a file:// rendezvous
    left over from a crashed run)."""

    def __init__(self, cfg, mode: str):
        die_with_launcher()  # a killed torchrun agent takes this worker with it: no orphan
        # set by torchrun (or by hand): each variable checked, a bad one said in one line
        self.launch = worker_launch(env_rendezvous=cfg.init_method == "env://")
        self.rank, self.world_size = self.launch.rank, self.launch.world_size
        refuse_self_launch_flags(cfg, self.launch)  # --nproc_per_node: the self-launch's alone
        check_master_address(self.launch)  # a loopback master across nodes
        check_launch(cfg, mode, self.world_size)  # no worker can run it: one line
        self.node_gpus = node_gpus(cfg.gpu_devices, cfg.backend)
        # LOCAL_RANK: none in a PyTorchJob pod of one process
        self.local_rank = local_rank_of(self.rank, self.launch.local_rank,
                                        len(self.node_gpus))  # one GPU each
        self.cfg = cfg
        self.timeout = datetime.timedelta(seconds=cfg.dist_timeout)  # a longer wait fails
        self.store = None

    @property
    def init_method(self) -> str | None:
        """--init_method (env://, tcp://HOST:PORT or file://PATH); None where `store` is."""
        return None if self.store else self.cfg.init_method

    def __enter__(self) -> CheckedLaunch:
        nccl_error_handling(os.environ)  # before the group: a failed collective reaches this thread
        # torch.distributed.nn's functions take the default group as their default argument when
        # first imported (torchvision and torch.compile import it): imported after the group is
        # made, they hold it past destroy_process_group, its gloo threads live on into Python's
        # exit, and torch 2.14 aborts a rank there ("terminate called without an active
        # exception", exit -6). Imported now, they hold None.
        import torch.distributed.nn  # noqa: F401
        try:  # a store of this attempt's own: after a torchrun restart only
            self.store = store_of_this_attempt(self.cfg.init_method, self.launch, self.timeout)
        except (RuntimeError, ValueError) as error:  # the rendezvous's first step
            raise self.failed(error) from None
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, (RuntimeError, ValueError)):  # DistNetworkError, DistStoreError too
            raise self.failed(error) from None

    def failed(self, error: Exception) -> UsageError:
        """Joining the group failed on this rank: the line that says why (others may not fail)."""
        return rendezvous_error(error, self.cfg.init_method, self.launch, self.cfg.dist_timeout)


def refuse_self_launch_flags(cfg, launch: WorkerLaunch) -> None:
    """--nproc_per_node and --max_restarts say how many workers `python train.py` starts without
    torchrun, and how often it restarts them: they take effect in the self-launch's workers only
    (which know it by STOP_REPORT). A worker that torchrun, or the user by hand, started would
    ignore them, and its run record them as if they had: refused in one line, with the way."""
    if os.environ.get(STOP_REPORT):  # a worker of the self-launch: they took effect
        return
    given = {flag: value for flag, value in (("nproc_per_node", cfg.nproc_per_node),
                                             ("max-restarts", cfg.max_restarts or None))
             if value is not None}
    if not given:
        return
    flags = " and ".join(f"--{flag.replace('-', '_')} {value}" for flag, value in given.items())
    one = len(given) == 1
    if launch.by_torchrun:
        torchrun = " ".join(f"--{flag} {value}" for flag, value in given.items())
        who, way = "torchrun", (f"give torchrun {torchrun} before train.py, and leave "
                                f"{'it' if one else 'them'} out after it")
    else:
        who, way = ("hand (RANK and WORLD_SIZE are set)",
                    f"leave {'it' if one else 'them'} out: each such process is one worker")
    raise UsageError(f"{flags} {'is' if one else 'are'} for `python train.py` without torchrun, "
                     f"which starts its own workers, and this process was started by {who}, "
                     f"where {'it' if one else 'they'} would be ignored: {way}")


# torchrun's variables that stay the user's choice in the self-launch: how the agent passes
# signals on and how long it then waits (launch_workers), not where the job is
AGENT_CHOICES = ("PET_SIGNALS_TO_HANDLE", "PET_SHUTDOWN_TIMEOUT")


@contextlib.contextmanager
def own_topology():
    """torchrun's parser (torch.distributed.run.get_args_parser) takes the default of each of its
    flags from PET_<FLAG> when it is built. Kubeflow's operators set them for torchrun in every pod
    (PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR; an elastic PyTorchJob
    PET_RDZV_ENDPOINT, PET_STANDALONE...), and the self-launch's standalone agent would take them:
    with PET_NNODES=2 it waits, silent, for a second node that never comes. While the parser is
    built, every PET_* but AGENT_CHOICES is out of the environment; the workers still inherit it."""
    hidden = {name: os.environ.pop(name) for name in list(os.environ)
              if name.startswith("PET_") and name not in AGENT_CHOICES}
    try:
        yield
    finally:
        os.environ.update(hidden)


def check_one_node(agent: AgentLaunch) -> None:
    """The self-launch trains on this node alone: in a job whose agents were told of several
    nodes (PET_NNODES, as a Kubeflow TrainJob or PyTorchJob sets it for torchrun: "2", or
    "MIN:MAX"), each node would train a job of its own, into the same run folder. Refused in one
    line, with torchrun, which joins the nodes, as the way."""
    if agent.nodes is not None and agent.nodes > 1:
        raise UsageError(f"PET_NNODES={os.environ['PET_NNODES']} in the environment (a Kubeflow "
                         f"TrainJob or PyTorchJob sets it for torchrun) makes this a job of "
                         f"{agent.nodes} nodes, and "
                         "`python train.py` starts workers on this node only: start it with "
                         "torchrun, which reads PET_* (`torchrun train.py ...`), or unset "
                         "PET_NNODES to train on this node alone")


def self_launch(cfg, script: str, argv, mode: str) -> int:
    """`python train.py` without torchrun (neither RANK nor WORLD_SIZE set): refuse what can be
    refused, then start one worker per GPU (or --nproc_per_node CPU workers) as `torchrun
    --standalone` would, on this node only, whatever PET_* variables an agent left in the
    environment; each worker runs `script` again."""
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:  # one without the other: a launch by
        worker_launch(env_rendezvous=False)  # hand half made, refused naming the one missing
    agent = agent_launch()  # the variables torch's agent reads, checked
    check_one_node(agent)  # an operator's job of several nodes: torchrun's, in one line
    gpus = node_gpus(cfg.gpu_devices, cfg.backend)
    nproc = cfg.nproc_per_node or len(gpus) or 1
    if gpus and nproc > len(gpus):
        raise UsageError(f"--nproc_per_node {nproc} is more than the {plural(len(gpus), 'GPU')} "
                         "available: one process per GPU")
    check_launch(cfg, mode, nproc)
    refusal = workers_refusal(cfg, nproc)  # --num_workers in each of the nproc workers
    if refusal:
        raise UsageError(refusal)
    run_dir = resolve_run_dir(cfg, mode, nproc)
    refuse_fresh_start(cfg, run_dir)  # in one line before any worker starts (and is restarted)
    # share the cores
    os.environ.setdefault("OMP_NUM_THREADS", str(max((os.cpu_count() or 1) // nproc, 1)))
    return launch_workers(script, sys.argv[1:] if argv is None else [str(arg) for arg in argv],
                          nproc, cfg.max_restarts,
                          run_dir if cfg.run_name else None,  # a default name is the worker's
                          agent)
