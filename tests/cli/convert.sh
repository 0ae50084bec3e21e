#!/usr/bin/env bash
# iflow-convert: good conversions, --info, and every kind of bad input the issue lists. A bad
# input must give one line on stderr naming the file and the place, exit 1, and leave no output.
. "$(dirname "$0")/lib.sh"
HF=$DATA/models/stories260K/hf

# ---- good ----
run $BIN/iflow-convert "$HF" -o "$TMP/s.ifs"
expect_rc 0 "convert stories260K"
run $BIN/iflow-convert --info "$TMP/s.ifs"
expect_rc 0 "--info"
expect_match "$out" "spec: llama" "--info names the spec"
expect_match "$out" "tensor +blk\.4\.ffn_down +f32 +64x172 " "--info lists blk.4.ffn_down [64,172]"
expect_eq "$(grep -c '^tensor ' <<<"$out")" 47 "--info: 47 tensors (embeddings, 5 x 9 per layer, final norm; tied output)"
run $BIN/iflow-convert --info "$TMP/s.ifs" --json
expect_match "$out" '"hparams": \{' "--info --json"

# stdout stream equals the file; a zstd stream decodes to the same model
$BIN/iflow-convert "$HF" >"$TMP/s2.ifs"
cmp -s "$TMP/s.ifs" "$TMP/s2.ifs" && ok || bad "stdout stream differs from -o FILE"
run $BIN/iflow-convert "$HF" --zstd -o "$TMP/s.ifs.zst"
expect_rc 0 "--zstd"
run $BIN/iflow-convert --info "$TMP/s.ifs.zst"
expect_rc 0 "--info on a zstd shard"
for t in f16 bf16; do
    run $BIN/iflow-convert "$HF" -t $t -o "$TMP/s.$t.ifs"
    expect_rc 0 "convert --dtype $t"
    expect_match "$($BIN/iflow-convert --info "$TMP/s.$t.ifs")" "blk\.0\.wq +$t " "--dtype $t stores matrices as $t"
done
run $BIN/iflow-convert "$DATA/models/xs-ckpt/hf" -o "$TMP/xs.ifs"
expect_rc 0 "convert xs-ckpt"

# ---- bad input ----
# a writable copy of the model directory
mkcopy() { rm -rf "$TMP/m"; mkdir "$TMP/m"; cp "$HF"/* "$TMP/m/"; chmod u+w "$TMP"/m/*; }
bad_convert() { # what, regex the message must match
    run $BIN/iflow-convert "$TMP/m" -o "$TMP/out.ifs"
    expect_rc 1 "$1"
    expect_one_line "$1"
    expect_match "$err" "^iflow-convert: $2" "$1: message"
    expect_no_file "$TMP/out.ifs*" "$1"
}

mkcopy; head -c 600000 "$HF/model.safetensors" >"$TMP/m/model.safetensors"
bad_convert "truncated safetensors" ".*model\.safetensors"

mkcopy; { printf '\377\377\377\377\000\000\000\000'; tail -c +9 "$HF/model.safetensors"; } >"$TMP/m/model.safetensors"
bad_convert "header length that lies" ".*header length.*model\.safetensors"

# swap a tensor's shape: same header length, same byte count, wrong shape for the model
mkcopy; sed 's/"shape":\[172,64\]/"shape":\[64,172\]/' "$HF/model.safetensors" >"$TMP/m/model.safetensors"
bad_convert "tensor with the wrong shape" "tensor 'model\.layers\.[0-9]\.mlp\.(gate|up)_proj\.weight' in '$TMP/m' has shape \[64, 172\], the model needs \[172, 64\]"

mkcopy; sed 's/model\.norm\.weight/model\.norx\.weight/' "$HF/model.safetensors" >"$TMP/m/model.safetensors"
bad_convert "missing tensor" "missing tensor 'model\.norm\.weight' \(iflow 'output_norm'\) in '$TMP/m'"

mkcopy; sed 's/LlamaForCausalLM/FoobarForCausalLM/' "$HF/config.json" >"$TMP/m/config.json"
bad_convert "unknown architecture" "unknown architecture 'FoobarForCausalLM'"

mkcopy; sed 's/"hidden_act": "silu"/"hidden_act": "gelu"/' "$HF/config.json" >"$TMP/m/config.json"
run $BIN/iflow-convert "$TMP/m" -o "$TMP/out.ifs"
expect_rc 0 "hidden_act is not read by the llama spec (its activation block is fixed)"
rm -f "$TMP/out.ifs"

rm -rf "$TMP/m"
run $BIN/iflow-convert "$TMP/does-not-exist" -o "$TMP/out.ifs"
expect_rc 1 "non-existent model directory"
expect_one_line "non-existent directory"
expect_match "$err" "does-not-exist" "non-existent directory: message names it"
expect_no_file "$TMP/out.ifs*" "non-existent directory"

# ---- bad shard files ----
size=$(stat -c %s "$TMP/s.ifs")
head -c $((size - 100)) "$TMP/s.ifs" >"$TMP/trunc.ifs"
run $BIN/iflow-convert --info "$TMP/trunc.ifs"
expect_rc 1 "truncated shard"
expect_one_line "truncated shard"
expect_match "$err" "^iflow-convert: truncated shard: .*trunc\.ifs" "truncated shard: message"

head -c 300000 "$TMP/s.ifs" >"$TMP/trunc2.ifs"
run $BIN/iflow-run -m "$TMP/trunc2.ifs" -p hi -n 1
expect_rc 1 "iflow-run on a shard cut inside a tensor"
expect_match "$err" "^iflow-run: truncated shard: tensor 'blk\.[0-9]\.[a-z_]+' needs [0-9]+ bytes at byte [0-9]+, file ends at byte 300000 in '.*trunc2\.ifs'" "cut inside a tensor: names tensor and offset"

cp "$TMP/s.ifs" "$TMP/flip.ifs"
printf '\x55' | dd of="$TMP/flip.ifs" bs=1 seek=500000 conv=notrunc status=none
run $BIN/iflow-run -m "$TMP/flip.ifs" -p hi -n 1
expect_rc 1 "bit-flipped shard"
expect_one_line "bit-flipped shard"
expect_match "$err" "^iflow-run: checksum mismatch in tensor 'blk\.[0-9]\.[a-z_]+' \(data at byte [0-9]+\) in '.*flip\.ifs'" "bit flip: names the tensor"

cp "$TMP/s.ifs" "$TMP/flip2.ifs"
printf '\x01' | dd of="$TMP/flip2.ifs" bs=1 seek=70 conv=notrunc status=none
run $BIN/iflow-convert --info "$TMP/flip2.ifs"
expect_rc 1 "bit flip in a record header"
expect_match "$err" "record header.* at byte 64 in '.*flip2\.ifs'" "header bit flip: names the offset"

printf 'not a shard at all' >"$TMP/junk.ifs"
run $BIN/iflow-run -m "$TMP/junk.ifs" -p hi
expect_rc 1 "not a shard"
expect_eq "$err" "iflow-run: not an iflow shard (bad magic at byte 0): '$TMP/junk.ifs'" "not a shard: exact message"

run $BIN/iflow-run -m "$TMP/nope.ifs" -p hi
expect_rc 1 "non-existent shard"
expect_eq "$err" "iflow-run: cannot open '$TMP/nope.ifs': No such file or directory" "non-existent shard: exact message"

# refusing a terminal is tested in help.sh; output to a directory that does not exist:
run $BIN/iflow-convert "$HF" -o "$TMP/no/such/dir/x.ifs"
expect_rc 1 "unwritable output"
expect_match "$err" "^iflow-convert: cannot create '$TMP/no/such/dir/x\.ifs'" "unwritable output: message"

# synthetic model of a real shape (small: a copy of stories260K's config)
mkdir -p "$TMP/syn" && cp "$HF/config.json" "$HF/tokenizer.json" "$TMP/syn/"
run $BIN/iflow-convert --synthetic "$TMP/syn" --seed 3 -o "$TMP/syn1.ifs"
expect_rc 0 "--synthetic"
$BIN/iflow-convert --synthetic "$TMP/syn" --seed 3 -o "$TMP/syn2.ifs"
cmp -s "$TMP/syn1.ifs" "$TMP/syn2.ifs" && ok || bad "--synthetic with one seed is not reproducible"
$BIN/iflow-convert --synthetic "$TMP/syn" --seed 4 -o "$TMP/syn3.ifs"
cmp -s "$TMP/syn1.ifs" "$TMP/syn3.ifs" && bad "--synthetic ignores the seed" || ok
run $BIN/iflow-run -m "$TMP/syn1.ifs" -p "Once" -n 8 --temp 0
expect_rc 0 "a synthetic model runs"

# the optional blocks no shared checkpoint has: q/k/v/o and MLP biases, a separate output matrix
mkdir -p "$TMP/syn2" && cp "$HF/tokenizer.json" "$TMP/syn2/"
sed 's/"attention_bias": false/"attention_bias": true/; s/"mlp_bias": false/"mlp_bias": true/; s/"tie_word_embeddings": true/"tie_word_embeddings": false/' \
    "$HF/config.json" >"$TMP/syn2/config.json"
run $BIN/iflow-convert --synthetic "$TMP/syn2" -o "$TMP/syn-bias.ifs"
expect_rc 0 "--synthetic with biases and an untied output"
info=$($BIN/iflow-convert --info "$TMP/syn-bias.ifs")
for t in "blk\.4\.bq +f32 +64 " "blk\.4\.bk +f32 +32 " "blk\.0\.bo +f32 +64 " "blk\.0\.ffn_gate_b +f32 +172 " \
         "blk\.0\.ffn_down_b +f32 +64 " "output +f32 +512x64 "; do
    expect_match "$info" "tensor +$t" "biases/untied: $t"
done
run $BIN/iflow-run -m "$TMP/syn-bias.ifs" -p "Once" -n 8 --temp 0 --json
expect_eq "$(jq '.gen_ids | length' <<<"$out")" 8 "a model with biases and an untied output runs"

# ---- an output that is a device: written in place, never replaced by a renamed file ----
run $BIN/iflow-convert "$DATA/models/stories260K/hf" -o /dev/null
expect_rc 0 "-o /dev/null"
[ -c /dev/null ] && ok || bad "-o /dev/null replaced /dev/null with a regular file"

summary
