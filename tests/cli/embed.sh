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
