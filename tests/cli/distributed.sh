#!/usr/bin/env bash
# A batch spread over several machines (examples/: GNU parallel, a Slurm array job), tested
# here with local workers: the merged result of a 2-way split equals the one-machine result
# (sorted by id, timings aside) for greedy and seeded requests, with and without explicit
# ids and seeds; a naive split (without pin-requests.jq) does not, which is why it exists.
. "$(dirname "$0")/lib.sh"
command -v parallel >/dev/null || { bad "GNU parallel is missing (make deps installs it)"; summary; exit 1; }
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" 2>/dev/null || { bad "convert"; summary; exit 1; }
RUN=$(cd "$BIN" && pwd)/iflow-run
norm() { jq -c 'del(.ttft_ms, .tokens_per_s)' "$@"; }   # timings differ from run to run

# 12 requests: greedy and sampled, some with their own id or seed, a blank line, a bad line
{
    for i in 1 2 3 4 5 6; do
        echo "{\"prompt\":\"Lily saw a $i\",\"max_tokens\":20,\"temperature\":0}"
        echo "{\"prompt\":\"Tom had $i\",\"max_tokens\":16,\"temperature\":0.9,\"top_p\":0.95}"
    done
    echo
    echo '{"id":"own-seed","prompt":"Once upon a time","max_tokens":16,"temperature":1.0,"seed":7}'
    echo '{"id":"own-id","prompt":"One day, a","max_tokens":16,"temperature":0.8}'
    echo '{"prompt":"Anna and","max_tokens":12,"min_p":0.05,"temperature":1.1}'
} >"$TMP/req.jsonl"
n=$(grep -c . "$TMP/req.jsonl")

$RUN -m "$TMP/s.ifs" --batch --seed 42 -t 1 <"$TMP/req.jsonl" | jq -s -c 'sort_by(.id)[]' | norm >"$TMP/one.jsonl"
expect_eq "$(wc -l <"$TMP/one.jsonl")" "$n" "one machine: a result per request"
expect_eq "$(jq -r 'select(has("error"))' "$TMP/one.jsonl")" "" "no error results"

# ---- GNU parallel, 2 local workers, 2 blocks (60% of the input, then the rest) ----
jq -R -n -r --argjson seed 42 -f examples/pin-requests.jq <"$TMP/req.jsonl" >"$TMP/pinned.jsonl"
size=$(wc -c <"$TMP/pinned.jsonl")   # parallel cuts the pinned requests
run bash -c "IFLOW_RUN='$RUN' IFLOW_RUN_ARGS='-t 1' IFLOW_WORKERS='2/:' IFLOW_BLOCK=$((size * 6 / 10)) \
    IFLOW_PARALLEL_ARGS='--joblog $TMP/jobs.log' examples/batch-parallel.sh '$TMP/s.ifs' 42 <'$TMP/req.jsonl'"
expect_rc 0 "batch-parallel.sh"
expect_eq "$(($(wc -l <"$TMP/jobs.log") - 1))" 2 "parallel ran 2 jobs"
expect_eq "$(norm <<<"$out")" "$(cat "$TMP/one.jsonl")" "2-way split with GNU parallel = one machine"
expect_eq "$(jq -r 'select(.id == "own-seed") | .text' <<<"$out")" \
    "$(jq -r 'select(.id == "own-seed") | .text' "$TMP/one.jsonl")" "a request's own seed is kept"

# the same split without pinning: seeds and ids restart in the second shard
half=$(( (n + 1) / 2 ))
parallel --will-cite --pipe -N "$half" -j 2 "$RUN -m '$TMP/s.ifs' --batch --seed 42 -t 1" <"$TMP/req.jsonl" |
    jq -s -c 'sort_by(.id)[]' | norm >"$TMP/naive.jsonl"
[ "$(cat "$TMP/naive.jsonl")" != "$(cat "$TMP/one.jsonl")" ] && ok || bad "a naive split should differ (ids and seeds restart)"
# ... while its greedy requests with their own ids would not: the rule is about defaults only
expect_eq "$(jq -c 'select(.id == "own-seed")' "$TMP/naive.jsonl")" "$(jq -c 'select(.id == "own-seed")' "$TMP/one.jsonl")" \
    "a request with its own id and seed is the same in any split"

# ---- the Slurm array script, its two tasks run here with Slurm's environment ----
run bash -n examples/iflow-batch.sbatch
expect_rc 0 "bash -n iflow-batch.sbatch"
expect_eq "$(wc -l <"$TMP/pinned.jsonl")" "$n" "pinned: one line per request"
mkdir -p "$TMP/out"
for task in 0 1; do
    run env SLURM_ARRAY_TASK_COUNT=2 SLURM_ARRAY_TASK_ID=$task SLURM_ARRAY_TASK_MIN=0 SLURM_CPUS_PER_TASK=1 IFLOW_RUN="$RUN" \
        bash examples/iflow-batch.sbatch "$TMP/s.ifs" "$TMP/pinned.jsonl" "$TMP/out"
    expect_rc 0 "array task $task"
done
expect_eq "$(ls "$TMP/out" | tr '\n' ' ')" "part-0.jsonl part-1.jsonl " "one part per task, no temporaries left"
expect_eq "$(wc -l <"$TMP/out/part-0.jsonl") $(wc -l <"$TMP/out/part-1.jsonl")" "$(( (n + 1) / 2 )) $(( n / 2 ))" "round-robin shards"
expect_eq "$(cat "$TMP"/out/part-*.jsonl | jq -s -c 'sort_by(.id)[]' | norm)" "$(cat "$TMP/one.jsonl")" \
    "2-way Slurm array = one machine"
run env -u SLURM_ARRAY_TASK_COUNT bash examples/iflow-batch.sbatch "$TMP/s.ifs" "$TMP/pinned.jsonl" "$TMP/out"
expect_rc 1 "outside an array job"
expect_match "$err" "not in a Slurm array job" "says why"
summary
