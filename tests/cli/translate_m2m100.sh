#!/usr/bin/env bash
# iflow-run --translate with M2M100's tokenizer: the tiny random-weight M2M100ForConditionalGeneration
# of tests/fixtures/families/m2m100-bpe (gen_translate_refs.py) over tests/fixtures/tokenizers/
# m2m100 (a BPE sentencepiece.bpe.model, an M2M100-shaped vocab.json, tokenizer_config.json and
# special_tokens_map.json: gen_unigram_refs.py). Each text, encoded with its source language
# (--source-prefix __xx__: [__xx__] text </s>) and translated into its target language
# (--decoder-prefix __yy__), gives the source ids, ids and text of transformers'
# M2M100Tokenizer(src_lang) + generate(forced_bos_token_id=get_lang_id(tgt), num_beams=1) +
# batch_decode(skip_special_tokens=True), exactly, with </s> forced at the length limit
# (generation_config.json's forced_eos_token_id); the language tokens are stored in the shard, so
# the shard alone is enough; __en__ is the source language by default; a Hugging Face-shaped
# folder converts without --tokenizer.
. "$(dirname "$0")/lib.sh"
FX=tests/fixtures/families/m2m100-bpe
REFS=$FX/refs.json
TOK=tests/fixtures/tokenizers/m2m100
N=$(jq '.max_new_tokens' "$REFS")
COUNT=$(jq '.texts | length' "$REFS")

# what --info says of the tokenizer: its files, the language tokens after vocab.json, __en__
INFO_TOK=$'\ntokenizer: spm \\(sentencepiece.bpe.model, vocab.json; 100 added tokens, 8 hidden, source prefix __en__\\)\n'

run $BIN/iflow-convert "$FX" --tokenizer "$TOK" -o "$TMP/m.ifs"
expect_rc 0 "convert m2m100-bpe with the M2M100 tokenizer folder"
run $BIN/iflow-convert --info "$TMP/m.ifs" --json
expect_eq "$(jq -c '.meta.tokenizer | [.added[0], .added[99], (.added | length), .hidden, .prefix]' <<<"$out")" \
    '["__af__","__zu__",100,8,"__en__"]' "--info --json: meta's added tokens, in M2M100Tokenizer's order"
expect_eq "$(jq -c '.meta.hparams.forced_eos' <<<"$out")" 2 "generation_config.json's forced_eos_token_id"
run $BIN/iflow-convert --info "$TMP/m.ifs"
expect_match "$out" "$INFO_TOK" "--info: the files, the language tokens after vocab.json, the default source language"

for ((i = 0; i < COUNT; i++)); do
    text=$(jq -r ".texts[$i].text" "$REFS")
    src=$(jq -r ".texts[$i].src_lang" "$REFS")
    tgt=$(jq -r ".texts[$i].tgt_lang" "$REFS")
    (cd "$TMP" && "$OLDPWD/$BIN/iflow-run" -m m.ifs --translate -n "$N" --source-prefix "__${src}__" \
        --decoder-prefix "__${tgt}__" --json -t 1 -p "$text" >out.json 2>err.txt)
    line=$(cat "$TMP/out.json")
    expect_eq "$(jq -c '.source_ids' <<<"$line")" "$(jq -c ".texts[$i].src" "$REFS")" \
        "$src -> $tgt, text $i: M2M100Tokenizer's source ids ([__${src}__] ... </s>), from the shard alone"
    expect_eq "$(jq -c '.ids' <<<"$line")" "$(jq -c ".texts[$i].greedy[1:] | map(select(. != 2))" "$REFS")" \
        "$src -> $tgt, text $i: generate()'s ids after the forced language token"
    expect_eq "$(jq -r '.translation' <<<"$line")" "$(jq -r ".texts[$i].translation" "$REFS")" \
        "$src -> $tgt, text $i: batch_decode's text"
    expect_eq "$(jq -r '.stop' <<<"$line")" length "$src -> $tgt, text $i: cut by -n, </s> forced there"
done

# English, the default source language, from standard input
jq -r '.texts[] | select(.src_lang == "en" and .tgt_lang == "fr") | .text' "$REFS" >"$TMP/en.txt"
run $BIN/iflow-run -m "$TMP/m.ifs" --translate -n "$N" --decoder-prefix __fr__ <"$TMP/en.txt"
expect_eq "$out" "$(jq -r '.texts[] | select(.src_lang == "en" and .tgt_lang == "fr") | .translation' "$REFS")" \
    "no --source-prefix: __en__ before the source"
run $BIN/iflow-run -m "$TMP/m.ifs" --tokenize --bos -p "The cat"
expect_eq "$(head -c 4 <<<"$out")" "990 " "--tokenize --bos: __en__ (972 + 18) first"

# a folder laid out as Hugging Face's: the tokenizer found beside the weights
mkdir "$TMP/hf"
for f in "$FX"/config.json "$FX"/generation_config.json "$FX"/model.safetensors "$TOK"/*; do
    ln -s "$(realpath "$f")" "$TMP/hf/"
done
run $BIN/iflow-convert --info "$TMP/hf"
expect_match "$out" "$INFO_TOK" "--info on the folder: M2M100's files"
first=$(jq -r '.texts[0].text' "$REFS")
run $BIN/iflow-run -m "$TMP/hf" --translate -n "$N" --source-prefix "__$(jq -r '.texts[0].src_lang' "$REFS")__" \
    --decoder-prefix "__$(jq -r '.texts[0].tgt_lang' "$REFS")__" -p "$first"
expect_eq "$out" "$(jq -r '.texts[0].translation' "$REFS")" "the folder converted on the fly: the same translation"

# refusals
run $BIN/iflow-run -m "$TMP/m.ifs" --source-prefix __de__ -p "x"
expect_rc 2 "--source-prefix without --translate"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --source-prefix goes with --translate" "--source-prefix without --translate: named"
echo '{"language_codes": "nllb"}' >"$TMP/tokenizer_config.json"
mkdir "$TMP/badtok"
ln -s "$(realpath "$TOK/sentencepiece.bpe.model")" "$(realpath "$TOK/vocab.json")" "$TMP/badtok/"
cp "$TMP/tokenizer_config.json" "$TMP/badtok/"
run $BIN/iflow-convert "$FX" --tokenizer "$TMP/badtok" -o "$TMP/x.ifs"
expect_rc 1 "an unknown language_codes"
expect_eq "$err" "iflow-convert: cannot find the tokenizer: unknown language_codes 'nllb' in '$TMP/badtok/tokenizer_config.json' (m2m100 or wmt21)" \
    "an unknown language_codes: the value and the file"
summary
