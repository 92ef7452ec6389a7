"""Every CUDA path of the suite, on one GPU: what no CPU test can show. Skipped, with
the reason, without CUDA; `bash benchmarks/gpu_check.sh OUT` runs them on a GPU
machine together with the benchmarks.

In process: the gpu loader on the device (the train file's batches within float rounding, its
crops replayed on resume); bf16 and fp16 autocast with fused SGD and the GradScaler (an fp16
overflow skips the step); channels_last; DataParallel's replica in bf16; CUDA-event timing against
a synchronised host clock; NVML readings of the right GPU; peak memory without the warm-up. As a
user runs them (subprocesses, several at once on the one GPU): every mode with the GPU defaults,
one NCCL process with SyncBatchNorm, two Gloo ranks sharing the GPU, --compile, a CPU checkpoint
resumed on the GPU under fp16 and channels_last, SIGTERM, --profile_steps' traces, the fast path
(benchmarks/fast.py: the gpu loader, channels aligned, its compile cache), profile_step.py,
--memory_snapshot, and compare.py with its GPU columns filled.

What one GPU cannot show: NCCL between GPUs (NCCL refuses two ranks on one GPU), SyncBatchNorm
across GPUs, DataParallel's scatter and replica threads over several GPUs, scaling. Their
mechanisms are tested on the CPU.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import runkit
from benchmarks.fast import graph_entries, train_file
from benchmarks.gpu_loader import DeviceLoader
from conftest import REPO, read_results, read_scalars
from pyramidnet import PyramidNet

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: run `bash "
                                       "benchmarks/gpu_check.sh OUT` on a GPU machine")

CUDA = torch.device("cuda", 0)
GIB = 2 ** 30
# a tiny model on a small synthetic set; on a GPU every default is the GPU's (bf16 or fp16,
# channels_last; fast.py: the gpu loader, channels stored in multiples of 8)
GPU_TINY = ["--dataset", "synthetic", "--synthetic_size", "256", "--depth", "8", "--alpha", "12",
            "--batch_size", "32", "--epochs", "1", "--log_interval", "4", "--warmup_steps", "1",
            "--num_workers", "0"]
# 2 warm-up steps, 4 timed, then 4 profiled (--profile_steps), which the run's clock times apart
PROFILED = ["--benchmark", "--warmup_steps", "2", "--benchmark_steps", "4", "--profile_steps", "4"]
FAST = "benchmarks/fast.py"


# ------------------------------------------------------------------------------------------ scripts
class Launch:
    """A script started as a user starts it, output to a log file;
    `wait()` checks its exit status."""

    def __init__(self, folder: Path, name: str, script: str, *flags, env=None,
                 runs: Path | None = None):
        self.name, self.log, self.run_dir = (name, folder / f"{name}.log",
                                             (runs or folder / "runs") / name)
        command = [sys.executable, str(REPO / script), *map(str, flags)]
        if "--log_dir" not in flags and "--out" not in flags:
            command += ["--log_dir", str(self.run_dir.parent), "--run_name", name]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                 **(env or {})})

    def wait(self, expected: int | None = 0, timeout: float = 300) -> str:
        """The run's output once it ends; with `expected` (None: any), an error
        unless it exited with that."""
        self.code = self.process.wait(timeout=timeout)
        output = self.log.read_text()
        assert expected is None or self.code == expected, (
            f"{self.name} exited {self.code}:\n{output[-4000:]}")
        return output


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The script runs, started together (they only need to be
    correct, not fast), then waited for."""
    folder = tmp_path_factory.mktemp("gpu_runs")
    # a checkpoint written on the CPU
    cpu_first = Launch(folder, "cpu_fp16", "single_gpu/train.py", *GPU_TINY, "--amp", "fp16",
                       "--epochs", "2", "--max_steps", "3", env={"CUDA_VISIBLE_DEVICES": ""})
    # 64 steps: long enough for NVML to sample the GPU
    longer = [*GPU_TINY, "--synthetic_size", "2048"]
    runs = {
        "single_gpu": Launch(folder, "single_gpu", "single_gpu/train.py", *longer),
        "data_parallel": Launch(folder, "data_parallel", "data_parallel/train.py", *longer),
        "nccl_sync_bn": Launch(folder, "nccl_sync_bn", "dist_parallel/train.py", *longer,
                               "--nproc_per_node", "1", "--sync_bn"),
        "gloo_shared": Launch(folder, "gloo_shared", "dist_parallel/train.py", *longer, "--backend",
                              "gloo", "--gpu_devices", "0", "0"),
        "fsdp_nccl": Launch(folder, "fsdp_nccl", "fsdp/train.py", *longer, "--nproc_per_node", "1",
                            "--save_model"),
        "fsdp_gloo_fp16": Launch(folder, "fsdp_gloo_fp16", "fsdp/train.py", *longer, "--backend",
                                 "gloo", "--gpu_devices", "0", "0", "--amp", "fp16",
                                 "--no-reshard_after_forward", "--save_model"),
        "compiled": Launch(folder, "compiled", "single_gpu/train.py", *GPU_TINY, "--compile",
                           "--benchmark", "--warmup_steps", "2", "--benchmark_steps", "6",
                           "--log_interval", "2"),
        "breakdown": Launch(folder, "breakdown", "single_gpu/train.py", *GPU_TINY, *PROFILED),
        "breakdown_gloo": Launch(folder, "breakdown_gloo", "dist_parallel/train.py", *GPU_TINY,
                                 *PROFILED, "--backend", "gloo", "--gpu_devices", "0", "0"),
        "fast": Launch(folder, "fast", FAST, "single_gpu", *longer, "--save_model"),
        "fast_nccl": Launch(folder, "fast_nccl", FAST, "dist_parallel", *longer,
                            "--nproc_per_node", "1"),
        "fast_compiled": Launch(folder, "fast_compiled", FAST, "single_gpu", *GPU_TINY,
                                "--compile", "--compile_cache", folder / "cache", "--benchmark",
                                "--warmup_steps", "2", "--benchmark_steps", "6"),
        "profile": Launch(folder, "profile", "benchmarks/profile_step.py", "--depth", "8",
                          "--alpha", "12", "--batch_size", "32", "--steps", "2", "--warmup_steps",
                          "1", "--out", folder / "profile.json"),
    }
    cpu_first.wait()
    runs["resumed_fp16"] = Launch(folder, "resumed_fp16", "single_gpu/train.py", *GPU_TINY,
                                  "--amp", "fp16", "--epochs", "2", "--resume",
                                  cpu_first.run_dir / "checkpoint.pt")
    # each test checks its own
    outputs = {name: launch.wait(expected=None) for name, launch in runs.items()}
    return folder, runs, outputs


def finished(launched, *names) -> None:
    """An error naming each of the runs a test reads that did not exit 0 (one
    failed run fails its tests only)."""
    _, runs, outputs = launched
    failed = [f"{name} exited {runs[name].code}:\n{outputs[name][-4000:]}" for name in names
              if runs[name].code]
    assert not failed, "\n".join(failed)


def gpu_amp() -> str:
    return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


def test_every_mode_runs_with_the_gpu_defaults(launched):
    names = ("single_gpu", "data_parallel", "nccl_sync_bn", "gloo_shared", "fsdp_nccl")
    finished(launched, *names)
    _, runs, _ = launched
    for name in names:
        results = read_results(runs[name].run_dir)
        cfg, summary = results["config"], results["summary"]
        assert (cfg["amp"], cfg["channels_last"]) == (gpu_amp(), True), name
        assert summary["test_acc"] is not None and 0 <= summary["test_acc"] <= 1, name
        assert summary["gpu_util_mean"] is not None and summary["peak_mem_gb"] > 0, name
        assert torch.isfinite(torch.tensor(summary["train_loss"])), name
        assert "gpu/0/util_pct" in read_scalars(runs[name].run_dir), name
    for name in ("nccl_sync_bn", "gloo_shared"):  # DDP's promise, over NCCL and a shared GPU
        assert read_results(runs[name].run_dir)["params_in_sync"] is True, name
    assert read_results(runs["gloo_shared"].run_dir)["world_size"] == 2


def test_fsdp_shards_on_the_gpu_with_fp16_loss_scaling(launched):
    """FSDP2 on CUDA: DTensor parameters under for-each SGD (torch has no sharding rule for fused
    SGD's kernel), the GradScaler's overflow check over sharded gradients, channels_last batches,
    the weights gathered whole onto rank 0's CPU for model.pt, and the same PyramidNet as the
    other modes (every parameter, every shape)."""
    finished(launched, "fsdp_nccl", "fsdp_gloo_fp16")
    _, runs, _ = launched
    results = read_results(runs["fsdp_gloo_fp16"].run_dir)
    assert (results["config"]["amp"] == "fp16"
            and results["config"]["reshard_after_forward"] is False)
    assert results["params_in_sync"] is True and results["world_size"] == 2
    assert torch.isfinite(torch.tensor(results["summary"]["train_loss"]))
    cfg = results["config"]
    plain = PyramidNet(cfg["depth"], cfg["alpha"], cfg["block"]).state_dict()
    for name in ("fsdp_nccl", "fsdp_gloo_fp16"):
        saved = torch.load(runs[name].run_dir / "model.pt", map_location="cpu", weights_only=True)
        assert all(tensor.device.type == "cpu" and torch.isfinite(tensor).all()
                   for tensor in saved.values()), name
        assert {k: v.shape for k, v in saved.items()} == \
            {k: v.shape for k, v in plain.items()}, name


def test_mfu_and_peak_memory_on_a_known_gpu(launched):
    finished(launched, "single_gpu")
    _, runs, _ = launched
    summary = read_results(runs["single_gpu"].run_dir)["summary"]
    if runkit.peak_tflops(CUDA, "bf16")[0] is None:
        pytest.skip(f"{torch.cuda.get_device_name(CUDA)} is not in the peak "
                    "table: MFU is null by design")
    assert summary["mfu"] is not None and 0 < summary["mfu"] < 1
    total = torch.cuda.get_device_properties(CUDA).total_memory / GIB
    assert 0 < summary["peak_mem_gb"] <= summary["peak_mem_reserved_gb"] < total


def test_compile_runs_and_its_first_step_holds_the_compile(launched):
    finished(launched, "compiled")
    _, runs, _ = launched
    results = read_results(runs["compiled"].run_dir)
    summary = results["summary"]
    assert results["config"]["compile"] is True and summary["step"] == 8
    assert summary["first_step_s"] > summary["batch_time_p90"]


def test_a_cpu_checkpoint_resumes_on_the_gpu_under_fp16_and_channels_last(launched):
    """Fused SGD and the GradScaler on the GPU from an optimizer saved on the
    CPU (fused None, NCHW buffers)."""
    finished(launched, "resumed_fp16")
    _, runs, _ = launched
    results = read_results(runs["resumed_fp16"].run_dir)
    assert results["config"]["amp"] == "fp16" and results["config"]["channels_last"] is True
    assert results["summary"]["step"] == 16  # 2 epochs of 8 steps, 3 of them on the CPU


def test_the_fast_path_trains_the_same_model_on_the_gpu(launched):
    """benchmarks/fast.py's GPU defaults (the gpu loader, channels stored in multiples of 8): the
    plain file's parameters, FLOPs and weights' shapes; under DDP over NCCL too."""
    finished(launched, "fast", "fast_nccl", "single_gpu")
    _, runs, outputs = launched
    ours, plain = (read_results(runs[name].run_dir) for name in ("fast", "single_gpu"))
    assert (ours["config"]["loader"], ours["config"]["align_channels"]) == ("gpu", 8)
    for key in ("parameters", "flops_per_image"):
        assert ours["summary"][key] == plain["summary"][key], key
    assert 0 <= ours["summary"]["test_acc"] <= 1 and ours["summary"]["data_wait_frac"] < 0.5
    assert "fast path: the gpu loader, channels stored in multiples of 8" in outputs["fast"]
    saved = torch.load(runs["fast"].run_dir / "model.pt", map_location="cpu", weights_only=True)
    assert {k: v.shape for k, v in saved.items()} == \
        {k: v.shape for k, v in PyramidNet(8, 12).state_dict().items()}
    distributed = read_results(runs["fast_nccl"].run_dir)
    assert distributed["params_in_sync"] is True and distributed["config"]["align_channels"] == 8


def test_the_fast_paths_compile_cache_holds_its_graphs(launched):
    finished(launched, "fast_compiled")
    folder, _, outputs = launched
    assert f"compile cache {folder / 'cache'} (cold)" in outputs["fast_compiled"]
    assert graph_entries(folder / "cache") > 0  # what a warm run reads


def test_profile_step_splits_a_gpu_step(launched):
    finished(launched, "profile")
    folder, _, outputs = launched
    report = json.loads((folder / "profile.json").read_text())
    assert report["device"] == torch.cuda.get_device_name(CUDA)
    assert sum(report["shares"].values()) == pytest.approx(1.0)
    assert (report["top_kernels"] and report["shares"]["convolution"] > 0
            and report["shares"]["batchnorm"] > 0)
    assert report["config"]["align_channels"] == 8  # the fast path's default on a GPU
    # each kernel by the pass of its operator; what no name places is shown, not dropped
    assert {"fprop", "dgrad", "wgrad", "unattributed"} <= set(report["conv_passes"])
    rates = report["achieved"]
    assert rates["convolution_tflops"] > 0 and rates["backward_tflops"] > 0
    assert "unattributed convolution kernels:" in outputs["profile"]
    if report["roofline"] is not None:  # a GPU of known peak and bandwidth
        assert 0 < report["roofline"]["op_by_op_share"] < 1
        assert 0 < report["roofline"]["training_fused_share"] < 1


def test_the_profiled_steps_leave_a_trace_of_kernels_on_every_rank(launched):
    """--profile_steps on a GPU: the run's last steps recorded, never timed, each rank's trace
    beside results.json holding its kernels (comparison/ splits them)."""
    finished(launched, "breakdown", "breakdown_gloo")
    _, runs, _ = launched
    for name, ranks in (("breakdown", ["0"]), ("breakdown_gloo", ["0", "1"])):
        summary = read_results(runs[name].run_dir)["summary"]
        assert summary["timed_steps"] == 4 and summary["profiled_steps"] == [7, 10], name
        for rank in ranks:
            trace = json.loads((runs[name].run_dir / f"trace_rank{rank}.json").read_text())
            assert any(event.get("cat") == "kernel" for event in trace["traceEvents"]), (name, rank)


def test_sigterm_on_the_gpu_checkpoints_and_exits(tmp_path):
    launch = Launch(tmp_path, "sigterm", "single_gpu/train.py", *GPU_TINY, "--epochs", "50",
                    "--synthetic_size", "2048", "--log_interval", "2")
    deadline = time.monotonic() + 120
    while "Epoch 1/50 [" not in launch.log.read_text():
        assert launch.process.poll() is None and time.monotonic() < deadline, launch.log.read_text()
        time.sleep(0.2)
    launch.process.send_signal(signal.SIGTERM)
    output = launch.wait(expected=128 + signal.SIGTERM, timeout=120)
    assert "stopped by SIGTERM" in output and (launch.run_dir / "checkpoint.pt").exists()
    assert "Traceback" not in output


def test_a_memory_snapshot_of_the_first_steps(tmp_path):
    """--memory_snapshot 2: the allocator's history of the first 2 steps in the run folder, as
    pytorch.org/memory_viz reads it (torch.cuda.memory._snapshot's dict, pickled): the GPU's
    segments, and a trace of allocations and frees whose stacks reach the training step; in
    single_gpu, and in fsdp (one NCCL process)."""
    import pickle

    single = Launch(tmp_path, "snapshot", "single_gpu/train.py", *GPU_TINY, "--memory_snapshot",
                    "2")
    fsdp = Launch(tmp_path, "snapshot_fsdp", "fsdp/train.py", *GPU_TINY, "--memory_snapshot", "2",
                  "--nproc_per_node", "1")
    for launch in (single, fsdp):
        launch.wait()
        snapshot = pickle.loads((launch.run_dir / "memory_snapshot.pickle").read_bytes())
        assert snapshot["segments"] and snapshot["device_traces"][0], launch.name
        actions = {event["action"] for event in snapshot["device_traces"][0]}
        assert {"alloc", "free_completed"} <= actions, actions
        frames = {frame["filename"] for event in snapshot["device_traces"][0]
                  for frame in event.get("frames", [])}
        assert any(name.endswith("train.py") for name in frames), launch.name


def test_compare_writes_the_gpu_columns(tmp_path):
    """The comparison gpu_check.sh ran (GPU_CHECK_COMPARE), or a small one on one GPU."""
    given = os.environ.get("GPU_CHECK_COMPARE")
    out = Path(given) if given else tmp_path / "compare"
    if not given:
        Launch(tmp_path, "compare", "compare.py", "--depth", "8", "--alpha", "12",
               "--synthetic_size", "512", "--batch_size", "32", "--warmup_steps", "2",
               "--benchmark_steps", "60", "--log_interval", "20", "--modes", "single_gpu",
               "dist_parallel", "--backends", "nccl", "--out", out).wait()
    import csv

    rows = list(csv.DictReader(open(out / "results.csv")))
    assert rows and all(row["status"] == "ok" for row in rows), rows
    for row in rows:
        for column in ("gpu_util_mean", "peak_mem_gb_per_gpu", "images_per_sec"):
            assert row[column] not in ("", None), (row["run"], column)
    assert torch.cuda.get_device_name(CUDA) in (out / "report.md").read_text()


# --------------------------------------------------------------------------------------- in process
@pytest.fixture(scope="module")
def single():
    return train_file("single_gpu")


def loaders_on(single, device: torch.device, *flags):
    """single_gpu/train.py's training DataLoader for `flags` and the gpu loader of it on
    `device`, as benchmarks/fast.py makes it."""
    args = single.get_args(["--dataset", "synthetic", "--synthetic_size", "1024", "--batch_size",
                            "128", "--num_workers", "2", *flags])
    train_set, test_set, _ = single.get_datasets(args)
    single.data_defaults(args, len(train_set))
    train, _ = single.get_loaders(args, train_set, test_set, device)
    side, _, mean, std = single.IMAGES[args.dataset]
    pad = side // 8 if args.augment == "pad" else None
    return train, DeviceLoader(train, device, pad=pad, flip=args.flip, mean=mean, std=std)


@pytest.mark.parametrize("flags", [[], ["--augment", "off"]])
def test_the_gpu_loader_feeds_the_images_the_train_files_loader_feeds(single, flags):
    """With augmentation and without: the same batches, on the device in channels_last, equal up
    to the float rounding of the normalisation (bit for bit on the CPU:
    tests/test_gpu_loader.py)."""
    plain, on_device = loaders_on(single, CUDA, *flags)
    expected = [batch for batch, _ in zip(single.epoch_batches(plain, 1, {"batch": 0}), range(4))]
    single.epoch_batches(on_device, 1, {"batch": 0})
    for (images, labels), (theirs, their_labels) in zip(on_device, expected):
        assert images.device == CUDA and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(labels.cpu(), their_labels)
        torch.testing.assert_close(images.cpu(), theirs, rtol=0, atol=1e-5)


def test_the_gpu_loader_replays_its_crops_on_resume(single):
    _, on_device = loaders_on(single, CUDA)
    single.epoch_batches(on_device, 3, {"batch": 0})
    whole = [images for images, _ in on_device]
    single.epoch_batches(on_device, 3, {"batch": 0})
    resumed = [images for images, _ in on_device.from_batch(5)]
    assert len(resumed) == 3 and all(torch.equal(a, b) for a, b in zip(resumed, whole[5:]))


def gpu_args(module, *flags):
    args = module.get_args(["--dataset", "synthetic", "--depth", "8", "--alpha", "12",
                            "--batch_size", "32", *flags])
    device = module.setup(args)
    module.data_defaults(args, 1024)
    return args, device


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_with_fused_sgd_and_the_grad_scaler(single, amp):
    if amp == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("no bf16 on this GPU")
    args, device = gpu_args(single, "--amp", amp)
    torch.manual_seed(0)
    model, raw_model, _ = single.get_model(args, 10, device)
    optimizer, _, scaler = single.get_optimizer(args, raw_model, device, steps_per_epoch=10)
    assert optimizer.param_groups[0]["fused"] is True and scaler.is_enabled() == (amp == "fp16")
    images = torch.randn(32, 3, 32, 32, device=CUDA).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (32,), device=CUDA)

    def step(poison: bool = False):
        with torch.autocast("cuda", single.AMP[amp]):
            logits = model(images)
            loss = F.cross_entropy(logits, labels) * (float("inf") if poison else 1.0)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return logits

    before = [p.detach().clone() for p in raw_model.parameters()]
    # the first step overflows: skipped, the scale halves, the momentum stays zero
    if amp == "fp16":
        scale = scaler.get_scale()
        step(poison=True)
        assert scaler.get_scale() == scale / 2
        assert all(torch.equal(a, b) for a, b in zip(before, raw_model.parameters()))
        assert not any(optimizer.state[p]["momentum_buffer"].any() for p in raw_model.parameters())
    assert step().dtype == single.AMP[amp]
    assert any(not torch.equal(a, b) for a, b in zip(before, raw_model.parameters()))
    assert all(torch.isfinite(p).all() for p in raw_model.parameters())
    conv = next(m for m in raw_model.modules()
                if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_data_parallel_on_one_gpu_computes_in_bf16():
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("no bf16 on this GPU")
    data_parallel = train_file("data_parallel")
    args, device = gpu_args(data_parallel, "--amp", "bf16", "--gpu_devices", "0")
    model, _, _ = data_parallel.get_model(args, 10, device)
    images = torch.randn(8, 3, 32, 32, device=CUDA).contiguous(memory_format=torch.channels_last)
    assert model(images).dtype == torch.bfloat16


def test_cuda_event_timing_agrees_with_a_synchronised_host_clock():
    """A known workload (matrix products of about 20 ms a step): the events' step time and the
    host's clock around synchronised steps agree within a few percent, and the host alone would
    have timed only the launches."""
    a = torch.randn(8192, 8192, device=CUDA)
    timer = runkit.StepTimer(CUDA, warmup_steps=2, step=0)
    torch.cuda.synchronize()
    launch_seconds, started = 0.0, None
    for index in timer.timed(range(12)):
        if index == 2:
            torch.cuda.synchronize()
            started = time.perf_counter()
        launched_at = time.perf_counter()
        for _ in range(2):
            a = (a @ a) / 8192 ** 0.5
        launch_seconds += time.perf_counter() - launched_at
        timer.step_done()
    torch.cuda.synchronize()
    host_seconds = time.perf_counter() - started
    steps, event_seconds, _ = timer.window()
    assert steps == 10
    assert event_seconds == pytest.approx(host_seconds, rel=0.05)
    # what a host clock without a sync would have measured
    assert launch_seconds < 0.5 * event_seconds


def test_nvml_reads_this_gpu():
    """The NVML handle is the torch device's own GPU (by UUID, right under CUDA_VISIBLE_DEVICES),
    and a busy second shows utilisation and memory."""
    monitor = runkit.GpuMonitor([0])
    try:
        uuid = monitor.nvml.nvmlDeviceGetUUID(monitor.handles[0])
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        assert str(torch.cuda.get_device_properties(0).uuid) in uuid
        a = torch.randn(4096, 4096, device=CUDA)
        busy_until = time.monotonic() + 1.0
        while time.monotonic() < busy_until:
            a = (a @ a) / 64
            torch.cuda.synchronize()
        util, memory = monitor.window()[0]
    finally:
        monitor.close()
    assert util is not None and util > 10 and memory is not None and memory > 0


def test_peak_memory_leaves_the_warm_up_out():
    """A large buffer freed during the warm-up (as cuDNN's autotuning
    workspaces are) is not in the peak."""
    timer = runkit.StepTimer(CUDA, warmup_steps=1, step=0)
    for index in timer.timed(range(3)):
        if index == 0:
            torch.empty(2 * GIB, dtype=torch.uint8, device=CUDA)  # allocated and freed at once
        small = torch.ones(1024, 1024, device=CUDA)
        timer.step_done()
    allocated, reserved = runkit.peak_memory_gb([0])["0"]
    # the freed buffer stays cached: reserved
    assert allocated < 1.0 and reserved >= allocated
    del small
