"""DataLoader's worker processes: how many a training process starts by default
(`default_num_workers`), and the one warning when more are asked for than there are cores; what a
worker does with a stop signal (it leaves stopping to the main process); and how a worker's death
reaches the run (`worker_death`, whatever the DataLoader raised for it; `LoaderWorkerDied`: it stops
as if asked to; `UnreadableImage`). The torchvision loader's workers decode and augment every
batch; the gpu loader's decode an image folder once."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings

from common.errors import plural
from common.launch_env import processes_on_this_node


class LoaderWorkerDied(RuntimeError):
    """A DataLoader worker process ended (killed by the OOM killer, say):
    the run can stop as if asked to."""


class UnreadableImage(LoaderWorkerDied):
    """An image of an image folder that PIL could not decode while training (one that
    passed check_images): the run stops as for a dead worker. Raised in a DataLoader
    worker, re-raised by the DataLoader in the main process with the worker's traceback,
    of which it keeps its own line."""

    def __init__(self, message: str):
        # re-raised by the DataLoader: the last line is this error's own
        if "Original Traceback" in message:
            message = message.rstrip().splitlines()[-1].split(f"{type(self).__name__}: ", 1)[-1]
        super().__init__(message)


# torch's words for an error a worker raised itself, re-raised in the main process
_RAISED_IN_A_WORKER = "in DataLoader worker process"


def worker_death(error: Exception, batches) -> str | None:
    """The line for a worker's death if `error`, raised while the DataLoader iterator `batches` ran,
    came of one, in torch's words ("DataLoader worker (pid N) is killed by signal: Killed"); None
    where no worker has ended: the error is its own. What the DataLoader raises depends on when the
    worker died (killed by the out-of-memory killer, at any moment): torch's RuntimeError once it
    finds the worker dead, but a ConnectionResetError, ConnectionRefusedError or EOFError where it
    was fetching a batch the worker sent (the file descriptor of its shared memory, from the
    worker's multiprocessing.resource_sharer) as the worker's threads ended: before the worker can
    be waited for, which torch's own checks need. So for any error but one a worker raised itself,
    a worker is given torch's status interval (5 s) to be found ended: its sentinel is ready once
    its last thread has ended."""
    from multiprocessing.connection import wait

    from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

    workers = list(getattr(batches, "_workers", ()))  # a multi-process iterator's processes
    within = 0.0 if _RAISED_IN_A_WORKER in str(error) else MP_STATUS_CHECK_INTERVAL
    deadline = time.monotonic() + within
    while workers:
        ended = wait([worker.sentinel for worker in workers],
                     timeout=max(0.0, deadline - time.monotonic()))
        if not ended:
            return None
        for worker in [worker for worker in workers if worker.sentinel in ended]:
            worker.join()  # ended: reaped now, for its exit code
            if worker.exitcode != 0:  # 0: shut down by the DataLoader itself
                return _ended(worker.pid, worker.exitcode)
            workers.remove(worker)
    return None


def _ended(pid: int, exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(-exitcode)}"
    if exitcode is not None:
        return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}"
    return f"DataLoader worker (pid {pid}) ended unexpectedly"  # reaped by another: how is unknown


# DataLoader workers per training process by default: enough to keep up with CIFAR-sized images
MAX_WORKERS = 4


def default_num_workers() -> int:
    """Workers per training process when --num_workers is not given: the cores this process may use,
    shared among the node's training processes (LOCAL_WORLD_SIZE; WORLD_SIZE on a launch without it,
    which is one node), less one core of each share for the process itself, at most MAX_WORKERS.
    Never above the usable cores, where the DataLoader warns of too many workers. 2 cores: 1 worker
    for one process, none for two."""
    cores, processes = _usable_cores(), processes_on_this_node()
    return max(0, min(MAX_WORKERS, cores // processes - 1))


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# torch's DataLoader warns of more workers than cores in every process, for every loader
# (twice a run, per rank): the run says it once instead, from its first process, when
# training starts (after every refusal).
warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker processes",
                        category=UserWarning)
_warned: set[str] = set()  # what this process has warned of


def say_once_if_too_many(num_workers: int) -> None:
    cores, processes = _usable_cores(), processes_on_this_node()
    if (num_workers * processes <= cores or "workers" in _warned
            or os.environ.get("RANK", "0") != "0"):
        return
    _warned.add("workers")
    each = f" in each of {processes} processes" if processes > 1 else ""
    print(f"warning: --num_workers {num_workers}{each} is more than the "
          f"{plural(cores, 'usable core')}: the workers will compete with training for them; leave "
          "--num_workers out to fit the machine",
          file=sys.stderr, flush=True)


def leave_stopping_to_the_main_process(main_process: int, worker_id: int) -> None:
    """Ctrl-C and a closed terminal signal the whole foreground process group and SLURM every
    process: a worker that ended on SIGINT, SIGHUP, SIGUSR1 or SIGTERM would make the main process
    fail ("DataLoader worker exited unexpectedly") before it wrote its stop checkpoint. So a worker
    ignores them all, except a SIGTERM from its own main process: that is how multiprocessing ends
    the workers when the main process exits (and then waits for them). The main process is named by
    its pid, not as the worker's parent, which under the forkserver and spawn start methods is
    another process. An orphaned worker exits by itself (torch's watchdog, within 5 s)."""
    # the other stop signals (StopSignals)
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(number, signal.SIG_IGN)
    # Linux; elsewhere (macOS) SIGTERM ends a worker as torch lets it
    if hasattr(signal, "sigwaitinfo"):
        # threads started from here on inherit it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(target=_exit_on_the_main_process_sigterm, args=(main_process,),
                         daemon=True).start()


def _exit_on_the_main_process_sigterm(main_process: int) -> None:
    # the sender, which a handler is not told
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != main_process:
        pass
    os._exit(0)  # as torch's own handler does on its main process's SIGTERM


def defer_worker_failures() -> None:
    """torch's SIGCHLD handler raises a dead worker's error wherever the main thread is, mid-step
    too (with some BatchNorm statistics or parameters updated and others not). Without it
    TorchvisionLoader.__iter__ finds the death when the next batch is asked for (and the DataLoader
    within 5 s while it waits for one), between steps. torch sets the handler once per process, from
    the main thread (and chains to a previous Python handler, which these scripts lack)."""
    from torch.utils.data._utils import signal_handling

    handler = signal.getsignal(signal.SIGCHLD)
    if (getattr(handler, "__module__", None) == signal_handling.__name__
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
