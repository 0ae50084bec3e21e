#!/usr/bin/env bash
# tools/gpu-lease.sh [STEP...] -- one device call's worth of GPU work, from the bundle that
# tools/gpu-bundle.sh packs in .gpu: run on the lent machine with carry [".gpu"].
#
#   env      nvidia-smi, and any library the programs cannot find there
#   unit     the CUDA kernels against their CPU references (tests/gpu/test_*)
#   kernels  bench/gpubench.c (--quick unless GPUBENCH_FULL=1)
#   cli      tests/gpu/cli.sh (greedy tokens and perplexity on the GPU against the CPU)
#   models   bench/bench-gpu.sh's model runs (IFLOW_BENCH_GPU_MODELS, default tinyllama)
#   sanitize compute-sanitizer memcheck over tests/gpu/test_* (slow)
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
[ -x "$b/bin/iflow-run" ] || { echo "gpu-lease: no bundle in $b (run tools/gpu-bundle.sh here first)" >&2; exit 2; }
O=${OUT:-/tmp/gpu-lease}
mkdir -p "$O"
export IFLOW_SPEC_PATH=$here/specs PATH=$b/bin:$PATH LD_LIBRARY_PATH=$b/lib:${LD_LIBRARY_PATH:-} \
    IFLOW_TEST_DATA=$b/shared BIN=$b/bin IFLOW_TEST_BUILD=$b/build

step() { # name, seconds, command...
    local name=$1 lim=$2 t0=$SECONDS rc
    shift 2
    echo "== $name (limit $lim s)"
    timeout -k 5 "$lim" bash -c "$(declare -f env_info unit kernels cli models sanitize ncu_kernels); $*" >"$O/$name.log" 2>&1
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
models() { IFLOW_BENCH_GPU_MODELS=${IFLOW_BENCH_GPU_MODELS:-tinyllama} IFLOW_BENCH_DIR=/tmp/bench-gpu \
    IFLOW_GPUBENCH_ARGS="--only copy --quick" bench/bench-gpu.sh "$b/build"; }
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

[ $# -gt 0 ] || set -- env unit kernels cli
for s in "$@"; do
    case $s in
    env) step env "${STEP_S_env:-30}" env_info ;;
    unit) step unit "${STEP_S_unit:-90}" unit ;;
    kernels) step kernels "${STEP_S_kernels:-90}" kernels ;;
    cli) step cli "${STEP_S_cli:-180}" cli ;;
    models) step models "${STEP_S_models:-240}" models ;;
    sanitize) step sanitize "${STEP_S_sanitize:-120}" sanitize ;;
    ncu) step ncu "${STEP_S_ncu:-90}" ncu_kernels ;;
    *) echo "gpu-lease: unknown step '$s'" >&2; exit 2 ;;
    esac
done
