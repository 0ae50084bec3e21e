#!/usr/bin/env bash
# iflow-run --batch: JSON Lines in and out through the continuous-batching engine. Greedy results
# against ../shared/golden (every golden prompt in one batch), batch composition not changing a
# seeded request's text, "n" completions of a prompt, error results for bad lines (line number
# and id, the others going on), a closed output, --dry-run, --metrics, --ordered (the input's
# order, the same results), and a soak of 10,000 short requests (each id exactly once, peak RSS
# flat between 1,000 and 10,000 requests; with --ordered too, every id in order).
. "$(dirname "$0")/lib.sh"
G=$DATA/golden
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }

# ---- every golden prompt in one batch: each text equals the golden greedy continuation ----
jq -c '{id: .prompt, prompt, max_tokens: 64, temperature: 0}' "$G/stories260K.greedy64.jsonl" >"$TMP/golden.jsonl"
n=$(wc -l <"$TMP/golden.jsonl")
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 4 -t 2 <'$TMP/golden.jsonl'"
expect_rc 0 "golden prompts in a batch"
expect_eq "$(wc -l <<<"$out")" "$n" "one result per golden prompt"
while IFS= read -r rec; do
    p=$(jq -r .prompt <<<"$rec")
    got=$(jq -r --arg p "$p" 'select(.id == $p) | .text' <<<"$out")
    expect_eq "$got" "$(jq -r .continuation <<<"$rec")" "batched greedy text for '$p'"
done <"$G/stories260K.greedy64.jsonl"
expect_eq "$(jq -r .finish_reason <<<"$out" | sort -u | tr '\n' ' ')" "length " "finish reasons"

# ---- a seeded request alone and among 15 others: the same text ----
req='{"id":"me","prompt":"Once upon a time","max_tokens":48,"temperature":0.9,"top_k":40,"top_p":0.95,"seed":7}'
run bash -c "echo '$req' | $BIN/iflow-run -m '$TMP/s.ifs' --batch"
alone=$(jq -r .text <<<"$out")
{
    for i in $(seq 1 7); do echo "{\"id\":$i,\"prompt\":\"Lily saw a $i\",\"max_tokens\":$((10 + i * 5)),\"temperature\":0.8}"; done
    echo "$req"
    for i in $(seq 8 15); do echo "{\"id\":$i,\"prompt\":\"Tom had $i\",\"max_tokens\":$((70 - i * 3))}"; done
} >"$TMP/mixed.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 6 -t 2 <'$TMP/mixed.jsonl'"
expect_rc 0 "mixed batch"
expect_eq "$(jq -r 'select(.id == "me") | .text' <<<"$out")" "$alone" "seeded text alone and in a batch"
expect_eq "$(wc -l <<<"$out")" 16 "16 results"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 16 --kv-type q8 -t 1 <'$TMP/mixed.jsonl'"
expect_rc 0 "q8 KV cache"
expect_eq "$(jq -r .id <<<"$out" | sort | tr '\n' ' ')" "$(jq -r .id "$TMP/mixed.jsonl" | sort | tr '\n' ' ')" "q8: every id"

# ---- sampling fields of sampler.h's table, per request: alone and in a batch the same ----
for r in '{"id":"m","prompt":"Once upon a time","max_tokens":40,"sampler":"mirostat2","mirostat_tau":4,"seed":3}' \
         '{"id":"m","prompt":"Once upon a time","max_tokens":40,"min_p":0.1,"temperature":1.2,"repeat_penalty":1.2,"seed":4}' \
         '{"id":"m","prompt":"Once upon a time","max_tokens":40,"sampler":"fsd","fsd_alpha":0.6}'; do
    one=$(echo "$r" | $BIN/iflow-run -m "$TMP/s.ifs" --batch | jq -r .text)
    run bash -c "{ head -n 5 '$TMP/mixed.jsonl'; echo '$r'; tail -n 5 '$TMP/mixed.jsonl'; } | $BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 4"
    expect_eq "$(jq -r 'select(.id == "m") | .text' <<<"$out")" "$one" "alone and in a batch: $r"
    expect_match "$one" '.{20}' "some text from $r"
done

# ---- the plain mode and --batch: the same engine, the same seeds, the same text ----
printf 'The little dog\nOnce upon a time\n' >"$TMP/two.txt"
plain=$($BIN/iflow-run -m "$TMP/s.ifs" -n 40 --temp 0.9 --min-p 0.05 --seed 5 <"$TMP/two.txt")
run bash -c "jq -R -c '{prompt: .}' '$TMP/two.txt' | $BIN/iflow-run -m '$TMP/s.ifs' --batch -n 40 --temp 0.9 --min-p 0.05 --seed 5 --parallel 2"
expect_eq "$(jq -r .text <<<"$out" | sort)" "$(sort <<<"$plain")" "plain mode and --batch give the same seeded texts"

# ---- bad lines: an error result with the line number and id; the others go on (ok1 runs 16,000
# tokens past the context, about a second on stories260K, so that it is still running when its
# duplicate on line 5 is read even on a loaded machine; 48 tokens, 3 ms, were not enough in CI) ----
long=$(printf 'Once upon a time %.0s' $(seq 1 40))
cat >"$TMP/bad.jsonl" <<EOF
{"id":"ok1","prompt":"Once upon a time","max_tokens":16000,"context_shift":"rope"}
not json
{"id":"nop","max_tokens":4}
{"id":"typo","prompt":"x","max_token":4}
{"id":"ok1","prompt":"dup","max_tokens":4}

{"id":"long","prompt":"$long","max_tokens":4}
{"id":"neg","prompt":"x","temperature":-1}
["an array"]
{"id":"ok2","prompt":"One day","max_tokens":4}
{"id":"lp21","prompt":"x","logprobs":21}
{"id":"lpbeams","prompt":"x","beams":2,"prompt_logprobs":1}
EOF
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch -c 64 <'$TMP/bad.jsonl'"
expect_rc 0 "bad lines do not stop the batch"
line() { jq -c --arg id "$1" 'select((.id | tostring) == $id) | [.line, .error]' <<<"$out"; }
expect_eq "$(line 2)" '[2,"not JSON: '"'"'['"'"' or '"'"'{'"'"' expected near '"'"'not'"'"' (column 3)"]' "invalid JSON"
expect_eq "$(line nop)" '[3,"field '"'"'prompt'"'"' (a string or token ids) or '"'"'messages'"'"' (a chat) is missing"]' "missing prompt"
expect_eq "$(line typo)" '[4,"unknown field '"'"'max_token'"'"' (see iflow-run(1), BATCH GENERATION)"]' "unknown field"
expect_eq "$(jq -c 'select(.line == 5) | .error' <<<"$out")" '"duplicate id \"ok1\": a request with this id is still running"' "duplicate id"
expect_match "$(line long)" '^\[7,"the prompt of [0-9]+ tokens does not fit the context of 64"\]$' "prompt longer than the context"
expect_eq "$(line neg)" '[8,"invalid value '"'"'-1'"'"' for temperature (a number from 0 to 100)"]' "bad number"
expect_eq "$(line 9)" '[9,"a request must be a JSON object"]' "not an object"
expect_eq "$(line lp21)" '[11,"field '"'"'logprobs'"'"' must be an integer from 0 to 20"]' "logprobs out of range"
msg="fields 'logprobs', 'prompt_logprobs' and 'continuation' do not go with 'beams'"
msg+=" (a beam's result has its log-probability)"
expect_eq "$(line lpbeams)" "$(jq -c -n --arg m "$msg" '[12, $m]')" "prompt_logprobs with beams"
expect_eq "$(jq -r 'select(.text) | .id' <<<"$out" | sort | tr '\n' ' ')" "ok1 ok2 " "the good requests finish"
expect_eq "$(jq -r 'select(.id == "ok2") | [.finish_reason, .completion_tokens] | @tsv' <<<"$out")" "length	4" "max_tokens"

# ---- log-probabilities: a prompt scored token by token; what it generates, with the most likely ----
run bash -c "echo '{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":3,\"prompt_logprobs\":1}' |
    $BIN/iflow-run -m '$TMP/s.ifs' --batch"
expect_eq "$(jq -c '[.prompt_logprobs[].id]' <<<"$out")" "[1,403,407,261,378]" \
    "prompt_logprobs: the prompt's ids (golden)"
expect_eq "$(jq -c '[.prompt_logprobs[0].logprob, ([.prompt_logprobs[1:][] | .logprob < 0 and .top[0].logprob >= .logprob]
    | all), ([.logprobs[] | .id == .top[0].id and (.top | length) == 3] | all), (.logprobs | length)]' <<<"$out")" \
    "[null,true,true,6]" "log-probabilities: greedy tokens are the most likely, 3 shown"
expect_eq "$(jq -r '[.logprobs[].token] | join("")' <<<"$out")" "$(jq -r .text <<<"$out")" \
    "the tokens' text is the text"

# --logprobs is the requests' default, but not a beam request's (a beam has its log-probability)
run bash -c "printf '%s\n' '{\"id\":\"b\",\"prompt\":\"Once\",\"max_tokens\":4,\"beams\":2}' \
    '{\"id\":\"p\",\"prompt\":\"Once\",\"max_tokens\":2}' | $BIN/iflow-run -m '$TMP/s.ifs' --batch --logprobs 0"
expect_eq "$(jq -c '[.id, (.logprobs | length), has("beams")]' <<<"$out" | sort | tr '\n' ' ')" '["b",0,true] ["p",2,false] ' \
    "--logprobs: the default of plain requests, not of beam ones"

# ---- scoring continuations (an evaluation's multiple choice): the sum of the continuation's
# log-probabilities, whether it is the greedy one; the same with the context from the prefix cache ----
ctx='Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she'
greedy=$(jq -cn --arg p "$ctx" '{prompt: $p, max_tokens: 6, temperature: 0}' | $BIN/iflow-run -m "$TMP/s.ifs" --batch |
    jq -r .text)
for c in "$greedy" ' ate a red apple' ' went to the moon' ' saw a big dog'; do
    jq -cn --arg p "$ctx" --arg c "$c" '{prompt: $p, continuation: $c, prompt_logprobs: 0}'
done >"$TMP/mc.jsonl"
score() { # extra options -> per request [id, tokens, logprob, greedy, the logprob summed from prompt_logprobs]
    $BIN/iflow-run -m "$TMP/s.ifs" --batch --parallel 4 "$@" <"$TMP/mc.jsonl" |
        jq -c '[.id, .continuation_tokens, .continuation_logprob, .continuation_greedy, .completion_tokens,
                ([.prompt_logprobs[-.continuation_tokens:][].logprob] | add)]' | sort
}
cached=$(score --metrics "$TMP/mc.json")
expect_eq "$(score --no-prefix-cache)" "$cached" "continuation scores: the same without the prefix cache"
expect_eq "$(jq -s -c 'map(.[3])' <<<"$cached")" "[true,false,false,false]" "continuation_greedy: the greedy text only"
expect_eq "$(jq -s -c 'map(.[4] == 0 and .[1] > 2 and .[2] < 0 and ((.[2] - .[5]) | fabs) < 1e-5) | all' \
    <<<"$cached")" \
    true "continuations: scored only, the sum of their prompt_logprobs"
expect_eq "$(jq -c '.prompt_tokens_cached > 0' "$TMP/mc.json")" true "continuations: the context from the prefix cache"

# ---- stop strings end the text before them ----
full=$(echo '{"prompt":"Once upon a time","max_tokens":30,"temperature":0}' | $BIN/iflow-run -m "$TMP/s.ifs" --batch | jq -r .text)
stop=${full:12:4}
run bash -c "echo '{\"prompt\":\"Once upon a time\",\"max_tokens\":30,\"temperature\":0,\"stop\":[\"zzz\",\"$stop\"]}' | $BIN/iflow-run -m '$TMP/s.ifs' --batch"
expect_eq "$(jq -r .finish_reason <<<"$out")" stop "finish reason stop"
expect_eq "$(jq -r .stop_string <<<"$out")" "$stop" "stop_string names the one that matched"
expect_eq "$(jq -r .text <<<"$out")" "${full%%"$stop"*}" "text cut before '$stop'"

# ---- a closed output stops cleanly: exit 1, no message, no crash ----
yes '{"prompt":"Once upon a time","max_tokens":8}' | head -n 300 >"$TMP/many.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/many.jsonl' | head -n 1 >/dev/null; echo \${PIPESTATUS[0]}"
expect_eq "$out" 1 "closed output: exit status"
expect_eq "$err" "" "closed output: nothing on stderr"

# ---- --metrics and -v ----
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 8 --metrics '$TMP/m.json' <'$TMP/mixed.jsonl' >/dev/null"
expect_rc 0 "metrics run"
expect_eq "$(jq -r '[.requests, .errors, (.ttft_ms | keys | join(",")), (.token_latency_ms.p50 > 0), (.batch_occupancy > 0), .kv_blocks.type, .kv_blocks.blocks_peak <= .kv_blocks.blocks_total] | @tsv' "$TMP/m.json")" \
    "16	0	mean,p50,p90,p99	true	true	f32	true" "metrics fields"

# ---- prefix caching: a shared beginning is evaluated once; the same texts without it ----
pre='Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.
Her friend Tom had a big red ball. They liked to throw it high in the sky and run after it. The sun was warm and
the birds sang in the trees. Lily was very happy. One day,'
for e in 'she saw a big dog' 'she found a red ball' 'it started to rain' 'her mom called her' 'she saw a big dog'; do
    jq -cn --arg p "$pre $e" '{prompt: $p, max_tokens: 24, temperature: 0.8, seed: 3}'
done >"$TMP/shared.jsonl"
shared_run() { # extra options -> the results' [id, text], sorted
    run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 3 -t 2 $* <'$TMP/shared.jsonl' |
        jq -c '[.id, .text]' | sort"
}
shared_run --metrics "$TMP/pc.json"
expect_rc 0 "prefix cache"
with=$out
shared_run --no-prefix-cache --metrics "$TMP/nc.json"
expect_eq "$out" "$with" "--no-prefix-cache: the same texts"
# the reference: each prompt's tokens, and for each the most whole blocks of 16 before its last token
# that an earlier prompt has alike from the start
while IFS= read -r line; do
    jq -j .prompt <<<"$line" | $BIN/iflow-run -m "$TMP/s.ifs" --tokenize --bos --json | jq -c .ids
done <"$TMP/shared.jsonl" >"$TMP/shared.ids"
want=$(jq -s '[range(length) as $i | .[$i] as $a | [range($i) as $j | .[$j] as $b |
    [range(([($a | length), ($b | length)] | min) - 1 | . / 16 | floor) as $k
     | select($a[0:16 * ($k + 1)] == $b[0:16 * ($k + 1)])] | length] | (max // 0)] | add * 16' "$TMP/shared.ids")
expect_eq "$(jq -c '[.prompt_tokens_cached, .kv_blocks.blocks_idle > 0]' "$TMP/pc.json")" "[$want,true]" \
    "prefix cache: positions taken from it"
[ "$want" -ge 256 ] && ok || bad "the shared prompts share only $want positions"
all=$(jq .prompt_tokens "$TMP/pc.json")
expect_eq "$(jq -c "[.prompt_tokens_cached, .kv_blocks.blocks_idle, .prompt_tokens == $all]" "$TMP/nc.json")" \
    "[0,0,true]" "--no-prefix-cache: nothing from the cache"
# the plain mode: consecutive prompts of standard input share too
jq -r .prompt "$TMP/shared.jsonl" >"$TMP/shared.txt"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -n 24 --seed 3 -t 2 <'$TMP/shared.txt'"
with=$out
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -n 24 --seed 3 -t 2 --no-prefix-cache <'$TMP/shared.txt'"
expect_eq "$out" "$with" "plain mode, --no-prefix-cache: the same texts"
run $BIN/iflow-run -m "$TMP/s.ifs" --embed --no-prefix-cache -p hi
expect_rc 2 "--no-prefix-cache with --embed"

# ---- --dry-run ----
run $BIN/iflow-run -m "$TMP/s.ifs" --dry-run --parallel 32 -c 256 --kv-type q8
expect_rc 0 "dry run"
# 5 layers x (K + V) x 16 positions x (4 kv heads x 8 dims + 4 x 1 F16 scales of groups of 8) = 6400
expect_eq "$(sed -n 3,5p <<<"$out")" "kv cache          q8, blocks of 16 positions, 6400 bytes a block
kv per request    102400 bytes (256 positions)
kv total          3.1 MiB (--parallel 32)" "dry run: the KV plan"
expect_match "$out" "largest parallel  [0-9]+" "dry run: the largest --parallel"
run $BIN/iflow-run -m "$TMP/s.ifs" --dry-run --json -c 256
expect_eq "$(jq -c '[.n_ctx, .kv_type, .parallel, .kv_per_request_bytes]' <<<"$out")" '[256,"f32",16,327680]' "dry run --json"

# ---- usage errors ----
run $BIN/iflow-run -m "$TMP/s.ifs" --parallel 4 -p hi
expect_rc 2 "--parallel without --batch"
expect_eq "$err" "iflow-run: --parallel and --metrics go with --batch
Try 'iflow-run --help' for more information." "--parallel without --batch: message"
run $BIN/iflow-run -m "$TMP/s.ifs" --embed --kv-type f16 -p hi
expect_rc 2 "--kv-type with --embed"
expect_eq "$err" "iflow-run: --kv-type goes with generation, not with --embed
Try 'iflow-run --help' for more information." "--kv-type with --embed: message"

# ---- --kv-type without --batch: one request through the same engine, in that cache ----
# (on this prompt the q8 cache's greedy text leaves the f32 one within 200 tokens)
run $BIN/iflow-run -m "$TMP/s.ifs" -p "The dog" -n 200 --temp 0 --kv-type q8 -t 1 -v
expect_rc 0 "--kv-type q8 without --batch"
expect_match "$err" "; kv cache q8; " "-v names the KV cache type"
one=$out
run bash -c "echo '{\"prompt\":\"The dog\",\"max_tokens\":200,\"temperature\":0}' | $BIN/iflow-run -m '$TMP/s.ifs' --batch --kv-type q8 -t 1"
expect_eq "$(jq -r .text <<<"$out")" "$one" "--kv-type q8: the text of a --batch request in a q8 cache"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "The dog" -n 200 --temp 0 -t 1
expect_rc 0 "the f32 cache"
[ "$out" != "$one" ] && ok || bad "--kv-type q8 had no effect on the text (the q8 cache's text is the f32 one's)"
run $BIN/iflow-run -m "$TMP/s.ifs" --batch --kv-type q4
expect_rc 2 "bad --kv-type"

# ---- "n": completions of one prompt. The first is the request's own; each is the same alone, in a
# larger batch and at --parallel 1; the prompt is evaluated once (prefix cache) ----
long="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog."
jq -c -n --arg p "$long" '{id: "n", prompt: $p, n: 4, temperature: 0.9, seed: 11, max_tokens: 24},
    {id: "one", prompt: $p, temperature: 0.9, seed: 11, max_tokens: 24},
    {id: "greedy", prompt: "Tom", n: 3, temperature: 0, max_tokens: 8}' >"$TMP/n.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --metrics '$TMP/n.json' <'$TMP/n.jsonl'"
expect_rc 0 "\"n\""
choices=$(jq -c 'select(.id == "n") | [.choices[] | [.index, .text]]' <<<"$out")
expect_eq "$(jq -c 'select(.id == "n") | [(.choices | length), .text == .choices[0].text]' <<<"$out")" "[4,true]" \
    "four completions, the first at the top"
expect_eq "$(jq -r 'select(.id == "n") | .choices[0].text' <<<"$out")" "$(jq -r 'select(.id == "one") | .text' <<<"$out")" \
    "the first is the request without n"
expect_eq "$(jq -r 'select(.id == "n") | [.choices[].text] | unique | length' <<<"$out")" 4 \
    "each completion its own stream: four texts"
expect_eq "$(jq -c 'select(.id == "greedy") | [.choices[].text] | unique | length' <<<"$out")" 1 "greedy: all alike"
expect_eq "$(jq -c '[.requests, .prompt_tokens_cached > 0]' "$TMP/n.json")" "[8,true]" \
    "metrics: every completion counted; the completions share the prompt's blocks"
{
    for i in 1 2 3 4 5; do echo "{\"id\":$i,\"prompt\":\"Lily and $i\",\"max_tokens\":$((8 + i * 3)),\"temperature\":0.8}"; done
    head -1 "$TMP/n.jsonl"
} >"$TMP/n2.jsonl"
for par in 1 16; do
    run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel $par <'$TMP/n2.jsonl'"
    expect_eq "$(jq -c 'select(.id == "n") | [.choices[] | [.index, .text]]' <<<"$out")" "$choices" \
        "the completions beside five other requests, --parallel $par"
done
jq -c -n '{id: 1, prompt: "x", n: 0}, {id: 2, prompt: "x", n: 65}, {id: 3, prompt: "x", n: 2, beams: 2},
    {id: 4, prompt: "x", n: 2, continuation: " y"}, {id: 5, prompt: "x", n: 1.5}' >"$TMP/n.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/n.jsonl'"
expect_eq "$(jq -r '.error' <<<"$out" | sort | uniq -c | sed 's/^ *//')" \
"1 field 'n' does not go with 'beams' (a beam search gives its beams)
1 field 'n' does not go with 'continuation' (a score is the same every time)
3 field 'n' must be an integer from 1 to 64" "\"n\": errors"

# ---- --ordered: the results in the input's order, each as without it ----
# long and short requests, refused lines and a blank line among them, through a window of
# 8 x --parallel 2 = 16 lines (smaller than the input)
for i in $(seq 1 40); do
    if [ $((i % 7)) = 0 ]; then echo "{\"id\": $i, \"prompt\": 5}"
    elif [ $((i % 3)) = 1 ]; then echo "{\"id\": $i, \"prompt\": \"Once upon a time\", \"max_tokens\": 60, \"temperature\": 0}"
    else echo "{\"id\": $i, \"prompt\": \"Lily\", \"max_tokens\": 1}"; fi
    [ "$i" = 20 ] && echo
done >"$TMP/ord.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 2 --seed 3 <'$TMP/ord.jsonl'"
free=$out
expect_eq "$([ "$(jq -c .id <<<"$free" | tr '\n' ' ')" != "$(seq 1 40 | tr '\n' ' ')" ] && echo shuffled)" shuffled \
    "without --ordered: the short requests finish first"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --parallel 2 --seed 3 --ordered <'$TMP/ord.jsonl'"
expect_rc 0 "--ordered"
expect_eq "$(jq -c .id <<<"$out" | tr '\n' ' ')" "$(seq 1 40 | tr '\n' ' ')" "--ordered: ids 1 to 40 in order"
expect_eq "$(jq -S -c 'del(.ttft_ms, .tokens_per_s)' <<<"$out" | sort)" \
    "$(jq -S -c 'del(.ttft_ms, .tokens_per_s)' <<<"$free" | sort)" "--ordered: each result as without it"
run $BIN/iflow-run -m "$TMP/s.ifs" -p x --ordered
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --ordered goes with --batch" "--ordered without --batch"

# ---- soak: 10,000 short requests, each id once, memory flat ----
if [[ ${IFLOW_TEST_BUILD:-} == *san* ]]; then
    echo "SKIP $NAME: the 10,000-request soak (sanitizer build)" >&2
else
    soak() { # N [options] -> peak RSS MiB
        seq 1 "$1" | awk '{ printf "{\"id\":%d,\"prompt\":\"Tom %d\",\"max_tokens\":%d}\n", $1, $1 % 97, 1 + $1 % 5 }' >"$TMP/soak.jsonl"
        $BIN/iflow-run -m "$TMP/s.ifs" --batch --parallel 64 -c 64 -t 1 --metrics "$TMP/soak.json" "${@:2}" <"$TMP/soak.jsonl" >"$TMP/soak.out"
        jq -r .peak_rss_mib "$TMP/soak.json"
    }
    rss1=$(soak 1000)
    rss10=$(soak 10000)
    expect_eq "$(jq -r .id "$TMP/soak.out" | sort -n | uniq | wc -l) $(wc -l <"$TMP/soak.out")" "10000 10000" "soak: every id exactly once"
    expect_eq "$(jq -r 'select(.error) | .id' "$TMP/soak.out" | wc -l)" 0 "soak: no errors"
    awk -v a="$rss1" -v b="$rss10" 'BEGIN { exit !(b <= a + 8) }' && ok || bad "soak: peak RSS grew from $rss1 MiB (1,000 requests) to $rss10 MiB (10,000)"
    echo "soak: peak RSS $rss1 MiB for 1,000 requests, $rss10 MiB for 10,000" >&2
    rss10o=$(soak 10000 --ordered)
    expect_eq "$(jq -r .id "$TMP/soak.out" | awk '$1 != NR { n++ } END { print n + 0, NR }')" "0 10000" \
        "soak --ordered: every id, in order"
    awk -v a="$rss1" -v b="$rss10o" 'BEGIN { exit !(b <= a + 8) }' && ok || bad "soak --ordered: peak RSS $rss10o MiB for 10,000 requests against $rss1 MiB for 1,000"
fi

summary
