#!/usr/bin/env bash
# tools/gpu-lease.sh [STEP...] -- one device call's worth of GPU work, from the bundle that
# tools/gpu-bundle.sh packs in .gpu: run on the lent machine with carry [".gpu"].
#
#   env      nvidia-smi, and any library the programs cannot find there
#   unit     the CUDA kernels against their CPU references (tests/gpu/test_*)
#   kernels  bench/gpubench.c (--quick unless GPUBENCH_FULL=1)
#   ops      gpubench --only ops: host and device microseconds of each operation of a decode
#            layer, and of the layer (where a decode step's time goes)
#   cli      tests/gpu/cli.sh (greedy tokens and perplexity on the GPU against the CPU)
#   models   bench/bench-gpu.sh's model runs (IFLOW_BENCH_GPU_MODELS, default tinyllama)
#   models7b the same for the Llama-2-7B shape (IFLOW_BENCH_GPU_TYPES picks the quantized types)
#   sanitize compute-sanitizer memcheck over tests/gpu/test_* (slow)
#   vunit    each test_cuda_ops in .gpu/variants (tools/gpu-variants.sh)
#   variants each gpubench in .gpu/variants (tools/gpu-variants.sh): decode matrix-vector products
#            (--quick) and decoding attention, one line per case with every variant's fraction
#            of the copy bandwidth
#   ncustep  Nsight Compute's duration of every kernel of a short TinyLlama-shape run (F16 and
#            Q4_B64; iflow-bench: 8 prompt tokens, 2 decode steps, best of 2), summed per kernel:
#            where a decode step's time goes (NCUSTEP_TYPES, default "f16 q4_b64")
#   ncu      Nsight Compute on one launch each of the decode kernels named in NCU_KERNELS
#            (demangled-name regexes, no spaces; default F16, Q8_B64 and Q4_B64 at T = 1)
#
# Default: env unit kernels cli. Each step has its own time limit (STEP_S_<step>, seconds) so
# that one hang cannot eat the lease; each writes its log to $OUT/<step>.log (the device tool
# brings $OUT back) and prints its last lines, so the call's reply alone says what happened.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export b=$here/.gpu
[ -f "$b/run.sh" ] && bash "$b/run.sh" unpack # tools/gpu-bundle.sh gzips the files past 1 MB
[ -x "$b/bin/iflow-run" ] || { echo "gpu-lease: no bundle in $b (run tools/gpu-bundle.sh here first)" >&2; exit 2; }
O=${OUT:-/tmp/gpu-lease}
mkdir -p "$O"
export IFLOW_SPEC_PATH=$here/specs PATH=$b/bin:$PATH LD_LIBRARY_PATH=$b/lib:${LD_LIBRARY_PATH:-} \
    IFLOW_TEST_DATA=$b/shared BIN=$b/bin IFLOW_TEST_BUILD=$b/build

step() { # name, seconds, command...
    local name=$1 lim=$2 t0=$SECONDS rc
    shift 2
    echo "== $name (limit $lim s)"
    timeout -k 5 "$lim" bash -c "$(declare -f env_info unit kernels cli ops models sanitize ncu_kernels variants vunit ncustep unpack_variants); $*" >"$O/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    grep -E '^(FAIL|OBSERVED|SKIP)|passed, [0-9]+ failed|error|Error' "$O/$name.log" | head -n 60
    tail -n "${TAIL:-6}" "$O/$name.log"
}

env_info() {
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
    for f in "$b"/bin/iflow-run "$b"/build/gpubench "$b"/build/tests/gpu/test_*; do
        ldd "$f" | grep 'not found' | sed "s|^|$(basename "$f"): |"
    done
    echo "glibc: $(ldd --version | head -n 1)"
}
unit() {
    local t rc=0
    for t in "$b"/build/tests/gpu/test_*; do "$t" || rc=1; done
    return $rc
}
kernels() {
    if [ "${GPUBENCH_FULL:-0}" = 1 ]; then "$b/build/gpubench"; else "$b/build/gpubench" --quick; fi
}
cli() { bash tests/gpu/cli.sh; }
ops() { "$b/build/gpubench" --only ops | jq -c 'select(.bench == "ops" or .error) | del(.bench)'; }
models() { # [models] [out-name]: bench-gpu.sh's model runs; their JSON in $OUT/<out-name>.json
    local which=${1:-${IFLOW_BENCH_GPU_MODELS:-tinyllama}} out=${OUT:-/tmp}/${2:-bench-gpu}.json
    IFLOW_BENCH_GPU_MODELS=$which IFLOW_BENCH_DIR=/tmp/bench-gpu \
        IFLOW_GPUBENCH_ARGS="--only copy --quick" bench/bench-gpu.sh "$b/build" >"$out" || return
    jq -c '.models[] | {name, error, load_s, graphs, op_by_op, unfused, overlap, tiled, runs: [.runs[]? | {prefill_tok_s, decode_tok_s, decode_weight_gbps,
        f: .decode_fraction_of_bandwidth}]}' "$out"
}
sanitize() {
    local t rc=0
    for t in "$b"/build/tests/gpu/test_*; do compute-sanitizer --tool memcheck --leak-check no "$t" || rc=1; done
    return $rc
}

ncu_kernels() {
    local k ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    [ -n "$ncu" ] || { echo "no ncu"; return 1; }
    for k in ${NCU_KERNELS:-fmatvec_kernel<.int.1,..int.1> qmatvec_kernel<.int.17,..int.1> qmatvec_kernel<.int.21,..int.1>}; do
        echo "---- ncu: $k"
        "$ncu" --clock-control none --kernel-name-base demangled -k "regex:$k" -c 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
            --section InstructionStats "$b/build/gpubench" --only matvec --quick 2>&1 | grep -v '^{'
    done
}

ncustep() {
    local ncu t src=/tmp/ncustep/tl-f16.ifs
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    [ -n "$ncu" ] || { echo "no ncu"; return 1; }
    mkdir -p /tmp/ncustep
    "$b/bin/iflow-convert" --synthetic "$b/shared/models/synthetic/tinyllama-1.1b" -t f16 -o "$src" >/dev/null || return
    for t in ${NCUSTEP_TYPES:-f16 q4_b64}; do
        local m=$src
        if [ "$t" != f16 ]; then
            m=/tmp/ncustep/tl-$t.ifs
            "$b/bin/iflow-quant" -t "$t" --keep "*=$t" -i "$src" -o "$m" >/dev/null || return
        fi
        echo "---- $t: iflow-bench without ncu"
        IFLOW_BENCH_DEVICE=cuda "$b/build/iflow-bench" "$m" 8 2 1 | jq -c '.runs[0]'
        echo "---- $t: kernel durations (ncu, each kernel serialized)"
        IFLOW_BENCH_DEVICE=cuda "$ncu" --clock-control none --metrics gpu__time_duration.sum \
            --print-summary per-kernel "$b/build/iflow-bench" "$m" 8 2 1 2>&1 | grep -v '^{'  # all of it: the log
    done
}

unpack_variants() { # tools/gpu-variants.sh gzips them
    local f
    for f in "$b"/variants/*.gz; do [ -e "$f" ] && gunzip -kf "$f"; done
    chmod +x "$b"/variants/gpubench-* "$b"/variants/test_cuda_* 2>/dev/null
    return 0
}

vunit() {
    local t rc=0
    unpack_variants
    for t in "$b"/variants/test_cuda_*-*; do
        [ -e "$t" ] || { echo "no variants (tools/gpu-variants.sh makes them)"; return 1; }
        case $t in *.gz) continue ;; esac
        echo "-- $(basename "$t")"
        "$t" || rc=1
    done
    return $rc
}

variants() { # the bundle's gpubench, then each variant's; VARIANT_ONLY: the benches (default attention_decode)
    local name v only
    unpack_variants
    { echo "bundle: (the bundle's own)"; cat "$b/variants/list" 2>/dev/null; } | while IFS= read -r line; do
        name=${line%%:*}
        v=$b/variants/gpubench-$name
        [ "$name" = bundle ] && v=$b/build/gpubench
        for only in ${VARIANT_ONLY:-attention_decode}; do
            if [ "$only" = matvec ]; then "$v" --only matvec --quick; else "$v" --only "$only"; fi |
                jq -c --arg v "$name" 'select(.bench != "device" and .bench != "copy") | {v: $v, b: .bench,
                    c: ((.wtype // .kv_type) + " " + ((.T // 1) | tostring) + " " + ((.N // .n_pos) | tostring) + "x" + ((.K // .head_dim) | tostring) + (if .kv_heads then " kv" + (.kv_heads | tostring) else "" end) + (if .overlap then " overlap" else "" end) + (if .layout then " " + .layout else "" end)),
                    f: .fraction_of_bw, us: .us_median}'
        done
    done >/tmp/variants.jsonl
    cp /tmp/variants.jsonl "${OUT:-/tmp}/variants.jsonl" 2>/dev/null
    jq -rs 'group_by(.c) | .[] | (.[0].c) + ": " + (map(.v + " " + (.f * 1000 | round / 1000 | tostring) + " (" + (.us | tostring) + " us)") | join(", "))' /tmp/variants.jsonl
}

[ $# -gt 0 ] || set -- env unit kernels cli
for s in "$@"; do
    case $s in
    env) step env "${STEP_S_env:-30}" env_info ;;
    unit) step unit "${STEP_S_unit:-90}" unit ;;
    kernels) step kernels "${STEP_S_kernels:-90}" kernels ;;
    ops) TAIL=${TAIL:-80} step ops "${STEP_S_ops:-60}" ops ;;
    cli) step cli "${STEP_S_cli:-180}" cli ;;
    models) step models "${STEP_S_models:-240}" models ;;
    models7b) step models7b "${STEP_S_models7b:-240}" models 7b bench-gpu-7b ;;
    sanitize) step sanitize "${STEP_S_sanitize:-120}" sanitize ;;
    vunit) step vunit "${STEP_S_vunit:-180}" vunit ;;
    variants) step variants "${STEP_S_variants:-120}" variants ;;
    ncu) step ncu "${STEP_S_ncu:-90}" ncu_kernels ;;
    ncustep) step ncustep "${STEP_S_ncustep:-150}" ncustep ;;
    *) echo "gpu-lease: unknown step '$s'" >&2; exit 2 ;;
    esac
done
