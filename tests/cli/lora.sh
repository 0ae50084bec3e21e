#!/usr/bin/env bash
# LoRA adapters merged at conversion (iflow-convert --lora, and iflow-run / iflow-ppl on a source
# converted on the fly) or applied at run time to a converted shard (iflow-run / iflow-ppl --lora),
# against independent float64 references (tests/fixtures/lora/refs.jsonl,
# tests/fixtures/gen_lora_refs.py: the adapters written from PEFT's and llama.cpp's published
# layouts, W + s B A in float64 over a GGUF's exactly dequantized weights):
#   - stories260K (Hugging Face checkpoint) + a PEFT adapter of all seven matrices of its five
#     layers (BF16, r 4, alpha 8);
#   - SmolLM2-135M-Instruct (Q4_1 GGUF) + a llama.cpp GGUF adapter of attn_q, attn_v and
#     ffn_down in four layers (F16, r 2, alpha 4), at scale 1 and 0.5 (--lora-scaled);
#   - crossed: SmolLM2's GGUF + a PEFT adapter of q, k, v, o_proj (Hugging Face names, q/k rows
#     in rotate-half order: permuted into the GGUF's interleaved rows), stories260K's Hugging
#     Face checkpoint + a GGUF adapter of attn_q, attn_k, ffn_up (the reverse permutation).
# The greedy continuation (--activations f32: logits within 2e-3 of float64) equals the
# reference's token for token up to the first step whose top-two margin is below 0.02 (and up
# to the end of turn, where iflow stops and the reference goes on), and differs from the base
# model's. What the shard says of its adapters; errors, each before anything is written. Adapters
# per request in one batch (--lora-module): each reply that of its prompt alone with its adapter.
. "$(dirname "$0")/lib.sh"
F=tests/fixtures/lora
SMOL=$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
STORIES=$DATA/models/stories260K/hf
[ -f "$SMOL" ] && [ -d "$STORIES" ] || { bad "missing $SMOL or $STORIES"; summary; exit 1; }

# $1: our ids (JSON), $2: the reference line -> [tokens compared, equal]
agree() {
    jq -cn --argjson got "$1" --argjson ref "$2" \
        '($ref.greedy_ids | index(2) // length) as $eos
         | ([($ref.margin | to_entries | map(select(.value < 0.02)) | .[0].key // 1e9), $eos, ($got | length)] | min) as $n
         | [$n, ($got[:$n] == $ref.greedy_ids[:$n])]'
}
check_case() { # $1: case name, $2: the continuation's ids (JSON)
    local ref a
    ref=$(jq -c --arg n "$1" 'select(.name == $n)' $F/refs.jsonl)
    a=$(agree "$2" "$ref")
    expect_match "$a" '^\[([5-9]|[1-9][0-9]),true\]$' "$1: the float64 reference's greedy tokens ([compared, equal])"
    [ "$2" != "$(jq -c '.base_ids[:32]' <<<"$ref")" ] && ok || bad "$1: the adapter changed nothing"
}

# ---- stories260K + PEFT: convert, then run the shard ----
run $BIN/iflow-convert "$STORIES" --lora $F/stories260K-peft -o "$TMP/s.ifs"
expect_rc 0 "convert stories260K --lora (PEFT directory)"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 32 --temp 0 --activations f32 --json
expect_eq "$(jq -c .prompt_ids <<<"$out")" "$(jq -c 'select(.name == "stories260K-peft") | .ids' $F/refs.jsonl)" \
    "stories260K: the prompt's ids (Hugging Face tokenizers')"
check_case stories260K-peft "$(jq -c .gen_ids <<<"$out")"
run $BIN/iflow-convert --info "$TMP/s.ifs" --json
expect_eq "$(jq -c '.meta.source.lora' <<<"$out")" "[{\"path\":\"$F/stories260K-peft\",\"scale\":1,\"tensors\":35}]" \
    "meta.source.lora: the adapter, its scale, the 35 matrices it changed"
expect_eq "$(jq -r '[.meta.source.tensors | to_entries[] | "\(.key) x\(.value)"] | join(", ")' <<<"$out")" \
    "F32 -> f32 x47" "an F32 source stays F32"
# the safetensors file named instead of its directory reads the same
run $BIN/iflow-convert "$STORIES" --lora $F/stories260K-peft/adapter_model.safetensors -o "$TMP/s2.ifs"
expect_rc 0 "convert with the adapter's .safetensors file"
cmp -s "$TMP/s.ifs" "$TMP/s2.ifs" && bad "the path is in meta: the files differ there" || ok
run $BIN/iflow-convert --info "$TMP/s2.ifs" --json
expect_eq "$(jq -r '[.records[] | select(.kind == "tensor") | .xxh64] | join(" ")' <<<"$out")" \
    "$($BIN/iflow-convert --info "$TMP/s.ifs" --json | jq -r '[.records[] | select(.kind == "tensor") | .xxh64] | join(" ")')" \
    "the same tensors, bit for bit"

# ---- SmolLM2 (Q4_1 GGUF) + a GGUF adapter, on the fly in iflow-run, at two scales ----
run $BIN/iflow-run -m "$SMOL" --lora $F/smollm2-q-v-down.gguf -p "The capital of France is" -n 32 --temp 0 \
    --activations f32 --json
expect_rc 0 "iflow-run --lora on a GGUF source"
check_case smollm2-gguf-x1.0 "$(jq -c .gen_ids <<<"$out")"
run $BIN/iflow-run -m "$SMOL" --lora-scaled $F/smollm2-q-v-down.gguf:0.5 -p "The capital of France is" -n 32 \
    --temp 0 --activations f32 --json
check_case smollm2-gguf-x0.5 "$(jq -c .gen_ids <<<"$out")"
# converted once: the twelve merged matrices are F32, the rest keep their exact types
run $BIN/iflow-convert "$SMOL" --lora-scaled $F/smollm2-q-v-down.gguf:0.5 -o "$TMP/m.ifs"
run $BIN/iflow-convert --info "$TMP/m.ifs"
expect_match "$out" 'q4_1 -> f32 x12, q4_1 -> q4_b32 x198' "--info: the merged matrices from Q4_1 to F32"
expect_match "$out" "; LoRA $F/smollm2-q-v-down.gguf \\(scale 0.5, 12 matrices\\)"$'\n' "--info names the adapter"
run $BIN/iflow-convert --info "$STORIES" --lora $F/stories260K-q-k-up.gguf
expect_match "$out" $'\nsource: hf, architecture LlamaForCausalLM; tensors F32 -> f32 x47; LoRA '"$F/stories260K-q-k-up.gguf \\(scale 1, 15 matrices\\)"$'\n' \
    "--info on a source: what the adapter would change"
run $BIN/iflow-convert --info "$TMP/m.ifs" --lora $F/smollm2-q-v-down.gguf
expect_rc 2 "--info on a shard takes no adapter"
run $BIN/iflow-convert "$SMOL" --lora $F/smollm2-q-v-down.gguf -t f16 -o "$TMP/m16.ifs"
run $BIN/iflow-convert --info "$TMP/m16.ifs"
expect_match "$out" 'q4_1 -> f16 x' "-t f16: the merged matrices in F16 too"
# two adapters add up: the adapter at 0.25 twice is the adapter at 0.5
run $BIN/iflow-convert "$SMOL" --lora-scaled $F/smollm2-q-v-down.gguf:0.25 \
    --lora-scaled $F/smollm2-q-v-down.gguf:0.25 -o "$TMP/m2.ifs"
run $BIN/iflow-run -m "$TMP/m2.ifs" -p "The capital of France is" -n 32 --temp 0 --activations f32 --json
check_case smollm2-gguf-x0.5 "$(jq -c .gen_ids <<<"$out")"
# iflow-ppl: --kl-base against the base model measures what the adapter changes
run $BIN/iflow-ppl -m "$SMOL" --lora $F/smollm2-q-v-down.gguf --kl-base "$SMOL" -f "$DATA/data/wikitext-2-raw/wiki.test.raw" \
    --max-tokens 300 -c 128 --json
expect_rc 0 "iflow-ppl --lora"
expect_eq "$(jq ".mean_kld > 0.01" <<<"$out")" true "the adapter moves the distribution"

# ---- crossed: each form of adapter for the other kind of checkpoint ----
run $BIN/iflow-run -m "$SMOL" --lora $F/smollm2-peft -p "The capital of France is" -n 32 --temp 0 --activations f32 --json
expect_rc 0 "a PEFT adapter on a GGUF file"
check_case smollm2-peft "$(jq -c .gen_ids <<<"$out")"
run $BIN/iflow-run -m "$STORIES" --lora $F/stories260K-q-k-up.gguf -p "Once upon a time" -n 32 --temp 0 \
    --activations f32 --json
expect_rc 0 "a GGUF adapter on a Hugging Face checkpoint"
check_case stories260K-gguf "$(jq -c .gen_ids <<<"$out")"

# ---- at run time, on converted models: W x + s B (A x), W as the shard holds it, A and s B in F16 ----
run $BIN/iflow-convert "$SMOL" -o "$TMP/smol.ifs"
run $BIN/iflow-convert "$STORIES" -o "$TMP/st.ifs"
for c in "smollm2-gguf-x1.0 smol --lora $F/smollm2-q-v-down.gguf" \
    "smollm2-gguf-x0.5 smol --lora-scaled $F/smollm2-q-v-down.gguf:0.5" "smollm2-peft smol --lora $F/smollm2-peft" \
    "stories260K-peft st --lora $F/stories260K-peft" "stories260K-gguf st --lora $F/stories260K-q-k-up.gguf"; do
    read -r name model opt adapter <<<"$c"
    prompt=$(jq -r --arg n "$name" 'select(.name == $n) | .prompt' $F/refs.jsonl)
    run $BIN/iflow-run -m "$TMP/$model.ifs" $opt $adapter -p "$prompt" -n 32 --temp 0 --activations f32 --json
    expect_rc 0 "$name at run time"
    check_case "$name" "$(jq -c .gen_ids <<<"$out")"
done
run $BIN/iflow-run -m "$TMP/st.ifs" --lora $F/stories260K-peft -p "Once" -n 2 -v
expect_match "$err" "device auto: running on the cpu \\(a LoRA adapter applied at run time\\)" "-v: the adapter keeps the model on the CPU"
# merged and applied at run time: the same continuation, and the same perplexity within 1e-3 (at
# run time the delta's a and b are F16, and the default --activations rounds what meets F16
# weights to BF16 on CPUs with AVX512_BF16: 3e-4 here)
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 64 --temp 0 --json
merged=$(jq -c .gen_ids <<<"$out") merged_text=$(jq -r .text <<<"$out")
run $BIN/iflow-run -m "$TMP/st.ifs" --lora $F/stories260K-peft -p "Once upon a time" -n 64 --temp 0 --json
expect_eq "$(jq -c .gen_ids <<<"$out")" "$merged" "stories260K: 64 tokens merged = at run time"
run $BIN/iflow-ppl -m "$TMP/s.ifs" -f "$DATA/data/wikitext-2-raw/wiki.test.raw" --max-tokens 2000 -c 256 --json
a=$(jq .ppl <<<"$out")
run $BIN/iflow-ppl -m "$TMP/st.ifs" --lora $F/stories260K-peft -f "$DATA/data/wikitext-2-raw/wiki.test.raw" \
    --max-tokens 2000 -c 256 --json
expect_close "$(jq .ppl <<<"$out")" "$a" 1e-3 "stories260K: perplexity merged = at run time ($a)"
# continuous batching with an adapter: each request's greedy reply is the one-prompt run's
jq -nc '{id: 1, prompt: "Once upon a time", max_tokens: 64, temperature: 0}, {id: 2, prompt: "The cat", max_tokens: 16, temperature: 0}' \
    >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/st.ifs' --lora $F/stories260K-peft --batch <'$TMP/req.jsonl'"
expect_eq "$(jq -r 'select(.id == 1) | .text' <<<"$out")" "$merged_text" "--batch --lora: the same reply"
# ---- adapters per request (--lora-module NAME=FILE, "lora": NAME): one batch, each request its
# adapter or none, every step shared; each reply is the one of its prompt alone with --lora FILE
# (or none), also for a long prompt whose blocks a request of another adapter cached first, and
# for a beam search
P="The capital of France is"
LP="Here is a list of the capital cities of the countries of Europe, with a short note on each one. $P"
jq -nc --arg p "$P" --arg lp "$LP" '{id: 1, prompt: $p, max_tokens: 24, temperature: 0, lora: "qvd"},
    {id: 2, prompt: $p, max_tokens: 24, temperature: 0}, {id: 3, prompt: $p, max_tokens: 24, temperature: 0, lora: "peft"},
    {id: 4, prompt: $lp, max_tokens: 16, temperature: 0}, {id: 5, prompt: $lp, max_tokens: 16, temperature: 0, lora: "qvd"},
    {id: 6, prompt: $p, max_tokens: 12, beams: 2, lora: "peft"}, {id: 7, prompt: $p, lora: "nope"},
    {id: 8, prompt: $p, max_tokens: 24, temperature: 0, lora: ""}' >"$TMP/multi.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --lora-module qvd=$F/smollm2-q-v-down.gguf --lora-module peft=$F/smollm2-peft \
    --batch --metrics '$TMP/multi.json' <'$TMP/multi.jsonl'"
expect_rc 0 "--batch with two --lora-module"
multi=$out
alone() { # $1: request id, $2..: iflow-run's options for that prompt alone
    local id=$1
    shift
    run $BIN/iflow-run -m "$TMP/smol.ifs" "$@" --temp 0 --json
    expect_eq "$(jq -r --argjson i "$id" 'select(.id == $i) | .text' <<<"$multi")" "$(jq -r .text <<<"$out")" \
        "request $id: the reply alone with ${*:1:2}"
}
alone 1 --lora $F/smollm2-q-v-down.gguf -p "$P" -n 24
alone 2 -p "$P" -n 24
alone 3 --lora $F/smollm2-peft -p "$P" -n 24
alone 4 -p "$LP" -n 16
alone 5 --lora $F/smollm2-q-v-down.gguf -p "$LP" -n 16
alone 6 --lora $F/smollm2-peft -p "$P" -n 12 --beams 2
alone 8 -p "$P" -n 24
[ "$(jq -r 'select(.id == 1) | .text' <<<"$multi")" != "$(jq -r 'select(.id == 2) | .text' <<<"$multi")" ] && ok ||
    bad "the adapter changed nothing"
expect_eq "$(jq -r 'select(.id == 7) | .error' <<<"$multi")" "field 'lora': no adapter 'nope' (there are 'qvd', 'peft')" \
    "an unknown adapter: an error result naming those there are"
expect_eq "$(jq .prompt_tokens_cached "$TMP/multi.json")" 0 "request 5 shares no block with request 4 (another adapter)"
# OpenAI batch lines: "model" naming an adapter selects it (vLLM's --lora-modules), another name
# is the base model; "lora" in the body wins
jq -nc --arg p "$P" '{custom_id: "qvd", url: "/v1/completions", body: {model: "qvd", prompt: $p, max_tokens: 24, temperature: 0}},
    {custom_id: "base", url: "/v1/completions", body: {model: "smollm2", prompt: $p, max_tokens: 24, temperature: 0}},
    {custom_id: "both", url: "/v1/completions", body: {model: "qvd", lora: "peft", prompt: $p, max_tokens: 24, temperature: 0}}' \
    >"$TMP/oa.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --lora-module qvd=$F/smollm2-q-v-down.gguf --lora-module peft=$F/smollm2-peft \
    --batch <'$TMP/oa.jsonl'"
oa() { jq -r --arg i "$1" 'select(.custom_id == $i) | .response.body.choices[0].text' <<<"$out"; }
expect_eq "$(oa qvd)" "$(jq -r 'select(.id == 1) | .text' <<<"$multi")" "an OpenAI line's model 'qvd': that adapter's reply"
expect_eq "$(oa base)" "$(jq -r 'select(.id == 2) | .text' <<<"$multi")" "another model name: the base model's reply"
expect_eq "$(oa both)" "$(jq -r 'select(.id == 3) | .text' <<<"$multi")" "model 'qvd' with lora 'peft': peft's reply"
run $BIN/iflow-run -m "$TMP/smol.ifs" --lora-module qvd=$F/smollm2-q-v-down.gguf -p "$P"
expect_eq "$rc:$err" "2:iflow-run: --lora-module names adapters for --batch's requests (\"lora\": NAME); --lora applies one to every prompt"$'\n'"Try 'iflow-run --help' for more information." \
    "--lora-module without --batch"
run $BIN/iflow-run -m "$TMP/smol.ifs" --lora-module "a b=$F/smollm2-peft" --batch </dev/null
expect_match "$err" "^iflow-run: --lora-module takes NAME=FILE, NAME of letters, digits" "a name with a space"
run $BIN/iflow-run -m "$TMP/smol.ifs" --lora-module a=$F/smollm2-peft --lora-module a=$F/smollm2-peft --batch </dev/null
expect_match "$rc:$err" "^2:iflow-run: --lora-module 'a' given twice"$'\n' "a name twice"
run $BIN/iflow-run -m "$TMP/smol.ifs" --lora-module st=$F/stories260K-peft --batch </dev/null
expect_eq "$rc:$err" "1:iflow-run: --lora-module 'st': LoRA adapter '$F/stories260K-peft': the delta of 'model.layers.0.self_attn.q_proj.weight' is [64, 64] and the model's blk.0.wq [576, 576]" \
    "an adapter of another model, named by its module"
# --dry-run counts the deltas held at run time: stories260K's PEFT adapter, rank 4 on the seven
# matrices of 5 layers (dim 64, q 64, kv 32, ffn 172): 5 x 4 x (128 + 96 + 96 + 128 + 3 x 236) x 2 bytes
run $BIN/iflow-run -m "$TMP/st.ifs" --lora-module a=$F/stories260K-peft --batch --dry-run --json
expect_eq "$(jq .adapter_bytes <<<"$out")" 46240 "--dry-run: a module's deltas (F16 a and b)"
run $BIN/iflow-run -m "$TMP/st.ifs" --lora $F/stories260K-peft --lora-module a=$F/stories260K-peft --batch --dry-run
expect_match "$out" $'\nadapters          92480 bytes \\(LoRA deltas applied at run time\\)\n' "--dry-run: --lora's and the module's"
run $BIN/iflow-run -m "$TMP/st.ifs" --dry-run --json
expect_eq "$(jq .adapter_bytes <<<"$out")" 0 "--dry-run: none"
# a quantized shard takes an adapter too (its matrices as they are, the delta in F16): the first
# six tokens, whose reference margins are all above 0.19 (Q8 moves logits by a few hundredths)
$BIN/iflow-quant -t q8_b32 -i "$TMP/st.ifs" -o "$TMP/q8.ifs" 2>/dev/null
run $BIN/iflow-run -m "$TMP/q8.ifs" --lora $F/stories260K-peft -p "Once upon a time" -n 16 --temp 0 --json
expect_eq "$(jq -c '.gen_ids[:6]' <<<"$out")" "$(jq -c '.[:6]' <<<"$merged")" "Q8 shard + adapter: the first 6 tokens"
run $BIN/iflow-run -m "$TMP/smol.ifs" --lora $F/stories260K-peft -p x
expect_eq "$rc:$err" "1:iflow-run: LoRA adapter '$F/stories260K-peft': the delta of 'model.layers.0.self_attn.q_proj.weight' is [64, 64] and the model's blk.0.wq [576, 576]" \
    "an adapter of another model, at run time"

# ---- errors: one line each, nothing written ----
run $BIN/iflow-convert "$SMOL" --lora $F/stories260K-peft -o "$TMP/bad.ifs"
expect_rc 1 "a PEFT adapter of another model"
expect_match "$err" "^iflow-convert: LoRA adapter '$F/stories260K-peft': the delta of 'model.layers.0.mlp.down_proj.weight' is \[64, 172\] and the tensor in '.*' \[576, 1536\]$" \
    "names the tensor as the adapter does, and both shapes"
run $BIN/iflow-convert "$DATA/models/stories260K/gguf/stories260K.gguf" --lora $F/smollm2-q-v-down.gguf -o "$TMP/bad.ifs"
expect_rc 1 "an adapter of another model"
expect_match "$err" "LoRA adapter '$F/smollm2-q-v-down.gguf': the delta of 'blk.0.attn_q.weight' is \[576, 576\] and the tensor in '.*stories260K.gguf' \[64, 64\]$" \
    "names the tensor and both shapes"
mkdir -p "$TMP/dora" && cp $F/stories260K-peft/* "$TMP/dora/"
jq '.use_dora = true' $F/stories260K-peft/adapter_config.json >"$TMP/dora/adapter_config.json"
run $BIN/iflow-convert "$STORIES" --lora "$TMP/dora" -o "$TMP/bad.ifs"
expect_eq "$rc:$err" "1:iflow-convert: LoRA adapter '$TMP/dora': use_dora is true, which iflow does not merge" "DoRA refused"
jq '.r = 8' $F/stories260K-peft/adapter_config.json >"$TMP/dora/adapter_config.json"
run $BIN/iflow-convert "$STORIES" --lora "$TMP/dora" -o "$TMP/bad.ifs"
expect_match "$err" "has rank 4, the config's r is 8$" "a rank the config does not say"
run $BIN/iflow-convert "$STORIES" --lora "$TMP/none" -o "$TMP/bad.ifs"
expect_eq "$rc:$err" "1:iflow-convert: cannot open LoRA adapter '$TMP/none': No such file or directory" "a missing adapter"
run $BIN/iflow-convert "$STORIES" --lora-scaled $F/stories260K-peft -o "$TMP/bad.ifs"
expect_rc 2 "--lora-scaled without :S"
expect_match "$err" "--lora-scaled takes FILE:SCALE, not '$F/stories260K-peft'" "says the form"
run $BIN/iflow-convert "$STORIES" --lora-scaled $F/stories260K-peft:x -o "$TMP/bad.ifs"
expect_rc 2 "--lora-scaled with a scale that is no number"
expect_no_file "$TMP/bad.ifs*" "nothing half-written"
run $BIN/iflow-run -m "$STORIES" --lora $F/stories260K-peft --tokenize
expect_rc 2 "--lora with --tokenize"

summary
