#!/usr/bin/env bash
# iflow-run --embed: an encoder (specs/bert.ini) over text, one JSON object per input line, the
# pooled embedding equal to transformers' float64 BertModel with sentence-transformers' mean
# pooling and normalization (tests/fixtures/gen_family_refs.py, family "bert": its WordPiece
# tokenizer and three texts) within 1e-5; -p; options that do not go with it, and a decoder,
# refused. The embedding of a fixed id sequence is tests/unit/test_families.c's; the real
# all-MiniLM-L6-v2 was checked by hand (docs: README, iflow-run(1)).
. "$(dirname "$0")/lib.sh"
FX=tests/fixtures/families/bert
REFS=$FX/refs.json

run $BIN/iflow-convert "$FX" -o "$TMP/bert.ifs"
expect_rc 0 "convert the BertModel fixture"
run $BIN/iflow-convert --info "$TMP/bert.ifs"
expect_match "$out" "layout=encoder" "--info: the encoder layout"
expect_match "$out" 'pooling="mean" normalize=true' "--info: pooling and normalization from modules.json"

jq -r '.texts[].text' "$REFS" >"$TMP/texts"
run $BIN/iflow-run -m "$TMP/bert.ifs" --embed -t 1 <"$TMP/texts"
expect_rc 0 "--embed over three lines"
expect_eq "$(wc -l <<<"$out")" 3 "one line per input"
printf '%s\n' "$out" >"$TMP/out.jsonl"
for i in 0 1 2; do
    line=$(sed -n "$((i + 1))p" "$TMP/out.jsonl")
    expect_eq "$(jq -c '[.schema, .index, .n_tokens, .truncated]' <<<"$line")" \
        "[1,$i,$(jq ".texts[$i].ids | length" "$REFS"),false]" "input $i: schema, index, the reference's token count"
    worst=$(jq -n --argjson a "$(jq -c .embedding <<<"$line")" --argjson b "$(jq -c ".texts[$i].embedding" "$REFS")" \
        '[range(0; $b | length) | (($a[.] - $b[.]) | fabs)] | max')
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' && ok || bad "input $i: embedding off by $worst (> 1e-5)"
    len=$(jq '[.embedding[] | . * .] | add' <<<"$line")
    expect_close "$len" 1 1e-5 "input $i: unit length (normalize)"
done

run $BIN/iflow-run -m "$TMP/bert.ifs" --embed -p "$(head -n 1 "$TMP/texts")"
expect_eq "$(jq -c .embedding <<<"$out")" "$(head -n 1 "$TMP/out.jsonl" | jq -c .embedding)" "-p: the first line's vector"

# a long input: the first tokens and the closing [SEP], said so (a context of 8)
run $BIN/iflow-run -m "$TMP/bert.ifs" --embed -c 8 -p "the cat sat on the mat the cat sat on the mat"
expect_eq "$(jq -c '[.n_tokens, .truncated]' <<<"$out")" "[8,true]" "-c 8: truncated to 8 tokens"

# ---- --embed --batch: OpenAI batch lines for /v1/embeddings (vLLM's run-batch, the Batch API) ----
jq -c '{custom_id: "texts", method: "POST", url: "/v1/embeddings", body: {input: [.texts[].text], model: "bert"}},
    {custom_id: "ids", url: "/v1/embeddings", body: {input: [.texts[].ids]}},
    {custom_id: "one", url: "/v1/embeddings", body: {input: .texts[0].text, encoding_format: "base64", dimensions: 32}}' \
    "$REFS" >"$TMP/emb.jsonl"
printf '%s\n' '' '{"custom_id": "dims", "url": "/v1/embeddings", "body": {"input": "x", "dimensions": 8}}' \
    '{"custom_id": "none", "url": "/v1/embeddings", "body": {"input": []}}' \
    '{"custom_id": "empty", "url": "/v1/embeddings", "body": {"input": ["a", ""]}}' \
    '{"custom_id": "chat", "url": "/v1/chat/completions", "body": {"messages": []}}' \
    '{"custom_id": "field", "url": "/v1/embeddings", "body": {"input": "x", "truncate": true}}' \
    '{"custom_id": "long", "url": "/v1/embeddings", "body": {"input": [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]]}}' \
    'not json' >>"$TMP/emb.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/bert.ifs' --embed --batch --ordered -c 30 -t 1 <'$TMP/emb.jsonl'"
expect_rc 0 "--embed --batch"
expect_eq "$(jq -r .custom_id <<<"$out" | tr '\n' ' ')" "texts ids one dims none empty chat field long 11 " \
    "one reply a line, in order, the blank line skipped (a line that is not JSON: its number)"
r=$(jq -c 'select(.custom_id == "texts") | .response' <<<"$out")
expect_eq "$(jq -c '[.status_code, .body.object, .body.model, (.body.data | map([.object, .index]))]' <<<"$r")" \
    '[200,"list","bert",[["embedding",0],["embedding",1],["embedding",2]]]' "three texts: a list of three embeddings"
expect_eq "$(jq -c '.body.usage' <<<"$r")" "$(jq -c '[.texts[].ids | length] | add | {prompt_tokens: ., total_tokens: .}' "$REFS")" \
    "usage: the reference's token counts"
for i in 0 1 2; do
    worst=$(jq -n --argjson a "$(jq -c ".body.data[$i].embedding" <<<"$r")" --argjson b "$(jq -c ".texts[$i].embedding" "$REFS")" \
        '[range(0; $b | length) | (($a[.] - $b[.]) | fabs)] | max')
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' && ok || bad "texts: input $i off the reference by $worst (> 1e-5)"
done
expect_eq "$(jq -c 'select(.custom_id == "ids") | .response.body.data | map(.embedding)' <<<"$out")" \
    "$(jq -c '.body.data | map(.embedding)' <<<"$r")" "token ids: the texts' embeddings"
b64=$(jq -r 'select(.custom_id == "one") | .response.body.data[0].embedding' <<<"$out")
worst=$(paste <(base64 -d <<<"$b64" | od -An -v -t f4 -w4 | tr -d ' ') <(jq -r '.body.data[0].embedding[]' <<<"$r") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d } END { print NR == 32 ? w + 0 : "count " NR }')
awk -v w="$worst" 'BEGIN { exit !(w <= 1e-7) }' && ok || bad "base64: the float32s of the float reply ($worst)"
e() { jq -r --arg i "$1" 'select(.custom_id == $i) | [.response.status_code, .response.body.error.message] | @tsv' <<<"$out"; }
expect_eq "$(e dims)" $'400\tfield \'dimensions\': 8, but this model\'s embeddings have 32' "dimensions other than the model's"
expect_eq "$(e none)" $'400\tfield \'input\' must hold 1 to 2048 inputs' "no inputs"
expect_eq "$(e empty)" $'400\tfield \'input\': input 2 is empty' "an empty input"
expect_eq "$(e chat)" $'400\tan encoder answers \'/v1/embeddings\' lines, not \'/v1/chat/completions\'' "a chat line"
expect_eq "$(e field)" $'400\tunknown field \'truncate\' of an embeddings request (input, model, encoding_format, dimensions, user)' \
    "an unknown body field"
expect_eq "$(e long)" $'400\tinput 1 has 31 tokens, more than the 30 this model takes' "an input longer than -c"
run $BIN/iflow-run -m "$TMP/bert.ifs" --embed --batch -p x
expect_eq "$rc:$(head -1 <<<"$err")" "2:iflow-run: --embed --batch reads OpenAI batch lines from standard input; -p does not go with it" \
    "--embed --batch -p"

run $BIN/iflow-run -m "$TMP/bert.ifs" --embed --json -p "x"
expect_rc 2 "--embed --json: a usage error"
expect_match "$err" "^iflow-run: --embed goes with none of" "--embed --json: says what does not go with --embed"
# an encoder has no logits: generation and perplexity say so, naming it
run $BIN/iflow-run -m "$TMP/bert.ifs" -p "the cat" -n 4
expect_rc 1 "generating with an encoder"
expect_match "$err" "an encoder gives embeddings" "generating with an encoder: says why"
printf 'the cat sat on the mat . the cat sat on the mat .\n' >"$TMP/t.txt"
run $BIN/iflow-ppl -m "$TMP/bert.ifs" -f "$TMP/t.txt" -c 8
expect_rc 1 "perplexity of an encoder"
expect_match "$err" "an encoder gives embeddings" "perplexity of an encoder: says why"
run $BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs"
run $BIN/iflow-run -m "$TMP/s.ifs" --embed -p "Once upon a time"
expect_rc 1 "--embed on a decoder"
expect_eq "$err" "iflow-run: model '$TMP/s.ifs' is a decoder: --embed needs an encoder (a BERT-like model)" \
    "--embed on a decoder: one line naming the model"
expect_eq "$out" "" "--embed on a decoder: nothing on standard output"
summary
