"""torch.compile's flags, the same in every mode, each held to what torch's own source does.

Inductor's C++ build of PyramidNet takes minutes on this CPU, so nothing here compiles it: each
fix is tested where it acts (a rule, a path, the arguments of torch.compile, the compile
callbacks), with TorchDynamo's eager backend where a real capture is needed, and the failure it
prevents is reproduced from torch's own code in a few milliseconds (each was also met, and the
fix run, once with inductor: docs/speed.md). The refusals as a user meets them, one line and
nothing written, are in tests/test_bad_input.py; the node's first compile on a real process
group in tests/test_process_group.py.

1. fsdp refuses the modes that capture CUDA graphs, in its train.py and in compare.py's matrix.
2. Compiled DDP asserts where its buckets are smaller than its first one: refused exactly there.
3. --compile_mode and --compile_cache without --compile are refused (they would be ignored).
4. A compile cache that is a file, a link that leads nowhere or read-only is
   refused before anything is written.
5. A space in the compile cache's path reaches the C++ compiler through a link without one.
6. fsdp compiles every block with static shapes (dynamic ones make inductor raise a TypeError).
7. A rank waits for its node's first rank to compile, and that wait is
   reported apart from compile time.
8. compile_time_s is the time inside torch's compile callbacks; a cache is warm
   only with compiled graphs in it.
9. dist_parallel's comment on static_graph says what DDP does.
"""
from __future__ import annotations

import os
import shlex
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import common.compiling
import compare
from common.compiling import CompileClock, graph_entries, inductor_cache_path, open_compile_cache
from common.compiling import compile_cache_alias, splits_apart
from common.config import Config, UsageError, parse_config
from common.performance import describe_fast_path, resolve_fast_path
from common.rules import CUDA_GRAPH_MODES, FIRST_BUCKET_BYTES, compile_refusal, launch_refusal
from comparison.matrix import PlannedRun, check_runs, config_class
from conftest import REPO, TINY, read_results

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def no_cache_variable(monkeypatch):
    """TORCHINDUCTOR_CACHE_DIR unset, and whatever a test (resolve_fast_path)
    sets in it undone after the test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")


def cpu_run(mode: str) -> PlannedRun:
    return PlannedRun(mode, 2, "gloo", None, False, 32, 1, index=1, unit="cpu")


def event(trigger: str, compile_id: str = "0/0") -> SimpleNamespace:
    """What torch passes its compile callbacks (torch/_dynamo/callback.py, CallbackArgs)."""
    from torch._dynamo.callback import CallbackTrigger

    return SimpleNamespace(callback_trigger=CallbackTrigger[trigger], compile_id=compile_id)


@pytest.fixture
def clock(tmp_path):
    """A CompileClock on a fresh cache, its callbacks removed after the test."""
    made = []

    def make(folder: Path = tmp_path / "cache") -> CompileClock:
        made.append(CompileClock(str(folder)))
        return made[-1]

    yield make
    for each in made:
        each.close()


# ----------------------------------------------------------------------------- 1. fsdp, CUDA graphs
def test_fsdp_refuses_the_modes_that_capture_cuda_graphs():
    """reduce-overhead and max-autotune turn on inductor's CUDA graphs
    (torch._inductor.list_mode_options); FSDP2 allocates its unsharded parameters anew at every
    unshard, so the graphs would be recorded again every step or fail. fsdp keeps default and
    max-autotune-no-cudagraphs; the other modes keep all four."""
    assert {mode for mode, options in torch._inductor.list_mode_options().items()
            if options.get("triton.cudagraphs")} == set(CUDA_GRAPH_MODES)
    for mode in CUDA_GRAPH_MODES:
        refusal = launch_refusal("fsdp", 2, cuda=True, batch_size=32, compile=True,
                                 compile_mode=mode)
        assert (f"--compile_mode {mode}" in refusal
                and "default or max-autotune-no-cudagraphs" in refusal)
        assert launch_refusal("dist_parallel", 2, cuda=True, batch_size=32, compile=True,
                              compile_mode=mode) is None
    for mode in ("default", "max-autotune-no-cudagraphs", None):
        assert launch_refusal("fsdp", 2, cuda=True, batch_size=32, compile=True,
                              compile_mode=mode) is None
    with pytest.raises(UsageError, match=r"reduce-overhead captures CUDA "
                                         r"graphs.*\(fsdp on 2 CPU processes"):
        check_runs([cpu_run("fsdp")], ["--compile", "--compile_mode", "reduce-overhead"], {})
    check_runs([cpu_run("dist_parallel")], ["--compile", "--compile_mode", "reduce-overhead"], {})


# -------------------------------------------------------------------------- 2. compiled DDP buckets
def ddp_bucket_bytes(bucket_cap_mb: float) -> int:
    """The bucket size a real DDP computes from --bucket_cap_mb (what TorchDynamo reads from it), on
    a one-rank group: the same on every torch the suite takes, whatever helper computes it."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2),
                                                        bucket_cap_mb=bucket_cap_mb)
        return ddp.bucket_bytes_cap
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bucket_cap_mb", [1e-3, 0.5, 1 - 2**-30, 1.0, 1 + 2**-30, 25.0])
def test_compiled_ddp_is_refused_exactly_where_torchs_ddp_optimizer_asserts(bucket_cap_mb):
    """TorchDynamo builds a DDPOptimizer for every compiled DDP model
    (torch/_dynamo/convert_frame.py) with DDP's bucket_bytes_cap and the first bucket's 1 MiB
    (dist._DEFAULT_FIRST_BUCKET_BYTES), and it asserts when the first is the larger: the rule
    refuses those bucket sizes and no others."""
    from torch._dynamo.backends.distributed import DDPOptimizer

    ddp_bytes = ddp_bucket_bytes(bucket_cap_mb)
    try:
        DDPOptimizer(bucket_bytes_cap=ddp_bytes, backend_compile_fn=None)
        asserts = False
    except AssertionError as error:
        asserts = "First bucket should be smaller/equal to other buckets" in str(error)
    assert FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    refusal = compile_refusal("dist_parallel", True, None, bucket_cap_mb)
    assert (refusal is not None) == asserts
    # eager DDP takes any size
    assert compile_refusal("dist_parallel", False, None, bucket_cap_mb) is None
    if asserts:
        assert "give --bucket_cap_mb 1 or more" in refusal
        with pytest.raises(UsageError, match=r"--bucket_cap_mb .* \(dist_parallel on 2 CPU "
                                             r"processes"):
            check_runs([cpu_run("dist_parallel")], ["--compile"],
                       {"dist_parallel": ["--bucket_cap_mb", str(bucket_cap_mb)]})


# ----------------------------------------------------------------------- 3. flags without --compile
def test_compile_flags_without_compile_are_refused_rather_than_ignored(tmp_path):
    """Refused, not taken to imply --compile: one switch says whether a run is compiled
    (results.json's `compile`, compare.py's rows, the first line), and `--compile_mode default`
    alone would otherwise compile."""
    for flags in (["--compile_mode", "default"], ["--compile_cache", str(tmp_path)]):
        with pytest.raises(UsageError, match=f"^{flags[0]} .* does nothing without "
                                             "--compile: give --compile"):
            parse_config(Config, [*TINY, *flags])
        parse_config(Config, [*TINY, "--compile", *flags])
    cfg = resolve_fast_path(parse_config(Config, [*TINY, "--log_dir", str(tmp_path)]), CPU)
    # results.json: nothing of a compile
    assert cfg.compile_mode is None and cfg.compile_cache is None
    cfg = resolve_fast_path(parse_config(Config, [*TINY, "--compile", "--log_dir", str(tmp_path)]),
                            CPU)
    assert cfg.compile_mode == "default"


# ------------------------------------------------------------------------------- 4. unusable caches
def cache_refusal(*flags) -> str:
    with pytest.raises(UsageError) as refused:
        parse_config(Config, [*TINY, "--compile", *map(str, flags)])
    return str(refused.value)


def test_a_compile_cache_that_cannot_be_used_is_refused_when_parsed(tmp_path, monkeypatch):
    """Before anything is written (the refusal is part of parsing, which compare.py does for every
    run of its matrix too): a file, a link that leads nowhere (inductor's makedirs raises
    FileExistsError on it), a folder under a file; from --compile_cache, TORCHINDUCTOR_CACHE_DIR
    or --log_dir's default alike."""
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert cache_refusal("--compile_cache", tmp_path / "file").endswith(
        "is a file, not a folder: give a --compile_cache folder")
    assert "dangling is a symbolic link to" in cache_refusal("--compile_cache",
                                                             tmp_path / "dangling")
    assert f": {tmp_path / 'dangling'} is a symbolic link" in \
        cache_refusal("--compile_cache", tmp_path / "dangling" / "cache")
    assert "(--compile_cache's default, under --log_dir)" in \
        cache_refusal("--log_dir", tmp_path / "file")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file"))
    assert "(from TORCHINDUCTOR_CACHE_DIR)" in cache_refusal()
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    # made later
    parse_config(Config, [*TINY, "--compile", "--compile_cache", str(tmp_path / "new" / "cache")])


def test_a_read_only_compile_cache_is_refused_before_the_run_folder_is_claimed(tmpfs, tmp_path,
                                                                               capsys):
    """A read-only cache used to fail at the first compile, after the run folder was claimed: now
    refused in one line by the script, and by compare.py before its --out is made."""
    from conftest import refuse_in_process

    read_only = tmpfs("size=1m,ro")
    assert "is on a read-only file system" in cache_refusal("--compile_cache", read_only / "cache")
    runs = tmp_path / "runs"
    done = refuse_in_process("single_gpu/train.py", *TINY, "--compile", "--compile_cache",
                             read_only, "--log_dir", runs)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "read-only" in done.stderr, \
        done.stderr
    assert not runs.exists()
    with pytest.raises(SystemExit) as exit_:
        compare.main(["--out", str(tmp_path / "out"), "--modes", "single_gpu", "--compile",
                      "--compile_cache", str(read_only)])
    assert exit_.value.code == 2 and "read-only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_compare_checks_each_runs_cache_where_the_run_will_put_it(tmp_path):
    """compare.py's runs write under <out>/runs: the default cache checked is
    theirs, not train.py's default."""
    (tmp_path / "runs").write_text("a file where the runs' folder goes")
    with pytest.raises(UsageError, match=f"{tmp_path / 'runs'} is a file"):
        check_runs([cpu_run("dist_parallel")], ["--compile"], {}, log_dir=tmp_path / "runs")
    check_runs([cpu_run("dist_parallel")], ["--compile"], {}, log_dir=tmp_path / "elsewhere")


# --------------------------------------------------------------------------- 5. a space in the path
def builder_command(folder: str) -> list[str]:
    """The command inductor's C++ builder runs for a kernel in
    `folder`, as it runs it (shlex.split)."""
    from torch._inductor.cpp_builder import CppBuilder, CppOptions

    builder = CppBuilder("kernel", sources=[f"{folder}/kernel.cpp"], BuildOption=CppOptions(),
                         output_dir=folder)
    return shlex.split(builder.get_command_line())


def test_a_space_in_the_cache_path_reaches_the_compiler_through_a_link_without_one(
        tmp_path, clock, monkeypatch):
    """Why --compile failed with a space in the cache's path ("g++: fatal error: input file '.../a'
    is the same as output file"): CppBuilder writes the source and output paths into its command
    unquoted and splits it with shlex (torch/_inductor/cpp_builder.py). The cache is then given to
    inductor as a link without spaces, in this user's folder of the temporary folder, that leads to
    it: the command holds the whole path, and what inductor writes there lands in the cache."""
    # where the link goes: this test's own
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    spaced = tmp_path / "my runs" / ".compile_cache"
    cfg = resolve_fast_path(parse_config(Config, [*TINY, "--compile", "--log_dir",
                                                  str(tmp_path / "my runs")]),
                            CPU)
    assert cfg.compile_cache == str(spaced)  # reported as the user's folder
    given = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert f"{spaced}/kernel.cpp" not in builder_command(str(spaced))  # torch's own behaviour
    assert given == inductor_cache_path(str(spaced)) == str(compile_cache_alias(str(spaced)))
    assert not splits_apart(given) and not spaced.exists()  # nothing made before the run starts
    clock(spaced)  # the run starts: the folder and its link
    assert (Path(given).resolve() == spaced.resolve()
            and f"{given}/kernel.cpp" in builder_command(given))
    (Path(given) / "entry").write_text("compiled")
    assert (spaced / "entry").read_text() == "compiled"
    # again (every rank of a node makes it): the same link
    assert open_compile_cache(str(spaced)) == given
    # no space: no link
    assert inductor_cache_path(str(tmp_path / "plain")) == str(tmp_path / "plain")


def test_a_space_is_refused_only_where_no_link_can_stand_in(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "temp dir"))
    assert "and so does the temporary folder" in cache_refusal("--compile_cache", tmp_path / "a b")
    parse_config(Config, [*TINY, "--compile", "--compile_cache", str(tmp_path / "a_b")])


# ----------------------------------------------------------------- 6. fsdp, a graph per block width
def test_inductor_cannot_convert_what_dynamic_batchnorm_shapes_leave_it():
    """The TypeError both fsdp ranks raised: FSDP2's hooks break the graph at every block,
    PyramidNet's blocks all differ in width, so TorchDynamo recompiled the block's forward with
    dynamic shapes, and in BatchNorm's backward inductor's index propagation met 1/(N*H*W) as
    IntTrueDiv(1.0, 4096.0), whose eval() folds only integers, and cast it to float
    (torch/_inductor/index_propagation.py, TypedExpr.__post_init__)."""
    import sympy
    from torch._inductor.index_propagation import TypedExpr
    from torch.utils._sympy.functions import IntTrueDiv

    with pytest.raises(TypeError, match="Cannot convert expression to float"):
        TypedExpr(IntTrueDiv(sympy.Float(1.0), sympy.Float(4096.0)), torch.float32)


def test_fsdp_compiles_every_block_with_static_shapes(monkeypatch, tmp_path):
    """fsdp/train.py compiles with dynamic=False, and lets TorchDynamo keep a graph for every block
    (its limit of graphs per code object is 8; PyramidNet-110 has 54 blocks, each of its own width:
    a graph each, and the root's), on a real one-rank group."""
    import fsdp.train as fsdp

    calls = []
    monkeypatch.setattr(fsdp.torch, "compile",
                        lambda model, **options: calls.append(options) or model)
    cfg = resolve_fast_path(parse_config(fsdp.FsdpConfig, [*TINY, "--depth", "110", "--alpha", "12",
                                                          "--compile", "--log_dir", str(tmp_path)]),
                            CPU)
    # torch's own patch, undone as torch undoes it: pytest's monkeypatch left the option hidden
    # on torch 2.14 with pytest 9.2 (its undo deletes, and a deleted option reads as missing)
    with torch._dynamo.config.patch(recompile_limit=8):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            fsdp.get_model(cfg, CPU)
        finally:
            dist.destroy_process_group()
        assert calls == [{"mode": "default", "dynamic": False}]
        assert torch._dynamo.config.recompile_limit == 55  # the 54 blocks' graphs, and the root's


# ---------------------------------------------------------------- 7. the node's first rank compiles
class Stopwatch:
    """common.compiling's time: its perf_counter reads seconds the test moves on by hand (a clock a
    loaded machine cannot slow); `read` is set at each reading."""

    def __init__(self):
        self.now, self.read = 0.0, threading.Event()

    def perf_counter(self) -> float:
        self.read.set()
        return self.now


def test_a_rank_waits_for_its_leaders_compile_and_the_wait_is_not_compile_time(clock, tmp_path,
                                                                               monkeypatch):
    """Two clocks on one store, as two ranks of a node: the follower's compilation waits until the
    leader's of the same key is over (it then reads the cache), and the wait is counted apart from
    its compile time. CUDA graphs are recorded by every rank itself: no wait. A key the leader never
    posts ends the waiting (the follower compiles alone) after the timeout."""
    watch = Stopwatch()
    monkeypatch.setattr(common.compiling, "time", watch)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    leader, follower = clock(tmp_path / "cache"), clock(tmp_path / "cache")
    leader.follow((server, True, 60.0))
    follower.follow((client, False, 60.0))

    def follower_compiles():
        follower._start(event("DYNAMO"))
        follower._end(event("DYNAMO"))

    waiting = threading.Thread(target=follower_compiles)
    waiting.start()
    assert watch.read.wait(60)  # the follower has begun: it waits for the leader's key
    watch.now += 0.2
    leader._start(event("DYNAMO"))
    watch.now += 0.3  # the leader's cold compile
    leader._end(event("DYNAMO"))
    waiting.join(60)
    assert not waiting.is_alive()
    assert follower.waited == pytest.approx(0.5) and follower.seconds == pytest.approx(0)
    assert leader.seconds == pytest.approx(0.3) and leader.waited == 0
    follower._start(event("CUDAGRAPH_RECORDING"))
    watch.now += 0.1
    follower._end(event("CUDAGRAPH_RECORDING"))
    # recording: not waited for, its own time
    assert follower.waited == pytest.approx(0.5) and follower.seconds == pytest.approx(0.1)
    follower.follow((client, False, 0.2))
    follower._start(event("LAZY_BACKWARD"))  # never compiled by the leader
    follower._end(event("LAZY_BACKWARD"))
    assert follower.leader is None and follower.events == 3


# ------------------------------------------------------------------------------ 8. what is measured
def test_compile_time_is_the_time_inside_torchs_compile_callbacks(clock, monkeypatch):
    """Every trigger torch times (a frame compiled, a backward compiled at its first
    backward, a CUDA graph recorded) counts; what happens between them (the first runs of the
    kernels, cuDNN's autotuning) does not. A real capture with AOTAutograd: the forward and
    the lazily compiled backward."""
    watch = Stopwatch()
    with monkeypatch.context() as patch:
        patch.setattr(common.compiling, "time", watch)
        timed = clock()
        for trigger in ("DYNAMO", "LAZY_BACKWARD", "CUDAGRAPH_RECORDING"):
            timed._start(event(trigger))
            watch.now += 0.05
            timed._end(event(trigger))
            watch.now += 0.1  # not compiling
    assert timed.seconds == pytest.approx(0.15) and timed.events == 3
    real = clock()
    model = torch.nn.Linear(3, 2)
    torch.compile(model, backend="aot_eager")(torch.ones(4, 3)).sum().backward()
    assert real.events == 2 and real.seconds > 0


def test_compile_time_leaves_out_the_first_steps_other_work(tmp_path, monkeypatch):
    """first_step_s minus the step's median (the old compile_time_s) counted anything slow in
    the first step, as cuDNN's autotuning is on a GPU: a first loss that takes a second
    stands in for it here (TorchDynamo's eager backend, in this process). compile_time_s
    leaves it out; first_step_s keeps it."""
    import single_gpu.train as single

    torch._dynamo.reset()  # this process may have compiled the model already (another test)
    real_compile, real_loss, losses = torch.compile, single.F.cross_entropy, []

    def slow_first_loss(*args, **kwargs):
        losses.append(1)
        time.sleep(1.0 if len(losses) == 1 else 0)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(single.torch, "compile",
                        lambda model, **options: real_compile(model, backend="eager"))
    monkeypatch.setattr(single.F, "cross_entropy", slow_first_loss)
    single.main([*TINY, "--max_steps", "3", "--no_progress", "--compile", "--log_dir",
                 str(tmp_path), "--run_name", "compiled"])
    summary = read_results(tmp_path / "compiled")["summary"]
    assert 0 < summary["compile_time_s"] < summary["first_step_s"] - 0.9, summary
    assert summary["compile_wait_s"] is None  # one process waits for no one


def test_a_cache_is_warm_only_with_compiled_graphs_a_compile_reads(tmp_path, monkeypatch):
    """Where torch puts an entry (FxGraphCache and AOTAutogradCache, asked for a key's folder)
    is where a warm cache is looked for: an empty tree, kernels alone, locks and a write's
    temporary file leave it cold."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache

    cache = tmp_path / "cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    cfg = resolve_fast_path(parse_config(Config,
                                         [*TINY, "--compile", "--compile_cache", str(cache)]), CPU)
    fx_folder = Path(FxGraphCache._get_tmp_dir_for_key("fabcdefgh"))
    aot_folder = Path(AOTAutogradCache._get_tmp_dir_for_key("aabcdefgh"))
    for folder in (fx_folder, aot_folder, cache / "locks", cache / "ab"):
        folder.mkdir(parents=True)
    (cache / "ab" / "cabcdef.py").write_text("# a kernel")
    (cache / "ab" / "cabcdef.so").write_bytes(b"")
    (fx_folder / ".entry.123.tmp").write_bytes(b"")  # write_atomic's, under way
    assert graph_entries(str(cache)) == 0 and "compiled (cache cold:" in describe_fast_path(cfg)
    (fx_folder / "entry").write_bytes(b"")
    assert (graph_entries(str(cache)) == 1 and "compiled (cache warm, 1 compiled "
                                               "graph:" in describe_fast_path(cfg))
    (aot_folder / "entry").write_bytes(b"")
    assert "compiled (cache warm, 2 compiled graphs:" in describe_fast_path(cfg)


# ---------------------------------------------------------------------------------- 9. static_graph
def test_the_static_graph_comment_says_what_ddp_does():
    """DDP searches for unused parameters every step only with find_unused_parameters (its
    static_graph docs: "DDP will not search graph in each iteration to detect unused parameters"
    helps only where they exist)."""
    source = (REPO / "dist_parallel/train.py").read_text()
    comment = source[source.index("# DDP broadcasts rank 0's weights"):source.index("model = DDP(")]
    assert "per-step search" not in comment and "find_unused_parameters" in comment
    assert config_class("dist_parallel")  # the file imports


# ------------------------------------------------------- 10. the tests leave torch as they found it
def test_a_test_that_leaves_an_option_changed_or_hidden_is_caught():
    """conftest's torch_left_as_found compares every compile option before and after each test:
    here, a changed value and an option that pytest's monkeypatch left hidden are both named (the
    hidden one on any pytest: a delattr is what its undo does on 9.2)."""
    from conftest import HIDDEN, compile_options, options_changed

    before = compile_options()
    assert HIDDEN not in before.values()
    limit = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=limit + 1):
        assert options_changed(before, compile_options()) == [
            f"torch._dynamo.config.recompile_limit: {limit} -> {limit + 1}"]
    assert options_changed(before, compile_options()) == []
    try:
        delattr(torch._dynamo.config, "recompile_limit")
        assert options_changed(before, compile_options()) == [
            f"torch._dynamo.config.recompile_limit: {limit} -> {HIDDEN!r}"]
    finally:
        torch._dynamo.config.recompile_limit = limit  # a set shows a hidden option again
    assert options_changed(before, compile_options()) == []
