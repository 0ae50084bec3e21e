#!/usr/bin/env bash
# Generating past the context (iflow-run --context-shift, --keep; the batch fields of the same
# names): runs to -n with the context full many times over, in flat memory; the tokens before
# the first shift are those of a run that stops at the context; bad values are usage errors.
. "$(dirname "$0")/lib.sh"
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }
P="Once upon a time"

run $BIN/iflow-run -m "$TMP/s.ifs" -c 64 -n 640 --temp 0 -p "$P" --json
expect_rc 0 "no shift"
expect_eq "$(jq -c '[.stop, (.gen_ids | length)]' <<<"$out")" '["context",59]' "no shift: stops at the context"
first=$(jq -c '.gen_ids' <<<"$out")
for mode in rope recompute; do
    run $BIN/iflow-run -m "$TMP/s.ifs" -c 64 -n 640 --temp 0 -p "$P" --json --context-shift $mode --keep 4
    expect_rc 0 "$mode"
    expect_eq "$(jq -c '[.stop, (.gen_ids | length)]' <<<"$out")" '["length",640]' "$mode: ten contexts' worth"
    expect_eq "$(jq -c '.gen_ids[:59]' <<<"$out")" "$first" "$mode: the tokens before the first shift"
done
# --keep alone means rope
run $BIN/iflow-run -m "$TMP/s.ifs" -c 64 -n 200 --temp 0 -p "$P" --json --keep 4
a=$(jq -c .gen_ids <<<"$out")
run $BIN/iflow-run -m "$TMP/s.ifs" -c 64 -n 200 --temp 0 -p "$P" --json --context-shift rope
expect_eq "$a" "$(jq -c .gen_ids <<<"$out")" "--keep alone shifts with rope (default keep 4)"

# ---- --batch: the fields, and flat memory over 10x and 100x the context ----
printf '%s\n' '{"id":"a","prompt":"Once upon a time","max_tokens":640,"temperature":0,"context_shift":"rope","keep":4}' \
    '{"id":"b","prompt":"Once upon a time","max_tokens":640,"temperature":0,"context_shift":"recompute"}' \
    '{"id":"c","prompt":"Once upon a time","max_tokens":640,"temperature":0}' \
    '{"id":"d","prompt":"x","context_shift":"sideways"}' '{"id":"e","prompt":"x","keep":-2}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch -c 64 <'$TMP/req.jsonl' | jq -c '[.id, .finish_reason, .completion_tokens, .error] | map(select(. != null))' | sort"
expect_eq "$out" '["a","length",640]
["b","length",640]
["c","context",59]
["d","field '"'"'context_shift'"'"' must be \"none\", \"rope\" or \"recompute\""]
["e","field '"'"'keep'"'"' must be an integer from -1 to 16777216"]' "batch: context shift fields"
for n in 640 6400; do
    echo "{\"prompt\":\"$P\",\"max_tokens\":$n,\"temperature\":0.8,\"context_shift\":\"rope\"}" >"$TMP/one.jsonl"
    run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch -c 64 --metrics '$TMP/m$n.json' <'$TMP/one.jsonl'"
    expect_eq "$(jq -c '[.finish_reason, .completion_tokens]' <<<"$out")" "[\"length\",$n]" "batch: $n tokens through a context of 64"
done
r1=$(jq .peak_rss_mib "$TMP/m640.json") r2=$(jq .peak_rss_mib "$TMP/m6400.json")
if [[ ${IFLOW_TEST_BUILD:-} == *san* ]]; then # AddressSanitizer keeps freed memory in quarantine
    echo "SKIP $NAME: flat memory (sanitizer build)" >&2
else
    expect_eq "$(jq -n "$r2 - $r1 < 2")" true "flat memory: peak RSS $r1 MiB at 640 tokens, $r2 MiB at 6400"
fi

# ---- usage errors ----
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --context-shift sideways
expect_rc 2 "bad --context-shift"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --context-shift must be none, rope or recompute, not 'sideways'" "bad --context-shift: message"
run $BIN/iflow-run -m "$TMP/s.ifs" -c 7 -n 20 -p "Once upon a time there" --context-shift rope --keep -1
expect_rc 1 "a keep that fills the context"
expect_match "$err" "keeping [0-9]+ positions leaves nothing to shift in a context of 7" "keep too large: message"
summary
