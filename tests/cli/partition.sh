#!/usr/bin/env bash
# iflow-partition: the --compare table of stories260K on 4 described H100s (exact), its JSON
# fields, a 70B shape on 8 and on 1 H100, plans written with -o that parse back (sections,
# ranges), a shard from a pipe, cpu:N, and errors: exact messages and exit codes.
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
layer    4x1         2.6 MiB      0.007     140950.0     412866.6  yes
tensor   1x4         1.9 MiB      0.120       8311.7       8311.7  yes
hybrid   2x2         2.1 MiB      0.043      23489.2      37993.4  yes
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
expect_eq "$err" "iflow-partition: cuda:0 (H100-80G) lacks 50.9 GiB (54641456128 bytes) for the tensor plan: it needs 130.5 GiB (weights 128.0 GiB, KV cache 2.5 GiB for 4096 positions x 1 sequence, scratch 44.1 MiB) and has 79.6 GiB" \
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
expect_match "$err" "decode step: read [0-9.]+ ms \+ all-reduce 0\.000 ms \+ transfers [0-9.]+ ms \+ output [0-9.]+ ms = [0-9.]+ ms" "-v breakdown"

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
# ---- -o /dev/null writes in place (a rename over it would replace the device) ----
run $BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy tensor -o /dev/null
expect_rc 0 "-o /dev/null"
[ -c /dev/null ] && ok || bad "-o /dev/null replaced /dev/null with a regular file"

summary
