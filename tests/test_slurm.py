"""slurm/*.sbatch run as SLURM runs them, on the CPU, with stand-in
`srun`, `scontrol` and `scancel`.

What these tests prove, each script run by bash from a copy in a spool folder (as sbatch does),
with the SLURM variables a job has and stand-ins first on PATH (srun starts its command once per
"node", in parallel, all on this host; scontrol names 127.0.0.1 as every node; scancel --signal
passes the signal to what srun started):

- both scripts are valid bash (shellcheck: tests/test_shell.py), and avoid the known mistakes
  of the public scripts: no job array, no world size from SLURM_NTASKS (torchrun computes
  it), no file:// rendezvous, no --local_rank; one task per node, c10d rendezvous on the
  first host of SLURM_JOB_NODELIST, --requeue, --open-mode=append, the run named after
  SLURM_JOB_ID and started with --resume auto;
- what the log says, with a stand-in for the interpreter (no training): the job's name names
  no mode and git ignores its log; the first line names the mode and counts in words ("1 node
  x 1 GPU"); a rendezvous host that does not resolve is refused in one line before any srun;
  after SIGTERM to every process of the job (scancel, preemption, scontrol requeue) the last
  line says what follows, requeued by SLURM or not, and never claims "not requeued"; after a
  step that fails by itself it does;
- the single-node script trains one job of 2 gloo workers (GPUS_PER_NODE=2) into
  $LOG_DIR/slurm-<job id>, as fsdp (MODE=fsdp; the multi-node test runs dist_parallel, the
  default); a MODE that is neither is refused;
- the multi-node script's launch line makes two torchrun agents ("nodes") one job of world size 2,
  with the rendezvous port it derives from the job id; USR1 to the batch shell (what
  --signal=B:USR1@120 sends before the time limit) makes every rank stop at a log window with a
  checkpoint, no process left, and the job requeue itself (scontrol requeue); the requeued job (same
  id) resumes that checkpoint and finishes; a finished run is not trained again (train.py says
  so); a job submitted from outside the repository is refused with one line, and so is the script
  run by bash outside SLURM;
- a requeued job whose run a stop left at its last log window (its evaluation and results owed)
  finishes it: evaluated, results.json written, the job's last line "finished"; a finished run
  whose TRAIN_ARGS raise --epochs is extended by the job (the script used to say "nothing to
  do"); "finished" is said of results.json that the step wrote, or beside a step that succeeded,
  never of an earlier one beside a step that failed.

.ci/slurm_cluster.sh runs both scripts under a real SLURM cluster (two slurmd on one host, CPUs
only): sbatch accepts the #SBATCH lines, both jobs train and finish, and `scontrol requeue` brings
the multi-node job back with the same id, its log appended, resuming from its checkpoint, each
attempt's last line saying what happened.

What only a real SLURM cluster with GPUs can show, and neither these tests nor that one do:

- sbatch on the site's version: --gpus-per-node needs SLURM >= 19.05 (--gres=gpu:N before), that
  SLURM_GPUS_ON_NODE and SRUN_CPUS_PER_TASK behave as assumed there, and GPU binding per task.
- Signal delivery: that USR1 reaches the batch shell 120-180 s before the limit, that scancel
  --signal=TERM reaches the agents on every node (and, with proctrack/cgroup, the workers directly:
  harmless, they stop the same way), that a real window plus checkpoint fits in
  TORCH_ELASTIC_SHUTDOWN_TIMEOUT, and what preemption does: SLURM signals srun too, which kills its
  tasks, so the checkpoint written then is not proven here.
- Several hosts: host names that resolve between nodes (RDZV_HOST, the workers' MASTER_ADDR being
  the first agent's host name), a file system shared by all nodes, firewalls between them.
- NCCL: over NVLink within a node and InfiniBand/RoCE between nodes
  (NCCL_SOCKET_IFNAME, NCCL_IB_HCA), its all-reduce across nodes, and its timeouts;
  here the workers use gloo over loopback.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY, read_results, train_in_process

pytestmark = pytest.mark.second_tier  # the longest scenarios: `python -m pytest -q -m second_tier`

SCRIPTS = {"single": REPO / "slurm" / "single_node.sbatch",
           "multi": REPO / "slurm" / "multi_node.sbatch"}
TRAIN_ARGS = " ".join([*TINY, "--backend", "gloo"])

# ---------------------------------------------------------------------------------------- stand-ins
# Each records its arguments in $STANDIN_LOG/<name>.calls, one call a line.
SRUN = r"""#!/bin/bash
# stand-in srun: the command once per task (--ntasks, default one per node of the job), in
# parallel, on this host
echo "$*" >> "$STANDIN_LOG/srun.calls"
ntasks="$SLURM_JOB_NUM_NODES"
while [[ "$1" == -* ]]; do
    case "$1" in --ntasks=*) ntasks="${1#--ntasks=}" ;; esac
    shift
done
pids=()
for ((task = 0; task < ntasks; task++)); do
    SLURM_NODEID=$task SLURM_PROCID=$task SLURM_LOCALID=0 SLURM_STEP_ID=0 "$@" &
    pids+=($!)
done
printf '%s\n' "${pids[@]}" > "$STANDIN_LOG/srun.pids"
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
"""
SCONTROL = r"""#!/bin/bash
# stand-in scontrol: every node of the job is this host; requeue is only recorded
echo "$*" >> "$STANDIN_LOG/scontrol.calls"
if [[ "$1 $2" == "show hostnames" ]]; then
    for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do echo 127.0.0.1; done
fi
"""
SCANCEL = r"""#!/bin/bash
# stand-in scancel --signal=SIG JOB: the signal to the tasks srun started (the job steps), not to
# the batch shell
echo "$*" >> "$STANDIN_LOG/scancel.calls"
[[ "$1" == --signal=* ]] && xargs kill -s "${1#--signal=}" < "$STANDIN_LOG/srun.pids"
"""


def free_rdzv_port() -> int:
    """A free port the multi-node script's default would choose (29500 + job id % 1000)."""
    for port in range(29500, 30500):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 29500-30499")


def make_job(tmp_path: Path, script: str, nodes: int, gpus_per_node: int, job_id: str,
             extra_args: str = ""):
    """A job's world: stand-ins on PATH, the script copied to a spool folder, the SLURM
    variables. Returns (command, env, log_dir): `command` runs the copy with bash from the
    spool folder, as slurmd does."""
    bin_dir, spool, call_logs = tmp_path / "bin", tmp_path / "spool", tmp_path / "calls"
    for folder in (bin_dir, spool, call_logs):
        folder.mkdir(exist_ok=True)
    for name, text in {"srun": SRUN, "scontrol": SCONTROL, "scancel": SCANCEL}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    shutil.copy(SCRIPTS[script], spool / "slurm_script")
    log_dir = tmp_path / "runs"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "SRUN_"))}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "STANDIN_LOG": str(call_logs),
        "SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": f"node[0-{nodes - 1}]", "SLURM_SUBMIT_DIR": str(REPO),
        "SLURM_CPUS_PER_TASK": "1", "GPUS_PER_NODE": str(gpus_per_node),
        "TRAIN_ARGS": f"{TRAIN_ARGS} {extra_args}".strip(), "LOG_DIR": str(log_dir),
        "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return ["bash", str(spool / "slurm_script")], env, log_dir


def calls(tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / "calls" / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


def run_job(command, env, cwd, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text` (torchrun starts each
    worker in a session of its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if text in (entry / "cmdline").read_bytes().decode(errors="replace") and state != "Z":
                found.append(int(entry.name))
        except (ValueError, OSError, IndexError):
            continue
    return found


def stand_in_python(folder: Path, body: str) -> str:
    """A stand-in for PYTHON, the interpreter the launch line runs, whose `body` replaces
    training: for tests of the script's own lines, which need no run."""
    path = folder / "bin" / "python"
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return str(path)


def code_lines(script: Path) -> list[str]:
    """What bash and sbatch read: #SBATCH lines and commands, without comments."""
    lines = []
    for line in script.read_text().splitlines():
        line = line.strip()
        if line.startswith("#SBATCH"):
            lines.append(line)
        elif line and not line.startswith("#"):
            lines.append(line.split("  #")[0])
    return lines


# ---------------------------------------------------------------------------------------- 1. static
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_are_valid_bash(script):
    done = subprocess.run(["bash", "-n", str(SCRIPTS[script])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_avoid_the_known_mistakes(script):
    code = "\n".join(code_lines(SCRIPTS[script]))
    for wrong in ("--array", "SLURM_NTASKS", "SLURM_NPROCS", "WORLD_SIZE", "file://",
                  "--local_rank", "/tmp"):
        assert wrong not in code, wrong
    for needed in ("#SBATCH --ntasks-per-node=1", "#SBATCH --signal=B:USR1@120",
                   "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --output=%x-%j.out",
                   "--resume auto", 'RUN_NAME="${RUN_NAME:-slurm-$SLURM_JOB_ID}"',
                   "-m torch.distributed.run", 'scontrol requeue "$SLURM_JOB_ID"',
                   # torchrun passes USR1 on (train.py's stop with a
                   # checkpoint) instead of dying of it
                   'PET_SIGNALS_TO_HANDLE="${PET_SIGNALS_TO_HANDLE:-SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1}"'):
        assert needed in code, needed
    if script == "multi":
        for needed in ('scontrol show hostnames "$SLURM_JOB_NODELIST"', '--nnodes "$NODES"',
                       '--rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint '
                       '"$RDZV_HOST:$RDZV_PORT"'):
            assert needed in code, needed
        assert "--node_rank" not in code  # c10d gives each node its rank


def test_a_job_submitted_outside_the_repository_is_refused(tmp_path):
    command, env, _ = make_job(tmp_path, "multi", nodes=2, gpus_per_node=1, job_id="7")
    done = run_job(command, {**env, "SLURM_SUBMIT_DIR": str(tmp_path)}, cwd=tmp_path, timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "submit from its root" in done.stderr and not calls(tmp_path, "srun")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_run_outside_slurm_says_how_to_submit_it(tmp_path, script):
    """`bash slurm/single_node.sbatch` on a machine, no SLURM job around it: one line that says
    to submit it with sbatch (it used to stop at "SLURM_JOB_ID: unbound variable")."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    done = run_job(["bash", str(SCRIPTS[script])], env, cwd=REPO, timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert done.stderr.startswith("error: SLURM_JOB_ID is not set")
    assert f"sbatch {SCRIPTS[script].relative_to(REPO)}" in done.stderr and not done.stdout


def test_a_mode_without_a_process_group_is_refused(tmp_path):
    command, env, _ = make_job(tmp_path, "single", nodes=1, gpus_per_node=2, job_id="8")
    done = run_job(command, {**env, "MODE": "data_parallel"}, cwd=tmp_path / "spool", timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert ("MODE=dist_parallel" in done.stderr and "MODE=fsdp" in done.stderr
            and not calls(tmp_path, "srun"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_job_name_is_the_same_for_every_mode(script):
    """An #SBATCH line cannot read MODE, so the job's name (and its log's,
    <job name>-<job id>.out) names no mode; the log's first line does (next test)."""
    names = [line for line in code_lines(SCRIPTS[script]) if line.startswith("#SBATCH --job-name=")]
    assert len(names) == 1, names
    for mode_word in ("ddp", "fsdp", "dist", "parallel"):
        assert mode_word not in names[0].lower(), names[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_first_line_names_the_mode_and_counts_in_words(tmp_path, script):
    """"1 node x 1 GPU", "2 nodes x 2 GPUs", and the mode: the line a reader checks first."""
    sizes = [(1, 1), (2, 2)] if script == "multi" else [(1, 1), (1, 2)]
    first_lines = {}
    for nodes, gpus in sizes:
        job = tmp_path / f"{nodes}x{gpus}"
        job.mkdir()
        command, env, _ = make_job(job, script, nodes=nodes, gpus_per_node=gpus, job_id="41")
        env.update(PYTHON=stand_in_python(job, "exit 0"), MODE="fsdp")
        done = run_job(command, env, cwd=job, timeout=30)
        first_lines[nodes, gpus] = done.stdout.splitlines()[0]
    assert "job 41 (restart 0): fsdp, 1 node x 1 GPU," in first_lines[1, 1], first_lines
    two = "2 nodes x 2 GPUs," if script == "multi" else "1 node x 2 GPUs,"
    assert f"fsdp, {two}" in first_lines[sizes[1]], first_lines


def test_a_rendezvous_host_that_does_not_resolve_is_refused(tmp_path):
    """torchrun would retry an unknown host for minutes: the script says so in one line, before
    any srun."""
    command, env, log_dir = make_job(tmp_path, "multi", nodes=2, gpus_per_node=1, job_id="61")
    env.update(PYTHON=stand_in_python(tmp_path, "exit 1"), RDZV_HOST="no-such-node.invalid")
    done = run_job(command, env, cwd=tmp_path, timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and "no-such-node.invalid" in done.stderr
    assert "set RDZV_HOST" in done.stderr and not done.stdout, done.stdout + done.stderr
    assert not calls(tmp_path, "srun") and not log_dir.exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_last_line_says_what_follows_a_sigterm_and_a_crash(tmp_path, script):
    """SIGTERM to every process of the job while the step runs (what scancel, a preemption and
    scontrol requeue do): SLURM may requeue the job itself, so the last line does not say "not
    requeued"; it says where the run continues in either case. A step that fails by itself is a
    crash: not requeued."""
    nodes = 2 if script == "multi" else 1
    command, env, _ = make_job(tmp_path, script, nodes=nodes, gpus_per_node=1, job_id="51")
    env["PYTHON"] = stand_in_python(tmp_path, "exec sleep 60")
    env["RUN_NAME"] = "run 51"  # a name a shell would split: the command to paste quotes it
    out = tmp_path / "job.out"
    with out.open("w") as stdout:
        batch = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "calls" / "srun.pids").exists():  # the step has started
            assert batch.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.02)
        os.killpg(batch.pid, signal.SIGTERM)  # the batch shell, srun and the tasks
        batch.wait(timeout=30)
    finally:
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
            batch.wait()
    last = out.read_text().splitlines()[-1]
    assert batch.returncode != 0 and "SIGTERM" in last, out.read_text()
    assert "not requeued" not in last and "from its last checkpoint" in last, last
    assert f"RUN_NAME=run\\ 51 sbatch {SCRIPTS[script].relative_to(REPO)}" in last, last

    env["PYTHON"] = stand_in_python(tmp_path, "exit 1")
    crashed = run_job(command, env, cwd=tmp_path, timeout=30)
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    assert crashed.stderr.splitlines()[-1].endswith("status 1 before finishing; not requeued")


def test_the_job_logs_are_ignored_by_git():
    """sbatch writes <job name>-<job id>.out in the folder it was run from: the repository's
    root."""
    name, = {line.split("=", 1)[1] for script in SCRIPTS.values() for line in code_lines(script)
             if line.startswith("#SBATCH --job-name=")}
    done = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", f"{name}-1234.out"],
        capture_output=True, text=True)
    assert done.returncode == 0, f"{name}-1234.out is not ignored: {done.stdout}{done.stderr}"


# -------------------------------------------------------------------------------------- 2. one node
def test_the_single_node_script_trains_one_job_of_two_workers(tmp_path):
    """GPUS_PER_NODE=2 on one "node", MODE=fsdp with channels_last batches: torchrun --standalone
    starts 2 fsdp workers, one job of world size 2."""
    command, env, log_dir = make_job(tmp_path, "single", nodes=1, gpus_per_node=2, job_id="31")
    # --channels_last, the GPU default: FSDP2 shards contiguous
    # parameters only, so the weights stay NCHW
    done = run_job(command, {**env, "MODE": "fsdp", "TRAIN_ARGS": f"{TRAIN_ARGS} --channels_last"},
                   cwd=tmp_path / "spool")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run {log_dir}/slurm-31" in done.stdout  # where the script says the run goes
    results = read_results(log_dir / "slurm-31")
    assert (results["world_size"] == 2 and results["mode"] == "fsdp"
            and results["config"]["channels_last"])
    srun, = calls(tmp_path, "srun")
    assert "--ntasks=1" in srun and "--standalone" in srun and "--nproc_per_node 2" in srun
    assert "/fsdp/train.py" in srun
    assert not calls(tmp_path, "scontrol")


# ------------------------------------------------------------------------------------- 3. two nodes
def test_the_multi_node_script_checkpoints_before_the_time_limit_requeues_and_resumes(tmp_path):
    """Two "nodes" of one GPU (a CPU process) each. Attempt 1 gets USR1 once training has started
    (what SLURM sends the batch shell 120 s before the time limit): every rank stops with a
    checkpoint and the job requeues itself. Attempt 2, the requeued job (same id), resumes from that
    checkpoint and finishes. Attempt 3 finds the run ended: train.py says so and writes nothing."""
    port = free_rdzv_port()
    # so the script's default port, 29500 + job id % 1000, is a free one
    job_id = str(100000 + port - 29500)
    # 32 steps of 32 images; the signal comes after the first log window (step 4)
    command, env, log_dir = make_job(tmp_path, "multi", nodes=2, gpus_per_node=1, job_id=job_id,
                                     extra_args="--synthetic_size 1024")
    run_dir, out = log_dir / f"slurm-{job_id}", tmp_path / "attempt1.out"
    with out.open("w") as stdout:
        batch = subprocess.Popen(command, cwd=tmp_path / "spool", env=env, stdout=stdout,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Epoch 1/1 [4/32]" not in out.read_text():
            assert batch.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        os.kill(batch.pid, signal.SIGUSR1)
        batch.wait(timeout=120)
    finally:  # on a failure here: nothing of this job left running
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
            batch.wait()
            for pid in processes_naming(str(log_dir)):  # the workers, in sessions of their own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    first = out.read_text()
    assert f"rendezvous 127.0.0.1:{port}" in first and f"run {run_dir}" in first
    assert "batch 32 (32 steps an epoch)" in first  # the global batch, over the job's two ranks
    assert "stopped by SIGTERM" in first and f"requeueing job {job_id}" in first, first
    assert calls(tmp_path, "scancel") == [f"--signal=TERM {job_id}"]
    assert calls(tmp_path, "scontrol")[-1] == f"requeue {job_id}"
    deadline = time.monotonic() + 10
    # the agents and the workers: every process of the job has ended
    while processes_naming(str(log_dir)):
        assert time.monotonic() < deadline, f"processes left: {processes_naming(str(log_dir))}"
        time.sleep(0.05)
    step = torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]["step"]
    assert 4 < step < 32 and not (run_dir / "results.json").exists()

    second = run_job(command, {**env, "SLURM_RESTART_COUNT": "1"}, cwd=tmp_path / "spool")
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resumed at step {step}" in second.stdout and "(restart 1)" in second.stdout
    results = read_results(run_dir)
    assert results["world_size"] == 2 and results["summary"]["step"] == 32
    assert second.stdout.count("results in") == 1  # only global rank 0 writes
    # a finished job is not requeued
    assert calls(tmp_path, "scontrol").count(f"requeue {job_id}") == 1
    srun = calls(tmp_path, "srun")
    assert len(srun) == 2 and all("--ntasks=2 --ntasks-per-node=1" in line for line in srun)

    before = (run_dir / "results.json").read_bytes()
    third = run_job(command, env, cwd=tmp_path / "spool")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "this run has ended" in third.stdout and "finished:" in third.stdout.splitlines()[-1]
    assert (run_dir / "results.json").read_bytes() == before  # trained nothing, wrote nothing


# ----------------------------------------------------------------- 4. a run's end, and past it
def test_the_requeued_job_finishes_a_run_whose_end_a_stop_left_owed(tmp_path):
    """Job 71's run stopped by SIGTERM at its last log window (single_gpu, the attempt before the
    requeue: its checkpoint leaves the evaluation and results owed). The requeued job (restart 1)
    evaluates the run and writes results.json and best.pt, and its last line says finished
    (train.py used to say "this run has ended" and exit 0, and the job ended "before finishing;
    not requeued", with no results ever)."""
    command, env, log_dir = make_job(tmp_path, "single", nodes=1, gpus_per_node=1, job_id="71")
    run_dir = log_dir / "slurm-71"
    stopped = train_in_process("single_gpu/train.py", *TINY, "--log_dir", log_dir, "--run_name",
                               run_dir.name, sigterm_at=8)
    assert stopped.returncode == 143, stopped.stdout + stopped.stderr
    job = run_job(command, {**env, "SLURM_RESTART_COUNT": "1"}, cwd=tmp_path / "spool")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "resumed at step 8" in job.stdout and "Epoch 1/1 test loss" in job.stdout, job.stdout
    assert job.stdout.splitlines()[-1].endswith(f"finished: {run_dir / 'results.json'}")
    results = read_results(run_dir)
    assert results["summary"]["step"] == 8 and results["summary"]["best_epoch"] == 1
    assert (run_dir / "best.pt").exists()


def test_a_job_whose_train_args_raise_epochs_extends_a_finished_run(tmp_path):
    """Job 72's run has finished (one epoch, results.json written); submitted again with --epochs 2
    in TRAIN_ARGS, the job trains the second epoch, as train.py extends a run (the script used to
    say "finished already: nothing to do" without launching it)."""
    command, env, log_dir = make_job(tmp_path, "single", nodes=1, gpus_per_node=1, job_id="72")
    run_dir = log_dir / "slurm-72"
    finished = train_in_process("single_gpu/train.py", *TINY, "--log_dir", log_dir, "--run_name",
                                run_dir.name)
    assert finished.returncode == 0 and (run_dir / "results.json").exists(), finished.stderr
    extended = run_job(command, {**env, "TRAIN_ARGS": f"{TRAIN_ARGS} --epochs 2"},
                       cwd=tmp_path / "spool")
    assert extended.returncode == 0, extended.stdout + extended.stderr
    assert "--epochs 1 made 2, the rate's schedule with it" in extended.stdout, extended.stdout
    results = read_results(run_dir)
    assert results["summary"]["step"] == 16 and results["config"]["epochs"] == 2
    assert extended.stdout.splitlines()[-1].endswith(f"finished: {run_dir / 'results.json'}")


def test_finished_means_results_that_this_step_wrote_or_a_step_that_succeeded(tmp_path):
    """With a stand-in for the interpreter: a step that fails (exit 1) beside the results.json of
    an earlier finish (a run extended, then crashed) did not finish, and says so; a step whose
    torchrun exits 1 after writing results.json (a stop that reached it as the run wrote them)
    finished the run, and the job ends with status 0."""
    command, env, log_dir = make_job(tmp_path, "single", nodes=1, gpus_per_node=1, job_id="73")
    results = log_dir / "slurm-73" / "results.json"
    results.parent.mkdir(parents=True)
    results.write_text("{}")
    env["PYTHON"] = stand_in_python(tmp_path, "exit 1")
    crashed = run_job(command, env, cwd=tmp_path, timeout=30)
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    assert crashed.stderr.splitlines()[-1].endswith("status 1 before finishing; not requeued")
    env["PYTHON"] = stand_in_python(tmp_path, f"echo '{{}}' > '{results}'; exit 1")
    written = run_job(command, env, cwd=tmp_path, timeout=30)
    assert written.returncode == 0, written.stdout + written.stderr
    assert written.stdout.splitlines()[-1].endswith(f"finished: {results}")
