# tests/cli/lib.sh -- helpers for the CLI tests (sourced). Each test script pins exact output
# and exit codes of the programs in bin/, then calls `summary`.
#
#   run CMD...            run CMD; sets $out (stdout), $err (stderr), $rc
#   expect_rc N WHAT      the last run exited N
#   expect_eq GOT WANT WHAT
#   expect_match TEXT REGEX WHAT   (bash extended regex)
#   expect_no_file PATTERN WHAT    no file matches the glob (nothing half-written)
#   expect_close A B TOL WHAT      |A-B| <= TOL*|B| (relative)
#   cpu_vnni              whether the CPU's quantized products take its AVX512_VNNI paths
set -u
NAME=$(basename "$0" .sh)
BIN=${BIN:-bin}
DATA=${IFLOW_TEST_DATA:-../shared}
[ -d "$DATA" ] && DATA=$(cd "$DATA" && pwd) # absolute: some tests run from elsewhere
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASS=0 FAIL=0

ok() { PASS=$((PASS + 1)); }
bad() { FAIL=$((FAIL + 1)); printf 'FAIL %s: %s\n' "$NAME" "$*" >&2; }

run() {
    out=$("$@" 2>"$TMP/.err")
    rc=$?
    err=$(cat "$TMP/.err")
}

expect_rc() { [ "$rc" = "$1" ] && ok || bad "$2: exit $rc, expected $1; stderr: $err"; }
expect_eq() { [ "$1" = "$2" ] && ok || bad "$3: got [$1], expected [$2]"; }
expect_match() { [[ $1 =~ $2 ]] && ok || bad "$3: [$1] does not match /$2/"; }
expect_no_file() {
    local f
    for f in $1; do [ -e "$f" ] && { bad "$2: '$f' was left behind"; return; }; done
    ok
}
expect_close() {
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= t * m) }' &&
        ok || bad "$4: $1 is not within $3 (relative) of $2"
}
# one line of stderr, naming the program
expect_one_line() { [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && ok || bad "$1: expected one line on stderr, got: $err"; }

# The CPU's quantized products take the AVX512_VNNI paths (qdispatch.c's path_vnni: Q8 on int8 x,
# each token's outliers split out, as the GPU's warp tiles round x) only where the CPU has
# AVX512_VNNI and iflow's kernels are an AVX-512 set; elsewhere Q8 meets int16 x, nothing split.
cpu_vnni() {
    grep -qw avx512_vnni /proc/cpuinfo &&
        [[ $($BIN/iflow-run --list-devices --json | jq -r 'select(.name == "cpu") | .detail') =~ ^kernels\ (avx512|avx512gfni|amx)$ ]]
}

summary() {
    echo "$NAME: $PASS passed, $FAIL failed"
    [ "$FAIL" = 0 ]
}
