#!/usr/bin/env bash
# iflow-run's samplers and stop strings on stories260K: --stop cuts the text (across token
# boundaries, the stop string not printed, or kept with --include-stop) and --json says why;
# every --sampler runs, gives one output per seed whatever the thread count; FSD and the
# penalties repeat less than greedy.
# --logit-bias, --min-tokens, --ignore-eos, --stop-token-id (and a request's logit_bias,
# min_tokens, ignore_eos, stop_token_ids) against the golden greedy ids (stories260K's greedy
# text holds no EOS, id 2, in 64 tokens). min_tokens holding back a stop string; a request's
# allowed_token_ids, bad_words and truncate_prompt_tokens (vLLM's), and their refusals.
. "$(dirname "$0")/lib.sh"
G=$DATA/golden
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }
R() { run $BIN/iflow-run -m "$TMP/s.ifs" "$@"; }
greedy=$(sed -n 1p "$G/stories260K.greedy64.jsonl" | jq -r .continuation) # of "Once upon a time"

# ---- stop strings ----
R -p "Once upon a time" -n 64 --temp 0 --stop park
expect_rc 0 "--stop"
expect_eq "$out" "${greedy%%park*}" "--stop park: the text before the first 'park'"
R -p "Once upon a time" -n 64 --temp 0 --stop "e l" --stop park
expect_eq "$out" "${greedy%%e l*}" "--stop 'e l' (spans two tokens) wins over a later 'park'"
R -p "Once upon a time" -n 64 --temp 0 --stop park --json
expect_eq "$(jq -r .text <<<"$out")" "${greedy%%park*}" "--stop --json: text"
expect_eq "$(jq -r '.stop + " " + .stop_string' <<<"$out")" "stop park" "--stop --json: why it stopped"
n=$(jq '.gen_ids | length' <<<"$out")
[ "$n" -gt 10 ] && [ "$n" -lt 64 ] && ok || bad "--stop --json: $n ids, expected fewer than 64"
# a stop string whose start ends the text is held back, then printed when it does not come
tail3=${greedy: -3}
R -p "Once upon a time" -n 64 --temp 0 --stop "${tail3}QQ"
expect_eq "$out" "$greedy" "a stop string that never completes: the held-back tail is printed"
R -p "Once upon a time" -n 64 --temp 0 --stop "${tail3}QQ" --json
expect_eq "$(jq -r '.stop + " " + (.stop_string // "-") + " " + (.gen_ids | length | tostring)' <<<"$out")" "length - 64" \
    "no stop string matched: length, 64 ids"
R -p "Once upon a time" -n 64 --temp 0 --stop ""
expect_rc 2 "--stop ''"
expect_eq "$err" "iflow-run: --stop needs a non-empty string
Try 'iflow-run --help' for more information." "--stop '': message"
R -p "Once upon a time" -n 64 --temp 0 --stop park --include-stop
expect_eq "$out" "${greedy%%park*}park" "--include-stop: the text up to and with 'park'"
R -p "Once upon a time" -n 64 --temp 0 --include-stop
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --include-stop goes with --stop (and not with --beams)" \
    "--include-stop without --stop"
printf '%s\n' '{"id": 1, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stop": "park", "include_stop_str_in_output": true}' \
    '{"id": 2, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stop": "park"}' \
    '{"id": 3, "prompt": "x", "beams": 2, "include_stop_str_in_output": true}' >"$TMP/incl.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/incl.jsonl'"
expect_eq "$(jq -r 'select(.id == 1) | .text' <<<"$out")" "${greedy%%park*}park" "include_stop_str_in_output: the stop string kept"
expect_eq "$(jq -r 'select(.id == 2) | .text' <<<"$out")" "${greedy%%park*}" "without it: cut before"
expect_eq "$(jq -r 'select(.id == 3) | .error' <<<"$out")" "field 'include_stop_str_in_output' does not go with 'beams'" \
    "not with beams"

# ---- every sampler: one output per seed, for any thread count ----
for s in chain greedy top-k top-p min-p typical tfs mirostat mirostat2 fsd rfsd; do
    R -p "The little dog" -n 48 --sampler $s --seed 21 -t 1
    expect_rc 0 "--sampler $s"
    a=$out
    [ -n "$a" ] && ok || bad "--sampler $s printed nothing"
    R -p "The little dog" -n 48 --sampler $s --seed 21 -t 2
    expect_eq "$out" "$a" "--sampler $s: seed 21 gives the same text with -t 1 and -t 2"
done
R -p "The little dog" -n 64 --sampler min-p --min-p 0.05 --temp 0.9 --seed 4 -t 1
a=$out
R -p "The little dog" -n 64 --sampler min-p --min-p 0.05 --temp 0.9 --seed 4 -t 2
expect_eq "$out" "$a" "seeded min-p: the same output with -t 1 and -t 2"
R -p "The little dog" -n 64 --sampler min-p --min-p 0.05 --temp 0.9 --seed 5 -t 2
[ "$out" != "$a" ] && ok || bad "min-p: seeds 4 and 5 gave the same 64 tokens"
R -p "Once upon a time" -n 64 --sampler greedy --temp 0.8
expect_eq "$out" "$greedy" "--sampler greedy ignores the temperature"
R -p "Once upon a time" -n 64 --sampler min-p --min-p 1 --temp 1.5 --seed 1
expect_eq "$out" "$greedy" "--min-p 1 keeps only the most likely token: greedy"

# ---- the chain as it runs, under -v ----
R -p "Once upon a time" -n 2 --sampler min-p --temp 0.9 --repeat-penalty 1.1 -v --device cpu
expect_match "$err" $'\niflow-run: sampler: penalties \\(repeat 1.1, frequency 0, presence 0, last 64\\) -> min-p 0.05 -> temp 0.9 -> draw$' "-v: the chain"
R -p "Once upon a time" -n 2 --sampler mirostat2 --mirostat-tau 4 -v --device cpu
expect_match "$err" $'\niflow-run: sampler: temp 0.8 -> mirostat2 \\(tau 4, eta 0.1\\)$' "-v: mirostat2"
R -p "Once upon a time" -n 2 --sampler fsd --fsd-alpha 0.6 -v --device cpu
expect_match "$err" $'\niflow-run: sampler: fsd \\(alpha 0.6, k 3, n 3, beta 0.9\\)$' "-v: fsd"

# ---- FSD and the penalties repeat less than greedy (distinct 3-grams of 200 tokens) ----
trigrams() { jq -r '.gen_ids | map(tostring) | join(" ")' <<<"$1" |
    awk '{ for (i = 1; i + 2 <= NF; i++) seen[$i" "$(i+1)" "$(i+2)] = 1; n = 0; for (k in seen) n++; print n }'; }
R -p "Once upon a time" -n 200 --temp 0 --json
g3=$(trigrams "$out")
R -p "Once upon a time" -n 200 --sampler fsd --json
f3=$(trigrams "$out")
[ "$f3" -gt $((g3 + 20)) ] && ok || bad "fsd: $f3 distinct 3-grams of 198, greedy $g3"
R -p "Once upon a time" -n 200 --sampler fsd --json
expect_eq "$(trigrams "$out")" "$f3" "fsd is deterministic"
R -p "Once upon a time" -n 200 --temp 0 --repeat-penalty 1.2 --json
p3=$(trigrams "$out")
[ "$p3" -gt $((g3 + 20)) ] && ok || bad "greedy with --repeat-penalty 1.2: $p3 distinct 3-grams of 198, greedy $g3"
R -p "Once upon a time" -n 200 --temp 0 --presence-penalty 1 --frequency-penalty 0.5 --json
p3=$(trigrams "$out")
[ "$p3" -gt $((g3 + 20)) ] && ok || bad "greedy with presence and frequency penalties: $p3 distinct 3-grams of 198, greedy $g3"

# ---- usage errors: one table of names and ranges ----
R -p hi --sampler beam
expect_rc 2 "--sampler beam"
expect_eq "$err" "iflow-run: unknown sampler 'beam' for --sampler (chain, greedy, top-k, top-p, min-p, typical, tfs, mirostat, mirostat2, fsd, rfsd)
Try 'iflow-run --help' for more information." "--sampler beam: message"
R -p hi --min-p 2
expect_rc 2 "--min-p 2"
expect_eq "$err" "iflow-run: invalid value '2' for --min-p (a number from 0 to 1)
Try 'iflow-run --help' for more information." "--min-p 2: message"
R -p hi --repeat-last-n x
expect_eq "$err" "iflow-run: invalid value 'x' for --repeat-last-n (an integer from -1 to 16777216)
Try 'iflow-run --help' for more information." "--repeat-last-n x: message"

# ---- logit biases and the end of a text ----
gids=$(sed -n 1p "$G/stories260K.greedy64.jsonl" | jq -c .gen_ids)
R -p "Once upon a time" -n 64 --temp 0 --logit-bias 2+100 --json
expect_eq "$(jq -c '[.stop, .gen_ids, .text]' <<<"$out")" '["eos",[],""]' "--logit-bias 2+100: the EOS at once"
R -p "Once upon a time" -n 64 --temp 0 --logit-bias 2+100 --min-tokens 5 --json
expect_eq "$(jq -c '[.stop, .gen_ids]' <<<"$out")" "[\"eos\",$(jq -c '.[:5]' <<<"$gids")]" \
    "--min-tokens 5: the 5 greedy tokens, then the EOS"
R -p "Once upon a time" -n 64 --temp 0 --logit-bias 2+100 --ignore-eos --json
expect_eq "$(jq -c '[.stop, .gen_ids]' <<<"$out")" "[\"length\",$gids]" "--ignore-eos: the 64 greedy tokens"
first=$(jq '.[0]' <<<"$gids")
R -p "Once upon a time" -n 4 --temp 0 --logit-bias "$first-inf" --json
[ "$(jq '.gen_ids[0]' <<<"$out")" != "$first" ] && ok || bad "--logit-bias $first-inf: token $first still first"
R -p "Once upon a time" -n 4 --temp 0 --logit-bias "$first-inf" -v
expect_match "$err" "sampler: logit bias \\(1\\) -> greedy" "-v names the bias in the chain"
R -p x --logit-bias 5
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --logit-bias takes ID+B or ID-B (B from 0 to 100) or ID-inf, not '5'" \
    "--logit-bias without a sign"
R -p x --logit-bias 5+101
expect_rc 2 "--logit-bias beyond 100"
R -p x --min-tokens 65 -n 64
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --min-tokens 65 is more than -n 64" "--min-tokens past -n"
R -p x --beams 2 --ignore-eos
expect_rc 2 "--ignore-eos with --beams"
R -p x --logit-bias 512+1
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --logit-bias: logit bias of token 512, outside the vocabulary of 512" \
    "--logit-bias of a token the model does not have"
# requests: the same fields; the command line's are defaults a request replaces
printf '%s\n' '{"id": 1, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "logit_bias": {"2": 100}, "min_tokens": 5, "ignore_eos": false}' \
    '{"id": 2, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "ignore_eos": false}' \
    '{"id": 3, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "logit_bias": {}}' \
    '{"id": 4, "prompt": "x", "logit_bias": {"two": 1}}' '{"id": 5, "prompt": "x", "beams": 2, "min_tokens": 1}' >"$TMP/bias.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --logit-bias 2+100 --ignore-eos <'$TMP/bias.jsonl'"
expect_eq "$(jq -c 'select(.id == 1) | [.finish_reason, .completion_tokens]' <<<"$out")" '["eos",5]' \
    "a request's logit_bias and min_tokens"
expect_eq "$(jq -c 'select(.id == 2) | [.finish_reason, .completion_tokens]' <<<"$out")" '["eos",0]' \
    "ignore_eos false: the command line's bias ends it at once"
expect_eq "$(jq -c 'select(.id == 3) | [.finish_reason, .completion_tokens]' <<<"$out")" '["length",64]' \
    "an empty logit_bias replaces the command line's; its --ignore-eos stays"
expect_eq "$(jq -r 'select(.id == 4) | .error' <<<"$out")" "field 'logit_bias': key 'two' is no token id" "a key that is no id"
expect_match "$(jq -r 'select(.id == 5) | .error' <<<"$out")" "^fields 'logit_bias', 'min_tokens', 'ignore_eos' and 'stop_token_ids' do not go with 'beams'" \
    "with beams"
# stop tokens: the 5th greedy token (376, not among the first 4) ends the text like an EOS
R -p "Once upon a time" -n 64 --temp 0 --stop-token-id 376 --json
expect_eq "$(jq -c '[.stop, .stop_token, .gen_ids]' <<<"$out")" "[\"stop\",376,$(jq -c '.[:4]' <<<"$gids")]" \
    "--stop-token-id 376: the 4 greedy tokens before it, finish stop"
R -p "Once upon a time" -n 64 --temp 0 --stop-token-id 376 --min-tokens 6 --json
expect_eq "$(jq -c '[.gen_ids[:4] == '"$(jq -c '.[:4]' <<<"$gids")"', .gen_ids[4] != 376, (.gen_ids | length) >= 6]' <<<"$out")" \
    "[true,true,true]" "--min-tokens 6 bans the stop token for the first 6"
R -p x --stop-token-id 512
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --stop-token-id 512 is outside the vocabulary (512)" "a stop token the model lacks"
printf '%s\n' '{"id": 1, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stop_token_ids": [376]}' \
    '{"id": 2, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stop_token_ids": []}' \
    '{"id": 3, "prompt": "x", "stop_token_ids": [-1]}' >"$TMP/stopid.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --stop-token-id 432 <'$TMP/stopid.jsonl'"
expect_eq "$(jq -c 'select(.id == 1) | [.finish_reason, .stop_token, .completion_tokens]' <<<"$out")" '["stop",376,4]' \
    "a request's stop_token_ids replace --stop-token-id"
expect_eq "$(jq -c 'select(.id == 2) | [.finish_reason, .completion_tokens]' <<<"$out")" '["length",64]' \
    "an empty list: no stop token"
expect_eq "$(jq -r 'select(.id == 3) | .error' <<<"$out")" "field 'stop_token_ids' must hold token ids (integers from 0)" \
    "a negative id"

# ---- min_tokens and stop strings; allowed_token_ids, bad_words, truncate_prompt_tokens ----
# "park" completes at the 26th greedy token: min_tokens 26 still stops there (vLLM's rule: the
# token that reaches it counts), 27 lets it pass
R -p "Once upon a time" -n 64 --temp 0 --stop park --min-tokens 26 --json
expect_eq "$(jq -c '[.stop, (.gen_ids | length)]' <<<"$out")" '["stop",26]' "--min-tokens 26: 'park' (token 26) still stops"
R -p "Once upon a time" -n 64 --temp 0 --stop park --min-tokens 27
expect_eq "$out" "$greedy" "--min-tokens 27: no stop string before 27 tokens, the 64 greedy tokens"
printf '%s\n' '{"id": 1, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stop": "park", "min_tokens": 27}' \
    '{"id": 2, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "allowed_token_ids": [432, 383, 286]}' \
    '{"id": 3, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "bad_words": ["Lily", " park"]}' \
    '{"id": 4, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "truncate_prompt_tokens": 3, "prompt_logprobs": 0}' \
    '{"id": 5, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "truncate_prompt_tokens": -1}' \
    '{"id": 6, "prompt": "x", "allowed_token_ids": []}' '{"id": 7, "prompt": "x", "allowed_token_ids": [1, 512]}' \
    '{"id": 8, "prompt": "x", "bad_words": ["  "]}' '{"id": 9, "prompt": "x", "beams": 2, "bad_words": ["a"]}' \
    '{"id": 10, "prompt": "x", "truncate_prompt_tokens": 0}' \
    '{"id": 11, "prompt": "x", "continuation": "y", "truncate_prompt_tokens": 3}' >"$TMP/vllm.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/vllm.jsonl'"
expect_eq "$(jq -r 'select(.id == 1) | .text' <<<"$out")" "$greedy" "a request's min_tokens holds back its stop string"
expect_eq "$(jq -c 'select(.id == 2) | .completion_tokens' <<<"$out")" 8 "allowed_token_ids: 8 tokens (no EOS allowed)"
expect_eq "$(jq -r 'select(.id == 2) | .text' <<<"$out")" ", there was there was there was there" \
    "allowed_token_ids [432 ',', 383 ' there', 286 ' was']: only those"
t3=$(jq -r 'select(.id == 3) | .text' <<<"$out")
expect_eq "${t3%%named*}" "${greedy%%named*}" "bad_words: the greedy text up to the word"
[[ $t3 != *Lily* && $t3 != *" park"* && ${#t3} -gt 100 ]] && ok || bad "bad_words: 'Lily' or ' park' in '$t3'"
expect_eq "$(jq -c 'select(.id == 4) | [.prompt_tokens, [.prompt_logprobs[].id]]' <<<"$out")" '[3,[407,261,378]]' \
    "truncate_prompt_tokens 3: the last 3 prompt tokens (upon a time)"
expect_eq "$(jq -c 'select(.id == 5) | .prompt_tokens' <<<"$out")" 5 "truncate_prompt_tokens -1: a prompt that fits stays whole"
expect_eq "$(jq -r 'select(.id == 6) | .error' <<<"$out")" "field 'allowed_token_ids' must be a list of 1 to 1048576 token ids" \
    "allowed_token_ids: an empty list"
expect_eq "$(jq -r 'select(.id == 7) | .error' <<<"$out")" "allowed token 512 is outside the vocabulary (512)" \
    "allowed_token_ids: an id the model lacks"
expect_eq "$(jq -r 'select(.id == 8) | .error' <<<"$out")" "field 'bad_words': word 1 must be a string with more than white space" \
    "bad_words: white space"
expect_match "$(jq -r 'select(.id == 9) | .error' <<<"$out")" "^fields 'allowed_token_ids' and 'bad_words' do not go with 'beams'" \
    "bad_words with beams"
expect_eq "$(jq -r 'select(.id == 10) | .error' <<<"$out")" "field 'truncate_prompt_tokens' must be -1 or at least 1" \
    "truncate_prompt_tokens 0"
expect_match "$(jq -r 'select(.id == 11) | .error' <<<"$out")" "^field 'truncate_prompt_tokens' does not go with 'continuation'" \
    "truncate_prompt_tokens with a continuation"
# -1 keeps what the context holds, one position left to generate: a 5-token prompt in a context of 4
echo '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "truncate_prompt_tokens": -1}' >"$TMP/trunc.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch -c 4 <'$TMP/trunc.jsonl'"
expect_eq "$(jq -c '[.prompt_tokens, .completion_tokens, .finish_reason]' <<<"$out")" '[3,1,"context"]' \
    "truncate_prompt_tokens -1 in a context of 4: 3 prompt tokens, 1 generated"

summary
