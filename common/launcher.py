"""The workers of a process-group mode (dist_parallel, fsdp) and what starts them: the self-launch
(`python train.py` without torchrun) through torch's own elastic launcher, which GPU each worker takes, workers
that die with their launcher, and the report of a clean stop, which the launcher cannot see for itself."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist

from common.checkpoint import refuse_fresh_start
from common.config import UsageError
from common.devices import cuda_devices
from common.guards import check_launch
from common.logger import resolve_run_dir

STOP_REPORT = "PYTORCH_MULTIGPU_STOP_REPORT"  # a file the self-launch gives its workers for their stop line


def tie_to_launcher() -> None:
    """A worker started by torch's elastic agent (torchrun or the self-launch) is tied to it. It dies with the
    agent: the agent puts each worker in a session of its own, so when the agent itself is killed (`kill -9`, an
    out-of-memory kill) nothing reaches the workers, which would train on as orphans, writing checkpoints beside
    whatever run is started next in their folder; Linux's parent-death signal kills them instead (the last
    checkpoint, written atomically, is intact). And a new attempt of the workers (--max_restarts) voids an earlier
    attempt's report of a clean stop."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return
    arm = killed_with(os.getppid())
    if arm is not None:
        arm()
    if os.environ.get("RANK") == "0" and os.environ.get(STOP_REPORT):
        Path(os.environ[STOP_REPORT]).unlink(missing_ok=True)


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


SHARING_HINT = " (ranks may share a GPU under --backend gloo; NCCL refuses two ranks on one GPU)"


def own_gpu(gpu_devices, local_rank: int, backend: str | None) -> list[int]:
    """This process's GPU: the local_rank-th of --gpu_devices (default: of every visible GPU); [] without CUDA.
    Under gloo a GPU may be listed more than once (`--gpu_devices 0 0`: two ranks on one GPU); NCCL refuses that."""
    gpus = cuda_devices(gpu_devices, default_all=True, shared=backend == "gloo", sharing_hint=SHARING_HINT)
    if gpus and local_rank >= len(gpus):
        raise UsageError(f"local rank {local_rank} has no GPU of its own ({len(gpus)} available): start at most "
                         f"one process per GPU", rank_specific=True)
    return gpus[local_rank:local_rank + 1]


def self_launch(cfg, script: str, argv, mode: str) -> int:
    """`python train.py` without torchrun: refuse what can be refused, then start one worker per GPU (or
    --nproc_per_node CPU workers) as `torchrun --standalone` would; each worker runs `script` again."""
    gpus = cuda_devices(cfg.gpu_devices, default_all=True, shared=cfg.backend == "gloo", sharing_hint=SHARING_HINT)
    nproc = cfg.nproc_per_node or len(gpus) or 1
    if gpus and nproc > len(gpus):
        raise UsageError(f"--nproc_per_node {nproc} is more than the {len(gpus)} GPUs available: one process per GPU")
    check_launch(cfg, mode, nproc)
    run_dir = resolve_run_dir(cfg, mode, nproc)
    refuse_fresh_start(cfg, run_dir)  # in one line before any worker starts (and is restarted)
    os.environ.setdefault("OMP_NUM_THREADS", str(max((os.cpu_count() or 1) // nproc, 1)))  # share the cores
    return launch_workers(script, sys.argv[1:] if argv is None else [str(arg) for arg in argv], nproc,
                          cfg.max_restarts)
