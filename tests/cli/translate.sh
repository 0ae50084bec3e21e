#!/usr/bin/env bash
# iflow-run --translate: an encoder-decoder (specs/t5.ini) over text, one translation per input
# line, equal to transformers' generate() (greedy) on the random-weight T5 fixture
# (tests/fixtures/gen_family_refs.py, family "t5": a WordPiece tokenizer standing in for
# SentencePiece, three texts, their ids and decoded translations); --json and its ids, -p, -n,
# --beams, --decoder-prefix; refusals: a decoder or an encoder given to --translate, options
# that do not go with it, generation, perplexity and partitioning of an encoder-decoder. The
# logits, greedy and beam ids of all four families are tests/unit/test_seq2seq.c's.
. "$(dirname "$0")/lib.sh"
FX=tests/fixtures/families/t5
REFS=$FX/refs.json

run $BIN/iflow-convert "$FX" -o "$TMP/t5.ifs"
expect_rc 0 "convert the T5 fixture"
run $BIN/iflow-convert --info "$TMP/t5.ifs"
expect_match "$out" "layout=encoder-decoder" "--info: the encoder-decoder layout"
expect_match "$out" "position=relative" "--info: relative position buckets"

jq -r '.texts[].text' "$REFS" >"$TMP/texts"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 12 -t 1 <"$TMP/texts"
expect_rc 0 "--translate over three lines"
expect_eq "$out" "$(jq -r '.texts[].translation' "$REFS")" "the translations transformers decodes"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 12 --json <"$TMP/texts"
expect_eq "$(wc -l <<<"$out")" 3 "--json: one line per input"
for i in 0 1 2; do
    line=$(sed -n "$((i + 1))p" <<<"$out")
    expect_eq "$(jq -c '[.schema, .index, .source_ids, .truncated]' <<<"$line")" \
        "[1,$i,$(jq -c ".texts[$i].src" "$REFS"),false]" "input $i: schema, index, the reference's source ids"
    expect_eq "$(jq -c '.ids' <<<"$line")" "$(jq -c ".texts[$i].greedy | map(select(. != 1))" "$REFS")" \
        "input $i: generate()'s ids (its EOS aside)"
done
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 12 -p "$(head -n 1 "$TMP/texts")"
expect_eq "$out" "$(jq -r '.texts[0].translation' "$REFS")" "-p: the first line's translation"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 3 --json -p "words"
expect_eq "$(jq -c '[(.ids | length), .stop]' <<<"$out")" '[3,"length"]' "-n 3: three tokens, stopped by length"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 12 --beams 4 --json -p "$(head -n 1 "$TMP/texts")"
expect_rc 0 "--beams 4"
expect_eq "$(jq -c '[(.beams | length), .ids == .beams[0].ids, (.beams | map(.score) | . == (sort | reverse))]' <<<"$out")" \
    '[4,true,true]' "--beams 4 --json: four beams, best first, the best one's ids on top"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 12 --beams 1 -p "$(head -n 1 "$TMP/texts")"
expect_eq "$out" "$(jq -r '.texts[0].translation' "$REFS")" "--beams 1: the greedy translation"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 4 --json --decoder-prefix "time" -p "words"
expect_rc 0 "--decoder-prefix"
expect_eq "$(jq -c '.ids | length' <<<"$out")" 4 "--decoder-prefix: the forced tokens are not counted or printed"

# quantized: the matrices in q8_b32, the relative position tables kept F32 (as vectors are)
run $BIN/iflow-quant -t q8_b32 -i "$TMP/t5.ifs" -o "$TMP/t5.q8.ifs"
expect_rc 0 "iflow-quant -t q8_b32"
run $BIN/iflow-convert --info "$TMP/t5.q8.ifs"
expect_match "$out" "tensor enc.rel_bias +f32" "--info: the encoder's bias table stays f32"
run $BIN/iflow-run -m "$TMP/t5.q8.ifs" --translate -n 12 --json -p "$(head -n 1 "$TMP/texts")"
expect_eq "$(jq -c '.ids | length' <<<"$out")" 12 "a q8_b32 model translates"

# refusals
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate --temp 0.7 -p "words"
expect_rc 2 "--translate with a sampling option"
expect_match "$err" "^iflow-run: --translate goes with none of" "--translate --temp: says what does not go with it"
run $BIN/iflow-run -m "$TMP/t5.ifs" --decoder-prefix "x" -p "words"
expect_rc 2 "--decoder-prefix without --translate"
run $BIN/iflow-run -m "$TMP/t5.ifs" -p "words" -n 4
expect_rc 1 "generating from a prompt with an encoder-decoder"
expect_match "$err" "is an encoder-decoder: it translates a source \(--translate\)" "generation: says what the model is"
printf 'the cat sat on the mat .\n' >"$TMP/t.txt"
run $BIN/iflow-ppl -m "$TMP/t5.ifs" -f "$TMP/t.txt" -c 8
expect_rc 1 "perplexity of an encoder-decoder"
expect_match "$err" "is an encoder-decoder" "iflow-ppl: names the layout"
run $BIN/iflow-run -m "$TMP/t5.ifs" --embed -p "words"
expect_rc 1 "--embed on an encoder-decoder"
expect_match "$err" "is an encoder-decoder: --embed needs an encoder" "--embed: names the layout"
run $BIN/iflow-partition -m "$TMP/t5.ifs" --devices cpu:2 --compare
expect_rc 1 "partitioning an encoder-decoder"
expect_match "$err" "is an encoder-decoder: partitioning one is not implemented" "iflow-partition: names the layout"
run $BIN/iflow-convert tests/fixtures/families/bert -o "$TMP/bert.ifs"
run $BIN/iflow-run -m "$TMP/bert.ifs" --translate -p "the cat"
expect_rc 1 "--translate on an encoder"
expect_eq "$err" "iflow-run: model '$TMP/bert.ifs' is an encoder: --translate needs an encoder-decoder (Marian, M2M100, T5)" \
    "--translate on an encoder: one line naming the layout"
run $BIN/iflow-convert tests/fixtures/families/qwen2 -o "$TMP/qwen2.ifs"
run $BIN/iflow-run -m "$TMP/qwen2.ifs" --translate -p "the cat"
expect_rc 1 "--translate on a decoder"
expect_match "$err" "is a decoder: --translate needs an encoder-decoder" "--translate on a decoder: names the layout"
expect_eq "$out" "" "--translate on a decoder: nothing on standard output"
summary
