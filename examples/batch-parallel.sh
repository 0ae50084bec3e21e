#!/usr/bin/env bash
# batch-parallel.sh -- one iflow-run --batch spread over several machines with GNU parallel.
#
#   examples/batch-parallel.sh MODEL SEED < requests.jsonl > results.jsonl
#
# 1. pin: every request gets the id and seed one machine would give it (pin-requests.jq), so
#    the split changes no result; 2. split: parallel --pipe cuts the input into blocks of whole
#    lines and runs `iflow-run --batch` on each, on the workers; 3. merge: the results, sorted
#    by id. The output equals `iflow-run -m MODEL --batch --seed SEED < requests.jsonl` sorted by
#    id, but for the timing fields (ttft_ms, tokens_per_s).
#
# Environment:
#   IFLOW_WORKERS        parallel's --sshlogin list (default ":", this machine), e.g.
#                        "1/gpu1,1/gpu2" (one job at a time on each); every worker needs
#                        iflow-run and MODEL at the same path (or add --basefile MODEL below)
#   IFLOW_BLOCK          bytes of requests per job (parallel --block; default 1M): make it about
#                        the input's size / (workers x 4) so that every worker stays busy
#   IFLOW_RUN            iflow-run on the workers (default: the one in their PATH)
#   IFLOW_RUN_ARGS       more iflow-run options ("--parallel 32 --device cuda -t 16")
#   IFLOW_PARALLEL_ARGS  more GNU parallel options ("--joblog jobs.log", "--retries 2")
set -euo pipefail
model=${1:?usage: batch-parallel.sh MODEL SEED < requests.jsonl > results.jsonl}
seed=${2:?usage: batch-parallel.sh MODEL SEED < requests.jsonl > results.jsonl}
here=$(cd "$(dirname "$0")" && pwd)
cmd="${IFLOW_RUN:-iflow-run} -m $(printf %q "$model") --batch ${IFLOW_RUN_ARGS:-}"
# shellcheck disable=SC2086 # IFLOW_PARALLEL_ARGS is a list of options
jq -R -n -r --argjson seed "$seed" -f "$here/pin-requests.jq" |
    parallel --will-cite --pipe --block "${IFLOW_BLOCK:-1M}" -S "${IFLOW_WORKERS:-:}" --halt now,fail=1 ${IFLOW_PARALLEL_ARGS:-} "$cmd" |
    jq -s -c 'sort_by(.id)[]'
