# shellcheck shell=bash
# The steps of benchmarks/fast_path.sh (its rows) and benchmarks/gpu_check.sh (its parts), each a
# job of its own process group, so that whatever stops a script stops everything it started. Sourced
# by both scripts; tests/test_benchmark_scripts.py drives these functions with small CPU commands.
#
#   job_run LIMIT_S COMMAND...   COMMAND as a job in its own process group; its exit status, 124 if
#                                it was stopped at LIMIT_S seconds (0: no limit). Whatever it leaves
#                                in its group when it ends is killed, and gone when job_run returns.
#   job_stop                     SIGTERM to the running job's whole group, then SIGKILL to what is
#                                left of it after JOB_GRACE_S seconds (default 20), until it is gone
#
# A script sources this file and stops its job on the way out, however it ends:
#   trap job_stop EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP
# Ctrl-C, a `kill`, `timeout` and a closed terminal then reach the job through the script: a
# training run checkpoints and exits at its next step on SIGTERM, and one that cannot within the
# grace (in the middle of a compile of minutes, say) is killed with all its processes. Without its
# own group a job would get `timeout`'s signal directly, outlive the script that ended at once, and
# run on, unseen, on the GPU. The script must outlast the grace for that: give `timeout` a
# --kill-after longer than JOB_GRACE_S.

JOB=            # the running job's process group (the pid of its first process); empty between jobs
WATCHDOG=       # the process group of the job's time limit, if it has one
JOB_GRACE_S=${JOB_GRACE_S:-20}

job_run() {
    local limit=$1 started=${EPOCHREALTIME//[!0-9]/} code took  # microseconds (bash 5)
    shift
    set -m  # job control, for the moment of the start: the job is put in a process group of its own
    "$@" &
    JOB=$!
    if [ "$limit" -gt 0 ]; then
        job_watchdog "$JOB" "$limit" &
        WATCHDOG=$!
    fi
    set +m  # and off again, so that the script's own commands stay in its group (Ctrl-C reaches it)
    wait "$JOB" 2>/dev/null  # (the shell's own "Killed" line left out: the caller says what ended)
    code=$?
    took=$((${EPOCHREALTIME//[!0-9]/} - started))  # its own time, before its leftovers are killed
    job_end_watchdog
    job_kill "$JOB"  # what the job left running in its group
    JOB="" WATCHDOG=""
    if [ "$limit" -gt 0 ] && [ "$took" -ge $((limit * 1000000)) ]; then
        return 124  # as `timeout` says it (SECONDS, in whole seconds, could say so early)
    fi
    return "$code"
}

job_watchdog() {  # job_watchdog GROUP LIMIT_S: stop the group once LIMIT_S seconds have passed
    sleep "$2"
    job_term "$1"
}

job_running() {  # job_running GROUP: whether a process of the group still runs (a zombie does not)
    local stat line fields
    for stat in /proc/[0-9]*/stat; do
        { read -r line < "$stat"; } 2>/dev/null || continue  # a process that just ended
        read -ra fields <<< "${line##*) }"  # after the command's name: state, ppid, process group
        [ "${fields[2]}" = "$1" ] && [ "${fields[0]}" != Z ] && return 0
    done
    return 1
}

job_gone() {  # job_gone GROUP TENTHS: back once none of the group runs, or after TENTHS tenths of s
    local tenths=0
    while job_running "$1" && [ "$tenths" -lt "$2" ]; do
        sleep 0.1
        tenths=$((tenths + 1))
    done
}

job_term() {  # job_term GROUP: SIGTERM to the group, then job_kill after JOB_GRACE_S at most
    kill -TERM -- "-$1" 2>/dev/null
    job_gone "$1" $((JOB_GRACE_S * 10))
    job_kill "$1"
}

job_kill() {  # job_kill GROUP: SIGKILL to the group, and back once none of it runs (at most 10 s)
    kill -KILL -- "-$1" 2>/dev/null
    job_gone "$1" 100  # a process ends some time after its SIGKILL, once it is scheduled to
}

job_end_watchdog() {
    [ -n "$WATCHDOG" ] || return 0
    kill -KILL -- "-$WATCHDOG" 2>/dev/null
    wait "$WATCHDOG" 2>/dev/null
    WATCHDOG=
}

job_stop() {
    job_end_watchdog
    [ -n "$JOB" ] || return 0
    job_term "$JOB"
    wait "$JOB" 2>/dev/null  # its end, told here rather than by the shell as "Killed"
    JOB="" WATCHDOG=""
}
