"""benchmarks/fast.py on the CPU, as a user runs it: a mode's own train.py with the gpu loader,
channels stored aligned and the shortcut in place swapped in trains the plain train.py's model (a
checkpoint of it resumed by the plain single_gpu/train.py ends with the plain run's weights, bit
for bit), reports the paper's parameters and FLOPs, starts dist_parallel's workers itself, keeps
its compile cache where it is told, and refuses what it cannot run in one line. Speed itself is
measured in benchmarks (benchmarks/fast_path.sh, BENCHMARKS.md), never in a test."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import torch

import runkit
from benchmarks import fast
from conftest import read_results, run_script, two_at_a_time

TINY = ["--dataset", "synthetic", "--synthetic_size", "256", "--depth", "8", "--alpha", "12",
        "--batch_size", "32", "--log_interval", "4", "--warmup_steps", "1", "--num_workers", "0"]
FAST = ["--loader", "gpu", "--align_channels", "8"]


def in_process(main, *argv) -> tuple[int, str, str]:
    """main(argv) as the script's __main__ block runs it (runkit.one_line_errors): the exit status,
    the output and the errors."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with runkit.one_line_errors():
                code = main([str(arg) for arg in argv])
        except SystemExit as exit_:
            code = exit_.code
    return code or 0, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """fast.py's single_gpu run to step 4 of 16 and its dist_parallel run on 2 processes (started
    by fast.py as the train.py starts them), side by side; then, in this process, the plain
    single_gpu/train.py's whole run, and its resume of fast.py's checkpoint."""
    logs = tmp_path_factory.mktemp("fast_path")
    where = ["--log_dir", logs]

    def launch(*argv):
        done = run_script("benchmarks/fast.py", *argv, *where)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    fast_run, dist_run = two_at_a_time(
        lambda: launch("single_gpu", *TINY, *FAST, "--epochs", "2", "--max_steps", "4",
                       "--save_model", "--run_name", "fast"),
        lambda: launch("dist_parallel", *TINY, *FAST, "--epochs", "1", "--nproc_per_node", "2",
                       "--run_name", "dist"))
    single = fast.train_file("single_gpu")
    for name, more in (("plain", []), ("resumed", ["--resume", logs / "fast" / "checkpoint.pt"])):
        code, _, err = in_process(single.main, *TINY, "--epochs", "2", "--save_model",
                                  "--run_name", name, *more, *where)
        assert code == 0, err
    code, evaluated, err = in_process(single.main, *TINY, "--evaluate", logs / "fast" / "model.pt",
                                      "--run_name", "evaluated", *where)
    assert code == 0, err
    return logs, fast_run.stdout, dist_run.stdout, evaluated


def test_a_fast_path_checkpoint_resumed_by_the_plain_train_py_ends_with_its_weights(runs):
    """fast.py's 4 steps (its loader's batches, the aligned model, the in-place sum; the
    momentum in the paper's shapes) then the plain file's 12 are the plain file's 16, bit for bit
    (fp32 on the CPU, a narrow model: docs/speed.md)."""
    logs = runs[0]
    resumed, whole = (torch.load(logs / name / "model.pt", weights_only=True)
                      for name in ("resumed", "plain"))
    assert list(resumed) == list(whole)
    assert all(torch.equal(resumed[key], whole[key]) for key in whole)
    assert read_results(logs / "resumed")["summary"]["step"] == 16


def test_it_reports_the_papers_model_and_its_own_flags(runs):
    logs, output, _, evaluated = runs
    ours, plain = (read_results(logs / name) for name in ("fast", "plain"))
    config = ours["config"]
    assert (config["loader"], config["align_channels"], config["width_multiple"]) == ("gpu", 8, 1)
    assert config["compile_cache"] is None and "loader" not in plain["config"]
    for key in ("parameters", "flops_per_image"):  # the paper's, not the padded storage's
        assert ours["summary"][key] == plain["summary"][key], key
    assert ("fast path: the gpu loader, channels stored in multiples of 8, the shortcut added in "
            "place") in output
    weights = {key: value.shape for key, value in
               torch.load(logs / "fast" / "model.pt", weights_only=True).items()}
    assert weights == {key: value.shape for key, value in
                       torch.load(logs / "plain" / "model.pt", weights_only=True).items()}
    # the plain file evaluates the fast path's weights as the fast path did
    assert read_results(logs / "evaluated")["summary"]["test_loss"] == pytest.approx(
        ours["summary"]["test_loss"], rel=1e-6)
    assert "test loss" in evaluated


def test_dist_parallel_starts_its_workers_each_on_the_fast_path(runs):
    logs, _, output, _ = runs
    results = read_results(logs / "dist")
    assert results["mode"] == "dist_parallel" and results["world_size"] == 2
    assert results["params_in_sync"] is True  # DDP over the aligned model: the same padded weights
    assert results["config"]["loader"] == "gpu" and results["config"]["align_channels"] == 8
    assert results["summary"]["parameters"] == read_results(logs / "plain")["summary"]["parameters"]
    assert output.count("fast path:") == 1  # rank 0 says it


@pytest.mark.parametrize("argv, says", [
    (["cifar10"], "'cifar10' is no mode"),
    (["--benchmark", "single_gpu"], "give the mode first"),
    (["fsdp", "--align_channels", "8"], "fsdp shards the paper's shapes; give --align_channels 0"),
    (["dist_parallel", "--sync_bn", "--align_channels", "8"], "SyncBatchNorm takes the paper's"),
    (["single_gpu", "--model", "resnet18", "--width_multiple", "8"], "widens PyramidNet"),
    (["single_gpu", "--model", "resnet18", "--align_channels", "8"], "leave it out with --model"),
    (["single_gpu", "--compile_cache", "cache"], "give --compile too"),
    (["single_gpu", "--compile", "--compile_cache", "a b"], "give a folder without one"),
    (["single_gpu", "--batch_size", "0"], "--batch_size"),  # the train.py's own refusal
    (["single_gpu", *TINY, "--loader", "gpu", "--augment", "resized"], "--augment resized"),
    (["single_gpu", *TINY, "--loader", "gpu", "--image_size", "40"], "--image_size 40"),
])
def test_what_it_cannot_run_is_refused_in_one_line(tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)  # a relative --compile_cache, here
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # what fast.py sets: undone after
    code, out, err = in_process(fast.main, *argv, "--log_dir", tmp_path / "runs")
    lines = [line for line in err.splitlines() if line != "warning: no CUDA GPU found: running on "
             "the CPU"]  # the train file's, on this machine
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_a_compile_cache_that_cannot_be_used_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for folder, says in ((tmp_path / "file", "is a file, not a folder"),
                         (tmp_path / "file" / "cache", "is a file, not a folder"),
                         (tmp_path / "dangling", "which is not there"),
                         (tmp_path / "dangling" / "cache", "is a link that leads nowhere")):
        with pytest.raises(runkit.UsageError, match=says):
            fast.compile_cache(str(folder))
    assert fast.compile_cache(str(tmp_path / "new" / "cache")) == tmp_path / "new" / "cache"
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):  # root writes anywhere
            pytest.skip("this user writes in a read-only folder (root)")
        with pytest.raises(runkit.UsageError, match="cannot be written"):
            fast.compile_cache(str(tmp_path / "cache"))
    finally:
        os.chmod(tmp_path, 0o700)


def test_the_compile_cache_is_inductors_and_said_cold_or_warm(tmp_path, monkeypatch):
    """--compile_cache sets TORCHINDUCTOR_CACHE_DIR before the train file imports torchvision
    (whose import asks inductor for its folder), so that inductor's caches go there; the first
    line says cold, or warm with the compiled graphs a compile reads (FX graphs, AOTAutograd's
    entries: an empty tree, kernels alone, locks or a write's temporary file leave it cold)."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # undone after the test
    cache = tmp_path / "cache"
    code, out, err = in_process(fast.main, "single_gpu", *TINY, "--compile", "--compile_cache",
                                cache, "--epochs", "0", "--log_dir", tmp_path / "runs")
    assert code == 0, err
    assert f"compile cache {cache} (cold)" in out and cache_dir() == str(cache)
    fx_folder = Path(FxGraphCache._get_tmp_dir_for_key("fabcdefgh"))
    aot_folder = Path(AOTAutogradCache._get_tmp_dir_for_key("aabcdefgh"))
    for folder in (fx_folder, aot_folder, cache / "locks", cache / "ab"):
        folder.mkdir(parents=True)
    (cache / "ab" / "cabcdef.py").write_text("# a kernel")
    (fx_folder / ".entry.123.tmp").write_bytes(b"")  # write_atomic's, under way
    assert fx_folder.is_relative_to(cache) and fast.graph_entries(cache) == 0
    (fx_folder / "entry").write_bytes(b"")
    (aot_folder / "entry").write_bytes(b"")
    options = fast.parse(["single_gpu", "--compile_cache", str(cache)])[0]
    fast.resolve(options, fast.train_file("single_gpu").get_args(["--compile"]), cuda=False)
    assert f"compile cache {cache} (warm, 2 compiled graphs)" in fast.described(options)


def test_the_defaults_are_the_fast_paths_on_a_gpu_and_the_plain_files_on_the_cpu():
    single, fsdp = fast.train_file("single_gpu"), fast.train_file("fsdp")
    for cuda, module, expected in ((True, single, ("gpu", 8)), (False, single, ("torchvision", 0)),
                                   (True, fsdp, ("gpu", 0))):
        options = fast.parse([module.MODE])[0]
        fast.resolve(options, module.get_args([]), cuda)
        assert (options.loader, options.align_channels) == expected, (module.MODE, cuda)


def test_its_default_loader_leaves_what_it_cannot_hold_to_the_train_files_own(capsys):
    """On a GPU the gpu loader is the default, not a demand: another --image_size (or an image
    folder, --augment resized) trains on the train file's DataLoader, said in a line and recorded;
    given, it is refused (above)."""
    single = fast.train_file("single_gpu")
    options, rest = fast.parse(["single_gpu", *TINY, "--image_size", "40"])
    fast.resolve(options, single.get_args(rest), cuda=True)
    assert options.loader == "gpu"
    fast.use_fast_path(single, options)
    args = single.get_args(rest)
    train_set, test_set, _ = single.get_datasets(args)
    single.data_defaults(args, len(train_set))
    loaders = single.get_loaders(args, train_set, test_set, torch.device("cpu"))
    assert all(isinstance(loader, torch.utils.data.DataLoader) for loader in loaders)
    assert args.loader == "torchvision"  # results.json's config says so
    assert "fast path: the torchvision loader (--loader gpu gives synthetic's images at their " \
        "own 32 px)" in capsys.readouterr().out
