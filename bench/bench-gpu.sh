#!/usr/bin/env bash
# bench/bench-gpu.sh BUILD_DIR -- iflow's GPU benchmarks as one JSON object on stdout (progress
# on stderr). Run by `make bench-gpu` on a machine with a CUDA GPU.
#
#   {"date", "machine": {"gpu": <gpubench's device line>, "bw_gbps", "cpu", "cores"},
#    "kernels": [<gpubench's lines>], "models": [<one entry per model and type>]}
#
# kernels: bench/gpubench.c (copy bandwidth, decode and prefill matrix products for every weight
#          type, decode and prefill attention). bw_gbps is its copy figure (bytes read + written
#          per second by a device-to-device copy), the ceiling of read-bound kernels.
# models:  iflow-bench with IFLOW_BENCH_DEVICE=cuda (every layer and the output on cuda:0),
#          prefill 512 tokens then 64 greedy decode steps, 1 CPU thread, for synthetic weights
#          (seeded random, real shapes) of
#            TinyLlama-1.1B ($DATA/models/synthetic/tinyllama-1.1b) and
#            Llama-2-7B (tests/fixtures/synthetic/llama-2-7b/config.json with the Llama 2
#            tokenizer.gguf of the TinyLlama folder, assembled in $work),
#          each in F16 and quantized (every matrix) to Q8_B64 and Q4_B64. Each run gets
#          decode_fraction_of_bandwidth = decode_weight_gbps / bw_gbps. Model files are deleted
#          after use (the 7B F16 file is 13.5 GB); a model that fails to run gets an entry with
#          "error" and the others go on. Decode runs as iflow-run's default runs it (each step
#          recorded once and run again at the next positions; graphs: the counts); op_by_op is a
#          second run with every operation launched on its own (iflow-run --no-gpu-graphs) and
#          its prefill in passes of 128 rows (IFLOW_PASS=128; a GPU's default is 512:
#          prefill_pass128_tok_s), unfused a third, op by op without the fused ops
#          (IFLOW_CUDA_UNFUSED=1); IFLOW_BENCH_GPU_COMPARE=0 skips those two. overlap: the main
#          run again with overlapped launches (IFLOW_CUDA_OVERLAP=1: each kernel starts while the
#          one before it finishes; compute capability 9.0), null where the run failed. tiled
#          (Q4_B32, Q4_B64, Q8_B32, Q8_B64): the main run with those matrices in warp tiles
#          (IFLOW_CUDA_TILED=1: int8 activations), and its decode with overlap as well.
#
# Environment: IFLOW_TEST_DATA (default ../shared), IFLOW_BENCH_DIR (scratch, default
# build/bench-gpu), IFLOW_BENCH_GPU_MODELS = all (default) | tinyllama | 7b | none,
# IFLOW_BENCH_GPU_TYPES (default "q8_b64 q4_b64", the quantized types besides F16),
# IFLOW_GPUBENCH_ARGS (extra gpubench options, e.g. --quick).
set -euo pipefail
shopt -s inherit_errexit
build=${1:?usage: bench/bench-gpu.sh BUILD_DIR}
build=$(cd "$build" && pwd)
cd "$(dirname "$0")/.."
DATA=${IFLOW_TEST_DATA:-../shared}
BIN=${BIN:-bin} # iflow-convert and iflow-quant (tools/gpu-bundle.sh sets its own)
work=${IFLOW_BENCH_DIR:-build/bench-gpu}
which_models=${IFLOW_BENCH_GPU_MODELS:-all}
case $which_models in
all | tinyllama | 7b | none) ;;
*)
    echo "bench-gpu: IFLOW_BENCH_GPU_MODELS must be all, tinyllama, 7b or none, not '$which_models'" >&2
    exit 2
    ;;
esac
mkdir -p "$work"
synth7b=$work/llama-2-7b-synthetic
trap 'rm -f "$work"/tinyllama-1.1b-*.ifs "$work"/llama-2-7b-*.ifs; rm -rf "$synth7b"' EXIT
log() { echo "bench-gpu: $*" >&2; }

# ---- kernels -------------------------------------------------------------------------------------
log "GPU kernel micro-benchmarks (bench/gpubench.c)"
read -ra gpubench_args <<<"${IFLOW_GPUBENCH_ARGS:-}"
if ! lines=$("$build/gpubench" ${gpubench_args[@]+"${gpubench_args[@]}"}); then
    # exit 1 and no device line: no usable GPU (gpubench said why on stderr)
    grep -q '"bench":"device"' <<<"$lines" || exit 1
    log "some kernel benchmarks failed: their lines carry \"error\""
fi
kernels=$(jq -s . <<<"$lines")
device=$(jq -c 'map(select(.bench == "device"))[0] // {} | del(.bench)' <<<"$kernels")
bw=$(jq 'map(select(.bench == "copy" and .bw_gbps != null))[0].bw_gbps // null' <<<"$kernels")
log "measured bandwidth (device copy, read + written): $bw GB/s"

# ---- models --------------------------------------------------------------------------------------
run_model() { # name, type, file -> one JSON line
    local name=$1 type=$2 file=$3 size run rc=0
    size=$(stat -c %s "$file")
    log "$name: running ($((size / 1000000)) MB)"
    run=$(IFLOW_BENCH_DEVICE=cuda "$build/iflow-bench" "$file" 512 64 1 2>"$work/$name.err") || rc=$?
    cat "$work/$name.err" >&2
    local graphs=null # the main run's recordings: steps run again, recordings made and dropped
    [ "$rc" = 0 ] && graphs=$(jq -c '{launches: .graph_launches, instantiations: .graph_instantiations,
                                      aborts: .graph_aborts, replays: .graph_replays}' <<<"$run")
    local op_by_op=null unfused=null # to compare: decode op by op (iflow-run --no-gpu-graphs) with
    # prefill in passes of 128, and op by op without the fused ops (IFLOW_CUDA_UNFUSED=1);
    # IFLOW_BENCH_GPU_COMPARE=0 skips them
    if [ "$rc" = 0 ] && [ "${IFLOW_BENCH_GPU_COMPARE:-1}" = 1 ]; then
        op_by_op=$(IFLOW_PASS=128 IFLOW_BENCH_DEVICE=cuda IFLOW_BENCH_GRAPHS=0 "$build/iflow-bench" "$file" 512 64 1 \
            2>/dev/null | jq -c '{decode_tok_s: .runs[0].decode_tok_s, prefill_pass128_tok_s: .runs[0].prefill_tok_s}') ||
            op_by_op=null
        unfused=$(IFLOW_CUDA_UNFUSED=1 IFLOW_BENCH_DEVICE=cuda IFLOW_BENCH_GRAPHS=0 "$build/iflow-bench" "$file" 512 64 1 \
            2>/dev/null | jq -c '{prefill_tok_s: .runs[0].prefill_tok_s, decode_tok_s: .runs[0].decode_tok_s}') ||
            unfused=null
    fi
    local overlap=null # the main run with overlapped launches (IFLOW_CUDA_OVERLAP=1)
    if [ "$rc" = 0 ]; then
        overlap=$(IFLOW_CUDA_OVERLAP=1 IFLOW_BENCH_DEVICE=cuda "$build/iflow-bench" "$file" 512 64 1 2>/dev/null |
            jq -c '{prefill_tok_s: .runs[0].prefill_tok_s, decode_tok_s: .runs[0].decode_tok_s}') || overlap=null
    fi
    local tiled=null # Q4 and Q8 in warp tiles (IFLOW_CUDA_TILED=1), the main run and with overlap
    if [ "$rc" = 0 ] && [[ $type =~ ^q[48]_b(32|64)$ ]]; then
        tiled=$(IFLOW_CUDA_TILED=1 IFLOW_BENCH_DEVICE=cuda "$build/iflow-bench" "$file" 512 64 1 2>/dev/null |
            jq -c '{prefill_tok_s: .runs[0].prefill_tok_s, decode_tok_s: .runs[0].decode_tok_s}') || tiled=null
        local tiled_ov
        tiled_ov=$(IFLOW_CUDA_TILED=1 IFLOW_CUDA_OVERLAP=1 IFLOW_BENCH_DEVICE=cuda "$build/iflow-bench" "$file" 512 64 1 \
            2>/dev/null | jq -c '{decode_tok_s: .runs[0].decode_tok_s}') || tiled_ov=null
        [ "$tiled" != null ] && tiled=$(jq -c --argjson ov "${tiled_ov:-null}" '. + {overlap: $ov}' <<<"$tiled")
    fi
    local line
    line=$(run_entry) || return 1
    log "done: $line"
    echo "$line"
}

run_entry() { # run_model's JSON line, from its locals
    if [ "$rc" != 0 ]; then
        jq -c -n --arg name "$name" --arg type "$type" --argjson size "$size" --argjson rc "$rc" \
            --arg err "$(tail -n 1 "$work/$name.err")" \
            '{name: $name, type: $type, file_bytes: $size, error: ("iflow-bench exited \($rc): " + $err)}'
    else
        jq -c -n --arg name "$name" --arg type "$type" --argjson size "$size" --argjson run "$run" \
            --argjson bw "$bw" --argjson graphs "${graphs:-null}" --argjson op_by_op "${op_by_op:-null}" \
            --argjson unfused "${unfused:-null}" --argjson overlap "${overlap:-null}" --argjson tiled "${tiled:-null}" '
            {name: $name, type: $type, file_bytes: $size, device: $run.device, load_s: $run.load_s,
             decode_bytes_per_token: $run.decode_bytes_per_token, graphs: $graphs, op_by_op: $op_by_op,
             unfused: $unfused, overlap: $overlap, tiled: $tiled,
             runs: [$run.runs[] | . + {bw_gbps: $bw, decode_fraction_of_bandwidth:
                    (if $bw != null and $bw > 0 then .decode_weight_gbps / $bw else null end)}]}'
    fi
    rm -f "$work/$name.err"
}

failed_entry() { # name, type, message -> one JSON line
    jq -c -n --arg name "$1" --arg type "$2" --arg err "$3" '{name: $name, type: $type, error: $err}'
}

model_family() { # label, synthetic folder -> JSON lines: F16 and each quantized type
    local label=$1 dir=$2 src="$work/$1-f16.ifs" t
    log "$label: converting (synthetic weights, F16)"
    if ! "$BIN"/iflow-convert --synthetic "$dir" -t f16 -o "$src" >&2; then
        failed_entry "$label-f16" f16 "iflow-convert --synthetic failed"
        return 0
    fi
    run_model "$label-f16" f16 "$src"
    for t in ${IFLOW_BENCH_GPU_TYPES:-q8_b64 q4_b64}; do
        log "$label-$t: quantizing"
        if "$BIN"/iflow-quant -t "$t" --keep "*=$t" -i "$src" -o "$work/$label-$t.ifs" >&2; then
            run_model "$label-$t" "$t" "$work/$label-$t.ifs"
        else
            failed_entry "$label-$t" "$t" "iflow-quant -t $t failed"
        fi
        rm -f "$work/$label-$t.ifs"
    done
    rm -f "$src"
}

# The Llama-2-7B shape: its config (in the repository) and the Llama 2 tokenizer that the
# TinyLlama folder already has (same 32000-token vocabulary), in a scratch folder.
llama7b_folder() {
    rm -rf "$synth7b"
    mkdir -p "$synth7b"
    cp tests/fixtures/synthetic/llama-2-7b/config.json "$synth7b/"
    cp "$DATA/models/synthetic/tinyllama-1.1b/tokenizer.gguf" "$synth7b/"
}

models=()
if [ "$which_models" = all ] || [ "$which_models" = tinyllama ]; then
    fam=$(model_family tinyllama-1.1b "$DATA/models/synthetic/tinyllama-1.1b")
    mapfile -t -O ${#models[@]} models <<<"$fam"
fi
if [ "$which_models" = all ] || [ "$which_models" = 7b ]; then
    llama7b_folder
    fam=$(model_family llama-2-7b "$synth7b")
    mapfile -t -O ${#models[@]} models <<<"$fam"
    rm -rf "$synth7b"
fi
if [ ${#models[@]} -gt 0 ]; then
    models_json=$(printf '%s\n' "${models[@]}" | jq -s .)
else
    models_json='[]'
fi

# ---- the document --------------------------------------------------------------------------------
jq -n --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --argjson gpu "$device" --argjson bw "$bw" \
    --arg cpu "$(sed -nE 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)" --arg cores "$(nproc)" \
    --argjson kernels "$kernels" --argjson models "$models_json" '
    {date: $date, machine: {gpu: $gpu, bw_gbps: $bw, cpu: $cpu, cores: ($cores | tonumber)},
     kernels: $kernels, models: $models}'
