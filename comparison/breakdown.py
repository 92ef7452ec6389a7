"""Where each rank's training step goes, from the trace the run left: `--profile_steps N` has
each rank of a run record its last N steps with torch.profiler (after its timed steps, never among
them) and write them to its run folder as trace_rank<r>.json (Chrome trace JSON, as torch's
export_chrome_trace writes it). The report splits every recorded step of every rank's trace into

    compute       a kernel computing (GPU); the training thread inside an operator (CPU)
    comm          communication in total, hidden or not: NCCL kernels (GPU), gloo's collectives
    comm_exposed  the part of comm during which nothing else of the step runs: the step waits
    bubble        a pipeline stage waiting for its neighbour: a transfer between stages open
                  (gloo's send or receive; NCCL's send/receive kernel on a GPU) and nothing else
                  of the step running; 0 in the modes that send nothing point to point
    data          the wait for the next batch, and the kernels the loader launches in it
    optimizer     Optimizer.step and Optimizer.zero_grad (on a GPU: the kernels they launch)
    other         the rest: kernel launches, Python, waits on nothing recorded

Every instant of a step goes to the first of data, optimizer, compute, communication and the bubble
that holds it, else to other: compute + comm_exposed + bubble + data + optimizer + other is the
step exactly, and comm - comm_exposed is the communication hidden behind other work (DDP's
all-reduce behind the backward pass).

A step is found by the ranges torch itself records: it begins as the training loop asks its
DataLoader for the batch (torch's "enumerate(DataLoader)#..." range, the data wait) and ends with
its optimizer's step (torch's "Optimizer.step#..." range), on the thread that trains. What the loop
does after that (its learning-rate schedule, its sums of the loss, a log window's all-reduce) is
in no step. A loader that records no range (one that is no DataLoader) leaves each step to begin
where the one before ended, data 0, and its first step out. Evaluation and the checkpoint after the
last step are in the trace too, and in no step.

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
other is compute. The step runs on the device from its start on the host, or from the end of the
work launched before it if that is later, to the end of the last work it launched, or its end on
the host if that is later.

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
import re
from pathlib import Path

DATA = "enumerate(DataLoader)#"  # torch's range around a DataLoader's __next__: the data wait
OPTIMIZER_STEP = "Optimizer.step#"  # torch's range around optimizer.step(): a step's end
OPTIMIZER = (OPTIMIZER_STEP, "Optimizer.zero_grad#")  # torch's ranges around optimizer calls
COMM = re.compile(r"^(c10d::|gloo:|nccl:|mpi:)|nccl|memcpy ptop", re.IGNORECASE)  # and GPU to GPU
# FSDP2's copies into and out of its collectives' buffers: the all-gather's input, its output into
# the parameters, the gradients into the reduce-scatter's input (torch.ops.fsdp)
FSDP_COPIES = ("fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat")
GLOO = "gloo:"  # gloo's own threads doing a collective: gloo:all_reduce, gloo:all_gather
TRANSFERS = ("gloo:send", "gloo:recv")  # point to point, recorded on the thread that asked
# NCCL's point-to-point kernel on a GPU (ncclDevKernel_SendRecv; ncclKernel_SendRecv_... before
# NCCL 2.19), which spins on the device until its peer's side of the transfer is there
DEVICE_TRANSFER = re.compile(r"SendRecv|nccl\w*Kernel_(Send|Recv)", re.IGNORECASE)
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's categories of work on a GPU
LAUNCH = ("cuda_runtime", "cuda_driver")  # the host's calls that launch it (cudaLaunchKernel ...)
FIELDS = ("step_ms", "compute_ms", "comm_ms", "comm_exposed_ms", "bubble_ms", "data_ms",
          "optimizer_ms", "other_ms")
TRACE = re.compile(r"trace_rank(\d+)\.json")  # each rank's, in the run folder


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


def _named(event, prefix: str) -> bool:
    return event.get("cat") == "user_annotation" and event.get("name", "").startswith(prefix)


def recorded_steps(events: list) -> list[dict]:
    """The whole steps among a trace's complete ("X") events, in order: each one's interval (from
    its data wait's start to its optimizer step's end), its data wait's, and its thread (pid, tid).
    A step's data wait is the last DataLoader range on its thread between the step before it and
    its optimizer step; without one, the step begins where the one before ended."""
    by_thread = {}
    for event in sorted(events, key=lambda event: event["ts"]):
        if _named(event, OPTIMIZER_STEP) or _named(event, DATA):
            by_thread.setdefault(_thread(event), []).append(event)
    found = []
    for thread, ranges in by_thread.items():
        previous_end, wait = None, None
        for event in ranges:
            if _named(event, DATA):
                wait = event if previous_end is None or event["ts"] >= previous_end else wait
                continue
            end = _range(event)[1]
            if wait is not None:
                found.append({"window": (wait["ts"], end), "data": _range(wait),
                              "thread": thread})
            elif previous_end is not None:
                found.append({"window": (previous_end, end), "data": (previous_end, previous_end),
                              "thread": thread})
            previous_end, wait = end, None
    return sorted(found, key=lambda step: step["window"])


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
    the communication, on it (a collective's call) and on gloo's threads; and gloo's alone; and
    its point-to-point transfers (a pipeline stage's), each open from its send or receive to its
    wait, across the operators between, so left out of the nesting."""
    own = [event for event in events if _thread(event) == thread
           and event.get("cat") in ("cpu_op", "user_annotation")
           and event.get("name") not in TRANSFERS]
    transfers = merged(_range(event) for event in events
                       if _thread(event) == thread and event.get("name") in TRANSFERS)
    calls = merged(_range(event) for event in own
                   if event.get("cat") == "cpu_op" and _is_comm(event))
    gloo = merged(_range(event) for event in events
                  if event.get("name", "").startswith(GLOO) and _thread(event) != thread)
    operators = merged((start, end) for start, end, event in innermost(own)
                       if event.get("cat") == "cpu_op" and not _is_comm(event))
    optimizer = merged(_range(event) for event in own if event.get("cat") == "user_annotation"
                       and event.get("name", "").startswith(OPTIMIZER))
    return {"optimizer": optimizer, "compute": subtract(operators, calls),
            "comm": merged(calls + gloo), "gloo": gloo, "transfers": transfers}


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
                    "transfer": DEVICE_TRANSFER.search(event.get("name", "")) is not None,
                    "launched": None if launch is None else launch["ts"]})
    return ops


def device_step(step: dict, ops: list, host: dict) -> tuple:
    """On a GPU: the step's interval on the device, and its data, optimizer, compute, comm and
    point-to-point transfer intervals there (gloo's collectives on the host are communication
    too: gloo over CUDA; its transfers, the host's)."""
    start, end = step["window"]
    earlier = [op["end"] for op in ops if op["launched"] is None or op["launched"] < start]
    own = [op["end"] for op in ops if op["launched"] is not None and start <= op["launched"] <= end]
    window = (max([start, *earlier]), max([end, *own]))
    kinds = {"data": [step["data"]], "optimizer": [], "compute": [], "comm": list(host["gloo"]),
             "transfers": list(host["transfers"])}
    for op in ops:
        if op["end"] <= window[0] or op["start"] >= window[1]:
            continue
        launched = op["launched"]
        if op["transfer"]:
            kind = "transfers"
        elif op["comm"]:
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
    (the trace's times are microseconds): {step_ms, compute_ms, comm_ms, comm_exposed_ms,
    bubble_ms, data_ms, optimizer_ms, other_ms}. From the GPUs' work where the trace has any, else
    from the threads."""
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
        # who holds an instant two parts share: a transfer open while its stage computes is no wait
        order = ("data", "optimizer", "compute", "comm", "transfers")
        shares = split(window, {name: parts[name] for name in order})
        milliseconds = {"step": window[1] - window[0], "compute": shares["compute"],
                        "comm": length(intersect([window], parts["comm"])),
                        "comm_exposed": shares["comm"], "bubble": shares["transfers"],
                        "data": shares["data"],
                        "optimizer": shares["optimizer"], "other": shares["other"]}
        result.append({f"{name}_ms": value / 1e3 for name, value in milliseconds.items()})
    return result


def mean_breakdown(steps: list[dict]) -> dict | None:
    """The mean of each figure over the steps; None without a step."""
    if not steps:
        return None
    return {name: sum(step[name] for step in steps) / len(steps) for name in FIELDS}


def trace_files(run_dir: Path) -> dict[int, Path]:
    """{rank: its trace} in a run folder."""
    found = {}
    for path in run_dir.glob("trace_rank*.json") if run_dir else []:
        match = TRACE.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def run_breakdown(run_dir: Path | None) -> dict[str, dict] | None:
    """{rank: the mean split of its recorded steps} from the traces in a run folder; None where the
    run left no trace, or a trace without a whole step (a rank's that cannot be read is left out:
    the report then shows the ranks it could read)."""
    split_by_rank = {}
    for rank, path in trace_files(run_dir).items():
        try:
            trace = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        mean = mean_breakdown(step_breakdowns(trace))
        if mean is not None:
            split_by_rank[str(rank)] = mean
    return split_by_rank or None

