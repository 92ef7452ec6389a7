"""Every CUDA path of the suite, on one GPU: what no CPU test can show. Skipped, with
the reason, without CUDA; `bash benchmarks/gpu_check.sh OUT` runs them on a GPU
machine together with the benchmarks.

In process: the gpu loader on the device (the same images as the torchvision loader, its crops
replayed on resume); bf16 and fp16 autocast with fused SGD and the GradScaler (an fp16 overflow
skips the step); channels_last; DataParallel's replica in bf16; CUDA-event timing against a
synchronised host clock; NVML readings of the right GPU; peak memory without the warm-up. As a user
runs them (subprocesses, several at once on the one GPU): every mode with the GPU defaults, one NCCL
process with SyncBatchNorm, two Gloo ranks sharing the GPU, --compile, a CPU checkpoint resumed on
the GPU under fp16 and channels_last, SIGTERM, --profile_steps' split of the step from its kernels,
profile_step.py and compare.py with its GPU columns filled.

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

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.augmentation import crop_boxes, resized_crop_draws
from common.config import Config, parse_config
from common.data import load_datasets
from common.devices import seed_everything
from common.loaders import make_loader
from common.metrics import StepTimer
from common.performance import autocast, peak_tflops, resolve_fast_path
from common.samplers import EvalShard, ShuffleSampler
from common.telemetry import GIB, GpuTelemetry, peak_memory_gb
from conftest import REPO, TINY, at_epoch, read_results, read_scalars
from models import pyramidnet

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: run `bash "
                                       "benchmarks/gpu_check.sh OUT` on a GPU machine")

CUDA = torch.device("cuda", 0)
# TINY without its --loader: on a GPU every default is the GPU's (gpu
# loader, bf16 or fp16, channels_last)
GPU_TINY = [arg for arg in TINY if arg not in ("--loader", "gpu")]
# 2 warm-up steps, 4 timed, then 4 profiled (--profile_steps), which the run's clock times apart
PROFILED = ["--benchmark", "--warmup_steps", "2", "--benchmark_steps", "4", "--profile_steps", "4"]


def config(*flags) -> Config:
    return resolve_fast_path(parse_config(Config, [*GPU_TINY, *flags]), CUDA)


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
            command += ["--log_dir", str(self.run_dir.parent), "--run_name", name, "--no_progress"]
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
    cpu_first = Launch(folder, "cpu_fp16", "single_gpu/train.py", *TINY, "--amp", "fp16",
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
                                 "--no_reshard_after_forward", "--save_model"),
        "compiled": Launch(folder, "compiled", "single_gpu/train.py", *GPU_TINY, "--compile",
                           "--benchmark", "--warmup_steps", "2", "--benchmark_steps", "6",
                           "--log_interval", "2"),
        "breakdown": Launch(folder, "breakdown", "single_gpu/train.py", *GPU_TINY, *PROFILED),
        "breakdown_gloo": Launch(folder, "breakdown_gloo", "dist_parallel/train.py", *GPU_TINY,
                                 *PROFILED, "--backend", "gloo", "--gpu_devices", "0", "0"),
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


def test_every_mode_runs_with_the_gpu_defaults(launched):
    finished(launched, "single_gpu", "data_parallel", "nccl_sync_bn", "gloo_shared", "fsdp_nccl")
    _, runs, outputs = launched
    for name in ("single_gpu", "data_parallel", "nccl_sync_bn", "gloo_shared", "fsdp_nccl"):
        results = read_results(runs[name].run_dir)
        cfg, summary = results["config"], results["summary"]
        expected_amp = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
        assert (cfg["amp"], cfg["channels_last"], cfg["loader"] or "gpu") == \
            (expected_amp, True, "gpu"), name
        assert summary["test_acc"] is not None and 0 <= summary["test_acc"] <= 1, name
        assert summary["gpu_util_mean"] is not None and summary["peak_mem_gb"] > 0, name
        assert torch.isfinite(torch.tensor(summary["train_loss"])), name
        scalars = read_scalars(runs[name].run_dir)
        # one process's GPUs by CUDA index; a process group's by rank (tests/test_tensorboard.py)
        device = "gpu/0/" if name in ("single_gpu", "data_parallel") else "rank/0/gpu/"
        assert f"{device}util_pct" in scalars and f"{device}mem_used_gib" in scalars, name
        if summary["mfu"] is not None:  # a GPU in the peak table: each window's MFU, in %, by the
            # same FLOPs, GPU count and peak as the run's: in proportion to the window's images/s
            per_image_s = 100 * summary["mfu"] / summary["images_per_sec"]
            rates = dict(scalars["throughput/images_per_s"])
            expected = {step: per_image_s * rate for step, rate in rates.items()}
            assert dict(scalars["perf/mfu_pct"]) == pytest.approx(expected, rel=1e-4), name
    assert "rank/1/gpu/util_pct" in read_scalars(runs["gloo_shared"].run_dir)  # both ranks' GPU
    assert "over nccl" in outputs["nccl_sync_bn"] and "over gloo" in outputs["gloo_shared"]
    assert "identical on 2 ranks" in outputs["gloo_shared"]  # the sync check over the shared GPU


def test_fsdp_shards_on_the_gpu_with_fp16_loss_scaling(launched):
    """FSDP2 on CUDA: DTensor parameters under for-each SGD (torch has no sharding rule for fused
    SGD's kernel), the GradScaler's overflow check over sharded gradients (DTensor reduces it
    across the ranks), channels_last batches beside the NCHW weights FSDP2 requires, the weights
    gathered whole onto rank 0's CPU for model.pt, and the same PyramidNet as the other modes
    (every parameter, every shape)."""
    finished(launched, "fsdp_nccl", "fsdp_gloo_fp16")
    _, runs, outputs = launched
    results = read_results(runs["fsdp_gloo_fp16"].run_dir)
    assert (results["config"]["amp"] == "fp16"
            and results["config"]["reshard_after_forward"] is False)
    assert ("identical on 2 ranks" in outputs["fsdp_gloo_fp16"]
            and results["summary"]["params_in_sync"] is True)
    assert torch.isfinite(torch.tensor(results["summary"]["train_loss"]))
    cfg = results["config"]
    plain = pyramidnet(cfg["depth"], cfg["alpha"], cfg["block"]).state_dict()
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
    if peak_tflops(CUDA, "bf16") is None:
        pytest.skip(f"{torch.cuda.get_device_name(CUDA)} is not in the peak "
                    "table: MFU is null by design")
    assert summary["mfu"] is not None and 0 < summary["mfu"] < 1
    assert 0 < summary["peak_mem_gb"] < torch.cuda.get_device_properties(CUDA).total_memory / GIB


def test_compile_reports_its_time_apart(launched):
    finished(launched, "compiled")
    _, runs, outputs = launched
    results = read_results(runs["compiled"].run_dir)
    assert results["config"]["compile"] is True and results["summary"]["compile_time_s"] > 0
    assert results["summary"]["steps"] == 8 and "compiled" in outputs["compiled"]


def test_a_cpu_checkpoint_resumes_on_the_gpu_under_fp16_and_channels_last(launched):
    """Fused SGD and the GradScaler on the GPU from an optimizer saved on the
    CPU (fused None, NCHW buffers)."""
    finished(launched, "resumed_fp16")
    _, runs, outputs = launched
    results = read_results(runs["resumed_fp16"].run_dir)
    assert "resumed at step 3" in outputs["resumed_fp16"]
    assert results["config"]["amp"] == "fp16" and results["config"]["channels_last"] is True
    assert results["summary"]["steps"] == 16  # 2 epochs of 8 steps, 3 of them on the CPU


def test_profile_step_splits_a_gpu_step(launched):
    finished(launched, "profile")
    folder, _, outputs = launched
    report = json.loads((folder / "profile.json").read_text())
    assert report["device"] == torch.cuda.get_device_name(CUDA)
    assert sum(report["shares"].values()) == pytest.approx(1.0)
    assert (report["top_kernels"] and report["shares"]["convolution"] > 0
            and report["shares"]["batchnorm"] > 0)
    # each kernel by the pass of its operator; what no name places is shown, not dropped
    assert {"fprop", "dgrad", "wgrad", "unattributed"} <= set(report["conv_passes"])
    rates = report["achieved"]
    assert rates["convolution_tflops"] > 0 and rates["backward_tflops"] > 0
    assert "unattributed convolution kernels:" in outputs["profile"]
    if report["roofline"] is not None:  # a GPU of known peak and bandwidth
        assert 0 < report["roofline"]["op_by_op_share"] < 1
        assert 0 < report["roofline"]["training_fused_share"] < 1


def test_the_step_breakdown_comes_from_the_kernels(launched):
    """--profile_steps on a GPU: the step split from the kernels on their streams
    (common/breakdown.py), the parts adding up to the step the CUDA events timed (the profiled
    steps, timed apart from the timed ones: rank 0's, within 5 %), and gloo's collectives over
    CUDA tensors counted as communication on both ranks sharing the GPU."""
    finished(launched, "breakdown", "breakdown_gloo")
    _, runs, _ = launched
    parts = ("compute_ms", "comm_exposed_ms", "data_ms", "optimizer_ms", "other_ms")
    for name, ranks in (("breakdown", {"0"}), ("breakdown_gloo", {"0", "1"})):
        results = read_results(runs[name].run_dir)
        summary = results["summary"]
        assert set(summary["breakdown"]) == ranks and summary["breakdown_steps"] == 4, name
        for rank, figures in summary["breakdown"].items():
            added = sum(figures[part] for part in parts)
            assert added == pytest.approx(figures["step_ms"]), (name, rank)
            assert figures["compute_ms"] > 0 and figures["optimizer_ms"] > 0, (name, rank)
            assert (figures["comm_ms"] > 0) == (name == "breakdown_gloo"), (name, rank)
            trace = json.loads((runs[name].run_dir / f"trace_rank{rank}.json").read_text())
            assert any(event.get("cat") == "kernel" for event in trace["traceEvents"]), (name, rank)
        assert summary["timed_steps"] == [3, 6] and summary["profiled_steps"] == [7, 10], name
        assert summary["breakdown"]["0"]["step_ms"] == pytest.approx(
            1e3 * summary["profiled_step_s"], rel=0.05), name


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
def test_the_gpu_loader_feeds_the_images_the_torchvision_loader_feeds():
    """With augmentation and without, both loaders give the same batches (each image's crop and flip
    are a function of seed, epoch and index), equal up to float rounding of the normalisation."""
    def batches(kind, augment, count=4):
        train_set, _ = load_datasets("synthetic", "", 1024, 0)
        loader = make_loader(kind, train_set, ShuffleSampler(1024, True, 0), 128, CUDA, train=True,
                             augment=augment, num_workers=2, seed=0,
                             memory_format=torch.channels_last)
        return [batch for batch, _ in zip(loader, range(count))]

    for augment in (False, True):
        pairs = zip(batches("gpu", augment), batches("torchvision", augment))
        for (gpu_images, gpu_labels), (tv_images, tv_labels) in pairs:
            assert (gpu_images.device == CUDA
                    and gpu_images.is_contiguous(memory_format=torch.channels_last))
            assert gpu_images.dtype == tv_images.dtype == torch.float32
            assert torch.equal(gpu_labels, tv_labels)
            torch.testing.assert_close(gpu_images, tv_images, rtol=0, atol=1e-5)


def test_the_gpu_loader_replays_its_crops_on_resume():
    train_set, _ = load_datasets("synthetic", "", 512, 0)
    loader = make_loader("gpu", train_set, ShuffleSampler(512, True, 0), 64, CUDA, train=True,
                         augment=True, num_workers=0, seed=0)
    at_epoch(loader, 3)
    whole = [images for images, _ in loader]
    at_epoch(loader, 3, 5)
    resumed = [images for images, _ in loader]
    assert len(resumed) == 3 and all(torch.equal(a, b) for a, b in zip(resumed, whole[5:]))


def test_an_image_folder_on_the_gpu_loader_gives_the_torchvision_loaders_images(tmp_path):
    """An image folder decoded into the GPU's memory (the default where it fits): its
    evaluation images are the torchvision loader's, and its training crops, cut by roi_align
    on the device, are the boxes drawn for them (tests/test_imagefolder.py's ramps, within
    1.5 of 255), in channels_last."""
    from PIL import Image

    from test_imagefolder import crop_expected, pixels, write_folder

    root = write_folder(tmp_path / "data")
    assert config("--dataset", "imagefolder", "--data_dir", str(root),
                  "--image_size", "32").loader == "gpu"
    train, val = load_datasets("imagefolder", str(root), 0, 0, 32)
    options = dict(num_workers=0, seed=0, memory_format=torch.channels_last)
    evaluation = {kind: next(iter(make_loader(kind, val, EvalShard(15), 15, CUDA, train=False,
                                              augment=True, **options)))[0]
                  for kind in ("gpu", "torchvision")}
    assert evaluation["gpu"].is_contiguous(memory_format=torch.channels_last)
    assert (evaluation["gpu"] - evaluation["torchvision"]).abs().max() <= 2 ** -21
    loader = at_epoch(make_loader("gpu", train, EvalShard(24), 24, CUDA, train=True, augment=True,
                                  **options), 2)
    crops = next(iter(loader))[0]
    assert crops.device == CUDA and crops.is_contiguous(memory_format=torch.channels_last)
    draws = resized_crop_draws(0, 2, 24, flip=True)
    for index, image in enumerate(pixels(crops.cpu()).numpy()):
        width, height = Image.open(train.samples[index][0]).size
        box = tuple(int(v) for v in crop_boxes([draw[index] for draw in draws[:4]], width, height))
        red, green = crop_expected(width, height, box, bool(draws[4][index]), 32)
        assert np.abs(image[0] - red[None, :])[1:-1, 1:-1].max() < 1.5, (index, box)
        assert np.abs(image[1] - green[:, None])[1:-1, 1:-1].max() < 1.5, (index, box)


def test_the_synthetic_set_at_224_pixels_is_resized_alike_by_both_loaders():
    """Generated at 32 pixels, cropped there, resized to 224 on the device
    (channels_last) by the gpu loader and in the workers by the torchvision loader: the
    same batches up to float rounding."""
    def batches(kind):
        train_set, _ = load_datasets("synthetic", "", 256, 0, 224)
        loader = make_loader(kind, train_set, ShuffleSampler(256, True, 0), 64, CUDA, train=True,
                             augment=True, num_workers=2, seed=0, memory_format=torch.channels_last)
        return [images for (images, _), _ in zip(loader, range(2))]

    for gpu_images, tv_images in zip(batches("gpu"), batches("torchvision")):
        assert gpu_images.shape == (64, 3, 224, 224)
        assert gpu_images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(gpu_images, tv_images, rtol=0, atol=1e-4)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_with_fused_sgd_and_the_grad_scaler(amp):
    if amp == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("no bf16 on this GPU")
    import single_gpu.train as single

    cfg = config("--amp", amp)
    seed_everything(0)
    model, raw_model = single.get_model(cfg, CUDA)
    optimizer, _, scaler = single.get_optimizer(cfg, raw_model, CUDA, steps_per_epoch=10)
    assert optimizer.param_groups[0]["fused"] is True and scaler.is_enabled() == (amp == "fp16")
    images = torch.randn(32, 3, 32, 32, device=CUDA).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (32,), device=CUDA)

    def step(poison: bool = False):
        with autocast(cfg, CUDA):
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
    assert step().dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    assert any(not torch.equal(a, b) for a, b in zip(before, raw_model.parameters()))
    assert all(torch.isfinite(p).all() for p in raw_model.parameters())
    conv = next(m for m in raw_model.modules()
                if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_data_parallel_on_one_gpu_computes_in_bf16():
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("no bf16 on this GPU")
    import data_parallel.train as data_parallel

    model, _ = data_parallel.get_model(config("--amp", "bf16"), CUDA, gpus=[0])
    images = torch.randn(8, 3, 32, 32, device=CUDA).contiguous(memory_format=torch.channels_last)
    assert model(images).dtype == torch.bfloat16


def test_cuda_event_timing_agrees_with_a_synchronised_host_clock():
    """A known workload (matrix products of about 20 ms a step): the events' step time and the
    host's clock around synchronised steps agree within a few percent, and the host alone would
    have timed only the launches."""
    a = torch.randn(8192, 8192, device=CUDA)
    timer = StepTimer(CUDA, warmup_steps=2)
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
    import pynvml

    from common.telemetry import nvml_handle

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(nvml_handle(pynvml, 0))
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        assert str(torch.cuda.get_device_properties(0).uuid) in uuid
    finally:
        pynvml.nvmlShutdown()
    telemetry = GpuTelemetry([0], interval=0.05)
    try:
        a = torch.randn(4096, 4096, device=CUDA)
        busy_until = time.monotonic() + 1.0
        while time.monotonic() < busy_until:
            a = (a @ a) / 64
            torch.cuda.synchronize()
        util, memory = telemetry.window()[0]
    finally:
        telemetry.close()
    assert util is not None and util > 10 and memory is not None and memory > 0


def test_peak_memory_leaves_the_warm_up_out():
    """A large buffer freed during the warm-up (as cuDNN's autotuning
    workspaces are) is not in the peak."""
    timer = StepTimer(CUDA, warmup_steps=1, gpus=[0])
    for index in timer.timed(range(3)):
        if index == 0:
            torch.empty(2 * GIB, dtype=torch.uint8, device=CUDA)  # allocated and freed at once
        small = torch.ones(1024, 1024, device=CUDA)
        timer.step_done()
    peak = peak_memory_gb([0])[0]
    # the freed buffer stays cached: reserved
    assert peak.allocated < 1.0 and peak.reserved >= peak.allocated
    del small


def test_a_memory_snapshot_of_the_first_steps(tmp_path):
    """--memory_snapshot 2: the allocator's history of the first 2 steps in the run folder, as
    pytorch.org/memory_viz reads it (torch.cuda.memory._snapshot's dict, pickled): the GPU's
    segments, and a trace of allocations and frees whose stacks reach the training step; in
    single_gpu, and in fsdp (rank 0 records; two gloo ranks on the one GPU)."""
    import pickle

    single = Launch(tmp_path, "snapshot", "single_gpu/train.py", *GPU_TINY, "--memory_snapshot",
                    "2")
    fsdp = Launch(tmp_path, "snapshot_fsdp", "fsdp/train.py", *GPU_TINY, "--memory_snapshot", "2",
                  "--nproc_per_node", "2", "--backend", "gloo", "--gpu_devices", "0", "0")
    for launch in (single, fsdp):
        output = launch.wait()
        path = launch.run_dir / "memory_snapshot.pickle"
        assert f"memory snapshot of the first 2 steps: {path}" in output, output
        assert output.count("memory snapshot of") == 1  # rank 0 alone
        snapshot = pickle.loads(path.read_bytes())
        assert snapshot["segments"] and snapshot["device_traces"][0], launch.name
        actions = {event["action"] for event in snapshot["device_traces"][0]}
        assert {"alloc", "free_completed"} <= actions, actions
        frames = {frame["filename"] for event in snapshot["device_traces"][0]
                  for frame in event.get("frames", [])}
        assert any(name.endswith("train.py") for name in frames), launch.name
