#!/usr/bin/env bash
# iflow-run --beams: width 1 prints the greedy text; wider beams come ranked in --json with
# scores that follow --length-penalty, the best at least as probable as greedy's continuation
# (the same length: stories260K never ends a text by itself); a beam that reaches a --stop
# string finishes there, cut before it; bad combinations are refused.
. "$(dirname "$0")/lib.sh"
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }
P="Once upon a time"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --temp 0
greedy=$out
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --beams 1
expect_rc 0 "--beams 1"
expect_eq "$out" "$greedy" "--beams 1 is greedy"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --beams 1 --json
g1=$(jq .beams[0].logprob <<<"$out")
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --beams 4 --json --length-penalty 0
expect_rc 0 "--beams 4"
expect_eq "$(jq '.beams | length' <<<"$out")" 4 "four beams"
expect_eq "$(jq '[.beams[].score] | . == (sort | reverse)' <<<"$out")" true "ranked by score"
expect_eq "$(jq '[.beams[] | .score == .logprob] | all' <<<"$out")" true "length penalty 0: score = logprob"
expect_eq "$(jq --argjson g "$g1" '.beams[0].logprob >= $g' <<<"$out")" true "the best beam is at least as probable as greedy"
expect_eq "$(jq -r '.text == .beams[0].text and .stop == .beams[0].stop' <<<"$out")" true "text and stop are the best beam's"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --beams 3 --json --length-penalty 2
expect_eq "$(jq '[.beams[] | (.score - .logprob / pow(.gen_ids | length; 2)) | fabs < 1e-9] | all' <<<"$out")" true \
    "length penalty 2: score = logprob / length^2"
# several prompts from standard input
printf '%s\n' "$P" "Lily saw" >"$TMP/p.txt"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -n 12 --beams 2 <'$TMP/p.txt'"
expect_eq "$(wc -l <<<"$out")" 2 "a line per prompt"

# --stop: "park w" spans the tokens " park" and " with"; a beam that reaches it finishes there
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --beams 4 --length-penalty 0 --stop "park w" --json
expect_rc 0 "--beams with --stop"
expect_eq "$(jq '[.beams[] | select(.stop == "stop")] | length > 0' <<<"$out")" true "a beam stops at the string"
expect_eq "$(jq '[.beams[] | select(.stop != "stop")] | length > 0' <<<"$out")" true "and the others go on"
expect_eq "$(jq '[.beams[] | select(.stop == "stop") | .stop_string == "park w" and (.text | endswith(" the "))] | all' <<<"$out")" true \
    "a stopped beam: its text cut before the string, stop_string named"
expect_eq "$(jq '[.beams[].text | contains("park w") | not] | all' <<<"$out")" true "no beam's text holds the string"
expect_eq "$(jq '[.beams[].score] | . == (sort | reverse)' <<<"$out")" true "--stop: still ranked by score"
stopped=$out
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --temp 0 --stop "outside in"
gstop=$out
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 40 --beams 1 --stop "outside in"
expect_eq "$out" "$gstop" "--beams 1 --stop is greedy with --stop"
# refused: --draft and a context shift
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" --beams 2 --draft "$TMP/s.ifs"
expect_rc 2 "--beams with --draft"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --beams does not go with --draft: a draft proposes one sequence, beam search keeps several" "--beams with --draft: message"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" --beams 2 --keep 4
expect_rc 2 "--beams with --keep"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --beams does not go with a context shift (--context-shift, --keep): beams end at the context" "--beams with a shift: message"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" --beams 2 --batch
expect_rc 2 "--beams with --batch"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" --length-penalty 2
expect_rc 2 "--length-penalty without --beams"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" --beams 33
expect_rc 2 "--beams 33"
# ---- --batch: "beams" per request, beside sampled ones; the same beams as the plain mode ----
run $BIN/iflow-run -m "$TMP/s.ifs" -p "$P" -n 24 --beams 3 --length-penalty 0.5 --json
plain=$(jq -c '[.beams[] | [.text, (.logprob * 1e6 | round), (.score * 1e6 | round), .stop]]' <<<"$out")
printf '%s\n' '{"id":"s","prompt":"Lily saw","max_tokens":30,"temperature":0.8}' \
    "{\"id\":\"b\",\"prompt\":\"$P\",\"max_tokens\":24,\"beams\":3,\"length_penalty\":0.5}" \
    '{"id":"g","prompt":"The sun","max_tokens":30,"temperature":0}' \
    '{"id":"e","prompt":"x","beams":2,"context_shift":"rope"}' \
    "{\"id\":\"t\",\"prompt\":\"$P\",\"max_tokens\":40,\"beams\":4,\"length_penalty\":0,\"stop\":[\"park w\"]}" '{"id":"f","prompt":"x","length_penalty":2}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 2 <'$TMP/req.jsonl'"
expect_rc 0 "--batch with a beam request"
expect_eq "$(jq -c 'select(.id == "b") | [.beams[] | [.text, (.logprob * 1e6 | round), (.score * 1e6 | round), .finish_reason]]' <<<"$out")" "$plain" \
    "--batch: the beams of the plain mode"
expect_eq "$(jq -r 'select(.id == "b") | .text == .beams[0].text' <<<"$out")" true "--batch: text is the best beam's"
expect_eq "$(jq -r 'select(.id == "e") | .error' <<<"$out")" "field 'beams' does not go with a context shift (beams end at the context; set 'context_shift' to \"none\")" "--batch: beams with a shift"
expect_eq "$(jq -c 'select(.id == "t") | [.beams[] | [.text, .finish_reason, .stop_string]]' <<<"$out")" \
    "$(jq -c '[.beams[] | [.text, .stop, .stop_string]]' <<<"$stopped")" "--batch: beams with a stop string, as the plain mode"
expect_eq "$(jq -r 'select(.id == "f") | .error' <<<"$out")" "field 'length_penalty' goes with 'beams'" "--batch: length_penalty alone"
expect_eq "$(jq -r 'select(.id == "s" or .id == "g") | .finish_reason' <<<"$out" | sort -u)" "length" "--batch: the other requests finish"
summary
