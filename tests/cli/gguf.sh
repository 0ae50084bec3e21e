#!/usr/bin/env bash
# GGUF files in: iflow-convert on stories260K.gguf (F32) and the SmolLM2 Q4_1 GGUF, to a file
# and down a pipe into iflow-run / iflow-ppl; --info on a GGUF and on what it became; bad GGUF
# input gives one line naming the file and the place, exit 1, and no output. The numbers are
# checked against references in tests/unit/test_gguf_model.c; here the programs' plumbing.
. "$(dirname "$0")/lib.sh"
G=$DATA/models/stories260K/gguf/stories260K.gguf
SMOL=$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
WIKI=$DATA/data/wikitext-2-raw/wiki.test.raw

# ---- stories260K.gguf: the same model as the Hugging Face checkpoint ----
run $BIN/iflow-convert "$G" -o "$TMP/g.ifs"
expect_rc 0 "convert stories260K.gguf"
run $BIN/iflow-convert --info "$TMP/g.ifs"
expect_match "$(grep '^source: ' <<<"$out")" "^source: gguf, architecture llama; tensors f32 -> f32 x48$" \
    "--info names the source and conversions"
expect_match "$out" "rope_layout=interleaved" "GGUF q/k rows: interleaved rope"
expect_match "$out" "tokenizer: gguf" "the tokenizer is the GGUF's vocabulary"
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/hf.ifs"
want=$($BIN/iflow-run -m "$TMP/hf.ifs" -p "Once upon a time" -n 48 --temp 0)
run $BIN/iflow-run -m "$TMP/g.ifs" -p "Once upon a time" -n 48 --temp 0
expect_eq "$out" "$want" "greedy text from the GGUF equals the Hugging Face checkpoint's"
out=$($BIN/iflow-convert "$G" | $BIN/iflow-run -m - -p "Once upon a time" -n 48 --temp 0)
expect_eq "$out" "$want" "iflow-convert x.gguf | iflow-run -m -"
run $BIN/iflow-run -m "$G" -p "Once upon a time" -n 48 --temp 0
expect_eq "$out" "$want" "iflow-run -m x.gguf converts on the fly"
run $BIN/iflow-run -m "$DATA/models/stories260K/hf" -p "Once upon a time" -n 48 --temp 0
expect_eq "$out" "$want" "iflow-run -m hf-dir/ converts on the fly"
expect_no_file "${TMPDIR:-/tmp}/iflow-model-*/model.ifs" "the on-the-fly shard is gone once open"
run env TMPDIR="$TMP/none" $BIN/iflow-run -m "$G" -p "x" -n 1
expect_rc 1 "no temporary directory"
expect_match "$err" "^iflow-run: cannot make a temporary directory to convert '.*stories260K.gguf' into" \
    "no temporary directory: named"
a=$($BIN/iflow-ppl -m "$TMP/g.ifs" -f "$WIKI" -c 256 --chunks 4 --json | jq .ppl)
b=$($BIN/iflow-ppl -m "$TMP/hf.ifs" -f "$WIKI" -c 256 --chunks 4 --json | jq .ppl)
expect_close "$a" "$b" 1e-5 "iflow-ppl: GGUF and Hugging Face conversions"
for t in f16 bf16; do
    run $BIN/iflow-convert "$G" -t $t -o "$TMP/g.$t.ifs"
    expect_match "$($BIN/iflow-convert --info "$TMP/g.$t.ifs")" "f32 -> $t x" "--dtype $t from a GGUF"
done

# ---- --info on a GGUF file: what converting it gives, without writing ----
run $BIN/iflow-convert --info "$G"
expect_rc 0 "--info x.gguf"
expect_match "$out" "source: gguf, architecture llama" "--info x.gguf: format and architecture"
expect_match "$out" "blk\.0\.wq +blk\.0\.attn_q\.weight +f32 +f32 +64x64" "--info x.gguf: tensor map"
run $BIN/iflow-convert --info "$G" --json
expect_eq "$(jq -r '.source.format + " " + .source.architecture + " " + (.tensors | length | tostring)' <<<"$out")" \
    "gguf llama 48" "--info x.gguf --json"

# ---- SmolLM2 Q4_1: q4_1 -> q4_b32 and q8_0 -> q8_b32 without a second rounding ----
if [ -f "$SMOL" ]; then
    run $BIN/iflow-convert --info "$SMOL"
    src=$(grep '^source: ' <<<"$out")
    for c in "q8_0 -> q8_b32 x1" "f32 -> f32 x61" "q4_1 -> q4_b32 x210"; do
        expect_match "$src" "^source: gguf, architecture llama; tensors .*$c" "--info SmolLM2: $c"
    done
    expect_match "$(grep '^hparams: ' <<<"$out")" "tie_embeddings=true" "SmolLM2: no output.weight, so tied"
    run $BIN/iflow-convert "$SMOL" -o "$TMP/smol.ifs"
    expect_rc 0 "convert SmolLM2"
    expect_match "$($BIN/iflow-convert --info "$TMP/smol.ifs")" "tensor +blk\.0\.ffn_down +q4_b32 +576x1536 " "q4_b32 matrices"
    run $BIN/iflow-run -m "$TMP/smol.ifs" -p "The capital of France is" -n 2 --temp 0
    expect_eq "$out" " Paris." "SmolLM2 greedy"
    out=$($BIN/iflow-convert "$SMOL" | $BIN/iflow-run -m - -p "The capital of France is" -n 2 --temp 0)
    expect_eq "$out" " Paris." "SmolLM2 through a pipe"
else
    echo "SKIP gguf: no SmolLM2 GGUF" >&2
fi

# ---- bad input: one line naming the file and the place, exit 1, no output ----
bad_gguf() { # file, what, regex
    rm -f "$TMP/out.ifs"
    run $BIN/iflow-convert "$1" -o "$TMP/out.ifs"
    expect_rc 1 "$2"
    expect_one_line "$2"
    expect_match "$err" "^iflow-convert: $3" "$2: message"
    expect_no_file "$TMP/out.ifs*" "$2: no output"
}
head -c 1000 "$G" >"$TMP/t1.gguf"
bad_gguf "$TMP/t1.gguf" "truncated metadata" "truncated gguf array at byte 69 in '.*t1\.gguf'"
head -c 1100000 "$G" >"$TMP/t2.gguf"
bad_gguf "$TMP/t2.gguf" "truncated tensor data" "truncated tensor data: 'blk\.4\.ffn_down\.weight' in '.*t2\.gguf' at byte 1097056"
sed 's/llama/llamb/g' "$G" >"$TMP/arch.gguf" # every 'llama' key and value: an architecture no spec serves
bad_gguf "$TMP/arch.gguf" "unknown architecture" "'.*arch\.gguf': unknown gguf architecture 'llamb'"
bad_gguf tests/fixtures/gguf/types.gguf "not a model" "'tests/fixtures/gguf/types\.gguf': unknown gguf architecture 'iflow-test'"
run $BIN/iflow-convert --spec specs/llama.ini tests/fixtures/gguf/types.gguf -o "$TMP/out.ifs"
expect_match "$err" "types\.gguf: gguf metadata lacks 'iflow-test\.embedding_length', needed for hyperparameter 'dim'" \
    "--spec on a GGUF that lacks its keys"
printf 'not a model' >"$TMP/x.bin"
bad_gguf "$TMP/x.bin" "neither directory nor GGUF" "'.*x\.bin' is not a model directory, a GGUF file or a llama2.c checkpoint"
summary
