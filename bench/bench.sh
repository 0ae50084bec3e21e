#!/usr/bin/env bash
# bench/bench.sh BUILD_DIR -- iflow's benchmarks as one JSON object on stdout (progress on stderr).
# bench/bench.sh BUILD_DIR speculative -- the speculative decoding entries alone (grammar: the
# constrained decoding entries alone).
#
# For stories260K (F32, from its HF folder) and the synthetic TinyLlama-1.1B shape (F16 and F32):
# convert time and peak RSS, load time, prefill and decode tokens/s at 1 and 2 threads, and
# decode speed as a fraction of the read bandwidth that ../shared/tools/membw.c measures; the
# same for TinyLlama with every matrix in each quantized type (bytes read per token are the
# quantized bytes; batched decode of 4 and 16 streams, batched_decode_N_tok_s; prefill of 128
# and 512 tokens as a fraction of the roof of the instruction the
# type's product runs on, which qbench --roof measures in the same run; the packed types also in
# the row layout, IFLOW_PACK=0; Q8_B64 also on int16 activations, IFLOW_BENCH_ACTIVATIONS=int16,
# as the entry q8_b64-int16_x); the same for TinyLlama in F16 and BF16 (float_weights: the BF16
# dot product where the CPU has it, also on the exact F32 product, IFLOW_BENCH_ACTIVATIONS=f32)
# (decode streams every weight matrix once per token); then the kernel micro-benchmarks
# (bench/kbench.c); and the TinyLlama shape split by layer and by tensor over virtual CPU devices
# (cpu:1, cpu:2; iflow-run --plan), measured against iflow-partition's estimate, so the cost
# model's error shows; and continuous batching (bench/batchbench.c): generated tokens/s of 1, 4
# and 16 streams on the TinyLlama shape in Q4_B64, and a replay of 200 WikiText prompts arriving
# as a Poisson process (IFLOW_BENCH_REPLAY_RATE requests/s, default 1) with its latency metrics,
# and 16 requests sharing a 512-token prompt prefix with the prefix cache and without it;
# and generation past the context (bench/shiftbench.c): perplexity and tokens/s of WikiText read
# through a small context with RoPE-key shifts, recomputation, and restarts; and decode beside a
# busy loop pinned to one of the two cores the run uses (the thread pool against OpenMP); and
# decode after a 2,048-token prompt with each KV cache type (decode_at_depth); and constrained
# decoding (bench/grammarbench.c, and SmolLM2's sampled reply with and without a grammar); and a
# LoRA adapter applied at run time (bench/loragen.c; prefill and decode with and without); and a
# mixture of experts (bench/configs/tinyllama-moe) against the dense TinyLlama whose FFN width a
# token reads.
# No thresholds: these are measurements.
set -euo pipefail
build=${1:?usage: bench/bench.sh BUILD_DIR}
cd "$(dirname "$0")/.."
DATA=${IFLOW_TEST_DATA:-../shared}
work=${IFLOW_BENCH_DIR:-build/bench}
mkdir -p "$work"
log() { echo "bench: $*" >&2; }

tl_q4_pair() { # the TinyLlama shape (random weights) in Q4_B64, and its Q2_B32 as a draft; made once
    [ -f "$work/tl-bq4.ifs" ] && [ -f "$work/tl-bq2.ifs" ] && return
    bin/iflow-convert --synthetic "$DATA/models/synthetic/tinyllama-1.1b" -t f16 -o "$work/tl-b16.ifs" >&2
    bin/iflow-quant -t q4_b64 --keep "*=q4_b64" -i "$work/tl-b16.ifs" -o "$work/tl-bq4.ifs" >&2
    bin/iflow-quant -t q2_b32 -i "$work/tl-b16.ifs" -o "$work/tl-bq2.ifs" >&2
    rm -f "$work/tl-b16.ifs"
}

# Speculative decoding, greedy, 5 proposals a step, 2 threads: MODEL alone and with DRAFT, RUNS
# alternating pairs (best tokens/s of each, from -v), the acceptance rate and tokens a step
# (from -v's draft line), and whether the text is the same (it must be). -> JSON
spec_pair() { # model, draft, prompt, tokens, runs
    local ta=0 tb=0 acc=0 tps=0 a b x y same=true
    for _ in $(seq "$5"); do
        a=$(bin/iflow-run -m "$1" -p "$3" -n "$4" --temp 0 -t 2 -v 2>&1 >"$work/spec.a")
        b=$(bin/iflow-run -m "$1" --draft "$2" --draft-n 5 -p "$3" -n "$4" --temp 0 -t 2 -v 2>&1 >"$work/spec.b")
        cmp -s "$work/spec.a" "$work/spec.b" || same=false
        x=$(sed -nE 's/.*generated [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' <<<"$a")
        y=$(sed -nE 's/.*draft: .*, ([0-9.]+) tok\/s generated.*/\1/p' <<<"$b")
        acc=$(sed -nE 's/.*accepted \(([0-9.]+) %\).*/\1/p' <<<"$b")
        tps=$(sed -nE 's/.*, ([0-9.]+) tokens a step.*/\1/p' <<<"$b")
        ta=$(jq -n "[$ta, ${x:-0}] | max") tb=$(jq -n "[$tb, ${y:-0}] | max")
    done
    rm -f "$work/spec.a" "$work/spec.b"
    jq -n --argjson ta "$ta" --argjson tb "$tb" --argjson acc "${acc:-0}" --argjson tps "${tps:-0}" \
        --argjson same "$same" --argjson n "$4" --argjson runs "$5" \
        '{draft_n: 5, threads: 2, tokens: $n, runs: $runs, target_tok_s: $ta, with_draft_tok_s: $tb,
          speedup: (if $ta > 0 then (($tb / $ta) * 1000 | round) / 1000 else null end), acceptance_pct: $acc,
          tokens_per_step: $tps, same_text: $same}'
}

# Both speculative entries. The TinyLlama shape with its q2 as the draft: the random weights
# agree on nothing (acceptance ~0), so it measures what proposals cost when none is kept.
# SmolLM2-135M-Instruct dequantized to F32 as the model and its Q4_1 weights as they are
# (q4_b32) as the draft: a real pair.
speculative_entries() {
    log "speculative decoding: TinyLlama Q4_B64 with its Q2_B32 (random weights: the overhead)"
    tl_q4_pair
    local tl smol gguf="$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    tl=$(spec_pair "$work/tl-bq4.ifs" "$work/tl-bq2.ifs" "Once upon a time" 32 3)
    rm -f "$work/tl-bq4.ifs" "$work/tl-bq2.ifs"
    log "speculative decoding: SmolLM2-135M F32 with its Q4_1 weights as the draft"
    bin/iflow-convert "$gguf" --dtype f32 -o "$work/smol.f32.ifs" >&2
    bin/iflow-convert "$gguf" -o "$work/smol.q4.ifs" >&2
    smol=$(spec_pair "$work/smol.f32.ifs" "$work/smol.q4.ifs" "The history of the Roman Empire" 64 3)
    rm -f "$work/smol.f32.ifs" "$work/smol.q4.ifs"
    jq -n --argjson tl "$tl" --argjson smol "$smol" \
        '{tinyllama_q2_draft: ({model: "tinyllama-1.1b-q4_b64 (random weights)", draft: "its q2_b32"} + $tl),
          smollm2: ({model: "smollm2-135m f32", draft: "smollm2-135m q4_b32"} + $smol)}'
}

# Constrained decoding: the masks of a JSON grammar over SmolLM2's vocabulary (bench/grammarbench.c),
# and SmolLM2-135M-Instruct's sampled reply (temp 0.8, 2 threads, 96 tokens; best of 3 runs) with
# no constraint, with a JSON grammar whose strings repeat their parser states, and with a regex
# (a date) whose every step is a new state: generated tok/s from -v and their ratio.
grammar_entries() {
    log "grammar: masks over SmolLM2's vocabulary; SmolLM2 sampled with and without a constraint"
    local gb gguf="$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" free json date
    gb=$("$build/grammarbench" "$DATA/models/tokenizers/smollm2-135m/tokenizer.json")
    bin/iflow-convert "$gguf" -o "$work/smol.ifs" >&2
    gen_tps() { # constraint args... -> best generated tok/s of 3 runs
        local best=0 x _
        for _ in 1 2 3; do
            x=$(bin/iflow-run -m "$work/smol.ifs" --chat -p "Describe a person as JSON." --temp 0.8 --seed 1 -n 96 \
                -t 2 -v "$@" 2>&1 >/dev/null | sed -nE 's/.*generated [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p')
            best=$(jq -n "[$best, ${x:-0}] | max")
        done
        echo "$best"
    }
    free=$(gen_tps)
    json=$(gen_tps --json-schema '{}')
    date=$(gen_tps --regex '([0-9]{4}-[0-9]{2}-[0-9]{2}, )*[0-9]{4}-[0-9]{2}-[0-9]{2}')
    rm -f "$work/smol.ifs"
    jq -n --argjson gb "$gb" --argjson free "$free" --argjson json "$json" --argjson date "$date" \
        '{masks: $gb, smollm2_sampled: {threads: 2, tokens: 96, free_tok_s: $free, json_tok_s: $json,
          json_ratio: (if $free > 0 then $json / $free else null end), date_regex_tok_s: $date,
          date_regex_ratio: (if $free > 0 then $date / $free else null end)}}'
}
# LoRA adapters applied at run time (iflow-run --lora on a converted shard): the TinyLlama shape in
# Q4_B64 with a seeded random adapter (bench/loragen.c) of rank 16 and 64 on all seven matrices of
# every layer, against the shard alone: an 18-token prompt's prefill and 32 greedy tokens' decode
# tok/s from -v (best of 3 runs, 2 threads), and the adapter file's F32 bytes (a decode step
# reads half of that beside the weights: iflow keeps a and b in F16); and a batch of four
# requests, each with an adapter of its own, against the same batch without adapters.
lora_entries() {
    log "LoRA at run time: TinyLlama Q4_B64 with adapters of rank 16 and 64"
    tl_q4_pair
    local cfg="$DATA/models/synthetic/tinyllama-1.1b/config.json" out=() r
    speeds() { # iflow-run args... -> {prefill_tok_s, decode_tok_s}, best of 3
        local p=0 d=0 line _
        for _ in 1 2 3; do
            line=$(bin/iflow-run -m "$work/tl-bq4.ifs" "$@" -p "Once upon a time there was a little girl who lived in a village near the forest" \
                -n 32 --temp 0 -t 2 -v 2>&1 >/dev/null | grep 'generated')
            p=$(jq -n "[$p, $(sed -nE 's/.*prompt [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' <<<"$line")] | max")
            d=$(jq -n "[$d, $(sed -nE 's/.*generated [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' <<<"$line")] | max")
        done
        jq -n --argjson p "$p" --argjson d "$d" '{prefill_tok_s: $p, decode_tok_s: $d}'
    }
    out+=("$(speeds | jq '. + {rank: 0, adapter_bytes: 0}')")
    for r in 16 64; do
        rm -rf "$work/lora" && mkdir -p "$work/lora"
        "$build/loragen" "$cfg" $r "$work/lora"
        out+=("$(speeds --lora "$work/lora" | jq --argjson r $r --argjson b "$(($(stat -c %s "$work/lora/adapter_model.safetensors")))" \
            '. + {rank: $r, adapter_bytes: $b}')")
    done
    # adapters per request (--lora-module): 4 requests of 32 greedy tokens in one batch (--parallel 4),
    # none with an adapter, each with its own rank-16 adapter, all four with the same one: the
    # batch's generated tok/s (--metrics, best of 3)
    rm -rf "$work/lora" && mkdir -p "$work/lora"
    "$build/loragen" "$cfg" 16 "$work/lora"
    local mods=() i
    for i in 1 2 3 4; do mods+=(--lora-module "a$i=$work/lora"); done
    batch_tps() { # $1: 0 no adapter, 1 each request its own, 2 all a1; iflow-run args... -> generated tok/s
        local with=$1 best=0 x _
        shift
        jq -nc --argjson w "$with" 'range(4) | {prompt: "Once upon a time there was a little girl named", max_tokens: 32,
            temperature: 0} + (if $w == 1 then {lora: "a\(. + 1)"} elif $w == 2 then {lora: "a1"} else {} end)' \
            >"$work/multi.jsonl"
        for _ in 1 2 3; do
            bin/iflow-run -m "$work/tl-bq4.ifs" "$@" --batch --parallel 4 -t 2 --metrics "$work/multi.json" \
                <"$work/multi.jsonl" >/dev/null 2>&1
            x=$(jq .generated_tokens_per_s "$work/multi.json")
            best=$(jq -n "[$best, ${x:-0}] | max")
        done
        echo "$best"
    }
    local m0 m4 m1
    m0=$(batch_tps 0)
    m4=$(batch_tps 1 "${mods[@]}")
    m1=$(batch_tps 2 "${mods[@]}")
    rm -rf "$work/lora" "$work/tl-bq4.ifs" "$work/tl-bq2.ifs" "$work/multi.jsonl" "$work/multi.json"
    printf '%s\n' "${out[@]}" | jq -s --argjson m0 "$m0" --argjson m4 "$m4" --argjson m1 "$m1" '.[0] as $base | {model: "tinyllama-1.1b-q4_b64",
        threads: 2, prompt_tokens: 18, tokens: 32, targets: "q k v o gate up down, every layer", runs: map(. + {
        prefill_ratio: (if $base.prefill_tok_s > 0 then .prefill_tok_s / $base.prefill_tok_s else null end),
        decode_ratio: (if $base.decode_tok_s > 0 then .decode_tok_s / $base.decode_tok_s else null end)}),
        per_request: {requests: 4, parallel: 4, tokens: 32, rank: 16, base_tok_s: $m0, four_adapters_tok_s: $m4,
        four_adapters_ratio: (if $m0 > 0 then $m4 / $m0 else null end), one_adapter_tok_s: $m1,
        one_adapter_ratio: (if $m0 > 0 then $m1 / $m0 else null end)}}'
}
# bench/bench.sh BUILD_DIR speculative (or grammar, lora): those entries alone
if [ "${2:-}" = lora ]; then
    lora_entries
    exit
fi
if [ "${2:-}" = speculative ]; then
    speculative_entries
    exit
fi
if [ "${2:-}" = grammar ]; then
    grammar_entries
    exit
fi


membw() { # threads -> read-only GB/s
    OMP_NUM_THREADS=$1 OMP_PROC_BIND=close OMP_PLACES=cores "$build/membw" 1 5 2>/dev/null |
        sed -nE 's/^read-only sum : *([0-9.]+) GB\/s/\1/p'
}
log "measuring memory bandwidth"
bw1=$(membw 1)
bw2=$(membw 2)
log "measuring the int8 / int16 / F32 / BF16 instruction roofs"
roof=$("$build/qbench" --roof --quick --threads 2 | jq -s .)

convert() { # name, args... -> JSON {convert_s, peak_rss_mib}
    local name=$1; shift
    local line
    line=$(bin/iflow-convert "$@" -o "$work/$name.ifs" -v 2>&1 >/dev/null | tail -n 1)
    sed -nE 's/.* in ([0-9.]+) s, peak RSS ([0-9.]+) MiB/{"convert_s": \1, "convert_peak_rss_mib": \2}/p' <<<"$line"
}

entry() { # name, prefill, decode, convert args...
    local name=$1 pre=$2 dec=$3; shift 3
    log "$name: converting"
    local conv run size
    conv=$(convert "$name" "$@")
    size=$(stat -c %s "$work/$name.ifs")
    log "$name: running"
    run=$("$build/iflow-bench" "$work/$name.ifs" "$pre" "$dec" 1 2)
    rm -f "$work/$name.ifs"
    jq -n --arg name "$name" --argjson conv "$conv" --argjson run "$run" --argjson size "$size" \
        --argjson bw1 "$bw1" --argjson bw2 "$bw2" '
        {name: $name, file_bytes: $size} + $conv + {load_s: $run.load_s,
         decode_bytes_per_token: $run.decode_bytes_per_token,
         runs: [$run.runs[] | . + {membw_gbps: (if .threads == 1 then $bw1 else $bw2 end)}
                | . + {decode_fraction_of_bandwidth: (.decode_weight_gbps / .membw_gbps)}]}'
}

s260=$(entry stories260K-f32 128 128 "$DATA/models/stories260K/hf")
tl16=$(entry tinyllama-1.1b-f16 64 16 --synthetic "$DATA/models/synthetic/tinyllama-1.1b" -t f16)
tl32=$(entry tinyllama-1.1b-f32 64 16 --synthetic "$DATA/models/synthetic/tinyllama-1.1b" -t f32)

# multiply-adds of the layers' matrices per token x 2: the FLOPs a prefill token costs (attention
# aside). The output matrix runs for the last token of a call only (iflow-bench asks for its
# logits alone, as llama-bench does): 1/128 of a token's share, left out. (Before 2026-11-28 it
# was counted for every token, which put the fractions 6.7 % too high.)
flop=$(jq '2 * (.num_hidden_layers * (2 * .hidden_size * .hidden_size
            + 2 * .hidden_size * (.hidden_size / .num_attention_heads * .num_key_value_heads)
            + 3 * .hidden_size * .intermediate_size))' \
    "$DATA/models/synthetic/tinyllama-1.1b/config.json")

# One weight type on the TinyLlama shape (every matrix in it) -> JSON: prefill of 128 and 512
# tokens and decode at 1 and 2 threads, as fractions of the roof of the instruction the type's
# product runs on (ROOF_OP, measured by qbench --roof above; bf16_or_fma: vdpbf16ps where the
# run reports bf16_dot, tdpbf16ps where its kernel path is amx, else FMA) and of the read bandwidth; with
# OTHER_ENV, the same file run again in that environment (another layout or product, reported
# as OTHER_NAME_prefill_tok_s and OTHER_NAME_decode_tok_s).
type_entry() { # shard type roof-op [other-env other-name]
    local f=$1 t=$2 op=$3 r128 r512 b1 b2 other=null
    r128=$("$build/iflow-bench" "$f" 128 16 1 2)
    r512=$("$build/iflow-bench" "$f" 512 1 1 2)
    # batched decode: 4 and 16 streams of 8-token prompts and 32 new tokens each, the decode
    # phase's generated tok/s (batchbench's S_TG), at 1 and 2 threads
    b1=$("$build/batchbench" "$f" streams 1 8 32 4 16)
    b2=$("$build/batchbench" "$f" streams 2 8 32 4 16)
    [ -n "${4:-}" ] && other=$(env "$4" "$build/iflow-bench" "$f" 128 16 1 2)
    jq -c --arg t "$t" --arg op "$op" --arg oname "${5:-other}" --argjson size "$(stat -c %s "$f")" \
        --argjson bw1 "$bw1" --argjson bw2 "$bw2" --argjson flop "$flop" --argjson roof "$roof" \
        --argjson r512 "$r512" --argjson other "$other" --argjson b1 "$b1" --argjson b2 "$b2" '
        (if $op == "bf16_or_fma" then (if .bf16_dot then (if .kernel_path == "amx" then "tdpbf16ps_amx_bf16" else "vdpbf16ps_bf16" end) else "vfmadd_f32" end) else $op end) as $op |
        ($roof | map(select(.op == $op))) as $ro |
        {name: ("tinyllama-1.1b-" + $t), type: $t, file_bytes: $size, load_s, decode_bytes_per_token,
         matrix_flop_per_token: $flop, roof_op: $op, bf16_dot,
         runs: [.runs[] | .threads as $n | . + {membw_gbps: (if $n == 1 then $bw1 else $bw2 end),
                prefill_512_tok_s: ($r512.runs[] | select(.threads == $n) | .prefill_tok_s),
                batched_decode_4_tok_s: ((if $n == 1 then $b1 else $b2 end)[] | select(.streams == 4) | .decode_tok_s),
                batched_decode_16_tok_s: ((if $n == 1 then $b1 else $b2 end)[] | select(.streams == 16) | .decode_tok_s),
                roof_gops: ($ro[] | select(.threads == $n) | .GOPs)}
                + (if $other then {($oname + "_prefill_tok_s"): ($other.runs[] | select(.threads == $n) | .prefill_tok_s),
                                   ($oname + "_decode_tok_s"): ($other.runs[] | select(.threads == $n) | .decode_tok_s)}
                   else {} end)
                | . + {decode_fraction_of_bandwidth: (.decode_weight_gbps / .membw_gbps),
                       prefill_fraction_of_roof: (.prefill_tok_s * $flop / 1e9 / .roof_gops),
                       prefill_512_fraction_of_roof: (.prefill_512_tok_s * $flop / 1e9 / .roof_gops)}]}' <<<"$r128"
}

quant_entries() { # TinyLlama F16 -> each quantized type (every matrix): decode and prefill
    log "tinyllama-1.1b quantized: converting F16"
    bin/iflow-convert --synthetic "$DATA/models/synthetic/tinyllama-1.1b" -t f16 -o "$work/tl-src.ifs"
    local t out=() op other
    for t in ${IFLOW_BENCH_TYPES:-q8_b32 q8_b64 q6 q5 q4_b32 q4_b64 q3h q3_b32 q2}; do
        log "tinyllama-1.1b-$t: quantizing and running"
        bin/iflow-quant -t "$t" --keep "*=$t" -i "$work/tl-src.ifs" -o "$work/tl-$t.ifs"
        # the instruction the type's product runs on: int16 x for Q6 and Q5, else int8 (Q8 less
        # each token's outliers, on CPUs with AVX512_VNNI); every type is packed at load where
        # the CPU has GFNI and AVX512_VBMI (kernels/cpu/qpack.h): the row layout too
        op=vpdpbusd_int8
        case $t in q[65]*) op=vpdpwssd_int16 ;; esac
        out+=("$(type_entry "$work/tl-$t.ifs" "$t" "$op" IFLOW_PACK=0 rows_layout)")
        # Q8_B64 once more on int16 x (--activations int16: vpdpwssd on the same packed tiles,
        # nothing taken out; the default before 2026-11-28), as the entry of "type" q8_b64-int16_x
        [ "$t" = q8_b64 ] && out+=("$(IFLOW_BENCH_ACTIVATIONS=int16 type_entry "$work/tl-$t.ifs" "$t-int16_x" vpdpwssd_int16 \
            IFLOW_PACK=0 rows_layout)")
        rm -f "$work/tl-$t.ifs"
    done
    rm -f "$work/tl-src.ifs"
    printf '%s\n' "${out[@]}" | jq -s .
}
quant=$(quant_entries)

float_entries() { # TinyLlama in F16 and BF16 (every matrix): on the BF16 dot product where the
    # CPU has it (kernels/cpu/kernels.h), and on the exact F32 product to compare
    local t out=()
    for t in f16 bf16; do
        log "tinyllama-1.1b-$t: converting and running"
        bin/iflow-convert --synthetic "$DATA/models/synthetic/tinyllama-1.1b" -t "$t" -o "$work/tl-$t.ifs"
        out+=("$(type_entry "$work/tl-$t.ifs" "$t" bf16_or_fma IFLOW_BENCH_ACTIVATIONS=f32 f32_product)")
        rm -f "$work/tl-$t.ifs"
    done
    printf '%s\n' "${out[@]}" | jq -s .
}
float=$(float_entries)

partition_entries() { # TinyLlama F16 on virtual CPU devices: measured decode against the cost model
    log "partition: TinyLlama F16 on cpu:1 and cpu:2, measured against iflow-partition's estimates"
    bin/iflow-convert --synthetic "$DATA/models/synthetic/tinyllama-1.1b" -t f16 -o "$work/tl-part.ifs"
    local n s out=() est meas
    for n in 1 2; do
        # each virtual device gets one core and the one-thread bandwidth measured above; together
        # they read what two threads did
        for s in layer tensor; do
            [ "$n" = 1 ] && [ "$s" = tensor ] && continue
            bin/iflow-partition -m "$work/tl-part.ifs" --devices "cpu:$n" --strategy "$s" --cpu-bw "$bw1" \
                --host-bw "$bw2" --ctx 64 -o "$work/plan.ini" >/dev/null
            est=$(bin/iflow-partition -m "$work/tl-part.ifs" --devices "cpu:$n" --cpu-bw "$bw1" --host-bw "$bw2" --ctx 64 --compare --json |
                jq -c --arg s "$s" 'select(.strategy == $s) | {ms_per_token, decode_tokens_per_s}')
            sed -i 's/^\[device cpu:\([0-9]*\)\]$/[device cpu:\1]\nthreads = 1/' "$work/plan.ini"
            meas=$(IFLOW_BENCH_PLAN="$work/plan.ini" "$build/iflow-bench" "$work/tl-part.ifs" 16 16 "$n" |
                jq -c '.runs[0] | {decode_tok_s, prefill_tok_s}')
            out+=("$(jq -cn --arg s "$s" --argjson n "$n" --argjson est "$est" --argjson meas "$meas" \
                '{devices: ("cpu:" + ($n | tostring)), strategy: $s, estimated_decode_tok_s: $est.decode_tokens_per_s,
                  measured_decode_tok_s: $meas.decode_tok_s, measured_over_estimated: ($meas.decode_tok_s / $est.decode_tokens_per_s),
                  measured_prefill_tok_s: $meas.prefill_tok_s}')")
        done
    done
    rm -f "$work/tl-part.ifs" "$work/plan.ini"
    printf '%s\n' "${out[@]}" | jq -s .
}
part=$(partition_entries)

batch_entries() { # continuous batching on the TinyLlama shape, Q4_B64: streams, a Poisson replay, a shared prefix
    log "batch: TinyLlama Q4_B64, 1/4/16 streams at 1 and 2 threads, a replay of 200 WikiText prompts, a shared prefix"
    tl_q4_pair
    local s1 s2 rp sh
    s1=$("$build/batchbench" "$work/tl-bq4.ifs" streams 1 8 64 1 4 16)
    s2=$("$build/batchbench" "$work/tl-bq4.ifs" streams 2 8 64 1 4 16)
    rp=$("$build/batchbench" "$work/tl-bq4.ifs" replay 2 "$DATA/data/wikitext-2-raw/wiki.test.raw" 200 \
        "${IFLOW_BENCH_REPLAY_RATE:-1}" 16 32)
    sh=$("$build/batchbench" "$work/tl-bq4.ifs" shared 2 512 16 32 16)
    jq -n --argjson s1 "$s1" --argjson s2 "$s2" --argjson rp "$rp" --argjson sh "$sh" \
        '{model: "tinyllama-1.1b-q4_b64", streams: {"1": $s1, "2": $s2}, replay: $rp[0], shared_prefix: $sh[0]}'
}
batch=$(batch_entries)

shift_entries() { # generating past the context: context shifts on xs-ckpt over WikiText-2
    log "context shift: xs-ckpt, 4096 WikiText tokens through a context of 256 (keep 4), rope vs recompute vs restart"
    bin/iflow-convert "$DATA/models/xs-ckpt/hf" -o "$work/xs.ifs"
    "$build/shiftbench" "$work/xs.ifs" "$DATA/data/wikitext-2-raw/wiki.test.raw" 256 4 4096 1
    rm -f "$work/xs.ifs"
}
ctxshift=$(shift_entries)

# Threads on a busy machine (kernels/cpu/pool.h): TinyLlama Q4_B64 on cores 0 and 1 (taskset),
# decode and prefill at 2 threads quiet and with a busy loop pinned to core 1, with the pool
# and with IFLOW_POOL=0 (OpenMP's dynamic loop, the pool's fallback). The competitor's fair share
# of the two cores is a quarter (half of one of them): decode should lose no more than that.
# The pool runs IFLOW_BENCH_BUSY_ROUNDS (default 3) alternating quiet / busy rounds, OpenMP one
# (its figure is a contrast); decode_kept_median is the pool's median round (the lower middle
# one for an even count). fair_share_bound: what decode keeps when the worker on core 1 gets
# exactly half of it and nothing is wasted, half the time at 1-thread speed and half at 2-thread
# speed: (1T + 2T) / (2 x 2T) of the same round; of_bound = decode_kept / fair_share_bound, how
# much of that the pool delivered.
busy_round() { # pool -> one JSON line
    local pool=$1 quiet busy bp
    quiet=$(IFLOW_POOL=$pool taskset -c 0,1 "$build/iflow-bench" "$work/tl-bq4.ifs" 16 48 1 2)
    taskset -c 1 bash -c 'while :; do :; done' &
    bp=$!
    busy=$(IFLOW_POOL=$pool taskset -c 0,1 "$build/iflow-bench" "$work/tl-bq4.ifs" 16 48 2)
    kill "$bp"
    wait "$bp" 2>/dev/null || true
    jq -cn --arg k "$([ "$pool" = 1 ] && echo pool || echo openmp)" --argjson q "$quiet" --argjson b "$busy" '
        ($q.runs[0].decode_tok_s) as $d1 | ($q.runs[1].decode_tok_s) as $d2 | ($b.runs[0].decode_tok_s) as $db |
        ($db / $d2) as $kept | (($d1 + $d2) / (2 * $d2)) as $bound |
        {threads: $k, quiet_1t_decode_tok_s: $d1, quiet_2t_decode_tok_s: $d2, busy_2t_decode_tok_s: $db,
         decode_kept: $kept, fair_share_bound: $bound, of_bound: ($kept / $bound),
         quiet_2t_prefill_tok_s: $q.runs[1].prefill_tok_s, busy_2t_prefill_tok_s: $b.runs[0].prefill_tok_s,
         prefill_kept: ($b.runs[0].prefill_tok_s / $q.runs[1].prefill_tok_s),
         items_taken_back: $b.runs[0].pool_items_taken_back, worker_moves: $b.runs[0].pool_worker_moves}'
}
busy_entry() {
    log "busy core: TinyLlama Q4_B64 at 2 threads, quiet and beside a busy loop on core 1; pool and OpenMP"
    tl_q4_pair
    local _ out=()
    for _ in $(seq "${IFLOW_BENCH_BUSY_ROUNDS:-3}"); do
        out+=("$(busy_round 1)")
    done
    out+=("$(busy_round 0)")
    printf '%s\n' "${out[@]}" | jq -s 'def pool_median(f): map(select(.threads == "pool") | f) | sort | .[(length - 1) / 2 | floor];
        {model: "tinyllama-1.1b-q4_b64", cores: "0,1", competitor: "busy loop on core 1", competitor_share: 0.25, runs: .,
         decode_kept_median: pool_median(.decode_kept), prefill_kept_median: pool_median(.prefill_kept)}'
}
busy=$(busy_entry)

# Decode at a depth: TinyLlama Q4_B64, 16 greedy steps after a 2,048-token prompt, at 2 threads,
# with each KV cache type (iflow-run --kv-type; IFLOW_BENCH_KV): what the attention over the
# cache adds to a step. kv_bytes_per_token: the cache a step reads (K and V of every layer at
# the prompt's length); decode_gbps_with_kv: weights and cache read per second.
depth_entries() {
    log "decode at depth 2048: TinyLlama Q4_B64, KV cache f32, f16, q8"
    tl_q4_pair
    local kv out=()
    for kv in f32 f16 q8; do
        out+=("$(IFLOW_BENCH_KV=$kv "$build/iflow-bench" "$work/tl-bq4.ifs" 2048 16 2)")
    done
    printf '%s\n' "${out[@]}" | jq -s --argjson bw2 "$bw2" 'map(
        {kv_type, depth: .runs[0].prefill_tokens, threads: .runs[0].threads, decode_tok_s: .runs[0].decode_tok_s,
         kv_bytes_per_token: .decode_kv_bytes_per_token,
         decode_gbps_with_kv: ((.decode_bytes_per_token + .decode_kv_bytes_per_token) * .runs[0].decode_tok_s / 1e9),
         fraction_of_bandwidth: ((.decode_bytes_per_token + .decode_kv_bytes_per_token) * .runs[0].decode_tok_s / 1e9 / $bw2)})
        | {model: "tinyllama-1.1b-q4_b64", runs: .}'
}
depth=$(depth_entries)

moe_entries() { # a mixture of experts against the dense model it matches token for token
    # bench/configs/tinyllama-moe: TinyLlama's attention with 8 experts of 1408 columns, 4 per
    # token, so a token's FFN reads 4 x 1408 = 5632 columns, TinyLlama's (fine-grained experts,
    # as Qwen3-MoE's); both in Q4_B64, every matrix. Decode reads the chosen experts' rows (the
    # model's decode_bytes_per_token counts n_experts_used / n_experts of each expert); a batch
    # of 16 streams reads most experts every step.
    log "moe: tinyllama-moe Q4_B64 against tinyllama Q4_B64"
    tl_q4_pair
    bin/iflow-convert --synthetic bench/configs/tinyllama-moe -t f16 -o "$work/moe-src.ifs" >&2
    bin/iflow-quant -t q4_b64 --keep "*=q4_b64" -i "$work/moe-src.ifs" -o "$work/moe-q4.ifs" >&2
    rm -f "$work/moe-src.ifs"
    local moe dense mb db
    moe=$("$build/iflow-bench" "$work/moe-q4.ifs" 128 32 1 2)
    dense=$("$build/iflow-bench" "$work/tl-bq4.ifs" 128 32 1 2)
    mb=$("$build/batchbench" "$work/moe-q4.ifs" streams 2 8 32 16)
    db=$("$build/batchbench" "$work/tl-bq4.ifs" streams 2 8 32 16)
    jq -n --argjson moe "$moe" --argjson dense "$dense" --argjson mb "$mb" --argjson db "$db" \
        --argjson size "$(stat -c %s "$work/moe-q4.ifs")" --argjson bw1 "$bw1" --argjson bw2 "$bw2" '
        {model: "tinyllama-moe-8x1408-top4-q4_b64", dense: "tinyllama-1.1b-q4_b64", file_bytes: $size,
         decode_bytes_per_token: $moe.decode_bytes_per_token, dense_decode_bytes_per_token: $dense.decode_bytes_per_token,
         runs: [$moe.runs[] | .threads as $n | ($dense.runs[] | select(.threads == $n)) as $d |
                {threads: $n, prefill_tok_s, decode_tok_s, decode_weight_gbps,
                 membw_gbps: (if $n == 1 then $bw1 else $bw2 end),
                 dense_prefill_tok_s: $d.prefill_tok_s, dense_decode_tok_s: $d.decode_tok_s,
                 prefill_ratio: (.prefill_tok_s / $d.prefill_tok_s), decode_ratio: (.decode_tok_s / $d.decode_tok_s)}
                | . + {decode_fraction_of_bandwidth: (.decode_weight_gbps / .membw_gbps)}],
         batched_decode_16_tok_s: ($mb[] | select(.streams == 16) | .decode_tok_s),
         dense_batched_decode_16_tok_s: ($db[] | select(.streams == 16) | .decode_tok_s)}'
    rm -f "$work/moe-q4.ifs"
}
moe=$(moe_entries)
spec=$(speculative_entries)

grammar=$(grammar_entries)
lora=$(lora_entries)

log "kernel micro-benchmarks"
kern=$("$build/kbench" --quick | jq -s .)

jq -n --argjson bw1 "$bw1" --argjson bw2 "$bw2" --argjson a "$s260" --argjson b "$tl16" --argjson c "$tl32" \
    --argjson kern "$kern" --argjson roof "$roof" --argjson quant "$quant" --argjson float "$float" --argjson part "$part" --argjson batch "$batch" --argjson ctxshift "$ctxshift" --argjson spec "$spec" --argjson busy "$busy" --argjson depth "$depth" --argjson grammar "$grammar" --argjson lora "$lora" --argjson moe "$moe" \
    --arg cpu "$(sed -nE 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)" --arg cores "$(nproc)" '
    {machine: {cpu: $cpu, cores: ($cores | tonumber), kernel_path: ($kern[0].isa // null),
               membw_read_gbps: {"1": $bw1, "2": $bw2}, roof: $roof},
     models: [$a, $b, $c], quantized: $quant, float_weights: $float, partition: $part, batch: $batch, context_shift: $ctxshift, speculative: $spec, busy_core: $busy, decode_at_depth: $depth, grammar: $grammar, lora: $lora, moe: $moe,
     kernels: $kern}'
