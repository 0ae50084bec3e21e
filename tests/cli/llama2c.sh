#!/usr/bin/env bash
# llama2.c checkpoints in: iflow-convert on stories260K.bin with its tok512.bin (given, and found
# beside the checkpoint as tokenizer.bin), to a file and down a pipe into iflow-run; greedy text
# equal to the golden (llama2.c run, llama.cpp and a float64 PyTorch forward agree on it);
# --info on the checkpoint; bad input gives one line naming the file, exit 1 and no output.
# Tensor bytes, tokenizer ids and version-1 files are tests/unit/test_llama2c.c's.
. "$(dirname "$0")/lib.sh"
B=$DATA/models/stories260K/llama2c/stories260K.bin
K=$DATA/models/stories260K/llama2c/tok512.bin
GOLD=$DATA/golden/stories260K.greedy64.jsonl

run $BIN/iflow-convert "$B" --tokenizer "$K" -o "$TMP/s.ifs"
expect_rc 0 "convert stories260K.bin --tokenizer tok512.bin"
run $BIN/iflow-convert --info "$TMP/s.ifs"
expect_match "$(grep '^source: ' <<<"$out")" "^source: llama2c, architecture llama; tensors f32 -> f32 x47$" \
    "--info names the source: llama2c, 47 tensors (the classifier is the embedding)"
expect_match "$out" "rope_layout=interleaved" "llama2.c q/k rows: interleaved rope"
expect_match "$out" "max_seq=512" "the context is the checkpoint's seq_len"

# greedy: the golden text, token for token (the prompt's continuation)
want=$(head -n 1 "$GOLD" | jq -r .text)
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 64 --temp 0 --echo
expect_eq "$out" "$want" "greedy text equals the golden"
out=$($BIN/iflow-convert "$B" --tokenizer "$K" | $BIN/iflow-run -m - -p "Once upon a time" -n 64 --temp 0 --echo)
expect_eq "$out" "$want" "iflow-convert x.bin | iflow-run -m -"

# tokenizer.bin beside the checkpoint
mkdir -p "$TMP/beside"
cp "$B" "$TMP/beside/model.bin"
cp "$K" "$TMP/beside/tokenizer.bin"
run $BIN/iflow-convert "$TMP/beside/model.bin" -o "$TMP/b.ifs"
expect_rc 0 "tokenizer.bin found beside the checkpoint"
expect_eq "$($BIN/iflow-convert --info "$TMP/b.ifs" | awk '/^tensor/ {print $2, $NF}')" "$($BIN/iflow-convert --info "$TMP/s.ifs" | awk '/^tensor/ {print $2, $NF}')" \
    "the same tensors as with --tokenizer"

# --info on the checkpoint itself
run $BIN/iflow-convert --info "$B" --tokenizer "$K" --json
expect_eq "$(jq -r '.source.format + " " + (.tensors | length | tostring) + " " + (.hparams.n_kv_heads | tostring)' <<<"$out")" \
    "llama2c 47 4" "--info x.bin --json"

# ---- bad input ----
rm "$TMP/beside/tokenizer.bin"
run $BIN/iflow-convert "$TMP/beside/model.bin" -o "$TMP/x.ifs"
expect_rc 1 "no tokenizer"
expect_eq "$err" "iflow-convert: llama2.c checkpoint '$TMP/beside/model.bin' needs its tokenizer: no '$TMP/beside/tokenizer.bin' (give one with --tokenizer)" \
    "no tokenizer: one line naming both files"
expect_no_file "$TMP/x.ifs*" "no output without a tokenizer"
head -c 1000000 "$B" >"$TMP/short.bin"
run $BIN/iflow-convert "$TMP/short.bin" --tokenizer "$K" -o "$TMP/x.ifs"
expect_rc 1 "truncated checkpoint"
expect_match "$err" "^iflow-convert: '.*short.bin' is not a model directory, a GGUF file or a llama2.c checkpoint" \
    "truncated checkpoint: named"
head -c 3000 "$K" >"$TMP/short-tok.bin"
run $BIN/iflow-convert "$B" --tokenizer "$TMP/short-tok.bin" -o "$TMP/x.ifs"
expect_rc 1 "truncated tokenizer"
expect_match "$err" "^iflow-convert: llama2.c tokenizer '.*short-tok.bin' ends at byte 3000 in token 214 of 512$" \
    "truncated tokenizer: the byte and the token"
run $BIN/iflow-convert "$DATA/models/stories260K/hf" --tokenizer "$K" -o "$TMP/x.ifs"
expect_rc 1 "--tokenizer with a Hugging Face directory"
expect_no_file "$TMP/x.ifs*" "no output after errors"
summary
