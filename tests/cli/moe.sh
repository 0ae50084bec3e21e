#!/usr/bin/env bash
# Mixtures of experts through the programs: the tiny Mixtral of tests/fixtures (random weights,
# 4 experts, 2 per token) as llama.cpp's converter wrote it, with 3-D expert tensors and with
# one tensor per expert (the same weights: the same greedy text); a batch of prompts gives each
# the text it gets alone (rows of other requests choose other experts); an importance matrix
# from iflow-ppl quantizes it although the text routed no token to some expert; a plan of whole
# layers over two CPU devices gives the same text; partitioning, --split and a plan that splits a
# layer are refused, naming what. The logits are checked against
# transformers in tests/unit/test_families.c and test_gguf_families.c; here the plumbing.
. "$(dirname "$0")/lib.sh"
FX=tests/fixtures/gguf-families
WIKI=$DATA/data/wikitext-2-raw/wiki.test.raw

run $BIN/iflow-convert "$FX/mixtral.gguf" -o "$TMP/m.ifs"
expect_rc 0 "convert mixtral.gguf"
run $BIN/iflow-convert --info "$TMP/m.ifs"
expect_match "$out" "n_experts=4 n_experts_used=2 expert_ffn_dim=24 expert_norm=true" "--info: the experts"
expect_match "$out" $'\ntensor blk.1.ffn_down.3 ' "--info: one record per expert"
run $BIN/iflow-convert --info "$FX/mixtral.gguf"
expect_match "$out" $'\nblk.0.ffn_gate.2 +blk.0.ffn_gate_exps.weight ' "--info of the GGUF: an expert from the 3-D tensor"
want=$($BIN/iflow-run -m "$TMP/m.ifs" -p "t5 t9 t17 t33" -n 12 --temp 0)
expect_match "$want" "^( t[0-9]+){12}$" "greedy text of 12 tokens"
run $BIN/iflow-run -m "$FX/mixtral-old.gguf" -p "t5 t9 t17 t33" -n 12 --temp 0
expect_eq "$out" "$want" "one tensor per expert: the same text"

# a batch: each request's text as alone
b=$(printf '{"prompt": "t5 t9 t17 t33", "max_tokens": 12}\n{"prompt": "t40 t2 t77", "max_tokens": 12}\n{"prompt": "t101 t6", "max_tokens": 12}\n' |
    $BIN/iflow-run -m "$TMP/m.ifs" --batch --temp 0 --parallel 3 | jq -r -s 'sort_by(.id) | .[].text')
for p in "t5 t9 t17 t33" "t40 t2 t77" "t101 t6"; do
    alone+=("$($BIN/iflow-run -m "$TMP/m.ifs" -p "$p" -n 12 --temp 0)")
done
expect_eq "$b" "$(printf '%s\n' "${alone[@]}")" "a batch of three: each as alone"

# an importance matrix, and quantizing with it
run $BIN/iflow-ppl -m "$TMP/m.ifs" -f "$WIKI" -c 64 --chunks 8 --save-imatrix "$TMP/m.imat"
expect_rc 0 "iflow-ppl --save-imatrix"
run $BIN/iflow-quant -t q8_b32 -i "$TMP/m.ifs" -o "$TMP/q.ifs" --imatrix "$TMP/m.imat"
expect_rc 0 "iflow-quant --imatrix: $err"
run $BIN/iflow-run -m "$TMP/q.ifs" -p "t5 t9 t17 t33" -n 4 --temp 0
expect_rc 0 "the quantized mixture runs"

# refusals
run $BIN/iflow-partition -m "$TMP/m.ifs" --devices cpu:2
expect_rc 1 "partitioning a mixture"
expect_eq "$err" "iflow-partition: '$TMP/m.ifs' is a mixture of experts: partitioning one is not implemented yet (it runs on the cpu)" \
    "partitioning: refused, named"
printf '[plan]\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 24\n[device cpu:0]\nheads = 0-1\nffn = 0-11\n[device cpu:1]\nheads = 2-3\nffn = 12-23\n' >"$TMP/plan.ini"
run $BIN/iflow-run -m "$TMP/m.ifs" --plan "$TMP/plan.ini" -p "t5" -n 2
expect_rc 1 "a plan splitting a layer"
expect_match "$err" "layer 0 is a mixture of experts: it cannot be split over devices yet" "a split layer: refused, named"
expect_one_line "a split layer"
printf '[plan]\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 24\n[device cpu:0]\nlayers = 0-0\n[device cpu:1]\nlayers = 1-1\n' >"$TMP/layers.ini"
run $BIN/iflow-run -m "$TMP/m.ifs" --plan "$TMP/layers.ini" -p "t5 t9 t17 t33" -n 12 --temp 0
expect_eq "$out" "$want" "a plan of whole layers over two cpu devices: the same text"
run $BIN/iflow-partition -m "$TMP/m.ifs" --plan "$TMP/layers.ini" --split "$TMP/split"
expect_rc 1 "--split of a mixture"
expect_eq "$err" "iflow-partition: cannot split '$TMP/m.ifs' into '$TMP/split': '$TMP/m.ifs' is a mixture of experts: splitting one is not implemented yet" \
    "--split: refused, named"
expect_no_file "$TMP/split" "--split: nothing written"
summary
