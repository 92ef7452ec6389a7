"""compare.py --verify on a GPU machine, as far as it can be shown without one: the runs it plans
(their command lines, each read by its train file's own parser, what each is for) and the tolerance
each check takes, from the flags alone, in-process. The verification itself runs, passes and fails
on purpose on the CPU in tests/test_verify_runs.py; whether the GPU tolerances hold needs GPUs."""
from __future__ import annotations

import shutil
import sys

import pytest
import torch

import compare
from comparison import train_files
from comparison.errors import UsageError
from comparison.report.outcome import Outcome
from comparison.verify_checks import BITWISE, ROUNDING
from conftest import REPO, TINY


@pytest.fixture
def gpus(monkeypatch):
    """have(count): this process believes it has `count` CUDA GPUs, so
    compare.configure resolves for them."""
    def have(count: int):
        monkeypatch.setattr(compare.torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(compare.torch.cuda, "device_count", lambda: count)
    return have


def planned(out, *argv) -> compare.Verification:
    return compare.Verification(*compare.configure(["--verify", *argv]), out)


def command_lines(verification) -> dict[str, str]:
    return {launch.name: " ".join(verification.argv(launch))
            for launch in verification.launches.values()}


def read_as_run(verification, name: str):
    """The command line of the launch `name`, its flags after the script as the run's train file's
    own parser reads them."""
    launch = next(launch for launch in verification.launches.values() if launch.name == name)
    argv = verification.argv(launch)
    script = argv.index(str(train_files.script(launch.run.mode)))
    return train_files.parse(launch.run.mode, argv[script + 1:])


def test_on_four_gpus_the_modes_run_on_gpu_0_and_dist_parallel_and_fsdp_on_all_four(gpus, tmp_path):
    """The default on 4 GPUs, SyncBatchNorm asked for too: the runs of each backend (NCCL, then
    Gloo), the one-device runs of single_gpu and data_parallel shared by both; for dist_parallel and
    then fsdp, each mode's checkpoint evaluated by 1 and 2 processes (4 is the run's own
    evaluation); each mode's second half continuing the other's first half (fsdp without
    resharding); SyncBatchNorm on 4; pipeline_parallel on 4, a stage a GPU and 4 micro-batches a
    step, under torchrun. Synthetic data, 24 steps of the full model's global batch 128, one epoch.
    Each command line is read by its train file's own parser as the run will read it."""
    gpus(4)
    verification = planned(tmp_path, "--sync_bn", "off", "on")
    lines = command_lines(verification)
    per_backend = ["{}-dist_parallel-1gpu-{}-train", "{}-dist_parallel-4gpu-{}-train",
                   "{}-dist_parallel-4gpu-{}-first_half", "{}-single_gpu-1gpu-evaluate",
                   "{}-dist_parallel-2gpu-{}-evaluate", "{}-fsdp-1gpu-{}-train",
                   "{}-fsdp-4gpu-{}-train", "{}-fsdp-4gpu-{}-first_half",
                   "{}-single_gpu-1gpu-evaluate", "{}-fsdp-2gpu-{}-evaluate",
                   "{}-dist_parallel-4gpu-{}-syncbn-train",
                   "{}-dist_parallel-4gpu-{}-resumed_from_fsdp",
                   "{}-fsdp-4gpu-{}-zero2-resumed_from_dist_parallel",
                   "{}-pipeline_parallel-4gpu-{}-train"]
    expected = ["01-single_gpu-1gpu-train", "02-data_parallel-1gpu-train"]
    for backend in ("nccl", "gloo"):
        for name in per_backend:
            expected.append(name.format(f"{len(expected) + 1:02d}", backend))
    assert list(lines) == expected
    assert (verification.steps == 24 and verification.epochs == 1
            and verification.processes == 4)
    for name in ("01-single_gpu-1gpu-train", "02-data_parallel-1gpu-train"):
        assert " --dataset synthetic " in lines[name] and " --max_steps 24 " in lines[name]
        assert lines[name].endswith(" --gpu_devices 0")
        args = read_as_run(verification, name)
        assert (args.gpu_devices, args.max_steps, args.epochs) == ([0], 24, 1)
    torchrun = f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node 4 "
    assert lines["04-dist_parallel-4gpu-nccl-train"].startswith(torchrun)
    assert " --backend nccl" in lines["04-dist_parallel-4gpu-nccl-train"]
    self_launch = f"{sys.executable} {REPO / 'dist_parallel' / 'train.py'} "
    assert lines["05-dist_parallel-4gpu-nccl-first_half"].startswith(self_launch)
    assert lines["05-dist_parallel-4gpu-nccl-first_half"].endswith(
        "--max_steps 12 --nproc_per_node 4")
    assert read_as_run(verification, "05-dist_parallel-4gpu-nccl-first_half").max_steps == 12
    assert lines["14-dist_parallel-4gpu-nccl-resumed_from_fsdp"].startswith(self_launch)
    assert lines["14-dist_parallel-4gpu-nccl-resumed_from_fsdp"].endswith(
        "--run_name 10-fsdp-4gpu-nccl-first_half --resume auto --nproc_per_node 4")
    resumed = read_as_run(verification, "15-fsdp-4gpu-nccl-zero2-resumed_from_dist_parallel")
    assert (resumed.run_name, resumed.resume, resumed.reshard_after_forward,
            resumed.nproc_per_node) == ("05-dist_parallel-4gpu-nccl-first_half", "auto", False, 4)
    checkpoint = tmp_path / "runs" / "04-dist_parallel-4gpu-nccl-train" / "checkpoint.pt"
    assert lines["06-single_gpu-1gpu-evaluate"].endswith(
        f"--gpu_devices 0 --evaluate {checkpoint}")
    assert lines["07-dist_parallel-2gpu-nccl-evaluate"].endswith(f"--evaluate {checkpoint}")
    assert read_as_run(verification, "13-dist_parallel-4gpu-nccl-syncbn-train").sync_bn
    pipeline = read_as_run(verification, "16-pipeline_parallel-4gpu-nccl-train")
    assert lines["16-pipeline_parallel-4gpu-nccl-train"].startswith(torchrun)
    assert (pipeline.microbatches, pipeline.backend, pipeline.max_steps) == (4, "nccl", 24)
    assert verification.settings[0].pipeline.name == "16-pipeline_parallel-4gpu-nccl-train"


def test_the_tolerances_follow_determinism_precision_and_the_ranks(gpus, tmp_path):
    """On GPUs the runs may take other kernels: check 1 is bitwise only with --deterministic, and
    rounding's tolerance follows the compute dtype (bf16 autocast by default, TF32 with --amp
    off). Checks 2 and 5, whose runs differ in the order the all-reduce adds the ranks' gradients,
    are bitwise with two ranks only; check 6 (the pipeline against DDP) too, and only where DDP's
    images are laid out as the pipeline's."""
    gpus(4)
    default = planned(tmp_path, "--gpu_counts", "2")
    setting = default.settings[0]
    assert not default.exact() and default.rounding(setting) is ROUNDING["half"]
    assert default.all_reduce_order(setting) is ROUNDING["half"]
    fp32 = planned(tmp_path, "--amp", "off", "--backends", "nccl")
    assert fp32.rounding(fp32.settings[0]) is ROUNDING["off"]
    two = planned(tmp_path, "--deterministic", "--backends", "nccl", "--gpu_counts", "2")
    assert two.exact() and two.all_reduce_order(two.settings[0]) is BITWISE
    assert " --deterministic " in command_lines(two)["01-single_gpu-1gpu-train"]
    four = planned(tmp_path, "--deterministic", "--backends", "nccl")
    assert four.exact() and four.all_reduce_order(four.settings[0]) is ROUNDING["half"]
    # check 6: DDP lays its images out channels_last on GPUs unless told not to, the pipeline
    # never: bitwise only with two GPUs, --deterministic and --no-channels_last
    assert default.pipeline_order(setting) is ROUNDING["half"]
    assert two.pipeline_order(two.settings[0]) is ROUNDING["half"]
    contiguous = planned(tmp_path, "--deterministic", "--no-channels_last", "--backends", "nccl",
                         "--gpu_counts", "2")
    assert contiguous.pipeline_order(contiguous.settings[0]) is BITWISE
    contiguous_four = planned(tmp_path, "--deterministic", "--no-channels_last", "--amp", "off",
                              "--backends", "nccl")
    assert contiguous_four.pipeline_order(contiguous_four.settings[0]) is ROUNDING["off"]
    assert not planned(tmp_path, "--deterministic", "--compile", "--backends", "nccl").exact()


def test_on_one_gpu_the_one_process_run_is_the_run_checks_2_to_5_start_from(gpus, tmp_path):
    """N = 1: the one-process dist_parallel and fsdp runs are planned once each; nothing to evaluate
    with 2 processes, no ranks to differ, and SyncBatchNorm says it needs two GPUs; no pipeline of
    one stage."""
    gpus(1)
    verification = planned(tmp_path, "--backends", "nccl", "--sync_bn", "on")
    setting = verification.settings[0]
    for mode in ("dist_parallel", "fsdp"):
        group = setting.groups[mode]
        assert group.trained is setting.one_device[mode] and list(group.evaluations) == [1]
        assert verification.ranks_in_sync(setting, mode, {}).verdict == "not run"
    assert len(verification.launches) == 10
    sync_bn = verification.sync_batchnorm(setting, {})
    assert sync_bn.verdict == "not run" and "two or more GPUs" in sync_bn.why
    pipeline = verification.pipeline_trains_ddp(setting, {})
    assert pipeline.verdict == "not run" and pipeline.why.startswith("N is 1: a pipeline needs")
    assert "pipeline_parallel" not in verification.modes  # --verify's default on one GPU


def test_any_model_is_verified_with_the_same_runs_and_verify_md_names_it(tmp_path):
    """--model resnet18 --image_size 32 on this CPU: the runs PyramidNet's verification plans,
    each given the model's flags, and verify.md titled with the model; but the pipeline's, which
    cuts only PyramidNet or an nn.Sequential into stages: its row says so. The runs themselves are
    PyramidNet's in tests/test_verify_runs.py: with a torchvision model they take minutes on 2
    cores (run by hand: `python compare.py --verify --model resnet18 --image_size 32
    --max_steps 4`, every check passes)."""
    default = planned(tmp_path / "pyramidnet")
    verification = planned(tmp_path, "--model", "resnet18", "--image_size", "32")
    lines = command_lines(verification)
    assert list(lines) == [name for name in command_lines(default) if "pipeline" not in name]
    assert default.settings[0].pipeline is not None
    row = verification.pipeline_trains_ddp(verification.settings[0], {})
    assert row.verdict == "not run" and "--model resnet18 is neither" in row.why
    assert all(" --model resnet18 " in line and " --image_size 32 " in line
               for line in lines.values())
    verification.write([], {}, ["--verify", "--model", "resnet18"], "CPU", 1.0)
    assert (tmp_path / "verify.md").read_text().startswith("# Verification: resnet18 — CPU")


def sgd_forms(*flags) -> dict[str, tuple]:
    """Each mode's SGD as its train.py builds it (its own get_args, get_model and get_optimizer)
    for a GPU: the model built on the CPU (fsdp's, dist_parallel's and pipeline_parallel's in a
    one-rank gloo group, the pipeline's one stage the whole model), the device said to be CUDA,
    which is what the choice of form reads. {mode: (fused, foreach)}."""
    import torch
    import torch.distributed as dist

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    forms = {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for mode in train_files.MODES:
            module = train_files.train_file(mode)
            args = module.get_args([*train_files.without(TINY, "loader"), *flags])
            args.image_size, args.amp, args.channels_last = 32, "off", False  # as setup leaves them
            mesh = ()
            if mode == "pipeline_parallel":  # as setup and data_defaults leave it: one stage here
                args.microbatches, args.stages = 2, 1
                mesh = (module.init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "pp")),)
            # the pipeline's: its schedule and stage first
            built = module.get_model(args, 10, cpu, *mesh)
            raw_model = built[2] if mode == "pipeline_parallel" else built[1]
            optimizer, _, _ = module.get_optimizer(args, raw_model, cuda, steps_per_epoch=8)
            forms[mode] = (optimizer.defaults["fused"], optimizer.defaults["foreach"])
    finally:
        dist.destroy_process_group()
    return forms


def test_under_deterministic_every_mode_takes_the_same_sgd_form_on_gpus():
    """On CUDA fused SGD keeps momentum, Nesterov and lr in double and rounds once
    (FusedSgdKernel.cu), the for-each form rounds to fp32 after every op, and fsdp's DTensors
    take only the for-each form: with --deterministic every mode takes it, so that
    `--verify --deterministic` can hold fsdp to the other modes bit for bit on a GPU. Without it
    the fast form stays (fused where torch has it). On the CPU the two forms agree (the CPU's fused
    kernel computes in fp32), which is why only a GPU run would have shown it. (fused None,
    foreach None: torch's default, the for-each form for tensors on a GPU.)"""
    fused, foreach = (True, None), (None, None)
    assert sgd_forms() == {"single_gpu": fused, "data_parallel": fused, "dist_parallel": fused,
                           "fsdp": foreach, "pipeline_parallel": fused}
    assert set(sgd_forms("--deterministic").values()) == {foreach}


@pytest.mark.parametrize("modes", [(), ("--modes", "dist_parallel", "pipeline_parallel")])
@pytest.mark.parametrize("flags, refusal", [
    (["--channels_last"], "--channels_last: activations cross between stages contiguous only"),
    (["--compile"], "--compile: not for a pipeline's stages"),
    (["--amp", "fp16"], "--amp fp16: no loss scale the stages share"),
])
def test_check_6_is_not_run_under_a_flag_the_pipeline_refuses(gpus, tmp_path, modes, flags,
                                                               refusal):
    """--compile, --channels_last and --amp fp16, which pipeline_parallel/train.py refuses: its
    run is not planned and its row says why in the pipeline's own words, whether --modes named
    it or not; dist_parallel's runs and checks are planned all the same."""
    gpus(2)
    verification = planned(tmp_path, "--backends", "nccl", *modes, *flags)
    setting = verification.settings[0]
    assert "dist_parallel" in setting.groups and setting.pipeline is None
    assert all(launch.run.mode != "pipeline_parallel" for launch in verification.launches.values())
    row = verification.pipeline_trains_ddp(setting, {})
    assert row.verdict == "not run"
    assert row.why.startswith("pipeline_parallel/train.py refuses these flags: " + refusal), row.why


def test_check_6_needs_dist_parallel_and_is_no_check_alone(gpus, tmp_path):
    """Without dist_parallel in --modes the pipeline has nothing to be held to: its run is not
    planned and its row says why; with no other check left, --verify is refused in one line
    that says what each check needs."""
    gpus(2)
    verification = planned(tmp_path, "--modes", "fsdp", "pipeline_parallel")
    assert all(launch.run.mode == "fsdp" or launch.run.mode == "single_gpu"
               for launch in verification.launches.values())
    row = verification.pipeline_trains_ddp(verification.settings[0], {})
    assert row.verdict == "not run" and row.why.startswith("--modes leaves out dist_parallel")
    for modes in (["pipeline_parallel"], ["single_gpu", "pipeline_parallel"]):
        with pytest.raises(UsageError, match=f"--verify --modes {' '.join(modes)} leaves no check "
                                             "to run: .* check 6 dist_parallel and "
                                             "pipeline_parallel"):
            planned(tmp_path, "--modes", *modes)


def fake_checkpoint(run_dir, weight: float, momentum: float, mean: float, updates: int):
    """A checkpoint.pt in every mode's format, of a model of one convolution and one BatchNorm."""
    run_dir.mkdir(parents=True)
    model = {"conv.weight": torch.full((2, 1, 1, 1), weight), "bn.weight": torch.ones(2),
             "bn.bias": torch.zeros(2), "bn.running_mean": torch.full((2,), mean),
             "bn.running_var": torch.ones(2), "bn.num_batches_tracked": torch.tensor(updates)}
    state = {index: {"momentum_buffer": torch.full_like(model[name], momentum)}
             for index, name in enumerate(("conv.weight", "bn.weight", "bn.bias"))}
    torch.save({"model": model, "optimizer": {"state": state, "param_groups": []}},
               run_dir / "checkpoint.pt")


def test_check_6_holds_weights_and_momentum_and_shows_the_batchnorm_statistics(monkeypatch,
                                                                             tmp_path):
    """Check 6 judged on made-up checkpoints of DDP's 2-process run and the pipeline's, on the CPU
    (bitwise): the same weights and momentum pass, with the BatchNorm statistics' difference and
    each run's count of updates in the row; a weight one float32 ulp off fails, and so does a
    momentum buffer; runs under different --amp are not compared."""
    monkeypatch.setattr(compare.torch.cuda, "is_available", lambda: False)
    verification = planned(tmp_path)
    setting = verification.settings[0]
    runs = {"ddp": setting.groups["dist_parallel"].trained, "pipe": setting.pipeline}
    outcomes = {launch.name: Outcome(launch.run, "ok", results={"config": {"amp": "off"}})
                for launch in runs.values()}

    def judged(pipe_weight=0.5, pipe_momentum=0.25):
        """The row, DDP's checkpoint as made here, the pipeline's with this weight and momentum,
        its BatchNorm's running mean off by 0.25 and updated twice as often."""
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
        fake_checkpoint(tmp_path / "runs" / runs["ddp"].run_dir, 0.5, 0.25, 0.5, 4)
        fake_checkpoint(tmp_path / "runs" / runs["pipe"].run_dir, pipe_weight, pipe_momentum,
                        0.75, 8)
        return verification.pipeline_trains_ddp(setting, outcomes)

    row = judged()
    assert (row.verdict, row.tolerance) == ("pass", BITWISE.text), row
    assert row.figures["max_abs_difference"] == 0
    assert row.figures["batchnorm_statistics_max_abs_difference"] == 0.25
    assert row.figures["batchnorm_updates"] == {"pipeline_parallel": [8], "dist_parallel": [4]}
    assert ("differ by up to 0.25, as each BatchNorm was updated 8 times in the pipeline "
            "(once a micro-batch) and 4 in DDP") in row.measured
    one_ulp = torch.nextafter(torch.tensor(0.5), torch.tensor(1.0)).item()
    row = judged(pipe_weight=one_ulp)
    assert row.verdict == "FAIL" and row.figures["max_abs_difference"] == one_ulp - 0.5
    assert judged(pipe_momentum=0.3).verdict == "FAIL"
    outcomes[runs["pipe"].name].results["config"]["amp"] = "bf16"
    row = judged()
    assert row.verdict == "not run" and "the pipeline under bf16" in row.why
