#!/usr/bin/env bash
# iflow-partition: the --compare table of stories260K on 4 described H100s (exact), its JSON
# fields, a 70B shape on 8 and on 1 H100, plans written with -o that parse back (sections,
# ranges), a shard from a pipe, cpu:N, and errors: exact messages and exit codes. --split: one
# file per device (from a file and from a pipe: the same bytes), run by iflow-run -m DIR and
# iflow-ppl -m DIR with the whole model + plan's output; a missing, foreign or truncated file.
. "$(dirname "$0")/lib.sh"
P=$BIN/iflow-partition
S=$DATA/models/stories260K/hf
B70=tests/fixtures/synthetic/llama-2-70b
run $BIN/iflow-convert "$S" -o "$TMP/s.ifs"
expect_rc 0 "convert stories260K"

# ---- the table, from a pipe ----
run bash -c "$BIN/iflow-convert '$S' | $P -m - --devices 4xH100-80G --compare"
expect_rc 0 "--compare from a pipe"
expect_eq "$out" "model: <stdin>: 5 layers, 8 heads, 4 kv heads, dim 64, ffn 172, 1040128 bytes
devices: 4xH100-80G (4); ctx 4096, batch 1, objective latency
strategy layout   mem/device   ms/token decode tok/s     tokens/s  fits
layer    4x1         3.6 MiB      0.192       5201.3      13074.4  yes
tensor   1x4         2.9 MiB      0.305       3274.9       3274.9  yes
hybrid   2x2         3.1 MiB      0.228       4392.6       7279.7  yes
gpu-cpu  -                 -          -            -            -  n/a: gpu-cpu needs a GPU and a CPU among the devices '4xH100-80G' (such as H100-80G,cpu)
best for latency: layer" "--compare table"

# ---- JSON Lines ----
run $P -m "$TMP/s.ifs" --devices 4xH100-80G --compare --json
expect_rc 0 "--compare --json"
expect_eq "$(jq -r '.strategy' <<<"$out" | paste -sd' ')" "layer tensor hybrid gpu-cpu" "one line per strategy"
expect_eq "$(jq -r 'select(.strategy == "hybrid") | [.fits, .layout, .stages, (.memory | length), .memory[0].device, .memory[0].description] | map(tostring) | join(" ")' <<<"$out")" \
    "true 2x2 2 4 cuda:0 H100-80G" "hybrid's fields"
expect_eq "$(jq -r 'select(.best) | .strategy' <<<"$out")" "layer" "the best is marked"
expect_eq "$(jq -r 'select(.strategy == "tensor") | [.ms_per_token > 0, .tokens_per_s > 0, .memory_max == ([.memory[].total] | max), (.memory[0].total == .memory[0].weights + .memory[0].kv + .memory[0].scratch)] | map(tostring) | join(" ")' <<<"$out")" \
    "true true true true" "tensor's figures add up"
expect_match "$(jq -r 'select(.strategy == "gpu-cpu") | .error' <<<"$out")" "needs a GPU and a CPU" "gpu-cpu: n/a, why"

# ---- a 70B shape: fits on 8 by tensor, not on 1 ----
run $P --config $B70 --devices 8xH100-80G --compare --json
expect_rc 0 "70B on 8xH100-80G"
expect_eq "$(jq -r 'select(.strategy == "tensor") | .fits' <<<"$out")" "true" "70B fits by tensor"
run $P --config $B70 --devices 1xH100-80G --strategy tensor -o "$TMP/no.ini"
expect_rc 1 "70B on one H100"
expect_eq "$err" "iflow-partition: cuda:0 (H100-80G) lacks 51.0 GiB (54784062464 bytes) for the tensor plan: it needs 130.7 GiB (weights 128.0 GiB, KV cache 2.5 GiB for 4096 positions x 1 sequence, scratch 180.1 MiB) and has 79.6 GiB" \
    "does not fit: names the device and bytes"
expect_no_file "$TMP/no.ini*" "no plan left behind"
run $P --config $B70 --devices 1xH100-80G
expect_rc 1 "auto on one H100"
expect_match "$err" "^iflow-partition: no strategy fits: cuda:0 \(H100-80G\) lacks " "auto: none fits"

# ---- -o writes a plan that reads back ----
run $P --config $B70 --devices 8xH100-80G --strategy hybrid -o "$TMP/h.ini"
expect_rc 0 "hybrid -o"
expect_eq "$out" "" "nothing on standard output"
expect_eq "$(grep -c '^\[device cuda:[0-7]\]$' "$TMP/h.ini")" 8 "8 device sections"
expect_eq "$(grep -E '^(strategy|layers|heads|kv_heads|ffn|output) = ' "$TMP/h.ini" | head -6 | paste -sd' ')" \
    "strategy = hybrid layers = 80 heads = 64 kv_heads = 8 ffn = 28672 output = cuda:4" "the [plan] section"
expect_eq "$(awk '/^\[device cuda:5\]/ { f = 1; next } f && /^$/ { exit } f' "$TMP/h.ini" | paste -sd' ')" \
    "layers = 40-79 heads = 16-31 ffn = 7168-14335" "cuda:5: the second layer group's second head group"
run $P -m "$TMP/s.ifs" --devices cpu:8 --strategy tensor -o "$TMP/t.ini"
expect_rc 0 "cpu:8 tensor"
expect_eq "$(awk '/^\[device cpu:7\]/ { f = 1; next } f' "$TMP/t.ini" | paste -sd' ')" "layers = all heads = 7-7 ffn = 151-171" \
    "cpu:7 holds head 7 (a replicated kv head)"
if $BIN/iflow-run --help | grep -q -- --plan; then
    run $BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/t.ini" -p "Once upon a time" -n 8 --temp 0
    expect_rc 0 "iflow-run --plan reads the plan: $err"
fi
run $P -m "$TMP/s.ifs" --devices 2xL40S --strategy layer
expect_rc 0 "plan to standard output"
expect_match "$out" "^# iflow partition plan" "the plan on standard output"
run $P -m "$TMP/s.ifs" --devices 2xL40S --strategy layer -o "$TMP/l.ini" --json -v
expect_rc 0 "--json -o"
expect_eq "$(jq -r '[.strategy, .fits, .stages] | map(tostring) | join(" ")' <<<"$out")" "layer true 2" "the plan's cost as JSON"
expect_match "$err" $'^iflow-partition: layer plan on 2xL40S: layout 2x1, 2 stages, ctx 4096, batch 1 \\(KV cache of 1 sequence\\)\n  cuda:0 ' "-v"
expect_match "$err" "decode step: read [0-9.]+ ms \+ fixed 0\.185 ms \+ all-reduce 0\.000 ms \+ transfers [0-9.]+ ms \+ output [0-9.]+ ms = [0-9.]+ ms" "-v breakdown"

# ---- --split: one shard file per device ----
gen() { $BIN/iflow-run -p "Once upon a time" -n 64 --temp 0 --json -t 1 "$@" | jq -c .gen_ids; }
ref=$(gen -m "$TMP/s.ifs")
expect_match "$ref" '^\[[0-9]+(,[0-9]+){63}\]$' "64 greedy tokens"
for strat in layer tensor hybrid; do
    run $P -m "$TMP/s.ifs" --devices cpu:4 --strategy $strat -o "$TMP/$strat.ini" --split "$TMP/split-$strat"
    expect_rc 0 "--split $strat"
    expect_eq "$out" "" "--split: nothing on standard output"
    expect_eq "$(cd "$TMP/split-$strat" && ls | paste -sd' ')" "device-0.ifs device-1.ifs device-2.ifs device-3.ifs plan.ini" \
        "$strat: four device files and the plan"
    cmp -s "$TMP/$strat.ini" "$TMP/split-$strat/plan.ini" && ok || bad "$strat: DIR/plan.ini is the plan"
    expect_eq "$(gen -m "$TMP/s.ifs" --plan "$TMP/$strat.ini")" "$ref" "$strat: the whole model + plan"
    expect_eq "$(gen -m "$TMP/split-$strat")" "$ref" "$strat: iflow-run -m DIR, the split files alone"
done
# each file holds only its slices, and says so in its meta
expect_eq "$($BIN/iflow-convert --info "$TMP/split-tensor/device-1.ifs" --json | jq -c '.meta.shard | [.index, .count, .device, .layers, .heads, .kv_heads, .ffn, .embeddings, .output]')" \
    '[1,4,"cpu:1",[0,5],[2,4],[1,2],[43,86],false,false]' "device 1's shard object"
total=$(stat -c %s "$TMP/s.ifs")
for f in "$TMP"/split-tensor/device-*.ifs; do
    [ "$(stat -c %s "$f")" -lt $((total / 2)) ] && ok || bad "$f holds less than half the model"
done
# from a pipe, by a plan file: the same files, byte for byte
run bash -c "$BIN/iflow-convert '$S' | $P -m - --plan '$TMP/hybrid.ini' --split '$TMP/split-pipe'"
expect_rc 0 "--split from a pipe"
for i in 0 1 2 3; do
    cmp -s "$TMP/split-pipe/device-$i.ifs" "$TMP/split-hybrid/device-$i.ifs" && ok || bad "device-$i.ifs from a pipe differs"
done
# perplexity from the split files: the whole model + plan's
ppl() { $BIN/iflow-ppl -f "$DATA/data/wikitext-2-raw/wiki.test.raw" -c 64 --chunks 2 --json -t 1 "$@" | jq -r .ppl; }
p_split=$(ppl -m "$TMP/split-hybrid")
expect_match "$p_split" '^[0-9]+\.[0-9]+$' "iflow-ppl -m DIR: a perplexity"
expect_eq "$p_split" "$(ppl -m "$TMP/s.ifs" --plan "$TMP/hybrid.ini")" "iflow-ppl -m DIR: the whole model + plan's"
# the plan of a split model may rename its devices, not change its partition
sed 's/cpu:\([0-3]\)/cpu:1\1/g' "$TMP/hybrid.ini" >"$TMP/renamed.ini"
expect_eq "$(gen -m "$TMP/split-hybrid" --plan "$TMP/renamed.ini")" "$ref" "the split's plan with its devices renamed"
run $BIN/iflow-run -m "$TMP/split-hybrid" --plan "$TMP/layer.ini" -p "Once" -n 4 --temp 0
expect_rc 1 "another partition's plan"
expect_match "$err" "^iflow-run: model '.*split-hybrid' is split by another plan: device 0 \(cpu:0\) holds layers 0-0, heads 0-7, ffn 0-171, but layers 0-2, heads 0-3, ffn 0-85 in its split's plan$" \
    "another partition's plan: why"
run $BIN/iflow-run -m "$TMP/split-hybrid" --device cpu -p "Once" -n 4 --temp 0
expect_rc 2 "--device with a split model"
# errors: a missing file, a file of another split, a truncated file, a pipe without --plan
mv "$TMP/split-hybrid/device-2.ifs" "$TMP/d2"
run $BIN/iflow-run -m "$TMP/split-hybrid" -p "Once" -n 4 --temp 0
expect_rc 1 "a missing file"
expect_match "$err" "^iflow-run: split model '.*split-hybrid', device 2 \(cpu:2\): cannot open '.*split-hybrid/device-2.ifs': No such file or directory$" \
    "a missing file: named"
cp "$TMP/split-tensor/device-2.ifs" "$TMP/split-hybrid/device-2.ifs"
run $BIN/iflow-run -m "$TMP/split-hybrid" -p "Once" -n 4 --temp 0
expect_rc 1 "a file of another split"
expect_match "$err" "device-2.ifs' is from another split: its partition differs from plan '.*split-hybrid/plan.ini'$" \
    "a file of another split: named"
head -c 100000 "$TMP/d2" >"$TMP/split-hybrid/device-2.ifs"
run $BIN/iflow-run -m "$TMP/split-hybrid" -p "Once" -n 4 --temp 0
expect_rc 1 "a truncated file"
expect_match "$err" "truncated shard: .* in '.*split-hybrid/device-2.ifs'$" "a truncated file: named"
expect_one_line "a truncated file"
run $BIN/iflow-run -m "$TMP/split-hybrid/device-0.ifs" -p "Once" -n 4 --temp 0
expect_rc 1 "one split file alone"
expect_match "$err" "is device 0 of a 4-device split model \(iflow-partition --split\): open its directory$" "one split file alone: why"
run bash -c "$BIN/iflow-convert '$S' | $P -m - --devices cpu:2 --split '$TMP/split-x'"
expect_rc 2 "a pipe without --plan"
expect_match "$err" "a model from standard input is read once: give the plan with --plan FILE" "a pipe without --plan: why"
run bash -c "head -c 300000 '$TMP/s.ifs' | $P -m - --plan '$TMP/hybrid.ini' --split '$TMP/split-cut'"
expect_rc 1 "a source that ends early"
expect_match "$err" "^iflow-partition: cannot split '<stdin>' into '.*split-cut': truncated shard" "a source that ends early: why"
expect_eq "$(ls -A "$TMP/split-cut" | wc -l)" 0 "a failed split leaves no file"
run $P -m "$TMP/s.ifs" --plan "$TMP/hybrid.ini"
expect_rc 2 "--plan without --split"

# ---- errors ----
run $P -m "$TMP/s.ifs" --devices 4xB200 --compare
expect_rc 1 "unknown description"
expect_match "$err" "^iflow-partition: unknown device description 'B200' in devices '4xB200' \(known: H100-80G, " "unknown description message"
expect_one_line "unknown description"
run $P -m "$TMP/s.ifs" --devices 4xH100-80G --strategy diagonal
expect_rc 2 "bad --strategy"
expect_eq "$err" "iflow-partition: unknown strategy 'diagonal' for --strategy (layer, tensor, hybrid, gpu-cpu, auto)
Try 'iflow-partition --help' for more information." "bad --strategy message"
run $P -m "$TMP/s.ifs"
expect_rc 2 "no --devices"
run $P -m "$TMP/s.ifs" --config $B70 --devices cpu:2
expect_rc 2 "-m and --config"
run $P -m "$TMP/s.ifs" --devices 3xH100-80G --strategy hybrid
expect_rc 1 "hybrid on 3"
expect_match "$err" "hybrid needs a device count G x T with G, T > 1.*3 devices have none" "hybrid on 3: why"
run $P -m "$TMP/nothing.ifs" --devices 2xL40S
expect_rc 1 "missing model"
expect_match "$err" "nothing\.ifs" "missing model: named"
# a post-norm model (BERT): its layers cannot be split over devices, so tensor plans are refused
# here, before a split is written or a run is placed, and --compare marks them n/a
$BIN/iflow-convert tests/fixtures/families/bert -o "$TMP/bert.ifs" 2>/dev/null
run $P -m "$TMP/bert.ifs" --devices cpu:2 --strategy tensor -o "$TMP/bt.ini"
expect_rc 1 "tensor plan of a post-norm model"
expect_eq "$err" "iflow-partition: layer 0 has post norms: it cannot be split over devices yet" "post norms: message"
run $P -m "$TMP/bert.ifs" --devices cpu:2 --compare
expect_match "$out" $'\ntensor .* n/a: layer 0 has post norms' "--compare: tensor n/a for a post-norm model"
expect_match "$out" "best for latency: layer" "--compare: layer is the best left"
printf '[plan]\nstrategy = tensor\nlayers = 2\nheads = 4\nkv_heads = 4\nffn = 64\noutput = cpu:0\n[device cpu:0]\nheads = 0-1\nffn = 0-31\n[device cpu:1]\nheads = 2-3\nffn = 32-63\n' >"$TMP/bt.ini"
run $P -m "$TMP/bert.ifs" --plan "$TMP/bt.ini" --split "$TMP/bt-split"
expect_rc 1 "--split by a tensor plan of a post-norm model"
expect_match "$err" "layer 0 has post norms: it cannot be split over devices yet" "--split: post norms named"
expect_no_file "$TMP/bt-split/*" "--split refused: nothing written"
run $P -m "$TMP/bert.ifs" --devices cpu:2 --strategy layer -o "$TMP/bl.ini"
expect_rc 0 "layer plan of a post-norm model"
# ---- -o /dev/null writes in place (a rename over it would replace the device) ----
run $BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy tensor -o /dev/null
expect_rc 0 "-o /dev/null"
[ -c /dev/null ] && ok || bad "-o /dev/null replaced /dev/null with a regular file"

summary
