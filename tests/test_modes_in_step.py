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
    "local_rank = launch.local_rank",  # LOCAL_RANK, else RANK modulo the node's GPUs (a pod)
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
                  "gather_by_rank", "prepare", "main"]
# Changed lines of code (added + removed) against single_gpu/train.py, measured when set, with a
# little room: only a guard against drift. dist_parallel's are every step of DDP above, each with
# its comment, the node's first compile, each rank's own log window gathered for TensorBoard's
# rank/<r>/ tags, each rank's one record for results.json (its peak memory, compile wait and
# --profile_steps split) gathered once; fsdp's are those with fully_shard
# in place of DDP, its evaluation's equal number of forward passes, the gathered weights, its
# compile with static shapes, its convolution weights stored (out, kh, kw, in) under
# --channels_last, and the FSDP2 construction: built on the meta device, sharded, materialised,
# filled from rank 0.
BUDGETS = {"data_parallel/train.py": 32, "dist_parallel/train.py": 152, "fsdp/train.py": 215}
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


# A process-group file's lines that are there only so that a failure, a signal or a bad launch
# ends cleanly, or to measure the run, or for `python train.py` to start its own workers: each says
# so where its comment begins, in one of three words a student learns to skip on a first read.
MARK = re.compile(r"#\s*(robustness|telemetry|convenience):")
# What only a marked line may call: the guards, votes and measurements around the lesson
GUARDED = ["CheckedLaunch(", "with launch:", "gather_by_rank(", "exit_together_if_rank0_refused(",
           "compile_leader(", "verify_sync(", "tell_self_launch_stopped(", "raise_group_failure(",
           "self_launch(", "signals.vote()", "StopSignals.agreed(", "until_any_rank_stopped(",
           "run.rank_record()", "LoaderWorkerDied as"]
# The lesson: lines of code (not comments) added to single_gpu/train.py and not marked, measured
# when set, with a little room. dist_parallel's are DDP's steps as its tutorial shows them; fsdp's
# are those with FSDP2's construction, its evaluation's equal forward passes and gathered weights.
LESSON = {"dist_parallel/train.py": 53, "fsdp/train.py": 93}


def marked_lines(path: str) -> set[int]:
    """The numbers of a file's lines that are marked: a line whose comment begins with a mark,
    every line of its statement, and of its block where it opens one that is not a `with` (whose
    body is the lesson it guards); a comment line alone that begins with one marks the statement
    below it in the same way."""
    lines = source(path).splitlines()
    statements = {}
    for node in ast.walk(ast.parse(source(path))):
        if isinstance(node, (ast.stmt, ast.ExceptHandler)):
            whole = not isinstance(node, (ast.With, ast.Try))
            end = node.end_lineno if whole else node.lineno
            statements.setdefault(node.lineno, end)
    marked = set()
    for number, line in enumerate(lines, 1):
        if not MARK.search(line):
            continue
        if line.lstrip().startswith("#"):  # a comment alone: it marks the statement below
            number = next(n for n in range(number + 1, len(lines) + 1)
                          if not lines[n - 1].lstrip().startswith("#"))
        start = max((n for n in statements if n <= number), default=number)
        marked |= set(range(start, max(statements.get(start, number), number) + 1))
    return marked


def lesson_lines(path: str) -> list[str]:
    """The lines of code a process-group file adds to single_gpu/train.py after its imports, the
    marked ones left out: what a student reads on a first read of the diff."""
    base, other = source("single_gpu/train.py").splitlines(), source(path).splitlines()
    marked = marked_lines(path)
    added = []
    for tag, _, _, start, end in difflib.SequenceMatcher(None, base, other,
                                                         autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            added += [f"{n + 1}: {other[n]}" for n in range(start, end) if n + 1 not in marked]
    config = next(n for n, line in enumerate(other, 1)
                  if line.startswith("# -") and line.endswith(" config"))
    code = [line for line in added if line.split(": ", 1)[1].strip()
            and not line.split(": ", 1)[1].lstrip().startswith("#")]
    return [line for line in code if int(line.split(":")[0]) > config]  # after the imports


@pytest.mark.parametrize("path", LESSON)
def test_each_guard_line_says_what_it_is_there_for(path):
    """Every call of the guards, votes and measurements sits on a marked line; every comment that
    begins with one lowercase word and a colon begins with one of the three marks."""
    marked = marked_lines(path)
    lines = source(path).splitlines()
    unmarked = [f"{n}: {line}" for n, line in enumerate(lines, 1) if n not in marked
                and any(call in line.split("#")[0] for call in GUARDED)]
    assert not unmarked, "\n".join(unmarked)
    docstring_end = ast.parse(source(path)).body[0].end_lineno
    words = {match for line in lines[docstring_end:]
             for match in re.findall(r"#\s*([a-z_]+):", line)}
    assert words == {"robustness", "telemetry", "convenience"}


@pytest.mark.parametrize("path", LESSON)
def test_the_lesson_is_short_once_the_marked_lines_are_skipped(path):
    lesson = lesson_lines(path)
    assert len(lesson) <= LESSON[path], "\n".join(lesson)


def test_marked_lines_cover_statements_and_blocks_but_not_a_with_body():
    marked = marked_lines("dist_parallel/train.py")
    lines = source("dist_parallel/train.py").splitlines()
    number = {line.strip(): n for n, line in enumerate(lines, 1)}
    assert number["tell_self_launch_stopped(run.step, path)"] in marked  # an if's block
    assert number["raise_group_failure(error, dist.get_rank(), run.step + 1)"] in marked  # except
    init = next(n for n, line in enumerate(lines, 1) if "dist.init_process_group(" in line)
    assert init not in marked  # the lesson inside `with launch:`
    gather = next(n for n, line in enumerate(lines, 1) if "def gather_by_rank" in line)
    assert {gather, gather + 1, gather + 2} <= marked  # a comment alone above a def marks it all


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
