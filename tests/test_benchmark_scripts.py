"""The GPU scripts' orchestration on the CPU: benchmarks/jobs.sh's steps in process groups of their
own, benchmarks/fast_path.sh keeping every finished row and leaving nothing running when it is
stopped, benchmarks/gpu_check.sh's plan first, its files under OUT, its refusals and its stop.

What the scripts measure needs a GPU (BENCHMARKS.md). Here the scripts run as a user runs them,
with `python` on PATH a stand-in (STAND_IN) that answers their CUDA check yes, names a GPU and
plays the runs: a train.py or fast.py row writes a results.json of made-up figures (the table's
code is the real one, its figures are no measurement), and the run named in SLOW ignores SIGTERM,
as a run in the middle of a compile of minutes does, with a child that ignores it too. Everything
else, the fast-path table among it, is the real python."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, running

STAND_IN = f'''#!{sys.executable}
import json, os, signal, subprocess, sys, time
args = sys.argv[1:]
if args[:1] == ["-c"] and "cuda.is_available" in args[1]:
    sys.exit(0)
if args[:1] == ["-c"] and "get_device_name" in args[1]:
    sys.exit(print("a stand-in GPU"))
script = next((a for a in args if a.endswith(".py")), "")
name = args[args.index("--run_name") + 1] if "--run_name" in args else os.path.basename(script)
if script.endswith("compare.py"):
    name = "compare" if "--verify" not in args else \
        "verify_deterministic" if "--deterministic" in args else "verify"
if script.endswith(("train.py", "fast.py", "compare.py")):
    if name in os.environ.get("SLOW", "").split():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        with open(os.environ["PIDS"], "a") as pids:
            pids.write(f"{{os.getpid()}} {{child.pid}}\\n")
        print(name, "runs and ignores SIGTERM", flush=True)
        time.sleep(600)
    if script.endswith(("train.py", "fast.py")):
        run = os.path.join(args[args.index("--log_dir") + 1], name)
        os.makedirs(run, exist_ok=True)
        summary = dict(images_per_sec=100.0, mfu=None, first_step_s=None, peak_mem_gb=None,
                       batch_time_p50=0.01, batch_time_p90=0.01, data_wait_frac=0.0)
        gpus = [os.environ["STAND_IN_GPU"]] if "STAND_IN_GPU" in os.environ else []
        with open(os.path.join(run, "results.json"), "w") as results:
            json.dump(dict(summary=summary, env=dict(gpus=gpus, torch="-", cuda=None),
                           config=dict(amp="off", width_multiple=1, batch_size=256)), results)
        if "--compile_cache" in args:  # a compiled graph, where inductor keeps one
            graph = os.path.join(args[args.index("--compile_cache") + 1], "fxgraph", "ab", "key")
            os.makedirs(graph, exist_ok=True)
            open(os.path.join(graph, "entry"), "w").close()
        if "--memory_snapshot" in args and not os.environ.get("NO_SNAPSHOT"):
            import pickle  # the allocator's format: one 2 MiB segment, half of it allocated
            block = dict(size=2 ** 20, requested_size=2 ** 20, frames=[])
            segment = dict(total_size=2 ** 21, stream=0, blocks=[
                {{**block, "state": "active_allocated"}}, {{**block, "state": "inactive"}}])
            event = dict(addr=0, size=2 ** 20, stream=0, frames=[])
            snapshot = dict(segments=[segment], device_traces=[[
                {{**event, "action": "alloc"}}, {{**event, "action": "free_completed"}}]])
            with open(os.path.join(run, "memory_snapshot.pickle"), "wb") as file:
                pickle.dump(snapshot, file)
    if name in os.environ.get("FAIL", "").split():
        sys.exit(print(name, "fails") or 3)
    if script.endswith("compare.py"):  # the lines of its report that gpu_check.sh reads
        out = args[args.index("--out") + 1]
        os.makedirs(out, exist_ok=True)
        report = "verify.md" if "--verify" in args else "report.md"
        print(f"the stand-in of {{name}} writes {{report}}")
        with open(os.path.join(out, report), "w") as file:
            file.write(f"`python compare.py` - 4 runs in 2 min 10 s: a stand-in of {{name}}\\n\\n"
                       "| check | verdict |\\n|---|---|\\n| 1 | pass |\\n\\n"
                       "passed: all 1 checks\\n")
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *args])
'''
GRACE_S = 1  # JOB_GRACE_S: fast_path.sh's rows, and gpu_check.sh's parts 10 s more


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> dict:
    """The environment that puts the stand-in first on PATH."""
    folder = tmp_path_factory.mktemp("bin")
    (folder / "python").write_text(STAND_IN)
    (folder / "python").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "JOB_GRACE_S": str(GRACE_S)}


def group_members(group: int) -> list[int]:
    """The running processes of a process group."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def start(argv: list[str], env: dict) -> subprocess.Popen:
    """A script started as from a terminal of its own: it leads its process group, which a
    `timeout` signals whole."""
    return subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(pids: Path, script: subprocess.Popen, seconds: float = 120) -> list[int]:
    """The slow run's pids, once it has written them."""
    deadline = time.monotonic() + seconds
    while not (pids.exists() and pids.read_text().strip()):
        assert script.poll() is None, script.stdout.read()
        assert time.monotonic() < deadline, "the slow run never started"
        time.sleep(0.1)
    return [int(pid) for pid in pids.read_text().split()]


def stop(script: subprocess.Popen, seconds: float = 60) -> tuple[int, str]:
    """SIGTERM to the script's whole process group, as `timeout` and a terminal's Ctrl-C send
    it: the exit status and the output. A script that has not ended after `seconds` (its jobs
    sleep for minutes, deaf to SIGTERM) fails the test."""
    os.killpg(script.pid, signal.SIGTERM)
    output, _ = script.communicate(timeout=seconds)
    return script.returncode, output


def time_out(timeout: subprocess.Popen, seconds: float = 60) -> tuple[int, str]:
    """The limit of `timeout` reached now (its alarm): it sends SIGTERM to the script and its
    process group. The exit status and the output. A script that has not ended after `seconds`
    fails the test with what still runs of its session (each process with its group and state),
    then is killed whole."""
    os.kill(timeout.pid, signal.SIGALRM)
    try:
        output, _ = timeout.communicate(timeout=seconds)
    except subprocess.TimeoutExpired as late:
        left = subprocess.run(["ps", "-o", "pid,pgid,stat,args", "--sid", str(timeout.pid)],
                              capture_output=True, text=True).stdout
        for group in {int(line.split()[1]) for line in left.splitlines()[1:]}:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.killpg(group, signal.SIGKILL)
        timeout.communicate()
        pytest.fail(f"still running {seconds} s after timeout's alarm:\n{left}\n{late.output}")
    return timeout.returncode, output


# ----------------------------------------------------------------------------------------- jobs.sh
def jobs(script: str, env=None) -> subprocess.CompletedProcess:
    """A bash script that has sourced benchmarks/jobs.sh, as the benchmark scripts do."""
    return subprocess.run(["bash", "-c", f". benchmarks/jobs.sh\n{script}"], cwd=REPO, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})


def test_a_job_runs_in_a_process_group_of_its_own_and_says_how_it_ended():
    done = jobs('job_run 0 bash -c \'echo "$$ $(ps -o pgid= $$)"; exit 3\'; echo "status $?"\n'
                'echo "script $(ps -o pgid= $$)"')
    job, job_group, _, status, _, script_group = done.stdout.split()
    assert job == job_group and job_group != script_group and status == "3", done.stdout


def test_a_job_past_its_limit_is_stopped_and_its_group_killed():
    """A job that ignores SIGTERM, with a child: both gone once the limit and the grace are
    past, and the status is timeout's 124."""
    done = jobs("SECONDS=0; job_run 1 bash -c 'trap \"\" TERM; sleep 300 & echo $!; sleep 300'\n"
                'echo "status $? after $SECONDS s"', env={"JOB_GRACE_S": "1"})
    child, _, status, _, seconds, _ = done.stdout.split()
    # its limit and its grace waited for: no sooner (jobs() stops a hang)
    assert status == "124" and int(seconds) >= 2, done.stdout + done.stderr
    assert not running(int(child))


def test_a_job_that_ends_before_its_limit_is_not_said_to_have_reached_it():
    """Half a second under a 1 s limit, five times: bash's SECONDS (whole seconds) read 1 for
    about half of such jobs, which job_run then reported as stopped at its limit."""
    done = jobs("for _ in 1 2 3 4 5; do job_run 1 sleep 0.5; echo $?; done")
    assert done.stdout.split() == ["0"] * 5, done.stdout + done.stderr


def test_a_stop_ends_the_running_job_with_everything_in_its_group(tmp_path):
    """The trap the scripts set: SIGTERM to the script reaches the job (which ignores it) and
    its child through job_stop, SIGKILL after the grace."""
    pids = tmp_path / "pids"
    script = start(["bash", "-c", ". benchmarks/jobs.sh\ntrap job_stop EXIT\ntrap 'exit 143' TERM\n"
                    f"job_run 0 bash -c 'trap \"\" TERM; sleep 300 & echo $$ $! > {pids}; "
                    "sleep 300'"], {**os.environ, "JOB_GRACE_S": "1"})
    members = wait_for(pids, script, 30)
    code, output = stop(script)
    assert code == 143, output
    assert not any(running(pid) for pid in members) and not group_members(members[0])


# ------------------------------------------------------------------------------------ fast_path.sh
def test_fast_path_stopped_midway_keeps_its_finished_rows_and_leaves_nothing_running(tmp_path,
                                                                                     stand_in):
    """`timeout 60 bash benchmarks/fast_path.sh` was seen to leave its training running, and the
    table was written only after the last row: a limit reached in the warm compile lost the cold
    compile's row. Here the second row hangs deaf to SIGTERM, and `timeout` stops the script."""
    out, pids = tmp_path / "fast_path", tmp_path / "pids"
    env = {**stand_in, "ROWS": "fast unaligned", "SLOW": "unaligned", "PIDS": str(pids)}
    script = start(["timeout", "600", "bash", "benchmarks/fast_path.sh", str(out)], env)
    members = wait_for(pids, script)
    table = (out / "summary.txt").read_text()
    assert "| fast | 100 |" in table and "| unaligned |" not in table  # the first row, at once
    code, output = time_out(script)
    assert code == 124, output  # timeout's own status: it stopped the script
    assert not any(running(pid) for pid in members), output
    assert not group_members(members[0])
    assert "| fast | 100 |" in (out / "summary.txt").read_text()


def test_fast_path_names_a_row_stopped_at_its_limit(tmp_path, stand_in):
    out, pids = tmp_path / "fast_path", tmp_path / "pids"
    env = {**stand_in, "ROWS": "unaligned", "SLOW": "unaligned", "PIDS": str(pids),
           "ROW_TIMEOUT": "2"}
    done = subprocess.run(["bash", "benchmarks/fast_path.sh", str(out)], cwd=REPO, env=env,
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "unaligned: stopped after ROW_TIMEOUT=2 s" in done.stdout
    assert "failed: unaligned" in (out / "summary.txt").read_text()
    assert not any(running(int(pid)) for pid in pids.read_text().split())


def test_fast_path_refuses_a_kept_compile_cache_that_would_make_compiled_cold_warm(tmp_path,
                                                                                   stand_in):
    """COMPILE_CACHE keeps the compiled rows' cache for a later call's compiled_warm; a cold row on
    a cache that holds files already would not be cold: refused in one line, nothing written."""
    out, cache = tmp_path / "fast_path", tmp_path / "cache"
    (cache / "fxgraph").mkdir(parents=True)
    env = {**stand_in, "ROWS": "fast compiled_cold", "COMPILE_CACHE": str(cache)}
    done = subprocess.run(["bash", "benchmarks/fast_path.sh", str(out)], cwd=REPO, env=env,
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert f"error: COMPILE_CACHE {cache} already holds files" in done.stderr
    assert not out.exists()
    done = subprocess.run(["bash", "benchmarks/fast_path.sh", str(out)], cwd=REPO, text=True,
                          env={**env, "ROWS": "compiled_warm"}, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr  # the warm row reads it, and keeps it
    assert "| compiled_warm | 100 |" in done.stdout and (cache / "fxgraph").is_dir()


def test_fast_path_computes_a_rows_bound_once_and_keeps_it_beside_the_runs(tmp_path, stand_in):
    """The table is written after every row; each row's roofline bound took torch's import and
    a recorded step (about 13 s a row on the GPU machine). A bound kept in OUT/.bounds.json is
    read, not computed: here one made up for the stand-in's GPU, which no table of peaks
    knows, so that only the kept bound can give the table its lines and shares."""
    out = tmp_path / "fast_path"
    out.mkdir()
    # the GPU, whether fast.py ran it, then model, depth, alpha, block, width_multiple,
    # align_channels, dataset, amp and batch_size as the stand-in's results.json holds them
    key = json.dumps(["a kept GPU", False, None, None, None, None, 1, None, None, "off", 256])
    bound = {"peak_tflops": 1, "bandwidth_tbs": 2, "kernel_us": 3, "lines": ["a kept bound"],
             "op_by_op_images_per_sec": 400.0, "training_fused_images_per_sec": 200.0}
    (out / ".bounds.json").write_text(json.dumps({key: bound}))
    env = {**stand_in, "ROWS": "fast unaligned", "STAND_IN_GPU": "a kept GPU"}
    done = subprocess.run(["bash", "benchmarks/fast_path.sh", str(out)], cwd=REPO, env=env,
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    table = (out / "summary.txt").read_text()
    assert "\n  a kept bound\n" in table
    assert "| fast | 100 | 1.000 | 10.0 | 10.0 | 0.00 | - | - | 25.0 | 50.0 | - |" in table
    assert json.loads((out / ".bounds.json").read_text()) == {key: bound}


# ------------------------------------------------------------------------------------ gpu_check.sh
PLAN_ROW = re.compile(r"^  (\w+) +(\d+\.\d) +(\d+\.\d|-)  (\S.*)$")


def gpu_check(out: Path, env: dict, **variables) -> subprocess.CompletedProcess:
    """benchmarks/gpu_check.sh run to its end with `variables` (PARTS, CALL, DEADLINE_S, KEEP)."""
    return subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=REPO, text=True,
                          env={**env, **variables}, capture_output=True, timeout=120)


def plan_rows(output: str) -> list[tuple[str, str, str, str]]:
    """The plan's rows, as the check prints them first: part, minutes, ends at, what."""
    lines = output.splitlines()
    assert lines[0].startswith("Plan"), output
    plan = lines[2:next(index for index, line in enumerate(lines) if line.startswith("Call 1 "))]
    return [PLAN_ROW.match(line).groups() for line in plan]


def for_benchmarks(out: Path) -> str:
    """The summary's last section, which the check writes however it ends."""
    return (out / "summary.md").read_text().split("## For BENCHMARKS.md")[1]


def test_gpu_check_prints_its_plan_first_and_keeps_its_files_under_out(tmp_path, stand_in):
    out = tmp_path / "check"
    done = gpu_check(out, stand_in, PARTS="verify compare", KEEP=str(tmp_path / "keep"))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Plan: the minutes predicted on one H200")
    assert lines[0].endswith("DEADLINE_S=540")
    rows = plan_rows(done.stdout)
    assert [name for name, *_ in rows] == ["start", "compare", "verify"]  # the script's order
    ends = 0.0
    for _, minutes, ends_at, _ in rows:  # each part ends its minutes after the one before it
        ends += float(minutes)
        assert float(ends_at) == pytest.approx(ends) and float(minutes) > 0
    first_part = next(index for index, line in enumerate(lines) if line.startswith("== "))
    assert lines[first_part].startswith("== compare")  # the plan before any part
    assert 'this call: PARTS="verify compare"' in "\n".join(lines[:first_part])
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU check")
    assert summary.index("## Plan") < summary.index("- compare")
    assert re.search(r"^- compare: ok in \d+ s \(predicted 2\.3 min\): `python compare.py --out "
                     r"\S+ --run_timeout \d+`$", summary, re.MULTILINE)
    assert re.search(r"^- verify: ok in .*`python compare.py --verify --modes single_gpu "
                     r"data_parallel dist_parallel fsdp --backends nccl .* --run_timeout \d+ .*, "
                     r"and beside it the same with --deterministic`$", summary, re.MULTILINE)
    # at most 8 files straight under OUT, none one or two folders down, the rest packed
    assert sorted(path.name for path in out.iterdir()) == [
        "compare_report.md", "environment.txt", "gpu_check.log", "logs.tar.gz", "summary.md",
        "verify.md", "work"]
    assert not [path for path in [*out.glob("*/*"), *out.glob("*/*/*")] if not path.is_dir()]
    assert "Plan: the minutes" in (out / "gpu_check.log").read_text()
    assert "a stand-in GPU" in summary  # the device, named once the plan is out
    assert "a stand-in GPU" in for_benchmarks(out) and "\ncommit " in for_benchmarks(out)
    listed = subprocess.run(["tar", "tzf", out / "logs.tar.gz"], capture_output=True, text=True)
    assert {"./logs/compare.log", "./logs/verify.log"} <= set(listed.stdout.split())


def test_gpu_check_runs_both_verifications_side_by_side_and_gives_both_verdicts(tmp_path,
                                                                               stand_in):
    """One part starts `--verify` and `--verify --deterministic` together, each in a folder of
    its own, each line of its output marked with its run; verify.md and the lines for
    BENCHMARKS.md give both verdicts, with compare's wall time."""
    out = tmp_path / "check"
    done = gpu_check(out, stand_in, PARTS="compare verify", KEEP=str(tmp_path / "keep"))
    assert done.returncode == 0, done.stdout + done.stderr
    log = (out / "work" / "parts" / "logs" / "verify.log").read_text().splitlines()
    assert sorted(log) == ["[deterministic] the stand-in of verify_deterministic writes verify.md",
                           "[verify] the stand-in of verify writes verify.md"]
    assert (out / "work" / "parts" / "verify" / "verify.md").is_file()
    assert (out / "work" / "parts" / "verify_deterministic" / "verify.md").is_file()
    verify = (out / "verify.md").read_text()
    assert verify.index("## compare.py --verify\n") < verify.index(
        "## compare.py --verify --deterministic\n")
    assert verify.count("passed: all 1 checks") == 2
    tail = for_benchmarks(out)
    assert "compare: `python compare.py` - 4 runs in 2 min 10 s" in tail
    assert "--verify: passed: all 1 checks\n--verify: 4 runs in 2 min 10 s" in tail
    assert "--verify --deterministic: passed: all 1 checks" in tail


def test_gpu_check_names_the_verify_part_failed_when_one_of_its_runs_fails(tmp_path, stand_in):
    """--deterministic fails (exit 3) while the plain run passes: the part fails with the failed
    run's status, and the plain run's verdict is kept."""
    out = tmp_path / "check"
    done = gpu_check(out, stand_in, PARTS="verify", FAIL="verify_deterministic",
                     KEEP=str(tmp_path / "keep"))
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (out / "summary.md").read_text()
    assert re.search(r"^- verify: FAILED \(exit 3\) in", summary, re.MULTILINE)
    assert "FAILED: verify" in summary
    assert "[deterministic] verify_deterministic fails" in done.stdout
    assert "--verify: passed: all 1 checks" in for_benchmarks(out)


def test_gpu_check_skips_a_part_that_would_end_past_its_deadline_and_names_it(tmp_path,
                                                                             stand_in):
    """DEADLINE_S=100: compare (2.3 min), verify (3.3) and compiled_cold (2.3) would end past it
    from the start, fast (0.7) would not. The plan marks them, the check skips them, names them
    in the summary and in the lines for BENCHMARKS.md, and leaves them to call 2; a skip is no
    failure."""
    out, keep = tmp_path / "check", tmp_path / "keep"
    done = gpu_check(out, stand_in, CALL="1", DEADLINE_S="100", KEEP=str(keep))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {name: (ends, what) for name, _, ends, what in plan_rows(done.stdout)}
    assert list(rows) == ["start", "compare", "verify", "fast", "compiled_cold"]
    for name in ("compare", "verify", "compiled_cold"):
        assert rows[name][0] == "-" and "past DEADLINE_S" in rows[name][1], rows[name]
    assert rows["fast"][0] == "0.9"  # after the start's 0.2, the skipped parts left out
    summary = (out / "summary.md").read_text()
    for name in ("compare", "verify", "compiled_cold"):
        assert re.search(rf"^- {name}: SKIPPED \(predicted \d\.\d min at \d+ s: past "
                         r"DEADLINE_S=100\): `", summary, re.MULTILINE), summary
        assert f"== {name}: SKIPPED" in done.stdout
    assert re.search(r"^- fast: ok in", summary, re.MULTILINE)
    assert "every part that ran passed" in summary
    assert "skipped, past DEADLINE_S=100: compare verify compiled_cold" in summary
    assert "left for call 2 (CALL=2): compare verify compiled_cold" in summary
    assert "ran fast in" in for_benchmarks(out)
    assert (keep / "call_1.left").read_text().split() == ["compare", "verify", "compiled_cold"]


def test_gpu_check_stopped_packs_what_finished_with_its_lines_for_benchmarks(tmp_path, stand_in):
    """SIGTERM (the lease's `timeout`) in call 1's verify part, whose --deterministic run ignores
    it with a child that does too: the part is stopped whole, both runs and the child gone,
    compare's report and the plain --verify's verdict kept, packed, and the summary ends with
    its lines for BENCHMARKS.md; the parts not run to their end are left to call 2."""
    out, keep, pids = tmp_path / "check", tmp_path / "keep", tmp_path / "pids"
    env = {**stand_in, "CALL": "1", "KEEP": str(keep), "SLOW": "verify_deterministic",
           "PIDS": str(pids)}
    script = start(["bash", "benchmarks/gpu_check.sh", str(out)], env)
    members = wait_for(pids, script)
    deadline = time.monotonic() + 60  # the plain run ends by itself, beside the slow one
    while not (out / "work" / "parts" / "verify" / "verify.md").exists():
        assert time.monotonic() < deadline, "the plain --verify never ended"
        time.sleep(0.1)
    code, output = stop(script)  # within stop()'s 60 s: its parts' grace is JOB_GRACE_S + 5
    assert code == 143, output
    assert not any(running(pid) for pid in members) and not group_members(members[0])
    summary = (out / "summary.md").read_text()
    assert "- compare: ok in" in summary
    assert re.search(r"^- verify: STOPPED by SIGTERM after \d+ s$", summary, re.MULTILINE)
    assert "STOPPED by SIGTERM during verify" in summary
    tail = for_benchmarks(out)
    assert "compare: `python compare.py` - 4 runs in" in tail
    assert "--verify: passed: all 1 checks" in tail and "--deterministic:" not in tail
    assert "(not run to its end: verify fast compiled_cold)" in tail
    listed = subprocess.run(["tar", "tzf", out / "logs.tar.gz"], capture_output=True, text=True)
    assert {"./logs/compare.log", "./logs/verify.log", "./verify/verify.md"} <= set(
        listed.stdout.split())
    assert (keep / "call_1.left").read_text().split() == ["verify", "fast", "compiled_cold"]


def test_gpu_check_plans_each_call_and_call_2_takes_what_call_1_left(tmp_path, stand_in):
    """Call 1's plan names both calls' parts; call 2, on the KEEP call 1 left (its compile cache,
    its fast-path row, the parts it skipped), plans compiled_warm with them in the script's
    order, reads the cache compiled_cold wrote, and its table holds call 1's row too."""
    out1, out2, keep = tmp_path / "call1", tmp_path / "call2", tmp_path / "keep"
    first = gpu_check(out1, stand_in, CALL="1", DEADLINE_S="170", KEEP=str(keep))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Plan of call 1 (CALL=1)" in first.stdout.splitlines()[0]
    assert "Call 1 (CALL=1) holds compare verify fast compiled_cold; call 2 (CALL=2" in first.stdout
    assert (keep / "call_1.left").read_text().split() == ["verify"]  # 3.3 min: past 170 s
    assert (keep / "compile_cache" / "fxgraph" / "ab" / "key" / "entry").is_file()  # kept
    second = gpu_check(out2, stand_in, CALL="2", DEADLINE_S="120", KEEP=str(keep))
    assert second.returncode == 0, second.stdout + second.stderr
    rows = {name: ends for name, _, ends, _ in plan_rows(second.stdout)}
    assert list(rows) == ["start", "verify", "compiled_warm", "memory_snapshot", "tests",
                          "fast_path_rest", "compare_repeat"]
    assert [name for name, ends in rows.items() if ends != "-"] == [
        "start", "compiled_warm", "memory_snapshot"]
    assert "Call 1 left: verify\n" in second.stdout
    assert "compile_cache holds 1 compiled graphs" in second.stdout
    table = (out2 / "fast_path.md").read_text()
    assert "| fast | 100 |" in table and "| compiled_warm | 100 |" in table  # one table, both calls
    assert "| compiled_cold | 100 |" in table
    assert re.search(r"^- compiled_warm: ok in", (out2 / "summary.md").read_text(), re.MULTILINE)


@pytest.mark.parametrize("written", [True, False])
def test_gpu_check_reads_the_memory_snapshot_back_or_fails_the_part(tmp_path, stand_in, written):
    """The memory_snapshot part runs docs/speed.md's fsdp command, its stacks symbolized the fast
    way, then reads its file with torch's own reader (torch.cuda._memory_viz, the real one: only
    train.py is a stand-in here): its segments and events into the summary; no file, and the
    part fails."""
    out = tmp_path / "check"
    env = {**stand_in, **({} if written else {"NO_SNAPSHOT": "1"})}
    done = gpu_check(out, env, PARTS="memory_snapshot", KEEP=str(tmp_path / "keep"))
    summary = (out / "summary.md").read_text()
    assert re.search(r"^- memory_snapshot: ok in .*`env TORCH_SYMBOLIZE_MODE=fast python "
                     r"fsdp/train.py --benchmark --benchmark_steps 5 --memory_snapshot 3 ",
                     summary, re.MULTILINE)
    if written:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "segments: 1\ntotal_reserved: 2.0MiB\ntotal_allocated: 1.0MiB" in summary
        assert "2 events: 1 allocations, 1 frees" in summary
    else:
        assert done.returncode == 1
        assert "FAILED: no snapshot at " in summary and "FAILED: memory_snapshot" in summary


def test_gpu_check_stopped_in_a_fast_path_row_leaves_nothing_running(tmp_path, stand_in):
    """The row is fast_path.sh's, itself a part of gpu_check.sh: the stop goes through both."""
    out, pids = tmp_path / "check", tmp_path / "pids"
    env = {**stand_in, "PARTS": "compare fast compiled_cold", "SLOW": "compiled_cold",
           "PIDS": str(pids), "KEEP": str(tmp_path / "keep")}
    script = start(["bash", "benchmarks/gpu_check.sh", str(out)], env)
    members = wait_for(pids, script)
    code, output = stop(script)
    assert code == 143, output
    assert not any(running(pid) for pid in members) and not group_members(members[0])
    summary = (out / "summary.md").read_text()
    assert "- compare: ok in" in summary and "- fast: ok in" in summary
    assert re.search(r"^- compiled_cold: STOPPED by SIGTERM after \d+ s$", summary, re.MULTILINE)
    assert "| fast | 100 |" in (out / "fast_path.md").read_text()  # its finished row
    assert "| fast | 100 |" in for_benchmarks(out)
    assert "stopped by SIGTERM during compiled_cold" in output


@pytest.mark.parametrize("env, folder_holds, says", [
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None, "error: no CUDA GPU here: gpu_check.sh runs on a GPU "
                                           "machine (the CPU suite is python -m pytest -q)"),
    ({"PARTS": "compare speed"}, None, "error: PARTS names speed, which is no part: choose among "
                                       "compare verify fast compiled_cold"),
    ({"CALL": "3"}, None, "error: CALL is 1 or 2, not 3: 1 holds compare verify fast"),
    ({"CALL": "1", "PARTS": "tests"}, None, "error: give CALL or PARTS, not both"),
    ({"DEADLINE_S": "9m"}, None, "error: DEADLINE_S is whole seconds from the start (0: none), "
                                 "not 9m"),
    ("stand_in", "summary.md", "already holds files: give a new or empty folder"),
])
def test_gpu_check_refuses_in_one_line_before_writing(tmp_path, stand_in, env, folder_holds, says):
    out, keep = tmp_path / "check", tmp_path / "keep"
    if folder_holds:
        out.mkdir()
        (out / folder_holds).write_text("an earlier check")
    base = {**(stand_in if env == "stand_in" else {**os.environ, **env}), "KEEP": str(keep)}
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=REPO, text=True,
                          capture_output=True, timeout=120, env=base)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert says in done.stderr
    assert sorted(p.name for p in out.iterdir()) == [folder_holds] if folder_holds \
        else not out.exists()
    assert not keep.exists()
