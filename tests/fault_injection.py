"""A train.py run with one rank made to fail: `python tests/fault_injection.py SCRIPT flags...` runs
SCRIPT as `__main__`, except that on rank FAULT_RANK (a process without RANK, single_gpu say, is
rank 0) the loss function raises on its FAULT_STEP-th call (a forward pass mid-training, or a batch
of --evaluate's evaluation); with FAULT_SIGNAL (a name: SIGTERM), that call sends this process the
signal instead, as `kill` would, and goes on; with FAULT_AWAIT_SIGNAL=1, that call prints
"waiting for a signal" and waits (60 s at most) until the run's own handler has noted a signal sent
from outside: one sent once that line is out lands in that step, whatever the machine's load.
The product carries no fault hooks; the failure is injected from outside, as a test would."""
import os
import runpy
import signal
import sys
import time

import torch.nn.functional as F


def await_signal() -> None:
    print("waiting for a signal", flush=True)
    handler = signal.getsignal(signal.SIGTERM)  # the run's StopSignals, installed by then
    deadline = time.monotonic() + 60
    while getattr(handler, "__self__", None) is not None and handler.__self__.received is None:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


if os.environ.get("RANK", "0") == os.environ["FAULT_RANK"]:
    real_cross_entropy, calls = F.cross_entropy, []

    def failing_cross_entropy(*args, **kwargs):
        calls.append(1)
        if len(calls) == int(os.environ["FAULT_STEP"]):
            if os.environ.get("FAULT_AWAIT_SIGNAL"):
                await_signal()
            elif os.environ.get("FAULT_SIGNAL"):
                os.kill(os.getpid(), getattr(signal, os.environ["FAULT_SIGNAL"]))
            else:
                raise RuntimeError(f"injected failure on rank {os.environ['RANK']}")
        return real_cross_entropy(*args, **kwargs)

    F.cross_entropy = failing_cross_entropy

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
