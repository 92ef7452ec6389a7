""".vscode/launch.json: every debug configuration names a script or module that exists, and its
flags parse with that script's own parser, its get_args (so a renamed flag fails here, not in
someone's debugger); the dist_parallel one, torchrun with one worker, is run once as VS Code
would start it (less the debugger)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from torch.distributed.run import get_args_parser

from conftest import REPO, read_results

# plain JSON
CONFIGURATIONS = json.loads((REPO / ".vscode" / "launch.json").read_text())["configurations"]


def resolved(value: str) -> str:
    value = value.replace("${workspaceFolder}", str(REPO))
    assert "${" not in value, f"a VS Code variable the test does not know: {value}"
    return value


def command(configuration: dict) -> tuple[list[str], str, list[str]]:
    """(the launcher's own arguments, the train.py it runs, that script's flags). A `module`
    configuration is torchrun (torch.distributed.run), whose arguments end at the script's path."""
    args = [resolved(arg) for arg in configuration.get("args", [])]
    if "program" in configuration:
        return [], resolved(configuration["program"]), args
    script = next(i for i, arg in enumerate(args) if arg.endswith("train.py"))
    return args[:script], args[script], args[script + 1:]


def script_module(path: str):
    """A train.py imported (nothing runs at import time) under a name of its own."""
    name = f"launch_json_{os.path.basename(os.path.dirname(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configurations_are_debugpy_launches_with_unique_names():
    names = [c["name"] for c in CONFIGURATIONS]
    assert len(set(names)) == len(names) >= 3
    for configuration in CONFIGURATIONS:
        assert (configuration["type"], configuration["request"]) == ("debugpy", "launch")
        assert resolved(configuration["cwd"]) == str(REPO)
        assert ("program" in configuration) != ("module" in configuration)


@pytest.mark.parametrize("configuration", CONFIGURATIONS, ids=[c["name"] for c in CONFIGURATIONS])
def test_configuration_runs_an_existing_script_with_flags_it_accepts(configuration):
    launcher_args, script, flags = command(configuration)
    assert os.path.isfile(script), script
    cfg = script_module(script).get_args(flags)  # the script's own parser
    # tiny, re-runnable
    assert cfg.dataset == "synthetic" and cfg.depth == 8 and cfg.overwrite and cfg.run_name
    if "module" in configuration:
        assert configuration["module"] == "torch.distributed.run"
        assert importlib.util.find_spec(configuration["module"]) is not None
        torchrun = get_args_parser().parse_args([*launcher_args, script, *flags])
        assert (torchrun.standalone, torchrun.nproc_per_node, torchrun.training_script) == \
            (True, "1", script)
        # debugpy follows torchrun to the worker it starts
        assert configuration["subProcess"] is True


def test_the_dist_parallel_configuration_starts_and_finishes(tmp_path):
    configuration = next(c for c in CONFIGURATIONS if c.get("module") == "torch.distributed.run")
    launcher_args, script, flags = command(configuration)
    env = {**os.environ, **configuration.get("env", {}), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}  # a core of its own: the suite runs a file per core
    done = subprocess.run([sys.executable, "-m", configuration["module"], *launcher_args, script,
                           # into tmp_path, not runs/; short
                           *flags, "--log_dir", str(tmp_path), "--max_steps", "4"],
                          cwd=resolved(configuration["cwd"]), env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = read_results(tmp_path / script_module(script).get_args(flags).run_name)
    assert results["mode"] == "dist_parallel" and results["world_size"] == 1
