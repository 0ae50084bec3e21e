#!/usr/bin/env bash
# examples/iflow-batch.sbatch run by Slurm itself: a one-node cluster of our own (munged,
# slurmctld and slurmd started here as root, every file and socket in a temporary folder, its
# own ports; no systemd, no cgroups: proctrack/linuxproc, task/none) runs the README's recipe,
# a 2-task array and a merge job that depends on it (afterok). The merged result must equal
# the one-machine `iflow-run --batch` result (sorted by id, timings aside) for greedy and seeded
# requests; an array whose tasks fail leaves no part and its merge job never runs. The daemons
# are stopped on exit, whatever happens. Skipped where Slurm is not installed (make deps
# installs munge, slurmctld, slurmd and slurm-client) or not as root (slurmd starts the jobs),
# with a SKIP line saying why (tests/run.sh shows every SKIP line).
. "$(dirname "$0")/lib.sh"
skip() { echo "SKIP $NAME: $*" >&2; echo "$NAME: 0 passed, 0 failed, 1 skipped"; exit 0; }
PATH=$PATH:/usr/sbin:/sbin
for c in munged slurmctld slurmd sbatch squeue scancel; do
    command -v $c >/dev/null || skip "$c not found (make deps installs munge, slurmctld, slurmd, slurm-client)"
done
[ "$(id -u)" = 0 ] || skip "not root (uid $(id -u)): slurmd must run as root to start jobs; run the suite as root to test the Slurm recipe"
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" 2>/dev/null || { bad "convert"; summary; exit 1; }
RUN=$(cd "$BIN" && pwd)/iflow-run
SBATCH=$(pwd)/examples/iflow-batch.sbatch
norm() { jq -c 'del(.ttft_ms, .tokens_per_s)' "$@"; }   # timings differ from run to run

# ---- the cluster: state, logs and the munge socket under $C, two free ports ----
C=$TMP/slurm
mkdir -p "$C/state" "$C/spool" "$C/log" && install -d -m 711 "$C/munge"
head -c 1024 /dev/urandom >"$C/munge/key" && chmod 400 "$C/munge/key"
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=
for _ in 1 2 3 4 5 6 7 8 9 10; do
    p=$((20000 + RANDOM % 20000))
    listening $p || listening $((p + 1)) || { port=$p; break; }
done
[ -n "$port" ] || { bad "no two free ports found"; summary; exit 1; }
export SLURM_CONF=$C/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=iflowtest
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$C/munge/socket
StateSaveLocation=$C/state
SlurmdSpoolDir=$C/spool
SlurmctldPidFile=$C/slurmctld.pid
SlurmdPidFile=$C/slurmd.pid
SlurmctldLogFile=$C/log/slurmctld.log
SlurmdLogFile=$C/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SwitchType=switch/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

pids=()
stop() {   # cancel our jobs, stop the daemons this script started (by their pids), remove $TMP
    if [ ${#pids[@]} -gt 1 ]; then
        scancel --user=root >/dev/null 2>&1
        for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
    fi
    local i pid
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do   # slurmd, slurmctld, then munged
        pid=${pids[i]}
        kill "$pid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap stop EXIT
logs() { tail -n 20 "$C"/log/*.log >&2; }

munged -F -f --socket="$C/munge/socket" --key-file="$C/munge/key" --pid-file="$C/munge/pid" \
    --log-file="$C/log/munged.log" --seed-file="$C/munge/seed" 2>>"$C/log/munged.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$C/munge/socket" ] && break; sleep 0.1; done
slurmctld -D -f "$SLURM_CONF" >/dev/null 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >/dev/null 2>&1 &
pids+=($!)
state=
for _ in $(seq 300); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.1
done
expect_eq "$state" idle "the one-node cluster is up"
[ "$state" = idle ] || { logs; summary; exit 1; }

# 8 requests: greedy and sampled, one with its own id and seed, one with its own id
{
    for i in 1 2 3; do
        echo "{\"prompt\":\"Lily saw a $i\",\"max_tokens\":20,\"temperature\":0}"
        echo "{\"prompt\":\"Tom had $i\",\"max_tokens\":16,\"temperature\":0.9,\"top_p\":0.95}"
    done
    echo '{"id":"own-seed","prompt":"Once upon a time","max_tokens":16,"temperature":1.0,"seed":7}'
    echo '{"id":"own-id","prompt":"One day, a","max_tokens":16,"temperature":0.8}'
} >"$TMP/req.jsonl"
n=$(grep -c . "$TMP/req.jsonl")
$RUN -m "$TMP/s.ifs" --batch --seed 42 -t 1 <"$TMP/req.jsonl" | jq -s -c 'sort_by(.id)[]' | norm >"$TMP/one.jsonl"
expect_eq "$(wc -l <"$TMP/one.jsonl")" "$n" "one machine: a result per request"
expect_eq "$(jq -r 'select(has("error"))' "$TMP/one.jsonl")" "" "no error results"

# ---- the README's recipe: a 2-task array, then a merge job after it (afterok) ----
# (--cpus-per-task overrides the script's 16, more than a CI machine has)
jq -R -n -r --argjson seed 42 -f examples/pin-requests.jq <"$TMP/req.jsonl" >"$TMP/pinned.jsonl"
mkdir -p "$TMP/out"
run env IFLOW_RUN="$RUN" sbatch --parsable --array=0-1 --cpus-per-task=1 \
    --chdir="$TMP" --output="$TMP/task-%a.log" "$SBATCH" "$TMP/s.ifs" "$TMP/pinned.jsonl" out
expect_rc 0 "sbatch the array"
job=$out
run sbatch --parsable --wait --chdir="$TMP" --output="$TMP/merge.log" --dependency=afterok:"$job" \
    --wrap "cat out/part-*.jsonl | jq -s -c 'sort_by(.id)[]' > results.jsonl"
expect_rc 0 "the merge job ran after the array"
[ "$rc" = 0 ] || logs
expect_eq "$(cat "$TMP/task-0.log" "$TMP/task-1.log" "$TMP/merge.log")" "" "nothing on the jobs' output"
expect_eq "$(ls "$TMP/out" | tr '\n' ' ')" "part-0.jsonl part-1.jsonl " "one part per task, no temporaries left"
expect_eq "$(wc -l <"$TMP/out/part-0.jsonl") $(wc -l <"$TMP/out/part-1.jsonl")" "$(( (n + 1) / 2 )) $(( n / 2 ))" "round-robin shards"
expect_eq "$(norm "$TMP/results.jsonl" 2>&1)" "$(cat "$TMP/one.jsonl")" "2-task Slurm array, merged = one machine"
expect_eq "$(jq -r 'select(.id == "own-seed") | .text' "$TMP/results.jsonl" 2>&1)" \
    "$(jq -r 'select(.id == "own-seed") | .text' "$TMP/one.jsonl")" "a request's own seed is kept"

# ---- tasks that fail (no model): no part is left, and the merge job never runs ----
mkdir -p "$TMP/bad"
run env IFLOW_RUN="$RUN" sbatch --parsable --array=0-1 --cpus-per-task=1 --chdir="$TMP" \
    --output="$TMP/bad-%a.log" "$SBATCH" "$TMP/missing.ifs" "$TMP/pinned.jsonl" bad
expect_rc 0 "sbatch the failing array"
job=$out
run sbatch --parsable --wait --kill-on-invalid-dep=yes --chdir="$TMP" --output="$TMP/bad-merge.log" \
    --dependency=afterok:"$job" --wrap "cat bad/part-*.jsonl | jq -s -c 'sort_by(.id)[]' > bad-results.jsonl"
expect_rc 0 "sbatch --wait the merge job"
expect_match "$(scontrol show job "$out" 2>&1)" "JobState=CANCELLED Reason=DependencyNeverSatisfied" "the merge job is cancelled, never run"
expect_match "$(scontrol show job "${job}_0" 2>&1)" "JobState=FAILED Reason=NonZeroExitCode" "a task without its model fails"
expect_match "$(cat "$TMP/bad-0.log")" "missing\.ifs" "a failed task's log names the model"
expect_eq "$(ls "$TMP/bad")" "" "failed tasks leave no part, no temporary"
expect_no_file "$TMP/bad-results.jsonl" "the merge did not run"
expect_no_file "$TMP/bad-merge.log" "the merge job has no output"
expect_eq "$(squeue -h)" "" "no job left in the queue"
summary
