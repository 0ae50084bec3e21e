#!/usr/bin/env bash
# iflow-run against ../shared/golden: greedy continuations token for token, stdin prompts,
# pipes, seeds, --tokenize, --json, and usage errors.
. "$(dirname "$0")/lib.sh"
G=$DATA/golden
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }

# ---- greedy continuations equal the golden ones (text and ids) ----
n=$(wc -l <"$G/stories260K.greedy64.jsonl")
for i in $(seq 0 $((n - 1))); do
    rec=$(sed -n "$((i + 1))p" "$G/stories260K.greedy64.jsonl")
    prompt=$(jq -r .prompt <<<"$rec")
    run $BIN/iflow-run -m "$TMP/s.ifs" -p "$prompt" -n 64 --temp 0
    expect_rc 0 "greedy '$prompt'"
    expect_eq "$out" "$(jq -r .continuation <<<"$rec")" "greedy text for '$prompt'"
    run $BIN/iflow-run -m "$TMP/s.ifs" -p "$prompt" -n 64 --temp 0 --json
    expect_eq "$(jq -c .prompt_ids <<<"$out")" "$(jq -c .prompt_ids <<<"$rec")" "prompt ids for '$prompt'"
    expect_eq "$(jq -c .gen_ids <<<"$out")" "$(jq -c .gen_ids <<<"$rec")" "greedy ids for '$prompt'"
done

# ---- one prompt per stdin line ----
run bash -c "printf 'Lily and Tom went to\nOne day, a\n' | $BIN/iflow-run -m '$TMP/s.ifs' -n 64 --temp 0 --json"
expect_rc 0 "prompts from stdin"
expect_eq "$(jq -c .gen_ids <<<"$out" | tr '\n' ' ')" \
    "$(sed -n '3p;4p' "$G/stories260K.greedy64.jsonl" | jq -c .gen_ids | tr '\n' ' ')" "stdin prompts: ids of both"

# ---- the model through a pipe ----
run bash -c "$BIN/iflow-convert '$DATA/models/stories260K/hf' | $BIN/iflow-run -m - -p 'Once upon a time' -n 64 --temp 0"
expect_rc 0 "model from a pipe"
expect_eq "$out" "$(sed -n 1p "$G/stories260K.greedy64.jsonl" | jq -r .continuation)" "model from a pipe: text"

run bash -c "$BIN/iflow-convert --zstd '$DATA/models/stories260K/hf' | $BIN/iflow-run -m - -p 'Once upon a time' -n 64 --temp 0"
expect_rc 0 "zstd-compressed model from a pipe"
expect_eq "$out" "$(sed -n 1p "$G/stories260K.greedy64.jsonl" | jq -r .continuation)" "zstd model from a pipe: text"

# ---- xs-ckpt: 64 greedy tokens from BOS ----
$BIN/iflow-convert "$DATA/models/xs-ckpt/hf" -o "$TMP/xs.ifs"
run $BIN/iflow-run -m "$TMP/xs.ifs" -p "" -n 64 --temp 0 --json
expect_eq "$(jq -c .gen_ids <<<"$out")" "$(jq -c .gen_ids "$G/xs-ckpt.greedy64.json")" "xs-ckpt greedy ids"

# ---- sampling: one seed, one output ----
run $BIN/iflow-run -m "$TMP/s.ifs" -p "The little dog" -n 64 --temp 0.8 --top-p 0.9 --seed 7
a=$out
run $BIN/iflow-run -m "$TMP/s.ifs" -p "The little dog" -n 64 --temp 0.8 --top-p 0.9 --seed 7 -t 1
expect_eq "$out" "$a" "same seed, same output (also across thread counts)"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "The little dog" -n 64 --temp 0.8 --top-p 0.9 --seed 8
[ "$out" != "$a" ] && ok || bad "seeds 7 and 8 gave the same 64 sampled tokens"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "The little dog" -n 64 --temp 1 --top-k 1 --seed 9
expect_eq "$out" "$(sed -n 2p "$G/stories260K.greedy64.jsonl" | jq -r .continuation)" "--top-k 1 is greedy"

# ---- -v: timings, threads, the kernel path and the seed on standard error ----
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 4 --temp 0.5 --seed 11 -t 1 -v --device cpu
expect_match "$err" "^iflow-run: load [0-9.]+ s; prompt 5 tokens in [0-9.]+ s \([0-9.]+ tok/s\); generated 4 tokens in [0-9.]+ s \([0-9.]+ tok/s\); threads 1; kernels (scalar|avx2|avx512|avx512gfni|amx); kv cache f32; seed 11
iflow-run: sampler: top-k 40 -> top-p 0.95 -> temp 0.5 -> draw$" "-v lines"

# ---- --echo, -n 0 ----
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 4 --temp 0 --echo
expect_eq "$out" "Once upon a time, there was a" "--echo"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 0
expect_eq "$out" "" "-n 0 prints an empty line"

# ---- --tokenize ----
run bash -c "printf 'Hello world' | $BIN/iflow-run -m '$DATA/tokenizer-tests/ggml-vocab-gpt-2.gguf' --tokenize"
expect_eq "$out" "15496 995" "--tokenize with a GGUF vocabulary"
run bash -c "printf 'Once upon a time' | $BIN/iflow-run -m '$TMP/s.ifs' --tokenize --bos"
expect_eq "$out" "1 403 407 261 378" "--tokenize --bos with a shard"
run bash -c "printf 'Once upon a time' | $BIN/iflow-run -m '$DATA/models/stories260K/hf' --tokenize"
expect_eq "$out" "403 407 261 378" "--tokenize with an HF directory"
run bash -c "printf '<s>hi' | $BIN/iflow-run -m '$TMP/s.ifs' --tokenize --parse-special"
expect_match "$out" "^1 " "--parse-special reads <s> as BOS"

# ---- usage errors ----
run $BIN/iflow-run -m - -n 4
expect_rc 2 "model from stdin without -p"
expect_eq "$err" "iflow-run: the model comes from standard input, so prompts must come from -p
Try 'iflow-run --help' for more information." "model from stdin without -p: message"
run $BIN/iflow-run -p hi
expect_rc 2 "no model"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --temp -1
expect_rc 2 "negative temperature"
expect_eq "$err" "iflow-run: invalid value '-1' for --temp (a number from 0 to 100)
Try 'iflow-run --help' for more information." "negative temperature: message"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -n 4 </dev/null"
expect_rc 0 "no prompts on stdin: nothing to do"
expect_eq "$out" "" "no prompts on stdin: no output"

# ---- devices (no GPU on the test machines: every path here is the CPU's) ----
run $BIN/iflow-run --list-devices
expect_rc 0 "--list-devices"
expect_match "$out" "^cpu      .*memory .* cores, kernels (scalar|avx2|avx512|avx512gfni|amx)" "--list-devices: the cpu first"
if ! [[ $out =~ cuda:0 ]]; then
    expect_match "$out" $'\n\(no GPU: [^\n]+\)$' "--list-devices without a GPU says why"
    run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 8 --temp 0 --device cuda
    expect_rc 1 "--device cuda without a GPU"
    expect_one_line "--device cuda without a GPU"
    expect_match "$err" "^iflow-run: cannot open cuda:0: " "--device cuda without a GPU: message"
    run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 8 --temp 0 -v
    expect_match "$err" "iflow-run: device auto: running on the cpu \\(" "--device auto falls back to the cpu under -v"
fi
run $BIN/iflow-run --list-devices --json
expect_eq "$(printf '%s\n' "$out" | head -n 1 | jq -r '.name + " " + (.units > 0 | tostring)')" "cpu true" "--list-devices --json"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 24 --temp 0
greedy_auto=$out
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 24 --temp 0 --device cpu
expect_eq "$out" "$greedy_auto" "--device cpu gives the default's greedy text"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --device tpu
expect_rc 2 "unknown device"
expect_eq "$err" "iflow-run: unknown device 'tpu' (expected auto, cpu, cuda or cuda:N)
Try 'iflow-run --help' for more information." "unknown device: message"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --device cpu --gpu-layers 2
expect_rc 2 "--gpu-layers with --device cpu"
expect_eq "$err" "iflow-run: --gpu-layers 2 needs a GPU, but --device is cpu
Try 'iflow-run --help' for more information." "--gpu-layers with --device cpu: message"

# ---- --plan: a hybrid plan over four virtual CPU devices gives the same greedy text ----
cat >"$TMP/plan.ini" <<'EOF'
[plan]
strategy = hybrid
layers = 5
heads = 8
kv_heads = 4
ffn = 172
output = cpu:3
[device cpu:0]
layers = 0-2
heads = 0-3
ffn = 0-85
[device cpu:1]
layers = 0-2
heads = 4-7
ffn = 86-171
[device cpu:2]
layers = 3-4
heads = 0-3
ffn = 0-85
[device cpu:3]
layers = 3-4
heads = 4-7
ffn = 86-171
EOF
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 24 --temp 0 --plan "$TMP/plan.ini" -v
expect_eq "$out" "$greedy_auto" "--plan (hybrid, 4 cpu devices): the single device's greedy text"
expect_match "$err" "^iflow-run: plan .*plan.ini \\(hybrid\\): 4 devices, output on cpu:3" "--plan -v line"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --plan "$TMP/plan.ini" --device cpu
expect_rc 2 "--plan with --device"
sed 's/^heads = 4-7/heads = 2-7/' "$TMP/plan.ini" >"$TMP/bad.ini"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --plan "$TMP/bad.ini"
expect_rc 1 "a plan with overlapping heads"
expect_eq "$err" "iflow-run: plan: query head 2 of layer 0 is on both cpu:0 and cpu:1" "overlapping heads: message"

summary
