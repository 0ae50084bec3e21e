#!/usr/bin/env bash
# iflow-run --translate through real SentencePiece tokenizers stored in the shard: the tiny
# random-weight MarianMTModel over opus-mt-en-mg's vocabulary (tests/fixtures/families/
# marian-en-mg, gen_translate_refs.py) converted with --tokenizer ../shared/models/tokenizers/
# opus-mt-en-mg (source.spm, target.spm, vocab.json), and a tiny T5 with uni-t5.model as its
# spiece.model. The translations of refs.json's texts (punctuation, numbers, accented words,
# characters the vocabulary lacks) equal transformers' MarianTokenizer + generate(num_beams=1,
# max_new_tokens=16, </s> forced as the 16th: forced_eos_token_id) + batch_decode(
# skip_special_tokens=True) exactly, ids too, and generate(num_beams=4)'s; the shard alone
# is enough (no tokenizer folder at run time, from a pipe, quantized); a model folder laid out
# as Hugging Face's converts without --tokenizer; the pad token is never generated (banned);
# --info names the tokenizer files; a damaged or missing tokenizer is refused, named.
. "$(dirname "$0")/lib.sh"
FX=tests/fixtures/families/marian-en-mg
REFS=$FX/refs.json
TOK=$DATA/models/tokenizers/opus-mt-en-mg
N=$(jq '.max_new_tokens' "$REFS")

# T5 over a unigram spiece.model (a file given to --tokenizer: one tokenizer for both sides)
T5=tests/fixtures/families/t5-uni
run $BIN/iflow-convert "$T5" --tokenizer tests/fixtures/tokenizers/uni-t5.model -o "$TMP/t5.ifs"
expect_rc 0 "convert t5-uni with uni-t5.model"
run $BIN/iflow-convert --info "$TMP/t5.ifs"
expect_match "$out" $'\ntokenizer: spm \\(uni-t5.model\\)\n' "--info: one SentencePiece model, no target side"
jq -r '.texts[].text' "$T5/refs.json" >"$TMP/t5.txt"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n "$N" -t 1 <"$TMP/t5.txt"
expect_eq "$out" "$(jq -r '.texts[].translation' "$T5/refs.json")" "T5: the translations T5Tokenizer decodes"
run $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n "$N" --json <"$TMP/t5.txt"
expect_eq "$(jq -c '[.source_ids, .ids]' <<<"$out")" \
    "$(jq -c '.texts[] | [.src, (.greedy | map(select(. != 1)))]' "$T5/refs.json")" "T5: source ids and generate()'s ids"

if [ ! -f "$TOK/source.spm" ]; then
    echo "SKIP $NAME: no $TOK (the opus-mt-en-mg tokenizer files)" >&2
    summary
    exit $?
fi

run $BIN/iflow-convert "$FX" --tokenizer "$TOK" -o "$TMP/m.ifs"
expect_rc 0 "convert marian-en-mg with opus-mt-en-mg's tokenizer files"
run $BIN/iflow-convert --info "$TMP/m.ifs"
expect_match "$out" $'\ntokenizer: spm \\(source.spm, vocab.json\\); target: spm \\(target.spm, vocab.json\\)\n' \
    "--info: both sides' files"
expect_match "$out" "banned_tokens=\[\[54687\]\]" "--info: the pad token is banned (config.json's bad_words_ids)"
expect_eq "$(awk '$1 == "blob" { print $2 }' <<<"$out" | tr '\n' ' ')" \
    "meta tokenizer/source.spm tokenizer/vocab.json tokenizer/target.spm " "one blob per file, vocab.json once"
run $BIN/iflow-convert --info "$TMP/m.ifs" --json
expect_eq "$(jq -c '.meta.tokenizer' <<<"$out")" \
    '{"format":"spm","record":"tokenizer/source.spm","file":"source.spm","vocab":"tokenizer/vocab.json","vocab_file":"vocab.json","target":{"format":"spm","record":"tokenizer/target.spm","file":"target.spm","vocab":"tokenizer/vocab.json","vocab_file":"vocab.json"}}' \
    "--info --json: meta's tokenizer description"

# The fixture's weights are F16 and its margins are for F32 arithmetic: the comparisons with
# transformers run on the exact product (--activations f32; the default rounds x to BF16 where
# the CPU has AVX512_BF16, which a random model of width 8 does not survive greedy for greedy).
X=(--activations f32)
jq -r '.texts[].text' "$REFS" >"$TMP/en.txt"
want=$(jq -r '.texts[].translation' "$REFS")
(cd "$TMP" && "$OLDPWD/$BIN/iflow-run" -m m.ifs "${X[@]}" --translate -n "$N" -t 1 <en.txt >mg.txt 2>mg.err)
expect_eq "$(cat "$TMP/mg.txt")" "$want" "the translations transformers decodes, from the shard alone"
run $BIN/iflow-run -m "$TMP/m.ifs" "${X[@]}" --translate -n "$N" --json <"$TMP/en.txt"
expect_eq "$(jq -c '.source_ids' <<<"$out")" "$(jq -c '.texts[].src' "$REFS")" \
    "source ids: MarianTokenizer's (a final </s>, unknown characters as <unk>)"
expect_eq "$(jq -c '.ids' <<<"$out")" "$(jq -c '.texts[].greedy | map(select(. != 0))' "$REFS")" \
    "ids: generate()'s, the pad token never among them"
expect_eq "$(jq -r '.stop' <<<"$out" | sort -u)" length "every text runs to -n: </s> forced there (forced_eos)"
run $BIN/iflow-run -m "$TMP/m.ifs" "${X[@]}" --translate -n "$N" --beams 4 --json -p "$(head -n 1 "$TMP/en.txt")"
expect_eq "$(jq -c '[.beams[].ids[] | select(. == 54687)] | length' <<<"$out")" 0 "--beams 4: no beam holds the pad token"
for i in 0 1; do
    run $BIN/iflow-run -m "$TMP/m.ifs" "${X[@]}" --translate -n "$N" --beams 4 --json -p "$(sed -n "$((i + 1))p" "$TMP/en.txt")"
    expect_eq "$(jq -c '[.ids, .stop, ([.beams[].stop] | unique)]' <<<"$out")" \
        "[$(jq -c ".texts[$i].beam4 | map(select(. != 0))" "$REFS"),\"length\",[\"length\"]]" \
        "--beams 4, text $i: generate(num_beams=4)'s ids, every beam ended by the </s> forced at -n"
done

# the shard through a pipe (the streaming reader), zstd-compressed, and quantized
out=$($BIN/iflow-convert "$FX" --tokenizer "$TOK" --zstd | $BIN/iflow-run -m - "${X[@]}" --translate -n "$N" -p "$(head -n 1 "$TMP/en.txt")")
expect_eq "$out" "$(jq -r '.texts[0].translation' "$REFS")" "from a pipe, zstd"
run $BIN/iflow-quant -t q8_b32 -i "$TMP/m.ifs" -o "$TMP/m.q8.ifs"
run $BIN/iflow-convert --info "$TMP/m.q8.ifs"
expect_match "$out" $'\ntokenizer: spm \\(source.spm, vocab.json\\); target: spm \\(target.spm, vocab.json\\)\n' \
    "iflow-quant keeps the tokenizer records"
run $BIN/iflow-run -m "$TMP/m.q8.ifs" --translate -n 4 --json -p "Hello, world!"
expect_eq "$(jq -c '.source_ids' <<<"$out")" "$(jq -c '.texts[0].src' "$REFS")" "q8_b32: the same source ids"

# a folder laid out as Hugging Face's (config, weights and tokenizer files side by side)
mkdir "$TMP/hf"
for f in "$FX/config.json" "$FX/model.safetensors" "$TOK/source.spm" "$TOK/target.spm" "$TOK/vocab.json"; do
    ln -s "$(realpath "$f")" "$TMP/hf/"
done
run $BIN/iflow-convert --info "$TMP/hf"
expect_match "$out" $'\ntokenizer: spm \\(source.spm, vocab.json\\); target: spm \\(target.spm, vocab.json\\)\n' \
    "--info on the folder: the files a shard would carry"
run $BIN/iflow-run -m "$TMP/hf" "${X[@]}" --translate -n "$N" -t 1 <"$TMP/en.txt"
expect_eq "$out" "$want" "the Hugging Face folder converted on the fly: the same translations"

# refusals
run $BIN/iflow-convert "$FX" --tokenizer "$TMP/nowhere" -o "$TMP/x.ifs"
expect_rc 1 "--tokenizer that does not exist"
expect_eq "$err" "iflow-convert: cannot find the tokenizer: cannot open '$TMP/nowhere': No such file or directory" \
    "--tokenizer that does not exist: one line naming it"
mkdir "$TMP/cut"
head -c 4000 "$TOK/source.spm" >"$TMP/cut/source.spm"
ln -s "$TOK/vocab.json" "$TMP/cut/vocab.json"
run $BIN/iflow-convert "$FX" --tokenizer "$TMP/cut" -o "$TMP/x.ifs"
expect_rc 1 "a truncated source.spm"
expect_match "$err" "^iflow-convert: .* at byte [0-9]+ .*in '$TMP/cut/source.spm'\$" "a truncated source.spm: the file and the byte"
expect_one_line "a truncated source.spm"
expect_no_file "$TMP/x.ifs*" "nothing written"
run $BIN/iflow-convert tests/fixtures/families/t5-uni --tokenizer "$TMP" -o "$TMP/x.ifs"
expect_rc 1 "--tokenizer a folder without a tokenizer"
expect_match "$err" "no tokenizer.json, tokenizer.gguf, source.spm with vocab.json, sentencepiece.bpe.model with vocab.json, or spiece.model in directory '$TMP'" \
    "a folder without a tokenizer: says what was looked for"
# a byte of the stored source.spm flipped: the record's checksum names it and its offset
off=$($BIN/iflow-convert --info "$TMP/m.ifs" | awk '$2 == "tokenizer/source.spm" { print $5 }')
cp "$TMP/m.ifs" "$TMP/bad.ifs"
printf '\x55' | dd of="$TMP/bad.ifs" bs=1 seek=$((off + 1000)) conv=notrunc status=none
run $BIN/iflow-run -m "$TMP/bad.ifs" --translate -p "Hello"
expect_rc 1 "a damaged tokenizer record"
expect_eq "$err" "iflow-run: checksum mismatch in blob 'tokenizer/source.spm' (data at byte $off) in '$TMP/bad.ifs'" \
    "a damaged tokenizer record: the record, its offset and the file"
summary
