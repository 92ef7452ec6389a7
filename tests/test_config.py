"""Each train.py's config (`get_args`: argparse with type=/choices= and a few checks between
flags), its optimizer and the rate's schedule (`get_optimizer`), its evaluation (`evaluate`) and the
weights --evaluate takes: the same flag means the same thing in every mode, and every value
outside a flag's domain is refused in one line naming the flag."""
from __future__ import annotations

import argparse
import re

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import runkit
from conftest import MODES, REPO, train_file

CPU = torch.device("cpu")
PARALLEL = ("dist_parallel", "fsdp")
DEFAULTS = {mode: vars(train_file(mode).get_args([])) for mode in MODES}


def parse(mode: str, *argv: str) -> argparse.Namespace:
    return train_file(mode).get_args([str(arg) for arg in argv])


def modes_with(flag: str) -> list[str]:
    return [mode for mode in MODES if flag in DEFAULTS[mode]]


# What the pipeline's stages cannot do in this version and every other mode can: its get_args
# refuses each in one line that says why (a value asked of every mode is asked of it there)
PIPELINE_REFUSES = {
    "--compile": "--compile: not for a pipeline's stages in this version; leave it out",
    "--channels_last": "--channels_last: activations cross between stages contiguous only, in "
                       "this version; leave it out",
    "--amp fp16": "--amp fp16: no loss scale the stages share yet (each would skip its own "
                  "overflows): give --amp bf16 or off"}


def refused_by_design(mode: str, argv) -> str | None:
    """The pipeline's refusal of `argv` where it refuses what the other modes take, else None."""
    line = f" {' '.join(map(str, argv))} "
    return next((why for given, why in PIPELINE_REFUSES.items() if f" {given} " in line
                 and mode == "pipeline_parallel"), None)


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("mode", MODES)
def test_the_defaults_are_the_seeds(mode):
    """The seed's hyper-parameters; what a run resolves from its machine and data stays None
    (--batch_size 128, or a small folder's; --amp, --channels_last, --flip, --num_workers)."""
    args = DEFAULTS[mode]
    assert {name: args[name] for name in ("batch_size", "lr", "momentum", "weight_decay",
                                          "nesterov", "epochs", "max_steps", "lr_warmup_epochs")} \
        == {"batch_size": None, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
            "nesterov": True, "epochs": 300, "max_steps": 0, "lr_warmup_epochs": 5.0}
    assert (args["model"], args["depth"], args["alpha"], args["block"]) == \
        ("pyramidnet", 110, 270.0, "basic")
    assert (args["dataset"], args["synthetic_size"], args["num_workers"], args["image_size"]) == \
        ("cifar10", 50_000, None, None)
    assert (args["shuffle"], args["augment"], args["flip"], args["amp"],
            args["channels_last"]) == (True, "auto", None, None, None)
    assert (args["save_model"], args["overwrite"], args["evaluate"], args["run_name"],
            args["gpu_devices"], args["resume"]) == (False, False, None, None, None, None)
    assert (args["log_interval"], args["warmup_steps"], args["seed"], args["deterministic"]) == \
        (50, 10, 0, False)
    assert args["data_dir"] == str(REPO / "data") and args["log_dir"] == str(REPO / "runs")


def test_a_flag_means_the_same_in_every_mode():
    """Every single_gpu flag is in every mode, with its default; the process group's flags are
    dist_parallel's, fsdp's and pipeline_parallel's, DDP's own, FSDP's own and the pipeline's
    own (its schedule, its micro-batches, its stages) each in its file."""
    shared = DEFAULTS["single_gpu"]
    for mode in MODES:
        assert {name: DEFAULTS[mode][name] for name in shared} == shared, mode
    group = {"backend", "dist_timeout", "nproc_per_node", "max_restarts"}
    assert set(DEFAULTS["data_parallel"]) == set(shared)
    assert set(DEFAULTS["dist_parallel"]) == set(shared) | group | {"sync_bn", "bucket_cap_mb"}
    assert set(DEFAULTS["fsdp"]) == set(shared) | group | {"reshard_after_forward"}
    assert set(DEFAULTS["pipeline_parallel"]) == set(shared) | group | {"schedule",
                                                                         "microbatches", "stages"}


@pytest.mark.parametrize("mode", MODES)
def test_switches_and_their_one_form(mode):
    """(--compile and --channels_last: the pipeline refuses them, tested below.)"""
    compiled = [] if refused_by_design(mode, ["--compile"]) else ["--compile"]
    args = parse(mode, "--no_nesterov", "--no_shuffle", "--save_model", "--overwrite",
                 "--deterministic", *compiled, "--benchmark")
    assert (args.nesterov, args.shuffle, args.save_model, args.overwrite, args.deterministic,
            args.compile, args.benchmark) == (False, False, True, True, True, bool(compiled), True)
    for flag, name in (("flip", "flip"), ("channels_last", "channels_last")):
        if not refused_by_design(mode, [f"--{flag}"]):
            assert getattr(parse(mode, f"--{flag}"), name) is True
        assert getattr(parse(mode, f"--no-{flag}"), name) is False
    for wrong in ("--nesterov", "--shuffle", "--no_save_model", "--no_overwrite"):
        with pytest.raises(runkit.UsageError, match="unrecognized arguments"):
            parse(mode, wrong)


@pytest.mark.parametrize("mode", MODES)
def test_typed_values(mode):
    args = parse(mode, "--gpu_devices", "0", "1", "--alpha", "48", "--depth", "20", "--lr",
                 "0.05", "--batch_size", "512", "--dataset", "synthetic", "--block", "bottleneck",
                 "--run_name", "x", "--evaluate", "model.pt", "--lr_warmup_epochs", "2.5")
    assert args.gpu_devices == [0, 1] and isinstance(args.alpha, float) and args.alpha == 48
    assert isinstance(args.depth, int) and args.depth == 20
    assert (args.lr, args.batch_size, args.dataset, args.block) == \
        (0.05, 512, "synthetic", "bottleneck")
    assert (args.run_name, args.evaluate, args.lr_warmup_epochs) == ("x", "model.pt", 2.5)


# Each flag's domain at its edges: flag -> (values accepted, values refused). A value is the flag's
# argument, a tuple of them (nargs), or, starting with "--", a whole command line (a switch, or a
# value with the flags it needs). Every mode that has the flag is asked.
DOMAINS = {
    "batch_size": (["1"], ["0", "-3", "1.5", "many"]),
    "epochs": (["0"], ["-1"]),
    "max_steps": (["0", str(2**63 - 1)], ["-1"]),
    "lr": (["1e-37"], ["0", "-0.1", "nan", "inf", "--lr=-inf"]),
    "lr_warmup_epochs": (["0", "1e9"], ["-1", "nan", "inf"]),
    "momentum": (["0", "0.999"], ["1", "-0.1", "nan"]),
    "weight_decay": (["0", "10"], ["--weight_decay=-1e-4", "nan", "inf"]),
    "model": (["pyramidnet", "resnet18", "vit_b_16"], ["", "resnt18", "fasterrcnn_resnet50_fpn"]),
    "depth": (["8"], ["0", "-4"]),  # 6n+2 / 9n+2: the model's own refusal (test_bad_input.py)
    "alpha": (["1e-3"], ["0", "-5", "nan", "inf"]),
    "block": (["bottleneck"], ["wide"]),
    "dataset": (["synthetic", "mnist", "imagefolder"], ["imagenet"]),
    "image_size": (["8", "224", "4096"], ["7", "0", "4097"]),
    "synthetic_size": (["5"], ["4", "0"]),
    "num_workers": (["0"], ["-1"]),
    "augment": (["auto", "pad", "resized", "off"], ["crop", "True"]),
    "flip": (["--flip", "--no-flip"], ["--augment off --flip"]),
    "amp": (["bf16", "fp16", "off"], ["fp8"]),
    "compile_mode": (["--compile --compile_mode max-autotune", "--compile_mode default"],
                     ["fast", "--compile_mode max-autotune"]),  # without --compile: ignored
    "benchmark_steps": (["1"], ["0"]),
    "gpu_devices": ([("0", "1")], [("-1",), ("0", "-1")]),
    "seed": (["0", str(2**32 - 1)], ["-1", str(2**32)]),  # numpy's seeds
    "log_interval": (["1"], ["0"]),
    "warmup_steps": (["0"], ["-1"]),
    "profile_steps": (["0", "1"], ["-1"]),
    "memory_snapshot": (["0", "1"], ["-1"]),
    "checkpoint_interval": (["0"], ["-1"]),
    "resume": (["--resume auto --run_name r", "checkpoint.pt"],
               ["--resume auto", "--resume auto --run_name r --overwrite"]),
    "evaluate": (["model.pt"], ["--evaluate model.pt --resume c.pt",
                                "--evaluate model.pt --benchmark"]),
    "backend": (["gloo", "nccl"], ["mpi"]),
    "nproc_per_node": (["1"], ["0", "-2"]),
    "dist_timeout": (["1e-3", "1e9"], ["0", "-5", "nan", "inf"]),
    "max_restarts": (["0"], ["--max_restarts=-1"]),
    "bucket_cap_mb": (["1e-3"], ["0", "nan", "inf"]),
    "schedule": (["gpipe", "1f1b"], ["GPipe", "zb"]),
    "microbatches": (["1"], ["0", "-2"]),  # more than the batch, fewer than the stages: later
    "stages": (["2"], ["1", "0"]),  # one that does not divide the processes: in setup
}


def argv_for(name: str, value) -> list[str]:
    if isinstance(value, tuple):
        return [f"--{name}", *value]
    return value.split(" ") if value.startswith("--") else [f"--{name}", value]


def cases(column: int, refused: bool = False) -> list:
    """The (mode, flag, value) of DOMAINS' column; of its first, those a mode takes (`refused`:
    those the pipeline refuses by design)."""
    return [pytest.param(mode, name, value, id=f"{mode}-{name}={ascii(value)[:30]}")
            for name, row in DOMAINS.items() for value in row[column] for mode in modes_with(name)
            if column or bool(refused_by_design(mode, argv_for(name, value))) == refused]


@pytest.mark.parametrize("mode, name, value", cases(0))
def test_edge_values_in_the_domain_are_accepted(mode, name, value):
    parse(mode, *argv_for(name, value))


@pytest.mark.parametrize("mode, name, value", cases(0, refused=True))
def test_the_pipeline_refuses_what_its_stages_cannot_do_yet(mode, name, value):
    """fp16's loss scale, compiled stages, channels-last activations: values every other mode takes
    (above), refused by the pipeline in one line that says why and what to give."""
    argv = argv_for(name, value)
    with pytest.raises(runkit.UsageError, match=f"^{re.escape(refused_by_design(mode, argv))}$"):
        parse(mode, *argv)


@pytest.mark.parametrize("flag", PIPELINE_REFUSES)
def test_each_refusal_of_the_pipeline_is_asked(flag):
    with pytest.raises(runkit.UsageError, match=f"^{re.escape(PIPELINE_REFUSES[flag])}$"):
        parse("pipeline_parallel", *flag.split())


@pytest.mark.parametrize("mode, name, value", cases(1))
def test_values_outside_the_domain_are_refused_in_one_line(mode, name, value):
    """A UsageError (one line, exit status 2 under one_line_errors) that names the flag and the
    value."""
    with pytest.raises(runkit.UsageError) as error:
        parse(mode, *argv_for(name, value))
    message = str(error.value)
    assert "\n" not in message and f"--{name}" in message, message
    single = value[-1] if isinstance(value, tuple) else value
    assert single.startswith("--") or f"'{single}'" in message or single in message, message


def test_the_table_holds_every_flag_with_a_value():
    """A flag added with a type or choices but without its row here fails this test."""
    switches = {"nesterov", "shuffle", "channels_last", "compile", "benchmark", "deterministic",
                "overwrite", "save_model", "sync_bn", "reshard_after_forward"}
    texts = {"data_dir", "log_dir", "run_name"}  # any path or name: the file system's to refuse
    every = {name for args in DEFAULTS.values() for name in args}
    assert every - switches - texts == set(DOMAINS)


@pytest.mark.parametrize("mode", MODES)
def test_a_value_that_starts_with_a_minus_says_how_to_give_it(mode):
    """argparse reads -1e-4 as a flag, not a value: the line says to give it after =."""
    with pytest.raises(runkit.UsageError, match=r"expected one argument .*--lr=-1 for one that "
                                                r"starts with -"):
        parse(mode, "--weight_decay", "-1e-4")
    assert parse(mode, "--weight_decay=-0").weight_decay == 0


@pytest.mark.parametrize("mode", MODES)
def test_help_shows_every_flag_with_its_default(mode, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(mode, "--help")
    text = capsys.readouterr().out
    assert exit_.value.code == 0 and "(default: 0.1)" in text and "(default: 128)" in text
    for name in DEFAULTS[mode]:
        assert f"--{name}" in text or f"--no_{name}" in text, name
    assert train_file(mode).__doc__.splitlines()[0] in text  # the commands, as written


@pytest.mark.parametrize("mode", MODES)
def test_a_benchmark_is_its_steps_on_the_same_images_every_step(mode):
    """--benchmark: warm-up + timed + profiled steps, on synthetic images (or the folder's)."""
    args = parse(mode, "--benchmark")
    assert (args.max_steps, args.dataset) == (10 + 100, "synthetic")
    args = parse(mode, "--benchmark", "--warmup_steps", "2", "--benchmark_steps", "6",
                 "--profile_steps", "3", "--dataset", "imagefolder")
    assert (args.max_steps, args.dataset) == (11, "imagefolder")
    assert parse(mode, "--max_steps", "24").dataset == "cifar10"


def test_single_gpu_refuses_several_gpus():
    with pytest.raises(runkit.UsageError, match="single_gpu trains on one GPU: for several, use "
                                                "data_parallel/train.py or dist_parallel"):
        train_file("single_gpu").setup(parse("single_gpu", "--gpu_devices", "0", "1"))


# -------------------------------------------------------------------------------------------- optim
def optimizer_of(mode: str, model: torch.nn.Module, *flags, steps_per_epoch: int = 10,
                 device: torch.device = CPU):
    """(optimizer, scheduler) as `mode`'s get_optimizer makes them for `flags`."""
    args = parse(mode, "--batch_size", "128", *flags)
    optimizer, scheduler, _ = train_file(mode).get_optimizer(args, model, device, steps_per_epoch)
    return optimizer, scheduler


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch, lr", [(128, 0.1), (512, 0.4), (32, 0.025)])
def test_the_rate_follows_the_global_batch(mode, batch, lr):
    optimizer, _ = optimizer_of(mode, torch.nn.Linear(2, 2), "--batch_size", batch)
    group = optimizer.param_groups[0]
    assert isinstance(optimizer, torch.optim.SGD) and group["initial_lr"] == pytest.approx(lr)
    assert (group["momentum"], group["weight_decay"], group["nesterov"]) == (0.9, 1e-4, True)
    optimizer, _ = optimizer_of(mode, torch.nn.Linear(2, 2), "--no_nesterov")
    assert optimizer.param_groups[0]["nesterov"] is False


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flags, steps_per_epoch, warmup", [
    (["--epochs", "10"], 20, 20),  # capped at a tenth of the 200 steps
    (["--epochs", "300"], 10, 50),  # 5 epochs
    (["--epochs", "300", "--lr_warmup_epochs", "2.5"], 10, 25),
    (["--epochs", "100", "--lr_warmup_epochs", "0"], 10, 0),
    (["--epochs", "10", "--dataset", "imagefolder"], 4, 13),  # at least 50, at most a third
    (["--epochs", "300", "--dataset", "imagefolder", "--lr_warmup_epochs", "1"], 4, 50)])
def test_the_rate_warms_up_linearly_then_drops_at_half_and_three_quarters(mode, flags,
                                                                          steps_per_epoch, warmup):
    _, scheduler = optimizer_of(mode, torch.nn.Linear(2, 2), *flags,
                                steps_per_epoch=steps_per_epoch)
    rate = scheduler.lr_lambdas[0]
    epochs = int(flags[1])
    assert [rate(step) for step in range(warmup)] == pytest.approx(
        [(step + 1) / warmup for step in range(warmup)])
    spe = steps_per_epoch
    half, three_quarters = -(-epochs // 2), -(-3 * epochs // 4)  # the first epoch at or past
    assert rate(warmup) == rate(half * spe - 1) == 1.0
    assert rate(half * spe) == pytest.approx(0.1) and rate(three_quarters * spe - 1) == \
        pytest.approx(0.1)
    assert rate(three_quarters * spe) == rate(epochs * spe - 1) == pytest.approx(0.01)


@pytest.mark.parametrize("mode", MODES)
def test_the_optimizer_steps_at_the_schedules_rate_and_resumes_on_it(mode):
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = optimizer_of(mode, model, "--batch_size", "512", "--epochs", "8",
                                        "--lr_warmup_epochs", "1", steps_per_epoch=5)
    seen = []
    for step in range(8 * 5):
        seen.append(optimizer.param_groups[0]["lr"])  # the rate optimizer.step() uses
        optimizer.step()
        scheduler.step()
        if step == 12:
            state = scheduler.state_dict()
    rate = scheduler.lr_lambdas[0]
    assert seen == pytest.approx([0.4 * rate(step) for step in range(40)])
    assert seen[0] == pytest.approx(0.4 / 4) and seen[-1] == pytest.approx(0.004)
    second, resumed = optimizer_of(mode, torch.nn.Linear(2, 2), "--batch_size", "512", "--epochs",
                                   "8", "--lr_warmup_epochs", "1", steps_per_epoch=5)
    resumed.load_state_dict(state)
    assert resumed.last_epoch == 13
    second.step()
    resumed.step()
    assert second.param_groups[0]["lr"] == pytest.approx(seen[14])


@pytest.mark.parametrize("mode, device", [("single_gpu", "cpu"), ("single_gpu", "cuda"),
                                          ("data_parallel", "cuda"), ("dist_parallel", "cuda"),
                                          ("fsdp", "cuda")])
def test_a_first_step_the_grad_scaler_skips_leaves_sgd_as_if_it_had_not_happened(mode, device):
    """fp16: the first step overflows, the GradScaler skips it, the next one counts. The optimizer
    must then be exactly where plain SGD that never saw the skipped step is. Fused SGD (a GPU's:
    "cuda", here on CPU tensors) left to itself would create its momentum buffers uninitialised at
    the skipped step and build on them."""
    def trained(make, skip_first: bool):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 8)
        optimizer = make(model)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
        for poison in ([True] if skip_first else []) + [False, False]:
            loss = model(torch.ones(4, 64)).square().mean() * (float("inf") if poison else 1.0)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return model.weight.detach(), optimizer

    reference, _ = trained(lambda model: torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True), False)
    weight, optimizer = trained(lambda model: optimizer_of(
        mode, model, "--lr_warmup_epochs", "0", "--epochs", "10",
        device=torch.device(device))[0], True)
    fused = device == "cuda" and mode != "fsdp"  # FSDP2's DTensors: the for-each form
    assert optimizer.param_groups[0]["fused"] is (True if fused else None)
    torch.testing.assert_close(weight, reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_momentum_buffers_start_at_zero_in_the_parameters_layout(mode):
    model = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    optimizer, _ = optimizer_of(mode, model)
    buffer = optimizer.state[model.weight]["momentum_buffer"]
    assert not buffer.any() and buffer.stride() == model.weight.stride()


# ----------------------------------------------------------------------------------------- evaluate
def tiny_pyramidnet(alpha: float = 12, channels: int = 3, depth: int = 8,
                    block: str = "basic") -> torch.nn.Module:
    return train_file("single_gpu").PyramidNet(depth, alpha, block, 10, channels)


@pytest.mark.parametrize("mode", ["single_gpu", "data_parallel"])
def test_evaluation_counts_every_image_once_as_a_loop_one_image_at_a_time(mode):
    torch.manual_seed(0)
    model = tiny_pyramidnet().eval()
    generator = torch.Generator().manual_seed(1)
    loader = [(torch.randn(n, 3, 32, 32, generator=generator),
               torch.randint(10, (n,), generator=generator)) for n in (5, 3, 1)]
    args = SimpleNamespace(amp="off", channels_last=False)
    evaluate = train_file(mode).evaluate
    test = evaluate(args, model, loader, CPU)
    loss, correct, top5, images = 0.0, 0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            for i in range(len(y)):  # one image at a time: the batch is summed, not averaged
                logits = model(x[i:i + 1])
                loss += F.cross_entropy(logits, y[i:i + 1]).item()
                correct += int(logits.argmax(1).item() == y[i].item())
                top5 += int((logits[0] > logits[0, y[i]]).sum().item() < 5)
                images += 1
    assert test["test_images"] == images == 9
    assert test["test_loss"] == pytest.approx(loss / 9, rel=1e-5)
    assert test["test_acc"] * 9 == pytest.approx(correct) and test["test_acc_top5"] * 9 == \
        pytest.approx(top5) and correct <= top5 < 9
    shards = [evaluate(args, model, loader[:1], CPU), evaluate(args, model, loader[1:], CPU)]
    assert sum(shard["test_images"] for shard in shards) == 9
    assert sum(shard["test_acc"] * shard["test_images"] for shard in shards) == \
        pytest.approx(correct)
    assert torch.is_grad_enabled()  # evaluate left grad mode as it was


# --------------------------------------------------------------------------- --evaluate's weights
def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("wrap", ["plain", "checkpoint", "module", "checkpoint-module"])
def test_evaluate_takes_weights_as_any_mode_saved_them(tmp_path, wrap):
    torch.manual_seed(0)
    trained = tiny_pyramidnet()
    with torch.no_grad():
        next(trained.buffers()).add_(1.0)  # buffers travel too
    state = trained.state_dict()
    if "module" in wrap:  # DataParallel's or DDP's module
        state = {f"module.{k}": v for k, v in state.items()}
    if "checkpoint" in wrap:
        state = {"model": state, "progress": {"step": 3}}
    torch.save(state, tmp_path / "model.pt")
    torch.manual_seed(1)
    model = tiny_pyramidnet()
    assert not same_weights(model, trained)
    runkit.load_weights(str(tmp_path / "model.pt"), model.load_state_dict)
    assert same_weights(model, trained)


def write(path, content) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)


@pytest.mark.parametrize("content", [
    pytest.param(None, id="missing"), pytest.param(b"", id="empty"),
    pytest.param(np.random.default_rng(0).bytes(4096), id="random-bytes"),
    pytest.param([torch.zeros(3)], id="a-list"), pytest.param(torch.zeros(3), id="a-tensor"),
    pytest.param({"weight": 3}, id="a-number"), pytest.param({"model": [1, 2]}, id="model-a-list"),
    pytest.param(42, id="an-int"), pytest.param({}, id="no-weights"),
    pytest.param(SimpleNamespace(weights=torch.zeros(1)), id="a-pickled-object"),
    pytest.param(lambda: tiny_pyramidnet(depth=14).state_dict(), id="another-depth"),
    pytest.param(lambda: tiny_pyramidnet(alpha=24).state_dict(), id="another-alpha"),
    pytest.param(lambda: tiny_pyramidnet(depth=11, block="bottleneck").state_dict(),
                 id="another-block"),
    pytest.param(lambda: tiny_pyramidnet(channels=1).state_dict(), id="mnists")])
def test_evaluate_refuses_what_holds_no_weights_of_this_model_in_one_line(tmp_path, content):
    path = tmp_path / "model.pt"
    write(path, content() if callable(content) else content)
    with pytest.raises(runkit.UsageError) as error:
        runkit.load_weights(str(path), tiny_pyramidnet().load_state_dict)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and "--evaluate" in message, message


def test_evaluate_refuses_a_folder(tmp_path):
    with pytest.raises(runkit.UsageError, match=f"{tmp_path} holds no weights"):
        runkit.load_weights(str(tmp_path), tiny_pyramidnet().load_state_dict)
