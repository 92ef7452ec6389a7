"""Where each rank's training step goes, measured. `--profile_steps N` records the run's last N
steps with torch's profiler, after the timed steps and never among them (the profiler's own host
cost would land in images/s), and after the warm-up (--warmup_steps); under --benchmark they come
after its --benchmark_steps. Each rank's trace is written beside the run as
trace_rank<r>.json (Chrome trace JSON, as torch's export_chrome_trace writes it), and from that
trace every recorded step is split into

    compute       a kernel computing (GPU); the training thread inside an operator (CPU)
    comm          communication in total, hidden or not: NCCL kernels (GPU), gloo's collectives
    comm_exposed  the part of comm during which nothing else of the step runs: the step waits
    data          the wait for the next batch, and the kernels the loader launches in it
    optimizer     Optimizer.step and Optimizer.zero_grad (on a GPU: the kernels they launch)
    other         the rest: kernel launches, Python, waits on nothing recorded

Every instant of a step goes to the first of data, optimizer, compute and communication that holds
it, else to other: compute + comm_exposed + data + optimizer + other is the step exactly, and
comm - comm_exposed is the communication hidden behind other work (DDP's all-reduce behind the
backward pass).

The step is the StepTimer's (common/metrics.py): from the moment it waits for its batch to the end
of its work. The timer marks it in the trace as two ranges, "data wait <n>" then "train step <n>"
(n: the step's number in the run, as results.json's `profiled_steps` gives them); a data wait
that no train step follows is an epoch's end.

On a GPU the figures come from the device's timeline: the kernels, copies and memsets on their
streams, each tied to the CUDA runtime or driver call that launched it (the trace's `correlation`,
as torch's own trace validator, torch/profiler/_trace_validator.py, matches them: other events
carry correlation ids too). Communication is NCCL's kernels, the peer-to-peer copies by which
DataParallel scatters and gathers between GPUs, and any work launched inside a collective's call
or inside FSDP2's copies into and out of its collectives' buffers: gloo's copies of CUDA tensors to
the host and back (its collectives run on the host), and FSDP2's all-gather copy-in
(fsdp::all_gather_copy_in), copy-out (fsdp::split_with_sizes_copy) and reduce-scatter copy-in
(fsdp::chunk_cat; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). A kernel launched
inside the data wait is data, one launched inside the optimizer's ranges is the optimizer's, any
other is compute. The step runs on the device from its start on the host, or from
the end of the work launched before it if that is later, to the end of the last work it launched,
or its end on the host if that is later: what the StepTimer's CUDA events measure.

On the CPU everything runs on threads. The training thread computes while it is inside an
operator: the innermost range it is in is an operator (its own time, a convolution's included),
not a range of Python's such as FSDP's, where it waits. Communication is a collective's call on
that thread (c10d::allreduce_, c10d::_allgather_base_, c10d::_reduce_scatter_base_ ...), FSDP2's
copies in and out of its collectives' buffers (the fsdp:: operators above), and the collectives'
work on gloo's own threads (gloo:all_reduce, gloo:all_gather; gloo runs a reduce-scatter as an
all-reduce). DDP's wait for its last bucket after the backward pass runs no operator: while gloo's
thread works then, that communication is exposed.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import re
import tempfile
import zlib
from pathlib import Path

import torch

DATA = "data wait"  # the StepTimer's wait for step n's batch: "data wait <n>"
STEP = "train step"  # the rest of step n, from its batch to its end: "train step <n>"
OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")  # torch's ranges around optimizer calls
COMM = re.compile(r"^(c10d::|gloo:|nccl:|mpi:)|nccl|memcpy ptop", re.IGNORECASE)  # and GPU to GPU
# FSDP2's copies into and out of its collectives' buffers: the all-gather's input, its output into
# the parameters, the gradients into the reduce-scatter's input (torch.ops.fsdp)
FSDP_COPIES = ("fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat")
GLOO = "gloo:"  # gloo's own threads doing a collective: gloo:all_reduce, gloo:all_gather
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's categories of work on a GPU
LAUNCH = ("cuda_runtime", "cuda_driver")  # the host's calls that launch it (cudaLaunchKernel ...)
FIELDS = ("step_ms", "compute_ms", "comm_ms", "comm_exposed_ms", "data_ms", "optimizer_ms",
          "other_ms")
TRACE_NAME = "trace_rank{rank}.json"  # in the run folder


# --------------------------------------------------------------------------- interval arithmetic
def merged(intervals) -> list[tuple[float, float]]:
    """The union of (start, end) intervals, as sorted disjoint intervals; empty ones dropped."""
    union = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def intersect(first: list, second: list) -> list[tuple[float, float]]:
    """Where two unions (merged) overlap."""
    both, i, j = [], 0, 0
    while i < len(first) and j < len(second):
        start, end = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        if start < end:
            both.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return both


def subtract(first: list, second: list) -> list[tuple[float, float]]:
    """`first` (merged) without `second` (merged)."""
    left, skip = [], 0
    for start, end in first:
        while skip < len(second) and second[skip][1] <= start:  # cuts that end before it
            skip += 1
        cut = skip
        while cut < len(second) and second[cut][0] < end:
            if second[cut][0] > start:
                left.append((start, second[cut][0]))
            start = max(start, second[cut][1])
            cut += 1
        if start < end:
            left.append((start, end))
    return left


def length(intervals: list) -> float:
    return sum(end - start for start, end in intervals)


def split(window: tuple[float, float], parts: dict) -> dict[str, float]:
    """`window`'s time given to `parts` (name -> merged intervals) in their order of priority:
    each instant to the first part that holds it, the rest to "other". The shares add up to the
    window."""
    left, shares = [window], {}
    for name, intervals in parts.items():
        shares[name] = length(intersect(left, intervals))
        left = subtract(left, intervals)
    shares["other"] = length(left)
    return shares


# ----------------------------------------------------------------------------- the trace's steps
def _range(event) -> tuple[float, float]:
    return event["ts"], event["ts"] + event["dur"]


def _thread(event) -> tuple:
    return event.get("pid"), event.get("tid")


def _numbered(event, prefix: str) -> int | None:
    """n of the StepTimer's range named "<prefix> <n>"; None for any other event."""
    name = event.get("name", "")
    if event.get("cat") != "user_annotation" or not name.startswith(prefix + " "):
        return None
    number = name[len(prefix) + 1:]
    return int(number) if number.isdigit() else None


def recorded_steps(events: list) -> list[dict]:
    """The whole steps among a trace's complete ("X") events, in order: each one's interval, its
    data wait's, and its thread (pid, tid)."""
    waits, steps = {}, {}
    for event in events:
        if (number := _numbered(event, DATA)) is not None:
            waits.setdefault(number, []).append(event)
        elif (number := _numbered(event, STEP)) is not None:
            steps[number] = event
    found = []
    for number, step in sorted(steps.items()):
        before = [wait for wait in waits.get(number, []) if wait["ts"] <= step["ts"]]
        if not before:  # its wait for data began before the recording did: not a whole step
            continue
        wait = max(before, key=lambda event: event["ts"])  # an earlier one was an epoch's end
        found.append({"number": number, "window": (wait["ts"], _range(step)[1]),
                      "data": _range(wait), "thread": _thread(step)})
    return found


def _is_comm(event) -> bool:
    name = event.get("name", "")
    return COMM.search(name) is not None or name in FSDP_COPIES


def innermost(events: list) -> list[tuple[float, float, dict]]:
    """The ranges of one thread (nested) as the pieces of time each holds itself, inside none of
    the others: (start, end, event), in order."""
    pieces, stack, cursor = [], [], -math.inf  # stack: (end, event), the innermost last
    for event in sorted(events, key=lambda event: (event["ts"], -event["dur"])) + [None]:
        at = math.inf if event is None else event["ts"]
        while stack and stack[-1][0] <= at:  # the ranges that end before this one starts
            end, closed = stack.pop()
            if cursor < end:
                pieces.append((cursor, end, closed))
            cursor = max(cursor, end)
        if event is None:
            break
        if stack and cursor < at:
            pieces.append((cursor, at, stack[-1][1]))
        cursor = max(cursor, at)
        end = at + event["dur"]
        stack.append((min(end, stack[-1][0]) if stack else end, event))  # inside its parent
    return pieces


def host_parts(events: list, thread: tuple) -> dict:
    """The host's share of the split, for the training thread `thread`: its optimizer ranges; its
    time inside an operator (compute: the innermost range is an operator, not a collective's call);
    the communication, on it (a collective's call) and on gloo's threads; and gloo's alone."""
    own = [event for event in events if _thread(event) == thread
           and event.get("cat") in ("cpu_op", "user_annotation")]
    calls = merged(_range(event) for event in own
                   if event.get("cat") == "cpu_op" and _is_comm(event))
    gloo = merged(_range(event) for event in events
                  if event.get("name", "").startswith(GLOO) and _thread(event) != thread)
    operators = merged((start, end) for start, end, event in innermost(own)
                       if event.get("cat") == "cpu_op" and not _is_comm(event))
    optimizer = merged(_range(event) for event in own if event.get("cat") == "user_annotation"
                       and event.get("name", "").startswith(OPTIMIZER))
    return {"optimizer": optimizer, "compute": subtract(operators, calls),
            "comm": merged(calls + gloo), "gloo": gloo}


def inside(intervals: list, at: float) -> bool:
    """Whether `at` lies in one of `intervals` (merged)."""
    index = bisect.bisect_right(intervals, (at, math.inf)) - 1
    return index >= 0 and intervals[index][0] <= at <= intervals[index][1]


def device_ops(events: list) -> list[dict]:
    """The work on the GPUs: each kernel, copy and memset, whether it is communication (by its name,
    or launched inside a collective's call or an FSDP2 copy for one), and when it was launched
    (None: before the recording began). Each is tied to its launch by the CUDA runtime's or
    driver's call with its correlation id, and only those: other events carry such ids too."""
    launches = {event["args"]["correlation"]: event for event in events
                if event.get("cat") in LAUNCH and "correlation" in event.get("args", {})}
    comm = {}  # each thread's collectives' calls (and FSDP2's copies for them), merged
    for event in events:
        if event.get("cat") in ("cpu_op", "user_annotation") and _is_comm(event):
            comm.setdefault(_thread(event), []).append(_range(event))
    comm = {thread: merged(ranges) for thread, ranges in comm.items()}
    ops = []
    for event in events:
        if event.get("cat") not in DEVICE:
            continue
        launch = launches.get(event.get("args", {}).get("correlation"))
        for_comm = launch is not None and inside(comm.get(_thread(launch), []), launch["ts"])
        ops.append({"start": event["ts"], "end": event["ts"] + event["dur"],
                    "comm": _is_comm(event) or for_comm,
                    "launched": None if launch is None else launch["ts"]})
    return ops


def device_step(step: dict, ops: list, host: dict) -> tuple:
    """On a GPU: the step's interval on the device, and its data, optimizer, compute and comm
    intervals there (gloo's collectives on the host are communication too: gloo over CUDA)."""
    start, end = step["window"]
    earlier = [op["end"] for op in ops if op["launched"] is None or op["launched"] < start]
    own = [op["end"] for op in ops if op["launched"] is not None and start <= op["launched"] <= end]
    window = (max([start, *earlier]), max([end, *own]))
    kinds = {"data": [step["data"]], "optimizer": [], "compute": [], "comm": list(host["gloo"])}
    for op in ops:
        if op["end"] <= window[0] or op["start"] >= window[1]:
            continue
        launched = op["launched"]
        if op["comm"]:
            kind = "comm"
        elif launched is not None and step["data"][0] <= launched <= step["data"][1]:
            kind = "data"
        elif launched is not None and any(a <= launched <= b for a, b in host["optimizer"]):
            kind = "optimizer"
        else:
            kind = "compute"
        kinds[kind].append((op["start"], op["end"]))
    return window, {kind: merged(intervals) for kind, intervals in kinds.items()}


def step_breakdowns(trace: dict) -> list[dict]:
    """Each whole step of a Chrome trace (as export_chrome_trace writes it), split in milliseconds
    (the trace's times are microseconds): {step_ms, compute_ms, comm_ms, comm_exposed_ms, data_ms,
    optimizer_ms, other_ms}. From the GPUs' work where the trace has any, else from the threads."""
    events = [event for event in trace.get("traceEvents", [])
              if event.get("ph") == "X" and isinstance(event.get("dur"), (int, float))]
    ops = device_ops(events)
    threads, result = {}, []  # threads: each training thread's host_parts, found once
    for step in recorded_steps(events):
        if step["thread"] not in threads:
            threads[step["thread"]] = host_parts(events, step["thread"])
        host = threads[step["thread"]]
        if ops:
            window, parts = device_step(step, ops, host)
        else:
            window, parts = step["window"], {**host, "data": [step["data"]]}
        order = ("data", "optimizer", "compute", "comm")  # who holds an instant two parts share
        shares = split(window, {name: parts[name] for name in order})
        milliseconds = {"step": window[1] - window[0], "compute": shares["compute"],
                        "comm": length(intersect([window], parts["comm"])),
                        "comm_exposed": shares["comm"], "data": shares["data"],
                        "optimizer": shares["optimizer"], "other": shares["other"]}
        result.append({f"{name}_ms": value / 1e3 for name, value in milliseconds.items()})
    return result


def mean_breakdown(steps: list[dict]) -> dict | None:
    """The mean of each figure over the steps; None without a step."""
    if not steps:
        return None
    return {name: sum(step[name] for step in steps) / len(steps) for name in FIELDS}


def slowest_rank(breakdown: dict | None) -> str | None:
    """The rank whose mean step is the longest (a straggler: the others wait for it)."""
    if not breakdown:
        return None
    return max(breakdown, key=lambda rank: breakdown[rank]["step_ms"])


def breakdown_line(breakdown: dict, rank: str, steps: int) -> str:
    """`profile of 3 steps, rank 1 (the slowest): step 45.1 ms = compute 30.2 + communication
    exposed 3.1 (of 12.0) + data 0.4 + optimizer 2.0 + other 9.4`."""
    ms = {name: f"{value:.1f}" for name, value in breakdown[rank].items()}
    slowest = " (the slowest)" if len(breakdown) > 1 else ""
    return (f"profile of {steps} step{'s' * (steps != 1)}, rank {rank}{slowest}: step "
            f"{ms['step_ms']} ms = compute {ms['compute_ms']} + communication exposed "
            f"{ms['comm_exposed_ms']} (of {ms['comm_ms']}) + data {ms['data_ms']} + optimizer "
            f"{ms['optimizer_ms']} + other {ms['other_ms']}")


# ---------------------------------------------------------------------------------- the recording
class StepProfiler:
    """Records the run's last `steps` steps with torch's profiler (those after the warm-up's
    `warmup_steps` among them), as the StepTimer tells it: `starting(n)` before this attempt's step
    n's first mark, `ready(n)` once its batch is there, `no_batch()` when the epoch had none left,
    `done()` after its last mark. `plan()` says where the run stands and where it ends; `covers(n)`
    whether step n is recorded, which the StepTimer then leaves out of its timed steps. The profiler
    starts before the first recorded step's mark and stops after the last one's (or at `stop()`,
    when the training ends first); its trace is then exported, split (step_breakdowns) and kept,
    compressed, for `result()`. No shapes, stacks or memory are recorded: only what the split
    needs, so that the recorded steps keep the pace of the others."""

    def __init__(self, steps: int, warmup_steps: int, device: torch.device):
        self.asked, self.warmup, self.device = steps, warmup_steps, device
        self.before = 0  # the run's steps before this attempt
        self.first = warmup_steps + 1  # this attempt's first recorded step (plan() sets it)
        self.profile = None
        self.open = []  # the ranges open now, the innermost last
        self.recorded = 0  # steps done under the profiler
        self.stopped = steps == 0
        self.steps, self.trace = [], None  # the split steps; the trace's JSON, compressed

    def plan(self, before: int, last: int) -> None:
        """The run had made `before` steps before this attempt and ends with step `last`: record
        its last `asked` steps, none of them a warm-up step of this attempt."""
        self.before = before
        self.first = max(self.warmup + 1, last - before - self.asked + 1)

    def covers(self, step: int) -> bool:
        """Whether this attempt's step `step` is (to be) recorded."""
        return self.asked > 0 and self.first <= step < self.first + self.asked

    def starting(self, step: int) -> None:
        if self.stopped or step < self.first:
            return
        if self.profile is None:
            self._start()
        self._open(f"{DATA} {self.before + step}")

    def ready(self, step: int) -> None:
        if self.open:
            self._close()
            self._open(f"{STEP} {self.before + step}")

    def no_batch(self) -> None:
        while self.open:
            self._close()

    def done(self) -> None:
        if not self.open:
            return
        self._close()
        self.recorded += 1
        if self.recorded == self.asked:
            self.stop()

    def _start(self) -> None:
        from torch.autograd import profiler

        if self.device.type == "cuda":  # the timed steps' work done before the profiler starts
            torch.cuda.synchronize(self.device)
        else:  # kineto's "gpuGetDeviceCount failed": there is no GPU
            # above kineto's highest level (USDT, 5): its profiler_start/stop lines silenced too,
            # here and in what this process starts (benchmarks/profile_step.py does the same)
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        # torch.autograd's profiler is the engine of torch.profiler.profile, which imports inductor
        # (seconds) when it starts, to read a setting of CUDA graphs
        self.profile = profiler.profile(use_cpu=True, use_kineto=True,
                                        use_device="cuda" if self.device.type == "cuda" else None)
        self.profile.__enter__()

    def _open(self, name: str) -> None:
        from torch.autograd import profiler

        scope = profiler.record_function(name)
        scope.__enter__()
        self.open.append(scope)

    def _close(self) -> None:
        self.open.pop().__exit__(None, None, None)

    def stop(self) -> None:
        """Stop recording (if it is under way), export the trace, split its steps."""
        self.stopped = True
        if self.profile is None:
            return
        self.no_batch()
        self.profile.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            self.profile.export_chrome_trace(str(path))
            text = path.read_bytes()
        self.profile = None
        self.steps = step_breakdowns(json.loads(text))
        self.trace = zlib.compress(text, 6)

    def result(self) -> dict:
        """This rank's mean breakdown (None without a step), its trace (compressed; None without
        one), the steps split, the first and last recorded (the run's numbers; None without one),
        and what the figures are not when they are fewer than asked."""
        self.stop()
        first = self.before + self.first
        span = [first, first + self.recorded - 1] if self.recorded else None
        return {"breakdown": mean_breakdown(self.steps), "trace": self.trace,
                "steps": len(self.steps), "span": span, "note": self.note()}

    def note(self) -> str | None:
        if not self.asked or len(self.steps) == self.asked:
            return None
        steps = f"{self.warmup} warm-up step{'s' * (self.warmup != 1)} (--warmup_steps)"
        warmup = (f"after its {steps}" if not self.before
                  else f"after the {steps} of its attempt that began after step {self.before}")
        if not self.steps:
            return (f"no step profiled: --profile_steps records the run's last steps {warmup}, "
                    f"and the run had none after them")
        return (f"{len(self.steps)} of the {self.asked} steps --profile_steps asked for were "
                f"profiled: the run's last {len(self.steps)}, {warmup}")

    def close(self) -> None:
        """A run that ends with an error: the profiler stopped, nothing exported."""
        while self.open:
            self._close()
        if self.profile is not None:
            self.profile.__exit__(None, None, None)
            self.profile = None


def trace_text(result: dict) -> bytes | None:
    """A rank's trace (result()'s), as the JSON text to write."""
    return None if result["trace"] is None else zlib.decompress(result["trace"])
