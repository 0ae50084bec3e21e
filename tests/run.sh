#!/usr/bin/env bash
# tests/run.sh BUILD_DIR -- run every unit-test binary and every CLI test script.
# tests/run.sh --gpu BUILD_DIR -- run the GPU tests instead (tests/gpu: test_* binaries, *.sh).
# tests/run.sh --gpu-variants BUILD_DIR -- the GPU tests built with the kernel variants
# (BUILD_DIR/tests/gpu-variants: make check-emu-variants).
#
# Each test prints one summary line "<name>: P passed, F failed[, S skipped]"; this script
# echoes them and ends with the totals as "N passed, N failed". Exit status: 0 only if every
# test program exited 0 and nothing failed.
set -u
suite=unit cli=tests/cli
if [ "${1:-}" = --gpu ]; then suite=gpu cli=tests/gpu; shift; fi
if [ "${1:-}" = --gpu-variants ]; then suite=gpu-variants cli=; shift; fi
build=${1:?usage: tests/run.sh [--gpu | --gpu-variants] BUILD_DIR}
export IFLOW_TEST_BUILD=$build   # the CLI tests skip their slowest cases in sanitizer builds
cd "$(dirname "$0")/.." || exit 2
export IFLOW_TEST_DATA=${IFLOW_TEST_DATA:-../shared}
[ -d "$IFLOW_TEST_DATA/models" ] || { echo "tests/run.sh: test data not found in '$IFLOW_TEST_DATA' (set IFLOW_TEST_DATA)" >&2; exit 2; }

passed=0 failed=0 skipped=0 broken=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

tally() { # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local line
    line=$(grep -E '^[A-Za-z0-9_./-]+: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ] || [ $rc -ne 0 ]; then
        cat "$log"
    else
        grep '^SKIP ' "$log"   # what did not run, and why, is never silent
    fi
    if [ -z "$line" ]; then
        echo "$name: no summary line (exit $rc)"
        broken=$((broken + 1))
        return
    fi
    echo "$line ($((SECONDS - t0)) s)"
    local p f s
    p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.*, ([0-9]+) failed.*/\1/' <<<"$line")
    s=$(sed -nE 's/.*, ([0-9]+) skipped.*/\1/p' <<<"$line")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + ${s:-0}))
    [ $rc -eq 0 ] || [ "$f" -gt 0 ] || broken=$((broken + 1))
}

for t in "$build"/tests/$suite/test_*; do
    [ -x "$t" ] && tally "$(basename "$t")" "$t"
done
# The packed products' other ways of reading their tiles (qdispatch.c: decode over several
# streams, a software prefetch ahead), which the dispatcher picks only on Intel CPUs or from the
# environment: the kernel tests again with both forced, so that AMD machines run them too.
if [ $suite = unit ] && [ -x "$build/tests/unit/test_qkernels" ]; then
    echo "test_qkernels again, with IFLOW_PACK_STREAMS=3 IFLOW_PACK_AHEAD=1024:"
    tally test_qkernels env IFLOW_PACK_STREAMS=3 IFLOW_PACK_AHEAD=1024 "$build/tests/unit/test_qkernels"
fi
for t in ${cli:+"$cli"/*.sh}; do
    [ -f "$t" ] || continue
    case $t in */lib.sh) continue ;; esac
    tally "$(basename "$t" .sh)" bash "$t"
done

echo "----"
[ $skipped -gt 0 ] && echo "($skipped skipped: see SKIP lines above)"
[ $broken -gt 0 ] && echo "$broken test program(s) crashed or exited non-zero without failing a check"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ] && [ $broken -eq 0 ]
