#!/usr/bin/env bash
# CI: slurm/*.sbatch under a real SLURM cluster of two nodes on this host (Debian's slurmctld,
# slurmd and munge).
#   bash .ci/slurm_cluster.sh      (as root: it installs the packages and edits /etc/hosts)
#
# What it checks, on tiny synthetic runs on the CPU (gloo; stand-in GPUs so that --gpus-per-node
# is accepted):
#   - sbatch accepts both scripts' #SBATCH lines, given --cpus-per-task=2 (a node has 2 CPUs),
#     --gpus-per-node (one worker per CPU), --time=10 and --output (into the scratch folder);
#   - single_node.sbatch trains MODE=fsdp with 2 workers on n1 and finishes;
#   - multi_node.sbatch trains dist_parallel on n1 and n2, the rendezvous on n1 (the first name
#     of `scontrol show hostnames`); `scontrol requeue` while it trains stops it, SLURM starts it
#     again with the same id (restart 1, its log appended), and it resumes from its checkpoint and
#     finishes with every step;
#   - each job's first log line, and the last line of each attempt: finished, or stopped by
#     SIGTERM and continued if SLURM requeues it (never "not requeued").
# It stops everything it starts (munged, slurmctld, two slurmd) by pid on exit, whatever the
# outcome, after cancelling the cluster's jobs; it removes the /etc/hosts lines it adds; its files
# are in a scratch folder, removed after a pass and kept after a failure (or with KEEP=1). Where it
# cannot run (not root, no apt-get, packages that do not install) it prints "skipped: ..." and
# exits 0; a failed check prints "FAILED: ..." with the job's log and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$PATH:/usr/sbin:/sbin"  # slurmctld, slurmd and munged live there
started=$SECONDS

skip() { echo "skipped: $*"; exit 0; }

# ---------------------------------------------------------------------------------------- packages
(( EUID == 0 )) || skip "root is needed to install SLURM, run slurmd and edit /etc/hosts"
installed() { local tool; for tool in "$@"; do command -v "$tool" > /dev/null || return 1; done; }
if ! installed slurmctld slurmd sbatch munged mungekey; then
    command -v apt-get > /dev/null ||
        skip "no apt-get here to install slurmctld, slurmd, slurm-client and munge"
    apt_log=$(mktemp)
    if ! { apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
               slurmctld slurmd slurm-client munge; } > "$apt_log" 2>&1; then
        skip "apt-get could not install slurmctld, slurmd, slurm-client and munge:" \
             "$(tail -n 1 "$apt_log")"
    fi
    rm -f "$apt_log"
fi

# ---------------------------------------------------------------------------------------- cleanup
scratch=$(mktemp -d "${TMPDIR:-/tmp}/slurm-cluster.XXXXXX")
chmod 755 "$scratch"  # munged runs as the munge user and must reach its folder in here
daemons=()
hosts_added=()
passed=0
cleanup() {
    local pid line ids kept deadline=$((SECONDS + 60))
    # The jobs first (every job of this cluster is ours): their slurmstepd would outlive slurmd
    while mapfile -t ids < <(squeue -h -o %A 2> /dev/null); (( ${#ids[@]} && SECONDS < deadline ))
    do
        scancel "${ids[@]}" 2> /dev/null || true
        sleep 1
    done
    for pid in "${daemons[@]}"; do kill "$pid" 2> /dev/null || true; done
    for pid in "${daemons[@]}"; do
        while kill -0 "$pid" 2> /dev/null && (( SECONDS < deadline + 10 )); do sleep 0.2; done
        kill -9 "$pid" 2> /dev/null || true
    done
    if (( ${#hosts_added[@]} )); then
        # rewritten in place: /etc/hosts may be a mount point, which cannot be replaced
        kept=$(grep -v -x -F "$(printf '%s\n' "${hosts_added[@]}")" /etc/hosts || true)
        printf '%s\n' "$kept" > /etc/hosts
        for line in "${hosts_added[@]}"; do
            if grep -q -x -F "$line" /etc/hosts; then
                echo "warning: could not remove '$line' from /etc/hosts" >&2
            fi
        done
    fi
    if (( passed )) && [[ -z "${KEEP:-}" ]]; then
        rm -rf "$scratch"
    else
        echo "the cluster's files and logs: $scratch" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {  # fail WHAT [LOG]: the reason, then the log that shows it
    echo "FAILED: $1" >&2
    if [[ -n "${2:-}" && -f "$2" ]]; then
        { echo "---- $2"; cat "$2"; echo "----"; } >&2
    fi
    exit 1
}

# ---------------------------------------------------------------------------------------- cluster
# The node names resolve here: the multi-node script's rendezvous host is the first node's name.
for entry in "127.0.0.1 n1" "127.0.0.2 n2"; do
    if ! getent hosts "${entry#* }" > /dev/null; then
        line="$entry  # slurm_cluster.sh"
        echo "$line" >> /etc/hosts
        hosts_added+=("$line")
    fi
done
read -r ctld_port n1_port n2_port < <(python3 -c '
import socket
sockets = [socket.socket() for _ in range(3)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))')

# munge with its own key and socket, so that it meets no other munged on this host
mkdir -p "$scratch/munge" "$scratch/state"
chown munge:munge "$scratch/munge"
chmod 755 "$scratch/munge"  # the clients reach the socket in it; the key is the munge user's only
as_munge=(setpriv --reuid=munge --regid=munge --clear-groups)  # setpriv executes the command itself
"${as_munge[@]}" mungekey --create --keyfile="$scratch/munge/munge.key"
"${as_munge[@]}" munged --foreground --socket="$scratch/munge/socket" \
    --key-file="$scratch/munge/munge.key" --pid-file="$scratch/munge/munged.pid" \
    --log-file="$scratch/munge/munged.log" --seed-file="$scratch/munge/munged.seed" 2> /dev/null &
daemons+=($!)

export SLURM_CONF="$scratch/slurm.conf"  # the daemons, the clients and the jobs read this one
cat > "$SLURM_CONF" <<EOF
ClusterName=ci
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$scratch/munge/socket
StateSaveLocation=$scratch/state
SlurmdSpoolDir=$scratch/spool-%n
SlurmctldPidFile=$scratch/slurmctld.pid
SlurmdPidFile=$scratch/slurmd-%n.pid
SlurmctldLogFile=$scratch/slurmctld.log
SlurmdLogFile=$scratch/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MinJobAge=600
GresTypes=gpu
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n1_port CPUs=2 Gres=gpu:4
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n2_port CPUs=2 Gres=gpu:4
PartitionName=ci Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
# Four stand-in GPUs a node, so that --gpus-per-node is accepted (the runs train on the CPU):
# slurmd wants a file for each, and nothing opens them
touch "$scratch"/gpu{0..3}
echo "NodeName=n[1-2] Name=gpu File=$scratch/gpu[0-3]" > "$scratch/gres.conf"
cat > "$scratch/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
ConstrainCores=no
ConstrainDevices=no
ConstrainRAMSpace=no
ConstrainSwapSpace=no
EOF

deadline=$((SECONDS + 30))
until [[ -S "$scratch/munge/socket" ]]; do
    (( SECONDS < deadline )) || fail "munged did not start" "$scratch/munge/munged.log"
    sleep 0.2
done
slurmctld -D -c > "$scratch/slurmctld.stdout" 2>&1 &
daemons+=($!)
for node in n1 n2; do
    slurmd -D -N "$node" > "$scratch/slurmd-$node.stdout" 2>&1 &
    daemons+=($!)
done
deadline=$((SECONDS + 60))
until [[ "$(sinfo -h -N -o '%N %T' 2> /dev/null | sort | tr '\n' ' ')" == "n1 idle n2 idle " ]]; do
    (( SECONDS < deadline )) ||
        fail "the nodes did not come up: $(sinfo -N 2>&1 | tr '\n' ' ')" "$scratch/slurmctld.log"
    sleep 0.5
done
echo "cluster up in $((SECONDS - started)) s: n1, n2 ($(sinfo -V))"

# ---------------------------------------------------------------------------------------- helpers
job_field() {  # job_field ID FIELD: one field of `scontrol show job`
    scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

wait_for_end() {  # wait_for_end ID LOG SECONDS: until the job has ended, COMPLETED
    local state deadline=$((SECONDS + $3))
    while true; do
        state=$(job_field "$1" JobState)
        case "$state" in
            COMPLETED) return 0 ;;
            PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUED|RESIZING|SUSPENDED) ;;
            *) fail "job $1 ended $state ($(job_field "$1" Reason)," \
                    "exit $(job_field "$1" ExitCode))" "$2" ;;
        esac
        (( SECONDS < deadline )) || fail "job $1 did not end within $3 s (state $state)" "$2"
        sleep 1
    done
}

last_line() {  # last_line FILE: the last line the batch script wrote (SLURM's own left out)
    grep -v -E '^(slurmstepd(-[^:]*)?|srun): ' "$1" | tail -n 1
}

check_results() {  # check_results RUN_DIR MODE WORLD_SIZE STEPS LOG
    python3 - "$@" <<'PY' || fail "$1/results.json is not what the run should have written" "$5"
import json, sys
run_dir, mode, world_size, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
results = json.load(open(f"{run_dir}/results.json"))
got = (results["mode"], results["world_size"], results["summary"]["step"])
if got != (mode, world_size, steps):
    sys.exit(f"mode, world size, steps: {got}, expected {(mode, world_size, steps)}")
PY
}

# ---------------------------------------------------------------------------------------- jobs
# The tests' tiny model (tests/conftest.py TINY) over gloo; the environment reaches the jobs.
tiny=$(cd tests && python3 -c 'from conftest import TINY; print(" ".join(TINY))')
export LOG_DIR="$scratch/runs" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
PYTHON=$(python3 -c 'import sys; print(sys.executable)')
export PYTHON
submit() {  # submit SCRIPT SBATCH_OPTIONS...: the job's id (its log: $scratch/<name>-<id>.out)
    local script=$1
    shift
    sbatch --parsable --cpus-per-task=2 --time=10 --output="$scratch/%x-%j.out" "$@" "$script" ||
        fail "sbatch refused $script"
}
# 8 steps of 32 images on n1, two fsdp workers
single=$(MODE=fsdp GPUS_PER_NODE=2 TRAIN_ARGS="$tiny --backend gloo" \
         submit slurm/single_node.sbatch --gpus-per-node=2)
# 64 steps on n1 and n2, one worker each, a checkpoint every 4 steps; it starts once n1 is free
multi_args="$tiny --backend gloo --synthetic_size 2048 --checkpoint_interval 4"
multi=$(GPUS_PER_NODE=1 TRAIN_ARGS="$multi_args" submit slurm/multi_node.sbatch --gpus-per-node=1)
job_name=$(job_field "$single" JobName)
single_log="$scratch/$job_name-$single.out"
multi_log="$scratch/$job_name-$multi.out"
echo "submitted: job $single (single_node.sbatch, fsdp), job $multi (multi_node.sbatch," \
     "dist_parallel)"

wait_for_end "$single" "$single_log" 240
grep -q "): fsdp, 1 node x 2 GPUs, run $LOG_DIR/slurm-$single" "$single_log" ||
    fail "job $single: its first line does not say fsdp, 1 node x 2 GPUs" "$single_log"
[[ "$(last_line "$single_log")" == *" finished: $LOG_DIR/slurm-$single/results.json" ]] ||
    fail "job $single: its last line does not say it finished" "$single_log"
check_results "$LOG_DIR/slurm-$single" fsdp 2 8 "$single_log"
echo "job $single: finished, $((SECONDS - started)) s"

# The requeue, once the multi-node run has a checkpoint and before it finishes
deadline=$((SECONDS + 180))
until [[ -f "$LOG_DIR/slurm-$multi/checkpoint.pt" ]]; do
    [[ "$(job_field "$multi" JobState)" =~ ^(PENDING|CONFIGURING|RUNNING)$ ]] ||
        fail "job $multi ended before its first checkpoint" "$multi_log"
    (( SECONDS < deadline )) || fail "job $multi wrote no checkpoint within 180 s" "$multi_log"
    sleep 0.5
done
grep -q "): dist_parallel, 2 nodes x 1 GPU, rendezvous n1:" "$multi_log" ||
    fail "job $multi: its first line does not say dist_parallel, 2 nodes x 1 GPU, rendezvous" \
         "n1" "$multi_log"
scontrol requeue "$multi"
echo "job $multi: scontrol requeue while it trains, $((SECONDS - started)) s"
# SLURM holds a requeued job back for two minutes (its BeginTime): start it once it is pending
deadline=$((SECONDS + 60))
until [[ "$(job_field "$multi" JobState)" == PENDING ]]; do
    (( SECONDS < deadline )) || fail "job $multi is not pending 60 s after the requeue" "$multi_log"
    sleep 0.5
done
scontrol update JobId="$multi" StartTime=now
wait_for_end "$multi" "$multi_log" 300

restart_line=$(grep -n "job $multi (restart 1)" "$multi_log" | cut -d: -f1 | head -n 1)
[[ -n "$restart_line" && "$(job_field "$multi" Restarts)" == 1 ]] ||
    fail "job $multi did not start again once (Restarts=$(job_field "$multi" Restarts))" \
         "$multi_log"
head -n "$((restart_line - 1))" "$multi_log" > "$scratch/attempt1.out"
first_end=$(last_line "$scratch/attempt1.out")
[[ "$first_end" == *"stopped by SIGTERM: if SLURM requeues job $multi"* ]] ||
    fail "job $multi: the requeued attempt's last line is not the SIGTERM line: $first_end" \
         "$multi_log"
tail -n "+$restart_line" "$multi_log" | grep -q "resumed at step" ||
    fail "job $multi: the requeued job did not resume from the checkpoint" "$multi_log"
[[ "$(last_line "$multi_log")" == *" finished: $LOG_DIR/slurm-$multi/results.json" ]] ||
    fail "job $multi: its last line does not say it finished" "$multi_log"
check_results "$LOG_DIR/slurm-$multi" dist_parallel 2 64 "$multi_log"
resumed=$(tail -n "+$restart_line" "$multi_log" | grep -o "resumed at step [0-9]*")
echo "job $multi: $resumed, finished"

passed=1
echo "passed: both sbatch scripts under SLURM $(sinfo -V | cut -d' ' -f2), one requeue," \
     "in $((SECONDS - started)) s"
