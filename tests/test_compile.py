"""torch.compile in the train files and on the fast path, each held to what torch's own source
does. Inductor's C++ build of PyramidNet takes minutes on this CPU, so nothing here compiles with
it: TorchDynamo's eager backend captures the real graphs, and the failure a choice prevents is
reproduced from torch's own code in milliseconds. The compile cache's folder and its warm or cold
state are tests/test_fast_path.py's; the compiled step on a GPU, tests/gpu's.

1. --compile_mode without --compile is refused (it would be ignored), in every train file;
   pipeline_parallel refuses --compile itself (its stages are not compiled in this version).
2. A compiled run trains the eager run's weights and saves the unwrapped model's; the fast path's
   blocks, compiled, add the padded sum, and train the same weights as eager's in-place sum.
3. fsdp compiles with static shapes (dynamic ones make inductor raise a TypeError).
4. A space in the compile cache's path would split inductor's C++ command: fast.py refuses it.
"""
from __future__ import annotations

import shlex

import pytest
import torch
import torch.distributed as dist

from benchmarks import fast
from test_fast_path import TINY, in_process

MODES = ("single_gpu", "data_parallel", "dist_parallel", "fsdp", "pipeline_parallel")


# --------------------------------------------------------------------------- 1. flags without it
@pytest.mark.parametrize("mode", MODES)
def test_compile_mode_without_compile_is_refused_rather_than_ignored(mode):
    module = fast.train_file(mode)
    code, _, err = in_process(module.get_args, "--compile_mode", "reduce-overhead")
    assert code == 2 and err == "error: --compile_mode needs --compile\n", err
    if mode == "pipeline_parallel":  # no compiled stage yet: said, not ignored either
        code, _, err = in_process(module.get_args, "--compile", "--compile_mode", "max-autotune")
        assert code == 2 and err == ("error: --compile: not for a pipeline's stages in this "
                                     "version; leave it out\n"), err
    else:
        assert module.get_args(["--compile", "--compile_mode", "reduce-overhead"]).compile


# ------------------------------------------------------------------------ 2. what a compile trains
@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile with TorchDynamo's eager backend: the capture is real, no code generated;
    the models it was given, kept."""
    compiled, real = [], torch.compile

    def compile_eagerly(model, **options):
        compiled.append(model)
        return real(model, backend="eager", **{k: v for k, v in options.items() if k != "mode"})

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    torch._dynamo.reset()
    yield compiled
    torch._dynamo.reset()


@pytest.mark.parametrize("script", ["single_gpu", "fast"])
def test_a_compiled_run_trains_the_eager_runs_weights(tmp_path, eager_backend, script):
    """single_gpu/train.py --compile, and fast.py's (its blocks' padded sum under compile, the
    in-place ShortcutSum eager): the weights of the eager run, under the unwrapped model's
    names."""
    main = fast.train_file("single_gpu").main if script == "single_gpu" else \
        lambda argv: fast.main(["single_gpu", "--loader", "gpu", "--align_channels", "8", *argv])
    flags = [*TINY, "--max_steps", "3", "--epochs", "1", "--save_model", "--log_dir", tmp_path]
    for name, more in (("compiled", ["--compile"]), ("eager", [])):
        code, _, err = in_process(main, *flags, "--run_name", name, *more)
        assert code == 0, err
    assert len(eager_backend) == 1  # the compiled run's model only
    compiled, eager = (torch.load(tmp_path / name / "model.pt", weights_only=True)
                       for name in ("compiled", "eager"))
    assert list(compiled) == list(eager) and not any("_orig_mod" in key for key in compiled)
    assert all(torch.equal(compiled[key], eager[key]) for key in eager)


# ------------------------------------------------------------------ 3. fsdp, a graph a block width
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


def test_fsdp_compiles_with_static_shapes(monkeypatch):
    """fsdp/train.py's get_model compiles with dynamic=False, on a real one-rank group, a
    recompile allowed for each block's width (the limit it raises is restored after)."""
    fsdp = fast.train_file("fsdp")
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **options: calls.append(options) or model)
    args = fsdp.get_args([*TINY, "--compile"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        args.amp, args.channels_last, args.image_size = "off", False, 32  # setup's, data's
        with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit):
            fsdp.get_model(args, 10, torch.device("cpu"))
            assert torch._dynamo.config.recompile_limit >= 64
    finally:
        dist.destroy_process_group()
    assert calls == [{"mode": "default", "dynamic": False}]


# -------------------------------------------------------------------------- 4. a space in the path
def test_a_space_in_the_cache_path_would_split_inductors_cpp_command(tmp_path):
    """Why fast.py refuses a --compile_cache with a space (g++: "input file '.../a' is the same as
    output file"): CppBuilder writes the source and output paths, which lie in the cache, into
    its command unquoted and splits it with shlex (torch/_inductor/cpp_builder.py)."""
    from torch._inductor.cpp_builder import CppBuilder, CppOptions

    spaced = f"{tmp_path}/my cache"
    builder = CppBuilder("kernel", sources=[f"{spaced}/kernel.cpp"], BuildOption=CppOptions(),
                         output_dir=spaced)
    assert f"{spaced}/kernel.cpp" not in shlex.split(builder.get_command_line())
    code, _, err = in_process(fast.main, "single_gpu", "--compile", "--compile_cache", spaced)
    assert code == 2 and "give a folder without one" in err


# ------------------------------------------------------- 5. the tests leave torch as they found it
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
