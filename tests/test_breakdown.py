"""The split of each rank's profiled steps into compute, communication (in total and exposed), data,
optimizer and the rest, from the trace_rank<r>.json torch.profiler leaves in the run folder
(comparison/breakdown.py): the report's "Where a step goes".

The split itself on small Chrome traces made here in the format torch's exporter writes, each step
marked as torch marks it (its DataLoader's __next__, its Optimizer.step): a GPU step from its
kernels on their streams (NCCL kernels beside compute kernels, copies between two GPUs, FSDP2's
copies in and out of its collectives' buffers, gloo's copies of CUDA tensors to the host and back,
each kernel tied to its launch by the CUDA runtime's or driver's event only), a CPU step from its
threads (the training thread's operators, gloo's thread, an FSDP wait inside a range of its own,
FSDP2's copies), an epoch's end and an evaluation, which are no step, and a loader that marks
nothing. Then on the traces of real runs, as a user starts them: two gloo processes of DDP whose
--bucket_cap_mb moves communication from exposed to hidden, FSDP's all-gathers and
reduce-scatters, one process with no communication. The GPU's own run is in tests/gpu. The
hand-made GPU traces name their kernels after torch's source (TensorShape.cu's chunk_cat and
split_with_sizes_copy kernels, ForeachBinaryOpList.cu's CopyFunctor); the split does not read
those names, and only a GPU run shows what a real trace holds."""
from __future__ import annotations

import json
import random

import pytest

from comparison.breakdown import (FIELDS, mean_breakdown, merged, recorded_steps, run_breakdown,
                                  split, step_breakdowns)
from comparison.train_files import without
from conftest import TINY, read_results, run_script

PARTS = ("compute_ms", "comm_exposed_ms", "bubble_ms", "data_ms", "optimizer_ms",
         "other_ms")  # sum: step_ms
MAIN = dict(pid=100, tid=100)  # the training thread
GLOO = dict(pid=100, tid=101)  # one of gloo's threads
NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"  # torch's: the data wait
STEP = "Optimizer.step#SGD.step"  # torch's: its end is the step's


def range_(name: str, ts: float, dur: float, cat: str = "user_annotation", where=MAIN,
           **args) -> dict:
    """A complete event ("X") as kineto writes it: times in microseconds."""
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where}
    return {**event, "args": args} if args else event


def launch(correlation: int, ts: float, where=MAIN, name="cudaLaunchKernel",
           cat="cuda_runtime") -> dict:
    """A kernel's launch with its correlation id: by default on the training thread through the
    CUDA runtime; on another host thread, through the driver, or a copy's when asked."""
    return range_(name, ts, 1, cat=cat, where=where, correlation=correlation)


def op(name: str, ts: float, dur: float, where=MAIN) -> dict:
    """An operator on a host thread, as torch.profiler records it."""
    return range_(name, ts, dur, cat="cpu_op", where=where)


def kernel(name: str, correlation: int, ts: float, dur: float, stream: int = 7, device: int = 0,
           cat: str = "kernel") -> dict:
    """Work on a GPU: kineto gives it the device as pid and the stream as tid."""
    return range_(name, ts, dur, cat=cat, where=dict(pid=device, tid=stream),
                  correlation=correlation, device=device, stream=stream)


def trace(*events) -> dict:
    process = {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}}
    return {"schemaVersion": 1, "traceEvents": [process, *events]}


def assert_adds_up(figures: dict) -> None:
    assert sum(figures[part] for part in PARTS) == pytest.approx(figures["step_ms"], rel=1e-9)
    assert figures["comm_exposed_ms"] <= figures["comm_ms"] + 1e-9


def in_ms(**microseconds) -> dict:
    """The figures in ms; a bubble of 0 unless given (only a pipeline stage waits for one)."""
    return {name: value / 1e3 for name, value in {"bubble_ms": 0, **microseconds}.items()}


# ------------------------------------------------------------------------------ the split, by hand
def test_a_gpu_step_is_split_from_its_kernels_on_their_streams():
    """The step on the device runs from the end of the work launched before it (a kernel of the
    step before, still running when the step began on the host) to the end of its last kernel (the
    optimizer's, after the host was done). The all-reduce on NCCL's stream is hidden while compute
    kernels run beside it and exposed after them; a kernel launched inside the data wait is data,
    one launched inside Optimizer.step the optimizer's; the gaps between kernels are the rest."""
    events = trace(
        range_(NEXT, 0, 10), range_(STEP, 80, 20),  # on the host: 0 to 100 us
        launch(1, -5), kernel("void at::native::elementwise_kernel<>", 1, 0, 15),  # step 6's
        launch(2, 5), kernel("void at::native::crop_flip_kernel", 2, 15, 3),  # the gpu loader's
        launch(3, 12), kernel("sm90_xmma_fprop_implicit_gemm_bf16", 3, 20, 30),
        launch(4, 14), kernel("sm90_xmma_dgrad_implicit_gemm_bf16", 4, 50, 20),
        launch(5, 30), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage)",
                              5, 40, 40, stream=20),
        launch(6, 82), kernel("void at::native::multi_tensor_apply_kernel<>", 6, 85, 20),
        range_(NEXT, 0, 10, cat="gpu_user_annotation", where=dict(pid=0, tid=7)),
    )
    (step,) = step_breakdowns(events)
    assert step == pytest.approx(in_ms(step_ms=90, compute_ms=50, comm_ms=40, comm_exposed_ms=10,
                                       data_ms=3, optimizer_ms=20, other_ms=7))
    assert_adds_up(step)


def test_a_pipeline_stage_waiting_for_its_neighbour_is_the_bubble_on_a_gpu_and_on_the_cpu():
    """A stage's point-to-point transfer, open while nothing else of its step runs, is the bubble:
    on a GPU NCCL's send/receive kernel, which spins until the neighbour's side is there; on the
    CPU gloo's send and receive ranges on the training thread, open across the operators they
    overlap (its c10d::send call, the enqueue, is communication). Behind compute it is no wait."""
    gpu = trace(
        range_(NEXT, 0, 10), range_(STEP, 90, 10),
        launch(1, 11), kernel("sm90_xmma_fprop_implicit_gemm_bf16", 1, 10, 30),
        launch(2, 12), kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 2, 30,
                              40, stream=20),  # 10 us behind compute, 30 waiting
        launch(3, 13), kernel("sm90_xmma_dgrad_implicit_gemm_bf16", 3, 70, 20),
        launch(4, 90), kernel("void at::native::multi_tensor_apply_kernel<>", 4, 90, 10),
    )
    (step,) = step_breakdowns(gpu)
    assert step == pytest.approx(in_ms(step_ms=100, compute_ms=50, comm_ms=0, comm_exposed_ms=0,
                                       bubble_ms=30, data_ms=10, optimizer_ms=10, other_ms=0))
    cpu = trace(
        range_(NEXT, 0, 10), op("aten::convolution", 10, 40), op("c10d::send", 50, 2),
        range_("gloo:send", 50, 20), range_("gloo:recv", 55, 25),  # open 50 to 80
        op("aten::convolution_backward", 80, 20), range_(STEP, 100, 10),
    )
    (step,) = step_breakdowns(cpu)
    assert step == pytest.approx(in_ms(step_ms=110, compute_ms=60, comm_ms=2, comm_exposed_ms=2,
                                       bubble_ms=28, data_ms=10, optimizer_ms=10, other_ms=0))
    assert_adds_up(step)


def test_data_parallel_copies_between_gpus_are_communication():
    """DataParallel on two GPUs, in one trace: the scatter's peer-to-peer copy and the replicas'
    broadcast (NCCL) are communication; a kernel on either GPU is compute, so communication is
    exposed only where no GPU computes."""
    events = trace(
        range_(NEXT, 0, 5), range_(STEP, 100, 0),
        launch(1, 6), kernel("Memcpy PtoP (Device -> Device)", 1, 10, 10, cat="gpu_memcpy"),
        launch(2, 7), kernel("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, ncclWork*)",
                             2, 15, 10, stream=13),
        launch(3, 8), kernel("implicit_convolve_sgemm", 3, 25, 40, device=0),
        launch(4, 9), kernel("implicit_convolve_sgemm", 4, 20, 30, device=1),
        launch(5, 60), kernel("Memcpy PtoP (Device -> Device)", 5, 65, 15, device=1,
                              cat="gpu_memcpy"),
    )
    (step,) = step_breakdowns(events)
    assert step == pytest.approx(in_ms(step_ms=100, compute_ms=45, comm_ms=30, comm_exposed_ms=25,
                                       data_ms=5, optimizer_ms=0, other_ms=25))
    assert_adds_up(step)


AUTOGRAD = dict(pid=100, tid=102)  # autograd's thread for the GPU, where backward's hooks run


def test_fsdp_copies_in_and_out_of_its_collectives_are_communication():
    """FSDP2 on a GPU (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): before a block's
    forward, fsdp::all_gather_copy_in copies the local shards into the all-gather's input (a
    for-each copy on its copy-in stream), the all-gather runs on NCCL's stream, and
    fsdp::split_with_sizes_copy copies its output out into the parameters; in backward, on
    autograd's thread, fsdp::chunk_cat copies the gradients into the reduce-scatter's input. Those
    copies are the collectives' cost, counted with communication by the operator that launched
    them whatever the kernel's name; the reduce-scatter is hidden where a compute kernel runs
    beside it."""
    events = trace(
        range_(NEXT, 0, 10),  # on the host: 0 to 200 us
        op("fsdp::all_gather_copy_in", 12, 4), launch(1, 13),
        kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
               "(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::"
               "CopyFunctor<float, float, float, 2, 1, 1>, std::identity>", 1, 15, 10, stream=20),
        op("c10d::_allgather_base_", 17, 2), launch(2, 18),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 2, 25, 20,
               stream=21),
        op("fsdp::split_with_sizes_copy", 20, 4), launch(3, 21),
        kernel("at::native::detail::split_with_sizes_copy_out_contiguous_no_cast_kernel(char**, "
               "char**, long*, long*, long*, long, long)", 3, 45, 10),
        launch(4, 26), kernel("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32", 4, 55, 65),
        op("fsdp::chunk_cat", 100, 4, where=AUTOGRAD), launch(5, 101, where=AUTOGRAD),
        kernel("at::native::detail::chunk_cat_cuda_kernel(char**, char*, long*, long*, long*, "
               "long*, long*, long*, long, long, bool)", 5, 120, 10),
        op("c10d::_reduce_scatter_base_", 105, 2, where=AUTOGRAD), launch(6, 106, where=AUTOGRAD),
        kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 6,
               130, 20, stream=21),
        launch(7, 108, where=AUTOGRAD), kernel("sm90_xmma_dgrad_implicit_gemm_f32", 7, 130, 10),
        range_(STEP, 150, 50), launch(8, 155),
        kernel("void at::native::multi_tensor_apply_kernel<>", 8, 160, 10),
    )
    (step,) = step_breakdowns(events)
    # communication 15-55 and 120-150: of it, 130-140 hidden behind the dgrad kernel
    assert step == pytest.approx(in_ms(step_ms=200, compute_ms=75, comm_ms=70, comm_exposed_ms=60,
                                       data_ms=10, optimizer_ms=10, other_ms=45))
    assert_adds_up(step)


def test_gloos_copies_of_cuda_tensors_to_the_host_and_back_are_communication():
    """Gloo over CUDA tensors (two ranks sharing a GPU): the collective's call copies the gradients
    to pinned host memory, gloo's thread all-reduces them there and copies the result back. Both
    copies are communication, launched inside the call and inside gloo's range; a copy the loader
    launches in the data wait stays data."""
    events = trace(
        range_(NEXT, 0, 10),  # 0 to 150 us
        launch(1, 2, where=MAIN, name="cudaMemcpyAsync"),
        kernel("Memcpy HtoD (Pinned -> Device)", 1, 3, 5, cat="gpu_memcpy"),  # the batch
        launch(2, 12), kernel("sm90_xmma_dgrad_implicit_gemm_f32", 2, 15, 40),
        op("c10d::allreduce_", 50, 5, where=AUTOGRAD),
        launch(3, 51, where=AUTOGRAD, name="cudaMemcpyAsync"),
        kernel("Memcpy DtoH (Device -> Pinned)", 3, 55, 10, stream=30, cat="gpu_memcpy"),
        range_("gloo:all_reduce", 60, 40, where=GLOO),
        launch(4, 98, where=GLOO, name="cudaMemcpyAsync"),
        kernel("Memcpy HtoD (Pinned -> Device)", 4, 100, 10, stream=30, cat="gpu_memcpy"),
        range_(STEP, 115, 35), launch(5, 116),
        kernel("void at::native::multi_tensor_apply_kernel<>", 5, 120, 10),
    )
    (step,) = step_breakdowns(events)
    # communication 55-110 on the device and the host; compute 15-55
    assert step == pytest.approx(in_ms(step_ms=150, compute_ms=40, comm_ms=55, comm_exposed_ms=55,
                                       data_ms=10, optimizer_ms=10, other_ms=35))
    assert_adds_up(step)


def test_a_kernel_is_tied_to_its_launch_by_the_cuda_runtime_or_driver_only():
    """Kernels are tied to the host's call that launched them by the CUDA runtime's or driver's
    events only, as torch's trace validator does (torch/profiler/_trace_validator.py): a kernel
    that the driver launched inside Optimizer.step (cuLaunchKernel, as compiled kernels are) is
    the optimizer's, though another event with its correlation id lies in the data wait."""
    events = trace(
        range_(NEXT, 0, 20), range_(STEP, 60, 40),
        launch(1, 65, where=MAIN, name="cuLaunchKernel", cat="cuda_driver"),
        kernel("triton_per_fused_add_mul_0", 1, 70, 20),
        range_("Stream Wait Event", 5, 0, cat="cuda_sync", where=dict(pid=0, tid=7),
               correlation=1),  # not a launch
    )
    (step,) = step_breakdowns(events)
    assert step["optimizer_ms"] == pytest.approx(0.02) and step["data_ms"] == pytest.approx(0.02)
    assert step["compute_ms"] == 0


def test_a_cpu_step_is_split_from_its_threads():
    """On the CPU the training thread computes inside its operators (an operator's own time, as a
    convolution's whose only child is an allocation); gloo's all-reduce beside them is hidden, and
    exposed where the training thread waits in no operator (DDP's wait after backward) or inside a
    range that is none (FSDP's). A collective's call on the training thread is communication."""
    events = trace(
        range_(NEXT, 0, 10),  # 0 to 200 us
        op("aten::conv2d", 12, 40),
        op("aten::mkldnn_convolution", 14, 36),
        op("aten::empty", 15, 2),  # inside: the convolution's own time counts
        op("autograd::engine::evaluate_function: ConvolutionBackward0", 60, 40),
        op("c10d::allreduce_", 70, 5),  # DDP's call from its hook
        range_("gloo:all_reduce", 75, 60, cat="gloo", where=GLOO),  # exposed 100-122, 130-135
        range_("FSDP::post_backward_reduce (0)", 120, 40),  # no operator: it waits
        op("aten::div_", 122, 8),
        range_(STEP, 170, 30),
        op("aten::add_", 172, 10),
    )
    (step,) = step_breakdowns(events)
    assert step == pytest.approx(in_ms(step_ms=200, compute_ms=83, comm_ms=65, comm_exposed_ms=32,
                                       data_ms=10, optimizer_ms=30, other_ms=45))
    assert_adds_up(step)


def test_on_the_cpu_fsdps_copies_for_its_collectives_are_communication_too():
    """FSDP2 on gloo: its copy of the shards into the all-gather's input (fsdp::all_gather_copy_in,
    the operators inside it included) is communication on the CPU as on a GPU, then the call and
    gloo's all-gather; the convolution after them is compute."""
    events = trace(
        range_(NEXT, 0, 10), range_(STEP, 100, 0),  # 0 to 100 us
        op("fsdp::all_gather_copy_in", 20, 10), op("aten::_foreach_copy_", 21, 8),
        op("c10d::_allgather_base_", 30, 2),
        range_("gloo:all_gather", 32, 18, where=GLOO),
        op("aten::conv2d", 50, 40),
    )
    (step,) = step_breakdowns(events)
    assert step == pytest.approx(in_ms(step_ms=100, compute_ms=40, comm_ms=30, comm_exposed_ms=30,
                                       data_ms=10, optimizer_ms=0, other_ms=20))
    assert_adds_up(step)


def test_an_epoch_end_and_an_evaluation_are_no_step_and_steps_are_averaged():
    """A step is its last wait for data since the step before, to the end of its optimizer step: a
    wait that no optimizer step followed (the epoch's last, which found no batch) and the
    evaluation between the epochs, with its own loader's waits, are no step. Steps are averaged; a
    step whose wait began before the recording did is left out."""
    events = trace(
        range_(STEP, 40, 10),  # its wait was not recorded
        range_(NEXT, 60, 10), range_(STEP, 90, 10),
        range_(NEXT, 110, 5),  # the epoch's end
        op("aten::conv2d", 120, 500), range_(NEXT, 300, 5),  # the evaluation, and its loader
        range_(NEXT, 700, 20), range_(STEP, 780, 0),
        op("aten::conv2d", 730, 40),
    )
    steps = step_breakdowns(events)
    assert [step["step_ms"] for step in steps] == pytest.approx([0.04, 0.08])
    assert mean_breakdown(steps) == pytest.approx(in_ms(
        step_ms=60, compute_ms=20, comm_ms=0, comm_exposed_ms=0, data_ms=15, optimizer_ms=5,
        other_ms=20))
    assert mean_breakdown([]) is None


def test_a_loader_that_marks_nothing_leaves_each_step_from_the_end_of_the_one_before():
    """A loader that is no DataLoader (a GPU-resident one, say) records no range: each step then
    runs from the end of the optimizer step before it, with no data wait, and the first is left
    out, its start unknown."""
    events = trace(range_(STEP, 0, 10), op("aten::conv2d", 20, 50), range_(STEP, 90, 10),
                   op("aten::conv2d", 110, 50), range_(STEP, 170, 10))
    complete = [event for event in events["traceEvents"] if event["ph"] == "X"]
    assert [step["window"] for step in recorded_steps(complete)] == [(10, 100), (100, 180)]
    assert [step["data_ms"] for step in step_breakdowns(events)] == [0, 0]


def test_the_parts_of_any_overlap_add_up_to_the_window():
    """Whatever the intervals, every instant of the window goes to one part: the first with it."""
    draw = random.Random(31)
    for _ in range(200):
        starts = {name: [draw.uniform(-10, 100) for _ in range(draw.randrange(5))]
                  for name in ("data", "optimizer", "compute", "comm")}
        parts = {name: merged((start, start + draw.uniform(0, 30)) for start in starts[name])
                 for name in starts}
        shares = split((0.0, 100.0), parts)
        assert sum(shares.values()) == pytest.approx(100.0)
        assert all(share >= 0 for share in shares.values())


# ------------------------------------------------------------------------------------- real runs
# A PyramidNet with enough weights (0.3 M) for DDP to split them over several buckets of 0.1 MB, on
# a batch small enough for a step of a fraction of a second. --benchmark: no evaluation, no
# checkpoint; 1 warm-up step, 3 timed, then 3 profiled (steps 5 to 7).
GROUP = ["--dataset", "synthetic", "--synthetic_size", "64", "--depth", "8", "--alpha", "96",
         "--batch_size", "8", "--num_workers", "0", "--log_interval", "50", "--benchmark",
         "--warmup_steps", "1", "--benchmark_steps", "3", "--profile_steps", "3"]


def group_run(tmp_path_factory, script: str, name: str, *flags):
    """A 2-process gloo run of `script` as a user starts it (its own launcher)."""
    log_dir = tmp_path_factory.mktemp(name)
    done = run_script(script, *GROUP, "--nproc_per_node", 2, *flags, "--log_dir", log_dir,
                      "--run_name", name)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return log_dir / name, done


@pytest.fixture(scope="module")
def one_bucket(tmp_path_factory):
    """DDP with every gradient in one bucket: its all-reduce starts once backward has ended."""
    return group_run(tmp_path_factory, "dist_parallel/train.py", "one_bucket",
                     "--bucket_cap_mb", 1000)


def test_each_ranks_trace_lies_in_the_run_folder_and_splits_into_its_profiled_steps(one_bucket):
    """Both ranks' traces beside results.json, each split into the 3 profiled steps (results.json's
    profiled_steps: 5 to 7, after the 1 warm-up and 3 timed ones), the parts adding up to the step,
    DDP's communication on gloo among them."""
    run_dir, _ = one_bucket
    summary = read_results(run_dir)["summary"]
    assert summary["timed_steps"] == 3 and summary["profiled_steps"] == [5, 7]
    breakdown = run_breakdown(run_dir)
    assert set(breakdown) == {"0", "1"}
    for rank, figures in breakdown.items():
        assert set(figures) == set(FIELDS)
        assert_adds_up(figures)
        assert figures["compute_ms"] > 0 and figures["comm_ms"] > 0, rank  # DDP's, on gloo
        written = json.loads((run_dir / f"trace_rank{rank}.json").read_text())
        assert len(step_breakdowns(written)) == 3, rank
        names = {event.get("name") for event in written["traceEvents"]}
        assert "gloo:all_reduce" in names, rank


def test_small_buckets_hide_the_communication_one_bucket_exposes(one_bucket, tmp_path_factory):
    """With every gradient in one bucket, DDP all-reduces them once the backward pass is over:
    nearly all of that communication is exposed. With buckets of 0.1 MB, each is all-reduced while
    the backward pass goes on with the layers below: more of it is hidden, on every rank. (On two
    processes sharing two cores, gloo's many small all-reduces take longer in all, and each waits
    for the other rank, so the milliseconds exposed need not fall: the share exposed and the
    milliseconds hidden are what the buckets move.)"""
    small_dir, _ = group_run(tmp_path_factory, "dist_parallel/train.py", "small_buckets",
                             "--bucket_cap_mb", 0.1)
    runs = {"one": run_breakdown(one_bucket[0]), "small": run_breakdown(small_dir)}
    for rank in ("0", "1"):
        exposed = {name: run[rank]["comm_exposed_ms"] / run[rank]["comm_ms"]
                   for name, run in runs.items()}
        hidden = {name: run[rank]["comm_ms"] - run[rank]["comm_exposed_ms"]
                  for name, run in runs.items()}
        assert exposed["one"] > exposed["small"], (rank, exposed)
        assert hidden["small"] > hidden["one"], (rank, hidden)


def collectives(run_dir, rank: str = "0") -> dict:
    """The all-gathers and reduce-scatters a rank's trace holds in its first recorded step."""
    events = [event for event in json.loads((run_dir / f"trace_rank{rank}.json").read_text())[
        "traceEvents"] if event.get("ph") == "X" and isinstance(event.get("dur"), (int, float))]
    start, end = recorded_steps(events)[0]["window"]
    inside = [event["name"] for event in events if start <= event["ts"] <= end]
    names = ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")
    return {name: inside.count(name) for name in names}


@pytest.fixture(scope="module")
def fsdp_resharded(tmp_path_factory):
    return group_run(tmp_path_factory, "fsdp/train.py", "fsdp_resharded")


@pytest.mark.second_tier  # a 2-process fsdp launch of its own
def test_fsdp_reports_its_all_gathers_and_reduce_scatters(fsdp_resharded):
    """FSDP on gloo: each block's parameters all-gathered before its forward and again before its
    backward (resharded after forward, the default), its gradients reduce-scattered; on the CPU
    FSDP waits for each where it issues it (no CUDA streams to overlap them on): exposed."""
    run_dir, _ = fsdp_resharded
    for rank, figures in run_breakdown(run_dir).items():
        assert_adds_up(figures)
        assert figures["comm_ms"] > 0 and figures["comm_exposed_ms"] > 0, rank
    counts = collectives(run_dir)
    assert counts["c10d::_allgather_base_"] == 2 * counts["c10d::_reduce_scatter_base_"] > 0, counts


@pytest.mark.second_tier
def test_fsdp_without_resharding_gathers_half_as_often(fsdp_resharded, tmp_path_factory):
    """--no-reshard_after_forward keeps the gathered parameters for the backward pass: one
    all-gather per block and step instead of two, the reduce-scatters unchanged."""
    kept_dir, _ = group_run(tmp_path_factory, "fsdp/train.py", "fsdp_kept",
                            "--no-reshard_after_forward")
    resharded, kept = collectives(fsdp_resharded[0]), collectives(kept_dir)
    assert kept["c10d::_reduce_scatter_base_"] == resharded["c10d::_reduce_scatter_base_"]
    assert 2 * kept["c10d::_allgather_base_"] == resharded["c10d::_allgather_base_"]
    for figures in run_breakdown(kept_dir).values():
        assert figures["comm_ms"] > 0
        assert_adds_up(figures)


def test_one_process_has_one_rank_and_no_communication(tmp_path):
    """data_parallel on the CPU (DataParallel wraps nothing there), run as a user runs it: rank "0"
    alone, its trace beside results.json, no communication, compute and the optimizer in its step;
    a run folder without a trace has no split."""
    done = run_script("data_parallel/train.py", *without(TINY, "loader"), "--benchmark",
                      "--benchmark_steps", 3, "--profile_steps", 3, "--log_dir", tmp_path,
                      "--run_name", "dp")
    assert done.returncode == 0, done.stderr
    breakdown = run_breakdown(tmp_path / "dp")
    assert list(breakdown) == ["0"] and (tmp_path / "dp" / "trace_rank0.json").is_file()
    figures = breakdown["0"]
    assert figures["comm_ms"] == 0 and figures["compute_ms"] > 0 and figures["optimizer_ms"] > 0
    assert_adds_up(figures)
    (tmp_path / "dp" / "trace_rank0.json").unlink()
    assert run_breakdown(tmp_path / "dp") is None and run_breakdown(None) is None
