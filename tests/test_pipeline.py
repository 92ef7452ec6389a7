"""pipeline_parallel/train.py, run as a user runs it: two processes under torchrun on gloo, each
holding one stage of a tiny PyramidNet, and what it must show.

- It trains and writes what every mode writes (results.json, the TensorBoard scalars, a
  checkpoint, model.pt), and its first line says where the model was cut and each stage's share
  of the work.
- Two stages, two micro-batches: the weights after 4 steps are DDP's on two processes bit for bit
  (micro-batch m holds DDP's rank m's images; each gradient is their sum / 2, which DDP's
  all-reduce makes too), and so is SGD's momentum, indexed as single_gpu's optimizer indexes it.
  The BatchNorm statistics are not: in the pipeline each BatchNorm is updated once a micro-batch,
  in turn; in DDP once a rank, each rank its own, and rank 0's are saved.
- Its evaluation counts every test image once, and single_gpu/train.py --evaluate of its
  checkpoint (the whole model's state dict, single_gpu's keys) finds the same loss and accuracy.
- Bad input, in one line: one process, --compile (in this process); a batch that does not split
  into the micro-batches, said once for two workers (second tier).
- A run cut short at step 2 (under GPipe) and resumed to step 4 (under 1F1B) ends with the
  uninterrupted run's tensors, every one: the schedule orders the work, and changes no sum
  (second tier).
- Two dimensions: 4 processes with --stages 2 are 2 stages x 2 replicas (a 2-D DeviceMesh), each
  replica its share of the batch in 2 micro-batches; their weights after 4 steps are DDP's on 4
  processes within float32 rounding, their evaluation counts each test image once over the
  replicas, single_gpu evaluates their model.pt alike, and a resumed run ends with the
  uninterrupted one's tensors (second tier: four launches of 4 processes). 3 processes do not
  split into replicas of 2 stages: one line (and once for 3 workers, second tier).

The fast tier launches two runs, the pipeline's and DDP's, side by side on the two cores, and the
first three tests read them; the second tier's launches are fixtures of their own. The pieces,
the cut, the default number of micro-batches and which images each replica's micro-batches hold
are checked in this process.
"""
from __future__ import annotations

import itertools
import random
import re
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import runkit
from conftest import (TINY, read_results, read_scalars, refuse_in_process, train_in_process,
                      two_at_a_time)
from processes import free_port, run, script, torchrun, train_file

MODE, SCRIPT = "pipeline_parallel", "pipeline_parallel/train.py"
# TINY's 8 steps an epoch, cut at 4 (and at 2 for the resume): two micro-batches of 16
STEPS = ["--max_steps", "4", "--deterministic"]
PIPELINE = [*TINY, *STEPS, "--microbatches", "2"]


def pipeline():
    return train_file(MODE)


def errors(done) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")]


def launch(logs, mode, *flags, name, processes=2):
    """`torchrun --nproc_per_node N <mode>/train.py flags`: (CompletedProcess, run folder)."""
    done = run(torchrun(processes, mode), *flags, "--log_dir", logs, "--run_name", name)
    return done, logs / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The pipeline's run and DDP's, 4 steps each, side by side."""
    logs = tmp_path_factory.mktemp("runs")
    pipe, ddp = two_at_a_time(lambda: launch(logs, MODE, *PIPELINE, "--save_model", name="pipe"),
                              lambda: launch(logs, "dist_parallel", *TINY, *STEPS, name="ddp"))
    for done, _ in (pipe, ddp):
        assert done.returncode == 0, done.stdout + done.stderr
    return {"pipe": pipe, "ddp": ddp}


@pytest.fixture(scope="module")
def second_tier_runs(tmp_path_factory):
    """The pipeline cut at step 2 and resumed, one launch after the other; beside them, a batch
    refused by the two workers of `python train.py --nproc_per_node 2`."""
    logs = tmp_path_factory.mktemp("second_tier_runs")

    def resumed():
        first = launch(logs, MODE, *PIPELINE, "--max_steps", "2", "--schedule", "gpipe",
                       name="resumed")
        return first, launch(logs, MODE, *PIPELINE, "--resume", "auto", name="resumed")

    def refused():
        return run(script(MODE), *TINY, "--nproc_per_node", "2", "--batch_size", "30",
                   "--microbatches", "4", "--log_dir", logs / "refused"), logs / "refused"

    halves, bad = two_at_a_time(resumed, refused)
    for done, _ in halves:
        assert done.returncode == 0, done.stdout + done.stderr
    return {"halves": halves, "refused": bad}


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    """On 4 processes: the pipeline of 2 stages x 2 replicas, then the same cut at step 2 (under
    GPipe) and resumed; beside them DDP's run, then 3 workers refused for --stages 2."""
    logs = tmp_path_factory.mktemp("mesh_runs")
    grid = [*PIPELINE, "--stages", "2"]

    def pipelines():
        straight = launch(logs, MODE, *grid, "--save_model", name="mesh", processes=4)
        first = launch(logs, MODE, *grid, "--max_steps", "2", "--schedule", "gpipe",
                       name="resumed", processes=4)
        return straight, first, launch(logs, MODE, *grid, "--resume", "auto", name="resumed",
                                       processes=4)

    def ddp_then_refused():
        ddp = launch(logs, "dist_parallel", *TINY, *STEPS, name="ddp", processes=4)
        return ddp, run(script(MODE), *grid, "--nproc_per_node", "3", "--log_dir",
                        logs / "refused")

    (straight, *halves), (ddp, refused) = two_at_a_time(pipelines, ddp_then_refused)
    for done, _ in (straight, *halves, ddp):
        assert done.returncode == 0, done.stdout + done.stderr
    return {"mesh": straight, "halves": halves, "ddp": ddp, "refused": (refused, logs / "refused")}


def checkpoint(run_dir):
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)


def tiny_model():
    torch.manual_seed(0)
    return pipeline().PyramidNet(8, 12)


# --------------------------------------------------------------------------- 1: it trains, it logs
def test_a_pipeline_trains_and_writes_what_every_mode_writes(runs):
    """4 steps on two stages: results.json as dist_parallel writes it (its parameters and FLOPs
    counted on the whole model before the cut), TensorBoard's scalars, a checkpoint and model.pt;
    the first line says where the model was cut and each stage's share of its FLOPs."""
    done, run_dir = runs["pipe"]
    shares = re.search(r"stages: 0: stem\.\.(\S+) \((\d+) %\), 1: (\S+)\.\.head \((\d+) %\); "
                       r"1f1b, 2 micro-batches of 16;", done.stdout)
    assert shares, done.stdout
    # the cut the stages report is the one the train file's own functions make of these pieces
    model = tiny_model()
    pieces = pipeline().model_pieces(model)
    costs = pipeline().piece_flops(pieces, torch.zeros(2, 3, 32, 32))
    cut = pipeline().balanced_cuts(costs, 2)[1]
    assert (shares[1], shares[3]) == (pieces[cut - 1][0], pieces[cut][0])
    assert int(shares[2]) == round(100 * sum(costs[:cut]) / sum(costs))
    results = read_results(run_dir)
    assert results["mode"] == MODE and results["world_size"] == 2
    assert [stage["first"] for stage in results["stages"]] == ["stem", pieces[cut][0]]
    summary = results["summary"]
    assert summary["step"] == 4 and summary["timed_steps"] == 3  # the first: warm-up, untimed
    assert summary["parameters"] == runkit.parameter_count(model)
    assert summary["flops_per_image"] == runkit.flops_per_image(model, torch.zeros(2, 3, 32, 32))
    assert results["config"]["schedule"] == "1f1b" and results["config"]["microbatches"] == 2
    scalars = read_scalars(run_dir)
    for tag in ("train/loss", "train/acc_pct", "train/lr", "time/step_s",
                "throughput/images_per_s", "test/loss", "test/acc_pct"):
        assert [step for step, _ in scalars[tag]] == [4], tag
    assert (run_dir / "checkpoint.pt").exists() and (run_dir / "model.pt").exists()


def assert_batchnorm_statistics_differ(pipe: dict, ddp: dict) -> None:
    """The running BatchNorm statistics are not DDP's, and the checkpoints say why: each stage's
    BatchNorm updated once a micro-batch (8 in 4 steps of 2), DDP's rank 0's once a step (4)."""
    norms = [name.removesuffix(".num_batches_tracked") for name in pipe["model"]
             if name.endswith(".num_batches_tracked")]
    for norm in norms:
        assert pipe["model"][f"{norm}.num_batches_tracked"] == 8
        assert ddp["model"][f"{norm}.num_batches_tracked"] == 4
        assert not torch.equal(pipe["model"][f"{norm}.running_mean"],
                               ddp["model"][f"{norm}.running_mean"]), norm


# ------------------------------------------------------------------- 2: DDP's weights, bit for bit
def test_two_stages_train_ddps_weights_bit_for_bit_but_not_its_batchnorm_statistics(runs):
    """The same seed, data, batch and steps: every parameter and SGD momentum buffer of the
    pipeline's checkpoint is DDP's, and its optimizer state dict is indexed as DDP's
    (single_gpu's) is. The BatchNorm statistics differ, and how: the pipeline updates each
    BatchNorm once a micro-batch, the two in turn (8 updates in 4 steps, their running averages
    over both micro-batches); DDP once a step on each rank, and saves rank 0's (4, over the first
    micro-batch's images alone). 8 and no more: the stages are given what crosses between them,
    so torch 2.9's own inference of it, a forward on zeros in training mode, never runs."""
    pipe, ddp = checkpoint(runs["pipe"][1]), checkpoint(runs["ddp"][1])
    assert list(pipe["model"]) == list(ddp["model"])  # single_gpu's keys, in its order
    names = [name for name, _ in tiny_model().named_parameters()]
    differ = [name for name in names if not torch.equal(pipe["model"][name], ddp["model"][name])]
    assert not differ, differ
    assert pipe["optimizer"]["param_groups"] == ddp["optimizer"]["param_groups"]
    assert list(pipe["optimizer"]["state"]) == list(range(len(names)))
    for index, state in ddp["optimizer"]["state"].items():
        assert torch.equal(pipe["optimizer"]["state"][index]["momentum_buffer"],
                           state["momentum_buffer"]), names[index]
    assert_batchnorm_statistics_differ(pipe, ddp)
    trained = [read_results(runs[name][1])["summary"] for name in ("pipe", "ddp")]
    assert trained[0]["train_acc"] == trained[1]["train_acc"]
    assert trained[0]["train_loss"] == pytest.approx(trained[1]["train_loss"], rel=1e-6)


# ------------------------------------------------------------------------------------ 3: evaluation
def test_its_evaluation_counts_every_test_image_once_as_single_gpu_finds_it(runs, tmp_path):
    """Every one of the 51 test images once, through the two stages; the checkpoint, the whole
    model's state dict with single_gpu's keys and each stage's own BatchNorm statistics, loads
    into single_gpu/train.py --evaluate, which finds the same loss and accuracy (on the same
    batches of 16: the same sums). model.pt holds the checkpoint's weights."""
    run_dir = runs["pipe"][1]
    tested = read_results(run_dir)["summary"]
    assert tested["test_images"] == 51  # TINY's 256 // 5
    done = train_in_process("single_gpu/train.py", *TINY, "--batch_size", "16", "--evaluate",
                            run_dir / "checkpoint.pt", "--log_dir", tmp_path, "--run_name", "e")
    assert done.returncode == 0, done.stderr
    evaluated = read_results(tmp_path / "e")["summary"]
    assert evaluated["test_images"] == 51
    assert evaluated["test_acc"] == tested["test_acc"]
    assert evaluated["test_loss"] == pytest.approx(tested["test_loss"], rel=1e-9)
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    model = checkpoint(run_dir)["model"]
    assert list(weights) == list(model)
    assert all(torch.equal(weights[key], model[key]) for key in model)


# ---------------------------------------------------------------------------------------- 4: resume
@pytest.mark.second_tier  # two launches, one after the other
def test_a_run_resumed_mid_epoch_ends_with_the_uninterrupted_runs_tensors(runs, second_tier_runs):
    """Stopped at step 2 of 8 (--max_steps 2, under GPipe), continued to step 4 (under 1F1B):
    each rank takes its stage's weights, SGD state and random generators back, and the run ends
    with every tensor of the uninterrupted run, BatchNorm statistics too."""
    (first, _), (second, run_dir) = second_tier_runs["halves"]
    assert "gpipe, 2 micro-batches" in first.stdout, first.stdout
    assert "resumed at step 2" in second.stdout, second.stdout
    resumed, straight = checkpoint(run_dir), checkpoint(runs["pipe"][1])
    assert resumed["progress"]["step"] == straight["progress"]["step"] == 4
    assert resumed["progress"]["batch"] == straight["progress"]["batch"] == 4
    differ = [key for key in straight["model"]
              if not torch.equal(resumed["model"][key], straight["model"][key])]
    assert not differ, differ
    for index, state in straight["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"],
                           state["momentum_buffer"])


# ------------------------------------------------------------------------------------- 5: bad input
@pytest.mark.second_tier  # a launch of two workers of its own
def test_a_batch_the_micro_batches_do_not_split_is_refused_once_for_every_worker(
        second_tier_runs):
    """Said once for the two workers (each refuses it, after the group formed), no run folder."""
    done, logs = second_tier_runs["refused"]
    assert done.returncode != 0 and errors(done) == [
        "error: --batch_size 30 does not split into 4 micro-batches: give a multiple of 4"], (
        done.stdout + done.stderr)
    assert not logs.exists()


def test_bad_input_is_refused_in_one_line(monkeypatch, tmp_path):
    """One process (a pipeline of one stage), --compile: one line each, no run folder made."""
    done = refuse_in_process(SCRIPT, *TINY, "--compile", "--log_dir", tmp_path)
    assert done.returncode == 2 and errors(done) == [
        "error: --compile: not for a pipeline's stages in this version; leave it out"], done.stderr
    for name, value in {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}.items():
        monkeypatch.setenv(name, str(value))
    done = refuse_in_process(SCRIPT, *TINY, "--log_dir", tmp_path)
    assert done.returncode == 2 and errors(done) == [
        "error: WORLD_SIZE=1: a pipeline needs 2 ranks or more, a stage each: start 2 or more "
        "processes (--nproc_per_node 2)"], done.stderr
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- 6: stages x replicas, 2-D mesh
# float32 rounding, not bit for bit: a replica adds its two micro-batches' gradients and the two
# replicas' sums are added, (g0 + g2) + (g1 + g3), where DDP's all-reduce adds the four ranks' in
# gloo's order; so a tensor's differences scale with its largest element, not each element's
# own. Measured after 4 steps: the weights at most 3e-8 apart (1e-7 of their largest), SGD's
# momentum 6e-8 (1.2e-6 of its largest), and the BatchNorm biases whose gradient is 0 but for
# rounding (each feeds another BatchNorm), and their momentum, at most 9e-9. The bounds leave ten
# times that room; micro-batches of other images than DDP's ranks' (a replica's step split in
# order, not dealt) moved a weight 2e-3.
MESH_RTOL, MESH_ATOL = 1e-5, 1e-7


def within_rounding(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """No element of `ours` further from `theirs` than MESH_RTOL of its largest, and MESH_ATOL."""
    return bool((ours - theirs).abs().max() <= MESH_RTOL * theirs.abs().max() + MESH_ATOL)


@pytest.mark.second_tier  # four launches of 4 processes, 2 at a time
def test_two_stages_by_two_replicas_train_ddps_weights_on_four_processes(mesh_runs):
    """--stages 2 on 4 processes: 2 stages x 2 replicas, each replica's step in 2 micro-batches of
    8, replica r's micro-batch m holding DDP's rank 2m + r's images (dealt). Every parameter and
    SGD momentum buffer after 4 steps is DDP's on 4 processes within rounding (MESH_RTOL, above),
    with single_gpu's keys and indices. The BatchNorm statistics differ, as with one replica:
    replica 0's, saved, updated once a micro-batch (8 in 4 steps, over its share alone); DDP's
    rank 0's once a step (4)."""
    done, run_dir = mesh_runs["mesh"]
    assert "1f1b, 2 micro-batches of 8 a replica: 2 stages x 2 replicas;" in done.stdout
    results = read_results(run_dir)
    assert (results["world_size"], results["replicas"], len(results["stages"])) == (4, 2, 2)
    assert results["config"]["stages"] == 2
    pipe, ddp = checkpoint(run_dir), checkpoint(mesh_runs["ddp"][1])
    assert list(pipe["model"]) == list(ddp["model"])
    names = [name for name, _ in tiny_model().named_parameters()]
    far = [name for name in names if not within_rounding(pipe["model"][name], ddp["model"][name])]
    assert not far, far
    assert list(pipe["optimizer"]["state"]) == list(range(len(names)))
    far = [names[index] for index, state in ddp["optimizer"]["state"].items() if not
           within_rounding(pipe["optimizer"]["state"][index]["momentum_buffer"],
                           state["momentum_buffer"])]
    assert not far, far
    assert_batchnorm_statistics_differ(pipe, ddp)
    trained = [read_results(runs[1])["summary"] for runs in (mesh_runs["mesh"], mesh_runs["ddp"])]
    assert trained[0]["train_acc"] == trained[1]["train_acc"]
    assert trained[0]["train_loss"] == pytest.approx(trained[1]["train_loss"], rel=1e-6)


@pytest.mark.second_tier  # reads the launches above
def test_replicas_evaluate_each_test_image_once_as_single_gpu_finds_their_model(mesh_runs,
                                                                                 tmp_path):
    """Each replica evaluates its share of the 51 test images (26 and 25) with replica 0's
    BatchNorm statistics, the saved ones: single_gpu/train.py --evaluate of model.pt finds the
    same accuracy, and the loss within float32 rounding (its batches are not the replicas')."""
    run_dir = mesh_runs["mesh"][1]
    tested = read_results(run_dir)["summary"]
    assert tested["test_images"] == 51
    done = train_in_process("single_gpu/train.py", *TINY, "--evaluate", run_dir / "model.pt",
                            "--log_dir", tmp_path, "--run_name", "e")
    assert done.returncode == 0, done.stderr
    evaluated = read_results(tmp_path / "e")["summary"]
    assert evaluated["test_images"] == 51
    assert evaluated["test_acc"] == tested["test_acc"]
    assert evaluated["test_loss"] == pytest.approx(tested["test_loss"], rel=1e-6)


@pytest.mark.second_tier  # reads the launches above
def test_a_resumed_mesh_run_ends_with_the_uninterrupted_runs_tensors(mesh_runs):
    """2 x 2, stopped at step 2 under GPipe, resumed to step 4 under 1F1B: every tensor of the
    uninterrupted run's checkpoint, BatchNorm statistics too (replica 0's, which every replica
    takes back; the others' are never saved, and evaluated with replica 0's)."""
    (first, _), (second, run_dir) = mesh_runs["halves"]
    assert "gpipe, 2 micro-batches of 8 a replica" in first.stdout, first.stdout
    assert "resumed at step 2" in second.stdout, second.stdout
    resumed, straight = checkpoint(run_dir), checkpoint(mesh_runs["mesh"][1])
    assert resumed["progress"]["step"] == straight["progress"]["step"] == 4
    differ = [key for key in straight["model"]
              if not torch.equal(resumed["model"][key], straight["model"][key])]
    assert not differ, differ
    for index, state in straight["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"],
                           state["momentum_buffer"])


@pytest.mark.second_tier  # a launch of three workers
def test_processes_the_stages_do_not_divide_are_refused_once_for_every_worker(mesh_runs):
    done, logs = mesh_runs["refused"]
    assert done.returncode != 0 and errors(done) == [REFUSED_3_BY_2], done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr and not logs.exists()


REFUSED_3_BY_2 = ("error: WORLD_SIZE=3 is no multiple of --stages 2: give a --stages that "
                  "divides it")


def test_processes_the_stages_do_not_divide_are_refused_in_one_line(monkeypatch, tmp_path):
    """3 processes for --stages 2, before the group forms: one line, exit 2, no traceback."""
    for name, value in {"RANK": 0, "WORLD_SIZE": 3, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 3,
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}.items():
        monkeypatch.setenv(name, str(value))
    done = refuse_in_process(SCRIPT, *TINY, "--stages", "2", "--log_dir", tmp_path)
    assert done.returncode == 2 and errors(done) == [REFUSED_3_BY_2], done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())


# -------------------------------------------------------------------- the parts, in this process
@pytest.mark.parametrize("depth", [8, 14])
def test_the_pieces_in_sequence_are_the_model(depth):
    """PyramidNet as stem, blocks, head: run one after the other they compute its forward bit for
    bit, and every parameter and buffer belongs to exactly one piece."""
    torch.manual_seed(0)
    model = pipeline().PyramidNet(depth, 12)
    pieces = pipeline().model_pieces(model)
    images = torch.randn(4, 3, 32, 32)
    x = images
    for _, piece in pieces:
        x = piece(x)
    assert torch.equal(x, model(images))
    held = [id(t) for _, piece in pieces for t in itertools.chain(piece.parameters(),
                                                                   piece.buffers())]
    assert sorted(held) == sorted(id(t) for t in itertools.chain(model.parameters(),
                                                                  model.buffers()))


def test_a_sequential_is_cut_at_its_children_and_any_other_model_refused():
    layers = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                 torch.nn.LazyLinear(10))
    assert pipeline().model_pieces(layers) == list(layers.named_children())
    resnet = pipeline().torchvision.models.resnet18(num_classes=10)
    with pytest.raises(runkit.UsageError, match="^ResNet is no sequence of pieces to cut into "
                                                "stages: give --model pyramidnet"):
        pipeline().model_pieces(resnet)


def costliest(costs: list[int], ends) -> int:
    """The costliest run's cost when `costs` is cut after each of `ends`."""
    bounds = [0, *ends, len(costs)]
    return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))


def test_the_cut_makes_the_costliest_stage_as_cheap_as_any_cut_can():
    """balanced_cuts against every contiguous cut, on random costs; and the comparison's own cut
    for its projection (comparison/projection.py's costliest_cut, which reads no train file)."""
    from comparison.projection import costliest_cut
    draw = random.Random(0)
    for _ in range(50):
        costs = [draw.randint(1, 100) for _ in range(draw.randint(2, 9))]
        stages = draw.randint(2, len(costs))
        best = min(costliest(costs, ends)
                   for ends in itertools.combinations(range(1, len(costs)), stages - 1))
        for cuts in (pipeline().balanced_cuts(costs, stages), costliest_cut(costs, stages)):
            assert cuts[0] == 0 and cuts[-1] == len(costs) and len(cuts) == stages + 1
            assert all(a < b for a, b in zip(cuts, cuts[1:]))  # each stage a piece at least
            assert costliest(costs, cuts[1:-1]) == best


def test_the_default_microbatches_keep_the_bubble_under_a_quarter():
    """The fewest M that keep (S-1)/(M+S-1) under 1/4 and divide the batch: 3S-2 where it
    divides (4 for 2 stages), else the next divisor (16 for 4 stages and 512 images)."""
    fewest = pipeline().fewest_microbatches
    assert (fewest(2, 128), fewest(4, 512), fewest(8, 128), fewest(3, 30)) == (4, 16, 32, 10)
    for stages, batch in itertools.product(range(2, 9), (32, 96, 128, 256, 1000)):
        m = fewest(stages, batch)
        assert batch % m == 0 and (stages - 1) / (m + stages - 1) < 1 / 4
        assert not any(batch % smaller == 0 and (stages - 1) / (smaller + stages - 1) < 1 / 4
                       for smaller in range(1, m))
    assert fewest(4, 6) == 6  # a batch too small for a quarter: an image a micro-batch


def replica(rank: int, replicas: int) -> dict:
    """What get_loaders reads of the mesh: its dp dimension, this process's place along it."""
    return {"dp": SimpleNamespace(get_local_rank=lambda: rank, size=lambda: replicas)}


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("replicas", "microbatches"), [(1, 3), (2, 2), (2, 3), (3, 2)])
def test_replica_rs_micro_batch_m_holds_ddps_rank_m_r_images(replicas, microbatches, shuffle):
    """get_loaders' share of replica r of R, each step dealt into M micro-batches of b, holds in
    micro-batch m the batch DDP's rank m * R + r of M * R would load at that step (a DataLoader of
    b over DistributedSampler's share), epoch after epoch, for a set whose size R * M does not
    divide (each sampler pads it; a step of b images a rank drops the rest). Each image is known
    by its label. The replicas' test shards hold every test image once."""
    ranks, b = replicas * microbatches, 8
    dataset = TensorDataset(runkit.synthetic_images(203, 0, "train")[0], torch.arange(203))
    args = SimpleNamespace(dataset="synthetic", image_size=32, augment="off", flip=False, seed=7,
                           shuffle=shuffle, num_workers=0, batch_size=ranks * b,
                           microbatches=microbatches)
    loaders = [pipeline().get_loaders(args, dataset, dataset, torch.device("cpu"),
                                      replica(r, replicas)) for r in range(replicas)]
    for epoch in (0, 1):
        ddp = []  # each rank's batches: DistributedSampler's share, as dist_parallel loads it
        for rank in range(ranks):
            share = DistributedSampler(dataset, ranks, rank, shuffle=shuffle, seed=7)
            share.set_epoch(epoch)
            ddp.append([labels for _, labels in DataLoader(dataset, b, sampler=share,
                                                           drop_last=True)])
        for r, (train, _) in enumerate(loaders):
            steps = [labels for _, labels in pipeline().epoch_batches(train, epoch, {"batch": 0})]
            assert len(steps) == len(ddp[0]) > 3
            for step, labels in enumerate(steps):
                held = pipeline().dealt(labels, microbatches).split(b)
                for m in range(microbatches):
                    assert torch.equal(held[m], ddp[m * replicas + r][step]), (epoch, r, m)
    shards = sorted(index for _, test in loaders for index in test.sampler)
    assert shards == list(range(203)) and {len(test.sampler) for _, test in loaders} <= {
        203 // replicas, 203 // replicas + 1}


def _complete(name: str, cat: str, start: float, end: float) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "pid": 1, "tid": 1, "ts": start,
            "dur": end - start}


def test_the_bubble_benchmark_counts_a_stages_wait_with_no_operator_running():
    """benchmarks/pipeline_bubble.py: a stage idles while a transfer is open and its thread runs
    no operator; the data wait and the optimizer are out of the schedule's time."""
    from benchmarks.pipeline_bubble import idle_share, theory
    trace = {"traceEvents": [
        _complete("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                  "user_annotation", 0, 10),
        _complete("aten::convolution", "cpu_op", 10, 50),
        _complete("gloo:send", "user_annotation", 40, 60),  # 10 of its 20 behind compute
        _complete("gloo:recv", "user_annotation", 55, 80),  # idle from 50 to 80
        _complete("aten::convolution_backward", "cpu_op", 80, 100),
        _complete("Optimizer.step#SGD.step", "user_annotation", 100, 110)]}
    assert idle_share(trace) == pytest.approx(30 / 90, rel=1e-12)
    assert theory(2, 4) == 1 / 5
