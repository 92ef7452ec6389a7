"""The four train.py files stay in step, and each teaches its mode: the same sections in the
same order, every torch.distributed call a process-group mode makes written in its own file
(fsdp repeats dist_parallel's rather than importing them), the training loop the same code in
every mode, `main` a short story, lines a reader can hold. A budget of changed lines stays
only as a guard against drift."""
from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize

import pytest

from conftest import REPO

MODES = ["single_gpu/train.py", "data_parallel/train.py", "dist_parallel/train.py", "fsdp/train.py"]
SECTIONS = ["imports", "config", "setup", "data", "model", "optimizer", "train / evaluate",
            "main loop", "teardown"]

# What a process-group mode's file must show itself, in its code (not a comment): each step DDP
# needs, as the PyTorch DDP tutorial's script shows it.
GROUP_CALLS = [
    'int(os.environ["RANK"])',  # where this process sits, read from the environment torchrun sets
    "local_rank = net.local_rank",  # LOCAL_RANK, else RANK modulo the node's GPUs (a pod)
    'int(os.environ["WORLD_SIZE"])',
    "torch.cuda.set_device(gpus[0])",  # one GPU per process, before the group
    "dist.init_process_group(",  # the process group
    "DistributedSampler(",  # each rank's share of every epoch...
    "loader.sampler.set_epoch(epoch)",  # ...reshuffled every epoch
    "dist.all_reduce(totals)",  # the log window's sums over ranks
    "dist.all_reduce(stop, op=dist.ReduceOp.MAX)",  # the stop vote: a signal to any rank stops all
    "dist.all_reduce(sums)",  # the evaluation's sums over ranks
    "dist.broadcast(buffer, src=0)",  # rank 0's BatchNorm statistics for the evaluation
    "dist.all_gather_object(",  # every rank's GPU readings
    "dist.get_rank() == 0",  # rank-0 side effects
    "dist.barrier()",  # no rank exits before rank 0 has written the stop checkpoint
    "dist.destroy_process_group()",
    # one cold compile per node, its ranks waiting for it...
    "compile_leader(device, cfg.dist_timeout)",
    # ...and that wait reported apart from compile time, in each rank's one record
    "dist.all_gather_object(records, run.rank_record())",
]
MUST_SHOW = {
    "data_parallel/train.py": ["nn.DataParallel(AutocastForward(raw_model, cfg)"],
    "dist_parallel/train.py": [*GROUP_CALLS, "DDP(raw_model",
                               "nn.SyncBatchNorm.convert_sync_batchnorm("],
    "fsdp/train.py": [*GROUP_CALLS, "fully_shard(block", "fully_shard(raw_model",
                      "module.reshard()", "dist.all_reduce(most, op=dist.ReduceOp.MAX)"],
}
# What every mode defines itself, where its parallel calls are made (they
# once lived in common/, hiding them).
OWN = ["setup", "get_loaders", "get_model", "train_one_epoch", "log_window", "evaluate", "prepare",
       "train", "finish", "main"]
# Functions that are the same code in dist_parallel and fsdp (their config class's name aside): what
# a process group needs is identical whether the model is replicated or sharded.
SAME_IN_GROUPS = ["setup", "get_loaders", "get_optimizer", "train_one_epoch", "log_window",
                  "by_rank", "prepare", "main"]
# Changed lines of code (added + removed) against single_gpu/train.py, measured when set, with a
# little room: only a guard against drift. dist_parallel's are every step of DDP above, each with
# its comment, the node's first compile, each rank's own log window gathered for TensorBoard's
# rank/<r>/ tags, each rank's one record for results.json (its peak memory, compile wait and
# --profile_steps split) gathered once, and the last barrier; fsdp's are those with fully_shard
# in place of DDP, its evaluation's equal number of forward passes, the gathered weights, its
# compile with static shapes, its convolution weights stored (out, kh, kw, in) under
# --channels_last, and the FSDP2 construction: built on the meta device, sharded, materialised,
# filled from rank 0.
BUDGETS = {"data_parallel/train.py": 30, "dist_parallel/train.py": 145, "fsdp/train.py": 205}
FSDP_AGAINST_DIST = 114


def source(path: str) -> str:
    return (REPO / path).read_text()


def code_lines(path: str) -> list[str]:
    text = source(path)
    docstring_end = ast.parse(text).body[0].end_lineno
    return text.splitlines()[docstring_end:]


def code_only(path: str) -> str:
    """The file without its comments and docstrings: what it runs."""
    text = source(path)
    tokens = [token for token in tokenize.generate_tokens(io.StringIO(text).readline)
              if token.type != tokenize.COMMENT]
    code = tokenize.untokenize(tokens)
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            code = code.replace(body[0].value.value, "")
    return code


def changed_lines(other: str, base: str = "single_gpu/train.py") -> list[str]:
    diff = difflib.unified_diff(code_lines(base), code_lines(other), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def functions(path: str) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.parse(source(path)).body
            if isinstance(node, ast.FunctionDef)}


def without_config_names(node: ast.AST) -> str:
    return re.sub(r"\b(Dist|Fsdp)Config\b", "ModeConfig", ast.dump(node))


@pytest.mark.parametrize("path", MODES)
def test_sections_in_the_same_order(path):
    headers = re.findall(r"^\s*# -{20,} (.+)$", source(path), flags=re.M)
    assert headers == SECTIONS


@pytest.mark.parametrize("path", MUST_SHOW)
def test_each_mode_makes_its_own_calls_in_its_file(path):
    code = code_only(path)
    missing = [call for call in MUST_SHOW[path] if call not in code]
    assert not missing, f"{path} does not show: {missing}"


@pytest.mark.parametrize("path", MODES)
def test_no_mode_hides_its_steps_in_common(path):
    tree = ast.parse(source(path))
    imported = {alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("common") for alias in node.names}
    assert not imported & set(OWN), f"{path} imports {sorted(imported & set(OWN))} from common/"
    assert set(OWN) <= \
        set(functions(path)), f"{path} does not define {sorted(set(OWN) - set(functions(path)))}"


def test_the_process_group_modes_repeat_the_same_code():
    dist, fsdp = functions("dist_parallel/train.py"), functions("fsdp/train.py")
    differing = [name for name in SAME_IN_GROUPS
                 if without_config_names(dist[name]) != without_config_names(fsdp[name])]
    assert not differing, f"dist_parallel and fsdp differ in {differing}"


def test_the_training_loop_is_the_same_code_in_every_mode():
    loops = {path: ast.dump(functions(path)["train_one_epoch"]) for path in MODES}
    assert len(set(loops.values())) == 1, "train_one_epoch differs between the modes"


@pytest.mark.parametrize("path", MODES)
def test_main_is_a_short_story(path):
    """main() prepares, trains and finishes, each phase a function
    of the file, in about 30 lines."""
    main = functions(path)["main"]
    assert main.end_lineno - main.lineno + 1 <= 30
    called = {node.func.id for node in ast.walk(main)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"prepare", "train", "finish"} <= called


@pytest.mark.parametrize("path", MODES)
def test_lines_a_reader_can_hold(path):
    """At most 100 characters a line, and one statement per line: no `;`, no `a, b = x, y`."""
    long = [number for number, line in enumerate(source(path).splitlines(), 1) if len(line) > 100]
    assert not long, f"{path}: lines over 100 characters: {long}"
    tree = ast.parse(source(path))
    paired = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple)]
    assert not paired, f"{path}: two assignments on one line at {paired}"
    statements = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    assert len(statements) == len(set(statements)), f"{path}: two statements on one line"


@pytest.mark.parametrize("path", BUDGETS)
def test_parallel_modes_differ_only_within_budget(path):
    changed = changed_lines(path)
    assert len(changed) <= BUDGETS[path], "\n".join(changed)


def test_data_parallel_adds_the_wrapper_and_nothing_else():
    added = "\n".join(line for line in changed_lines("data_parallel/train.py")
                      if line.startswith("+"))
    assert "nn.DataParallel(AutocastForward(raw_model, cfg)" in added
    for unrelated in ("dist.", "DistributedSampler", "optimizer", "evaluate(", "loss"):
        assert unrelated not in added, unrelated


def test_the_ddp_diff_shows_the_sampler_and_its_set_epoch():
    """What DDP adds to the data path is in single_gpu -> dist_parallel's added lines, where a
    reader of the diff sees it; and no window's sums are read by position there."""
    added = [line for line in changed_lines("dist_parallel/train.py") if line.startswith("+")]
    for call in ("DistributedSampler(", ".sampler.set_epoch(epoch)"):
        assert any(call in line and not line.lstrip("+ ").startswith("#") for line in added), call
    assert not re.search(r"(totals|values)\[\d*:", code_only("dist_parallel/train.py"))


def test_fsdp_is_dist_parallel_with_fully_shard_in_place_of_ddp():
    changed = changed_lines("fsdp/train.py", base="dist_parallel/train.py")
    assert len(changed) <= FSDP_AGAINST_DIST, "\n".join(changed)
    added = "\n".join(line for line in changed if line.startswith("+"))
    assert "fully_shard(raw_model" in added and "DDP(" not in added
    for unrelated in ("loss", "DistributedSampler", "init_process_group"):
        assert unrelated not in added, unrelated
    # FSDP2's lesson: SGD after sharding
    said = [line for line in added.splitlines() if "optimizer" in line]
    assert said == \
        ["+    optimizer = build_optimizer(raw_model, cfg, device)  # after "
         "sharding: SGD holds each slice"]


def test_no_mode_flags_in_the_shared_code():
    shared = [p.relative_to(REPO).as_posix() for p in (REPO / "common").glob("*.py")]
    for path in ["single_gpu/train.py", "data_parallel/train.py", *shared]:
        text = (REPO / path).read_text()
        assert not re.search(r"if\s+(ddp|distributed|is_distributed)\b", text), path


def test_no_module_in_common_imports_most_of_its_siblings():
    modules = sorted(p.stem for p in (REPO / "common").glob("*.py") if p.stem != "__init__")
    for name in modules:
        imported = set(re.findall(r"^\s*from common\.(\w+) import", source(f"common/{name}.py"),
                                  flags=re.M))
        assert len(imported) <= (len(modules) - 1) // 2, (name, sorted(imported))
