"""The fast path on the CPU: --benchmark in every mode, autocast, channels_last, the FLOP
count, MFU's peak table, the compile cache and the profile. Speed itself is measured in
benchmarks (benchmarks/, BENCHMARKS.md), never in a test: the suite's own overhead against a
bare loop is benchmarks/overhead.py."""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import common.performance as performance
from common.config import Config, UsageError, parse_config
from common.data import load_datasets
from common.devices import seed_everything
from common.loaders import make_loader
from common.performance import (autocast, describe_fast_path, flops_per_image, grad_scaler, mfu,
                                peak_tflops, resolve_fast_path, speed_summary)
from common.samplers import EvalShard, ShuffleSampler
from conftest import REPO, TINY, read_results, refuse_in_process, run_script
from models import pyramidnet
from models.factory import environment_as_found

CPU = torch.device("cpu")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
BENCH = ["--benchmark", "--warmup_steps", "2", "--benchmark_steps", "6", "--log_interval", "3"]


def run_ok(script: str, run_dir: Path, *flags, env=ONE_THREAD, base=TINY):
    done = run_script(script, *base, *flags, "--log_dir", run_dir.parent, "--run_name",
                      run_dir.name, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# -------------------------------------------------------------------------------------- --benchmark
@pytest.mark.parametrize("script, flags, devices", [
    ("single_gpu/train.py", [], 1),
    ("data_parallel/train.py", [], 1),
    ("dist_parallel/train.py", ["--nproc_per_node", "2", "--bucket_cap_mb", "1"], 2),
])
def test_benchmark_writes_the_speed_figures_and_nothing_else(tmp_path, script, flags, devices):
    """Without --synthetic_size, the synthetic set holds the images the steps draw: 8 x 32, one
    epoch (not 50,000 images and their 10,000 test images)."""
    run_dir = tmp_path / "bench"
    i = TINY.index("--synthetic_size")
    done = run_ok(script, run_dir, *BENCH, "--dataset", "cifar10", "--data_dir",
                  tmp_path / "nothing", *flags, base=TINY[:i] + TINY[i + 2:])
    results = read_results(run_dir)
    summary, config = results["summary"], results["config"]
    assert config["dataset"] == "synthetic"  # no download, whatever --dataset says
    assert summary["steps"] == 8 and config["max_steps"] == 8  # 2 untimed + 6 timed
    assert config["synthetic_size"] == 8 * 32 and config["epochs"] == 1
    assert summary["images_per_sec"] > 0
    assert summary["images_per_sec_per_gpu"] == pytest.approx(summary["images_per_sec"] / devices)
    assert 0 < summary["batch_time_p50"] <= summary["batch_time_p90"]
    assert 0 <= summary["data_wait_frac"] < 1
    assert summary["flops_per_image"] == flops_per_image(parse_config(Config, TINY))
    # no GPU: no peak to divide by, no memory
    assert summary["mfu"] is None and summary["peak_mem_gb"] is None
    assert summary["peak_mem_reserved_gb"] is None and results["peak_mem_reserved_gb_per_gpu"] == {}
    assert summary["test_acc"] is None and summary["test_loss"] is None  # no evaluation
    assert not (run_dir / "model.pt").exists()
    assert "test loss" not in done.stdout
    speed = next(line for line in done.stdout.splitlines() if line.startswith("speed: "))
    assert "img/s" in speed and "GFLOP/img" in speed and "data wait" in speed


def test_benchmark_times_exactly_the_benchmark_steps(tmp_path):
    """The epochs are sized to reach warm-up + timed steps; the windows' timed
    steps add up to --benchmark_steps."""
    run_dir = tmp_path / "bench"
    run_ok("single_gpu/train.py", run_dir, "--benchmark", "--warmup_steps", "3",
           "--benchmark_steps", "13", "--synthetic_size", "128")  # 4 steps per epoch: 4 epochs
    from conftest import read_scalars

    results = read_results(run_dir)
    assert results["summary"]["steps"] == 16 and results["config"]["epochs"] == 4
    assert results["summary"]["timed_steps"] == [4, 16]  # after the 3 warm-up steps
    assert results["summary"]["profiled_steps"] is None  # no --profile_steps
    windows = read_scalars(run_dir)["time/step_s"]
    assert len(windows) == 4  # one window per epoch's end (log_interval 4)


def test_benchmark_and_evaluate_together_are_refused(tmp_path):
    done = refuse_in_process("single_gpu/train.py", *TINY, "--benchmark", "--evaluate",
                             tmp_path / "model.pt", "--log_dir", tmp_path)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "--benchmark" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------- precision
@pytest.fixture(scope="module")
def bf16_nhwc(tmp_path_factory):
    """One run with --amp bf16 and --channels_last (fp16's scaler:
    test_grad_scaler_scales_only_fp16)."""
    run_dir = tmp_path_factory.mktemp("fast_path") / "bf16_nhwc"
    return (run_dir, run_ok("single_gpu/train.py", run_dir, "--amp", "bf16", "--channels_last",
                            "--max_steps", "4"))


def test_autocast_trains_on_the_cpu(bf16_nhwc):
    run_dir, done = bf16_nhwc
    results = read_results(run_dir)
    assert results["config"]["amp"] == "bf16" and "amp bf16" in done.stdout
    assert results["summary"]["steps"] == 4
    assert torch.isfinite(torch.tensor(results["summary"]["train_loss"]))


def test_cpu_defaults_are_fp32_and_nchw():
    cfg = resolve_fast_path(parse_config(Config, []), CPU)
    assert (cfg.amp, cfg.channels_last) == ("off", False)
    forced = resolve_fast_path(parse_config(Config, ["--amp", "bf16", "--channels_last"]), CPU)
    assert (forced.amp, forced.channels_last) == ("bf16", True)
    assert parse_config(Config, ["--no_channels_last"]).channels_last is False


def test_autocast_computes_the_forward_pass_in_the_chosen_dtype():
    layer = torch.nn.Linear(4, 4)
    for amp, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16), ("off", torch.float32)]:
        with autocast(dataclasses.replace(Config(), amp=amp), CPU):
            assert layer(torch.randn(2, 4)).dtype == dtype


@pytest.mark.parametrize("amp, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_data_parallel_replicas_compute_in_the_requested_dtype(amp, dtype):
    """On several GPUs, DataParallel's parallel_apply calls each replica in a new thread under
    `torch.autocast(device, enabled=True)`, without the dtype: a fresh thread's own default (fp16 on
    CUDA, bf16 on the CPU) would win over the run's --amp. Here the replicated module is called that
    way from a fresh thread, on the CPU, whose default is bf16, so fp16 shows the defect; bf16 on
    CUDA is the same case. The saved and evaluated model stays the plain PyramidNet."""
    import threading

    import data_parallel.train as data_parallel

    cfg = dataclasses.replace(parse_config(Config, TINY), amp=amp)
    model, raw_model = data_parallel.get_model(cfg, CPU, gpus=[])
    replica, computed = model.module, []  # what DataParallel replicates onto each GPU

    def replica_thread():
        with torch.autocast("cpu", enabled=True):  # as parallel_apply enters it: on/off only
            computed.append(replica(torch.randn(2, 3, 32, 32)).dtype)

    thread = threading.Thread(target=replica_thread)
    thread.start()
    thread.join()
    assert computed == [dtype]
    # no wrapper in the saved keys
    assert set(raw_model.state_dict()) == set(pyramidnet(8, 12).state_dict())


def test_grad_scaler_scales_only_fp16():
    assert grad_scaler(dataclasses.replace(Config(), amp="fp16"), CPU).is_enabled()
    assert not grad_scaler(dataclasses.replace(Config(), amp="bf16"), CPU).is_enabled()
    assert not grad_scaler(dataclasses.replace(Config(), amp="off"), CPU).is_enabled()


def test_channels_last_reaches_the_model_and_the_batches(bf16_nhwc):
    dataset, _ = load_datasets("synthetic", "", 64, 0)
    for kind in ("gpu", "torchvision"):
        loader = make_loader(kind, dataset, ShuffleSampler(64, True, 0), 16, CPU, train=True,
                             augment=True, num_workers=0, seed=0, memory_format=torch.channels_last)
        images, _ = next(iter(loader))
        assert images.is_contiguous(memory_format=torch.channels_last), kind
        # the torchvision loader set a transform on it
        dataset, _ = load_datasets("synthetic", "", 64, 0)
    plain = make_loader("gpu", dataset, EvalShard(64), 16, CPU, train=False, augment=False,
                        num_workers=0, seed=0)
    assert next(iter(plain))[0].is_contiguous()
    run_dir, done = bf16_nhwc
    assert (read_results(run_dir)["config"]["channels_last"] is True
            and "channels_last" in done.stdout)


def test_channels_last_changes_the_layout_not_the_result():
    """The same weights and batch give the same loss in either memory format
    (up to float summation order)."""
    seed_everything(0)
    model = pyramidnet(8, 12, "basic").eval()
    images = torch.randn(4, 3, 32, 32)
    plain = model(images)
    nhwc = model.to(memory_format=torch.channels_last)(
        images.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(nhwc, plain, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------ FLOPs and MFU
def test_default_model_costs_28_3_gflop_per_training_image():
    """PyramidNet-110 alpha=270, forward + backward, counted by
    torch.utils.flop_counter: 28.3 GFLOP +- 2 %."""
    assert default_model_flops() == pytest.approx(28.3e9, rel=0.02)


@functools.cache
def default_model_flops() -> int:
    """PyramidNet-110 alpha=270's count, taken once for the tests that
    need it (about 1.5 s each time)."""
    return flops_per_image(Config())


def test_flops_follow_the_model_not_a_constant():
    small, large = (flops_per_image(dataclasses.replace(Config(), depth=d, alpha=a))
                    for d, a in [(20, 24), (56, 48)])
    assert 0 < small < large < default_model_flops()
    bottleneck = flops_per_image(dataclasses.replace(Config(), depth=272, alpha=200,
                                                     block="bottleneck"))
    assert bottleneck != default_model_flops()


def test_flop_count_is_three_forward_passes():
    """Backward costs two forward passes (gradients of inputs and of
    weights): the count is 3x a forward."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = dataclasses.replace(Config(), depth=20, alpha=24)
    with torch.device("meta"), FlopCounterMode(display=False) as counter:
        pyramidnet(cfg.depth, cfg.alpha, cfg.block)(torch.empty(1, 3, 32, 32))
    forward = counter.get_total_flops()
    assert flops_per_image(cfg) == pytest.approx(3 * forward, rel=0.01)


def fake_gpu(monkeypatch, name: str,
             uuid: str = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6") -> torch.device:
    """cuda:0 as peak_tflops sees it, with nothing touching CUDA: its
    name and its properties' UUID."""
    monkeypatch.setattr(performance.torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(performance.torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(uuid=uuid))
    return torch.device("cuda", 0)


# torch.cuda.get_device_name() as it reads on each GPU, the table entry it must
# find, and that entry's bf16 peak
@pytest.mark.parametrize("name, key, bf16", [
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100-SXM4-40GB", "A100", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),  # PCIe, but an A100: not "H100 PCIe"
    ("NVIDIA H100 80GB HBM3", "H100", 989.4),  # SXM, as this project's GPU machine reports it
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA GH200 480GB", "GH200", 989.4),  # Grace Hopper: not "H200"
    ("NVIDIA GH200 144G HBM3e", "GH200", 989.4),  # its HBM3e variant: the same GPU peaks
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2),
    ("NVIDIA GeForce RTX 3090", "RTX 3090", 71.0),
    ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA GB200", "GB200", 2500.0),  # Grace Blackwell: not "B200"
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA A10", "A10", 125.0),
    ("Tesla V100-SXM2-16GB", "V100", None),  # no bf16 on Volta
    ("Tesla V100-SXM2-32GB", "V100", None),
    ("Tesla V100-PCIE-32GB", "V100-PCIE", None),
    ("Tesla V100S-PCIE-32GB", "V100S", None),
])
def test_peak_table_matches_device_names(monkeypatch, name, key, bf16):
    device = fake_gpu(monkeypatch, name)
    assert performance.table_peaks(name) is performance.GPU_PEAK_TFLOPS[key]
    assert peak_tflops(device, "bf16") == bf16 and performance.no_peak_reason(device) is None


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 D",
                                  "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA A10G",
                                  "Tesla V100-FHHL-16GB", "NVIDIA L40"])
def test_a_card_a_shorter_name_would_match_is_not_taken_for_it(monkeypatch, name):
    """"RTX 3090" is in "RTX 3090 Ti" as whole words; the Ti, the 4090 D and the laptop 4090 have
    other peaks, as have the A10G (not NVIDIA's A10), the V100 FHHL card and the L40 (not the
    L40S)."""
    device = fake_gpu(monkeypatch, name)
    assert performance.table_peaks(name) is None and peak_tflops(device, "bf16") is None
    assert performance.no_peak_reason(device) == f"GPU not in the peak table: {name}"


def test_each_gpu_added_since_names_its_public_source():
    """B200, GB200, L4, A10 and V100: each peak with the vendor's page or datasheet it comes from,
    in the comment above the table."""
    source = Path(performance.__file__).read_text()
    sources = source[source.index("# Dense (no sparsity)"):source.index("GPU_PEAK_TFLOPS = {")]
    for gpu in ("B200", "GB200", "L4", "A10", "V100"):
        assert re.search(rf"^#   {gpu}: .*https://(www|images)\.nvidia\.com/", sources, re.M), gpu
        assert gpu in performance.GPU_PEAK_TFLOPS


@pytest.mark.parametrize("name, amp, expected", [
    ("NVIDIA H200", "fp16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "off", 156.0),  # TF32 convolutions
    ("NVIDIA H100 PCIE", "bf16", 756.5),  # the case of a name is not relied on
    ("Tesla K80", "bf16", None),  # not in the table
    ("Tesla V100-SXM2-16GB", "fp16", 125.0),  # fp16 tensor cores; fp32 math under --amp off
    ("Tesla V100-SXM2-16GB", "off", 15.7),
    ("NVIDIA L4", "off", 60.0),
    ("NVIDIA B200", "off", 1125.0),
])
def test_peak_follows_the_dtype_in_use(monkeypatch, name, amp, expected):
    assert peak_tflops(fake_gpu(monkeypatch, name), amp) == expected


@pytest.mark.parametrize("name, uuid", [
    # the name says so
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"),
    ("NVIDIA A100-SXM4-40GB", "MIG-4f2a9c1e-5d3b-5a7e-9c1d-0e2f3a4b5c6d"),  # only the UUID does
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "MIG-4f2a9c1e-5d3b-5a7e-9c1d-0e2f3a4b5c6d"),
])
def test_a_mig_slice_has_no_peak(monkeypatch, name, uuid):
    """A MIG instance has a share of the chip's SMs and memory: the whole
    chip's peak would understate MFU."""
    device = fake_gpu(monkeypatch, name, uuid)
    assert (peak_tflops(device, "bf16") is None
            and performance.no_peak_reason(device) == performance.MIG_NOTE)


def test_mfu_is_model_flops_over_peak():
    assert peak_tflops(CPU, "off") is None and mfu(100.0, 10**9, None) is None
    assert mfu(14_000.0, 28_300_000_000, 989.4) == pytest.approx(14_000 * 28.3e9 / 989.4e12)
    assert mfu(None, 10**9, 989.4) is None


def test_speed_summary_reports_compile_time_apart():
    """compile_time_s is the timer's compile clock (torch's compile callbacks:
    tests/test_compile.py), not the first step's excess; compile_wait_s the longest any rank waited
    for another's compile; None without them."""
    class Timer:
        first_step_seconds = 30.5
        compiling = SimpleNamespace(seconds=12.5, events=4)

        def percentiles(self):
            return 0.5, 0.6

    from common.metrics import Sums

    totals = Sums([0, 0, 0, 10, 5.0, 0.05])  # 10 timed steps of 0.5 s, 1 % of it waiting for data
    cfg = dataclasses.replace(parse_config(Config, TINY), compile=True, amp="off")
    summary = speed_summary(cfg, totals, Timer(), CPU, devices=2, compile_waits={0: 0.0, 1: 7.0})
    assert summary["images_per_sec"] == pytest.approx(32 / 0.5)
    assert summary["images_per_sec_per_gpu"] == pytest.approx(32 / 0.5 / 2)
    assert summary["compile_time_s"] == 12.5 and summary["first_step_s"] == 30.5
    assert summary["compile_wait_s"] == 7.0 and summary["data_wait_frac"] == pytest.approx(0.01)
    # --evaluate: compiled, but nothing to compile
    Timer.compiling = SimpleNamespace(seconds=0.0, events=0)
    assert speed_summary(cfg, totals, Timer(), CPU, 1, {0: None})["compile_time_s"] == 0.0
    Timer.compiling = None
    summary = speed_summary(dataclasses.replace(cfg, compile=False), totals, Timer(), CPU, 1)
    assert summary["compile_time_s"] is summary["compile_wait_s"] is None


def test_results_json_says_why_mfu_is_missing(monkeypatch):
    class Timer:
        first_step_seconds = 0.6

        def percentiles(self):
            return 0.5, 0.6

    from common.metrics import Sums

    totals, cfg = (Sums([0, 0, 0, 10, 5.0, 0.05]),
                   dataclasses.replace(parse_config(Config, TINY), amp="bf16"))
    cpu = speed_summary(cfg, totals, Timer(), CPU, 1)
    assert cpu["mfu"] is None and cpu["mfu_note"].startswith("CPU")
    gpu = speed_summary(cfg, totals, Timer(), fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3"), 1)
    assert (gpu["mfu"] == pytest.approx(32 / 0.5 * gpu["flops_per_image"] / 989.4e12)
            and gpu["mfu_note"] is None)
    assert set(gpu) == set(cpu)  # the same keys, whatever the device
    mig = speed_summary(cfg, totals, Timer(),
                        fake_gpu(monkeypatch, "NVIDIA A100-SXM4-40GB MIG 1g.5gb"), 1)
    assert mig["mfu"] is None and mig["mfu_note"] == performance.MIG_NOTE
    unknown = speed_summary(cfg, totals, Timer(), fake_gpu(monkeypatch, "Tesla K80"), 1)
    assert unknown["mfu"] is None and unknown["mfu_note"] == "GPU not in the peak table: Tesla K80"


# ----------------------------------------------------------------------------------------- overhead
def test_bf16_on_a_gpu_without_it_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(performance.torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: False)
    monkeypatch.setattr(performance.torch.cuda, "get_device_name",
                        lambda device=None: "Tesla V100-SXM2-16GB")
    # restored after the test
    monkeypatch.setattr(performance.torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(performance.torch, "set_float32_matmul_precision", lambda precision: None)
    cuda = torch.device("cuda", 0)
    # the default where bf16 is missing
    assert resolve_fast_path(parse_config(Config, []), cuda).amp == "fp16"
    with pytest.raises(UsageError, match="--amp fp16"):
        resolve_fast_path(parse_config(Config, ["--amp", "bf16"]), cuda)


def test_compile_wraps_the_training_model_and_reports_its_time_apart(tmp_path, monkeypatch):
    """--compile in-process with TorchDynamo's eager backend: the graph capture is real, code
    generation skipped (inductor's C++ build takes about a minute on this machine; `--compile` with
    inductor was run by hand). The compiled run trains the same weights as the eager one, and its
    first step is reported as compile time."""
    import single_gpu.train as single

    compiled_models = []
    real_compile = torch.compile

    def eager_backend_compile(model, **options):
        compiled_models.append(model)
        return real_compile(model, backend="eager", **options)

    monkeypatch.setattr(single.torch, "compile", eager_backend_compile)
    flags = [*TINY, "--max_steps", "4", "--no_augment", "--save_model", "--no_progress",
             "--log_dir", str(tmp_path)]
    single.main([*flags, "--compile", "--run_name", "compiled"])
    single.main([*flags, "--run_name", "eager"])
    assert len(compiled_models) == 1  # the compiled run only
    compiled, eager = (read_results(tmp_path / name)["summary"] for name in ("compiled", "eager"))
    assert compiled["compile_time_s"] > 0 and eager["compile_time_s"] is None
    weights = [torch.load(tmp_path / name / "model.pt", weights_only=True)
               for name in ("compiled", "eager")]
    # the unwrapped model is saved, not the compiled wrapper
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=1e-5, atol=1e-6)


def test_compile_keeps_its_caches_where_the_next_run_finds_them(tmp_path, monkeypatch):
    """--compile points inductor's caches (FX graphs, AOTAutograd, Triton) at --compile_cache, or at
    the TORCHINDUCTOR_CACHE_DIR a user set, or at <log_dir>/.compile_cache, and the first line says
    whether earlier compilations left work there (warm) or not (cold)."""
    # what the test sets is undone after it
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cfg = resolve_fast_path(parse_config(Config, [*TINY, "--compile", "--log_dir", str(tmp_path)]),
                            CPU)
    cache = tmp_path / ".compile_cache"
    assert cfg.compile_cache == str(cache) and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert "compiled (cache cold" in describe_fast_path(cfg)
    (cache / "fxgraph").mkdir(parents=True)
    # warm: with compiled graphs (tests/test_compile.py)
    assert "compiled (cache cold" in describe_fast_path(cfg)
    chosen = tmp_path / "elsewhere"
    flags = [*TINY, "--compile", "--compile_cache", str(chosen),
             "--compile_mode", "reduce-overhead"]
    cfg = resolve_fast_path(parse_config(Config, flags), CPU)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(chosen)
    assert f"compiled (reduce-overhead, cache cold: {chosen})" in describe_fast_path(cfg)
    # a folder set by hand is kept
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "the user's"))
    cfg = resolve_fast_path(parse_config(Config, [*TINY, "--compile", "--log_dir", str(tmp_path)]),
                            CPU)
    assert cfg.compile_cache == str(tmp_path / "the user's")


def test_a_torchvision_model_leaves_the_compile_cache_where_the_suite_puts_it(tmp_path):
    """--model resnet18 without TORCHINDUCTOR_CACHE_DIR: the cache is <log_dir>/.compile_cache, as
    for PyramidNet. Checking the model's name imports torchvision, which imports torch._dynamo,
    whose import set TORCHINDUCTOR_CACHE_DIR to torch's /tmp/torchinductor_<user>: the run then
    took that for the user's choice. A process of its own: the import is once per process."""
    env = {name: value for name, value in os.environ.items()
           if name != "TORCHINDUCTOR_CACHE_DIR"}  # this process imported torchvision long ago
    done = subprocess.run(
        [sys.executable, str(REPO / "single_gpu/train.py"), "--dataset", "synthetic",
         "--synthetic_size", "64", "--batch_size", "32", "--model", "resnet18", "--image_size",
         "32", "--compile", "--epochs", "0", "--log_dir", str(tmp_path), "--no_progress"],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first = next(line for line in done.stdout.splitlines() if line.startswith("single_gpu:"))
    assert f"compiled (cache cold: {tmp_path / '.compile_cache'})" in first, first


def test_environment_as_found_undoes_what_an_import_sets(monkeypatch):
    monkeypatch.setenv("SUITE_KEPT", "a")
    with environment_as_found():
        os.environ["SUITE_KEPT"], os.environ["SUITE_ADDED"] = "b", "c"
        del os.environ["SUITE_KEPT"]
    assert os.environ["SUITE_KEPT"] == "a" and "SUITE_ADDED" not in os.environ


def test_profile_tool_splits_a_step_into_categories(tmp_path):
    """On the CPU: the split, without rates (a CPU's TFLOP/s would read as a GPU's 0.0) and
    without the profiler's own lines about the GPU it does not find."""
    out = tmp_path / "profile.json"
    done = run_script("benchmarks/profile_step.py", "--depth", "8", "--alpha", "12", "--batch_size",
                      "16", "--steps", "2", "--warmup_steps", "1", "--top", "5", "--out", out,
                      env=ONE_THREAD)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # once Kineto's "ERROR: ... gpuGetDeviceCount failed"
    assert "TFLOP/s" not in done.stdout and "GB/s" not in done.stdout
    assert "no rates on the CPU" in done.stdout
    import json

    report = json.loads(out.read_text())
    assert set(report["shares"]) == {"convolution", "batchnorm", "elementwise", "other"}
    assert sum(report["shares"].values()) == pytest.approx(1.0)
    # a CNN's step is its convolutions
    assert max(report["shares"], key=report["shares"].get) == "convolution"
    assert len(report["top"]) == 5 and report["top_kernels"] == []  # kernels only on a GPU
    assert "convolution" in done.stdout and "ms of operator self time per step" in done.stdout
    passes = report["conv_passes"]  # on the CPU: forward and backward, by the input's resolution
    assert (set(passes) == {"fprop", "backward"}
            and set(passes["fprop"]) == {"32x32", "16x16", "8x8"})
    assert report["achieved"] is None and report["roofline"] is None
