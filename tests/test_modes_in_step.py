"""The four train.py files stay in step: the same sections in the same order, and the parallel ones differ from
single_gpu/train.py only by a bounded number of lines (the module docstrings, which must differ, are left out)."""
from __future__ import annotations

import ast
import difflib
import re

import pytest

from conftest import REPO

SECTIONS = ["imports", "config", "setup", "data", "model", "optimizer", "train / evaluate", "main loop", "teardown"]
# Changed lines (added + removed) of code against single_gpu/train.py, as measured when the budgets were set, with
# a little room. A file that drifts past its budget fails here. dist_parallel was 111 before checkpoints and
# preemption, which add what only a process group needs: ranks voting to stop at the same window, resuming through
# rank 0, naming a dead peer's failure (134), and 146 with workers that die with their launcher, the run folder
# claimed through rank 0, the self-launch told of a clean stop and a dead DataLoader worker ending its rank alone;
# data_parallel was 19, and 24 with autocast inside the replicas' forward and the refusal of --compile on several GPUs.
# dist_parallel came down to 141 when its log window and evaluation moved to common/distributed.py for fsdp to share;
# fsdp was 154: dist_parallel's lines with fully_shard in place of DDP, the weights kept NCHW (FSDP2 shards contiguous
# parameters only), and the weights gathered before they are saved.
BUDGETS = {"data_parallel/train.py": 25, "dist_parallel/train.py": 145, "fsdp/train.py": 160}


def code_lines(path: str) -> list[str]:
    source = (REPO / path).read_text()
    docstring_end = ast.parse(source).body[0].end_lineno
    return source.splitlines()[docstring_end:]


def changed_lines(other: str, base: str = "single_gpu/train.py") -> list[str]:
    diff = difflib.unified_diff(code_lines(base), code_lines(other), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.parametrize("path", ["single_gpu/train.py", *BUDGETS])
def test_sections_in_the_same_order(path):
    headers = re.findall(r"^\s*# -{20,} (.+)$", (REPO / path).read_text(), flags=re.M)
    assert headers == SECTIONS


@pytest.mark.parametrize("path", BUDGETS)
def test_parallel_modes_differ_only_within_budget(path):
    changed = changed_lines(path)
    assert len(changed) <= BUDGETS[path], "\n".join(changed)


def test_data_parallel_adds_the_wrapper_and_nothing_else():
    added = "\n".join(line for line in changed_lines("data_parallel/train.py") if line.startswith("+"))
    assert "nn.DataParallel(AutocastForward(raw_model, cfg)" in added
    for unrelated in ("dist.", "DistributedSampler", "optimizer", "evaluate(", "loss"):
        assert unrelated not in added, unrelated


def test_fsdp_is_dist_parallel_with_fully_shard_in_place_of_ddp():
    """What fsdp shares with dist_parallel (the process group, launches, evaluation, stopping) is the same code:
    the two files differ only where one shards and the other replicates (59 lines when this was written)."""
    changed = changed_lines("fsdp/train.py", base="dist_parallel/train.py")
    assert len(changed) <= 65, "\n".join(changed)
    added = "\n".join(line for line in changed if line.startswith("+"))
    assert "fully_shard(raw_model" in added and "DDP(" not in added
    for unrelated in ("optimizer", "evaluate(", "loss", "DistributedSampler", "init_group"):
        assert unrelated not in added, unrelated


def test_no_mode_flags_in_the_shared_code():
    for path in ["single_gpu/train.py", "data_parallel/train.py", *(p.relative_to(REPO).as_posix()
                                                                    for p in (REPO / "common").glob("*.py"))]:
        text = (REPO / path).read_text()
        assert not re.search(r"if\s+(ddp|distributed|is_distributed)\b", text), path
