#!/usr/bin/env bash
# tools/gpu-bundle.sh [DIR] -- everything `make check-gpu` and `make bench-gpu` need, in one
# folder (default .gpu, git-ignored) that the device tool can carry to a lent GPU machine.
#
# That machine receives the working tree only: no ../shared, and no Debian -dev packages (it
# cannot install any). So this builds here, then gathers:
#   bin/            the programs            build/   the GPU tests, iflow-bench, gpubench
#   lib/            the shared libraries they need beyond glibc and CUDA's own (jansson, inih,
#                   utf8proc, xxhash, zstd, pcre2, gomp), and jq with its libraries
#   shared/         the test data the GPU tests read: stories260K, xs-ckpt, the synthetic
#                   TinyLlama shape, the greedy goldens, WikiText-2's test split
#   run.sh          `bash .gpu/run.sh check` (= make check-gpu) or `bash .gpu/run.sh bench`
#                   (= make bench-gpu), with the paths above set
# Then, on the device: carry [".gpu"] and run `bash .gpu/run.sh check`. cuBLAS comes from the
# machine's CUDA toolkit (/usr/local/cuda/lib64, the programs' rpath).
set -euo pipefail
out=${1:-.gpu}
cd "$(dirname "$0")/.."
DATA=${IFLOW_TEST_DATA:-../shared}
log() { echo "gpu-bundle: $*" >&2; }

# The programs that compute on the GPU are built for Hopper only (sm_90: the lent machines are
# H100 and H200), in a build folder of their own, and stripped, to stay well inside the 64 MiB
# the device tool carries; iflow-convert, iflow-quant and iflow-partition need no GPU and come from CUDA=0.
# GPU_BUNDLE_DEFS: -D options for kernels/cuda (CUDA_DEFS), built in a folder of their own (named
# by a hash of them, so that other options never reuse stale objects).
B=build/gpu-bundle
[ -z "${GPU_BUNDLE_DEFS:-}" ] || B=build/gpu-bundle-$(printf '%s' "$GPU_BUNDLE_DEFS" | md5sum | cut -c1-8)
make --no-print-directory deps >&2
make --no-print-directory -j"$(nproc)" CUDA=0 all >&2
rm -rf "$out"
mkdir -p "$out/bin" "$out/build/tests/gpu" "$out/lib" "$out/shared/models/stories260K" "$out/shared/models/xs-ckpt" \
    "$out/shared/models/synthetic" "$out/shared/golden" "$out/shared/data/wikitext-2-raw"
strip -o "$out/bin/iflow-convert" bin/iflow-convert
strip -o "$out/bin/iflow-quant" bin/iflow-quant
strip -o "$out/bin/iflow-partition" bin/iflow-partition
make --no-print-directory -j"$(nproc)" CUDA=1 BUILD=$B CUDA_ARCH="-gencode arch=compute_90,code=sm_90" \
    CUDA_DEFS="${GPU_BUNDLE_DEFS:-}" \
    all gpu-bins $B/iflow-bench $B/gpubench >&2
strip -o "$out/bin/iflow-run" bin/iflow-run
strip -o "$out/bin/iflow-ppl" bin/iflow-ppl
for t in $B/tests/gpu/test_*; do strip -o "$out/build/tests/gpu/$(basename "$t")" "$t"; done
strip -o "$out/build/iflow-bench" $B/iflow-bench
strip -o "$out/build/gpubench" $B/gpubench
cp "$(command -v jq)" "$out/bin/"
make --no-print-directory -j"$(nproc)" all >&2 # bin/ back to the default build

# Shared libraries outside glibc and CUDA that the programs and jq load.
libs() { ldd "$@" | awk '$3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' ; }
for l in $(libs "$out"/bin/* "$out"/build/tests/gpu/* "$out"/build/iflow-bench); do
    cp -L "$l" "$out/lib/"
done

cp -r "$DATA/models/stories260K/hf" "$out/shared/models/stories260K/"
cp -r "$DATA/models/xs-ckpt/hf" "$out/shared/models/xs-ckpt/"
cp -r "$DATA/models/synthetic/tinyllama-1.1b" "$out/shared/models/synthetic/"
cp "$DATA/golden/stories260K.greedy64.jsonl" "$DATA/golden/xs-ckpt.greedy64.json" "$out/shared/golden/"
cp "$DATA/data/wikitext-2-raw/wiki.test.raw" "$out/shared/data/wikitext-2-raw/"

# Files past 1 MB travel gzipped (the programs each hold kernels/cuda's machine code: 45 MB
# become 21, leaving the carry room for variants); run.sh unpacks them (`run.sh unpack` alone:
# tools/gpu-lease.sh).
find "$out" -type f -size +1M ! -name '*.gz' -exec gzip -9 {} +

cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# run.sh check|bench|unpack -- make check-gpu or make bench-gpu from this bundle
# (tools/gpu-bundle.sh); each first unpacks the files that travel gzipped (unpack: only that).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
find "$here" -name '*.gz' ! -path "$here/variants/*" -exec gunzip -f {} + # variants: their own steps
chmod +x "$here"/bin/* "$here"/build/gpubench "$here"/build/iflow-bench "$here"/build/tests/gpu/* 2>/dev/null
cd "$here/.."
export IFLOW_SPEC_PATH=$PWD/specs PATH=$here/bin:$PATH LD_LIBRARY_PATH=$here/lib:${LD_LIBRARY_PATH:-} IFLOW_TEST_DATA=$here/shared BIN=$here/bin
case ${1:-check} in
check) exec tests/run.sh --gpu "$here/build" ;;
bench) exec bench/bench-gpu.sh "$here/build" ;;
unpack) ;;
*) echo "usage: run.sh check|bench|unpack" >&2; exit 2 ;;
esac
EOF
chmod +x "$out/run.sh"
log "$(du -sh "$out" | cut -f1) in $out (files past 1 MB gzipped); on the device: carry [\"$out\"], run: bash $out/run.sh check"
