#!/usr/bin/env bash
# tools/gpu-variants.sh NAME='FLAGS' ... -- gpubench, test_cuda_ops, test_cuda_matmul and
# test_cuda_tiled built with the working tree's kernels/cuda/attention.cu, matmul.cu and
# qtiled.cu (and other tuning constants, FLAGS) over the library of the last tools/gpu-bundle.sh,
# into .gpu/variants/{gpubench,test_cuda_ops,test_cuda_matmul,test_cuda_tiled}-NAME.gz, so that one device call can
# check and time a kernel change beside the bundle's own (tools/gpu-lease.sh vunit variants). FLAGS are nvcc -D options for kernels/cuda/matmul.cu,
# qtiled.cu and attention.cu (IFKC_MV_WARPS, IFKC_MV_R, IFKC_MV_R_WIDE, IFKC_MV_U1, IFKC_MV_MINB, IFKC_DEC_UNROLL,
# IFKC_DEC_BPS, IFKC_DEC_MINB; IFKC_PF_TC=1 and IFKC_DEC_TC=1: prefill and decoding attention on
# tensor cores; IFKC_MV_DP4A=1: the quantized decode products on int8 activations; all three off
# by default until they have run on a GPU; IFKC_MV_PREFETCH=1, IFKC_DEC_PREFETCH=1: the decode
# products' and decoding attention's L2 prefetch without overlapped launches; VARIANT_ONLY picks
# what is timed).
# Run after tools/gpu-bundle.sh (it links against that build's library); sm_90 only.
#   tools/gpu-variants.sh r1='-DIFKC_MV_R=1' u16='-DIFKC_MV_U1=16 -DIFKC_DEC_UNROLL=8'
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/gpu-bundle
[ -f $B/libiflow.a ] || { echo "gpu-variants: run tools/gpu-bundle.sh first" >&2; exit 2; }
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
CC_FLAGS=$(make --no-print-directory -n CUDA=1 BUILD=$B CUDA_ARCH="-gencode arch=compute_90,code=sm_90" -W bench/gpubench.c $B/gpubench |
    grep -- '-o build/gpu-bundle/gpubench' | sed -E 's/ -o build\/gpu-bundle\/gpubench.*//')
LINK_TAIL=$(make --no-print-directory -n CUDA=1 BUILD=$B CUDA_ARCH="-gencode arch=compute_90,code=sm_90" -W bench/gpubench.c $B/gpubench |
    grep -- '-o build/gpu-bundle/gpubench' | sed -E 's/.*build\/gpu-bundle\/libiflow.a//')
mkdir -p .gpu/variants build/gpu-variants
for arg in "$@"; do
    name=${arg%%=*} flags=${arg#*=}
    o=build/gpu-variants/$name
    mkdir -p "$o"
    for f in attention matmul qtiled; do
        # shellcheck disable=SC2086
        $NVCC -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I. -Xcompiler -Wall,-Wno-unused-parameter,-fPIC \
            -Xptxas -warn-spills $flags -c kernels/cuda/$f.cu -o "$o/$f.o" 2>&1 | grep -v '^$' || true
    done
    # shellcheck disable=SC2086
    $CC_FLAGS -o "$o/gpubench" bench/gpubench.c "$o/attention.o" "$o/matmul.o" "$o/qtiled.o" $B/libiflow.a $LINK_TAIL
    strip -o .gpu/variants/gpubench-"$name" "$o/gpubench"
    for t in test_cuda_ops test_cuda_matmul test_cuda_tiled; do
        # shellcheck disable=SC2086
        $CC_FLAGS -o "$o/$t" tests/gpu/$t.c "$o/attention.o" "$o/matmul.o" "$o/qtiled.o" $B/libiflow.a $LINK_TAIL
        strip -o .gpu/variants/"$t-$name" "$o/$t"
    done
    # gzip: three programs a variant would take ~13 MB of the 64 MB a device call carries
    gzip -9f .gpu/variants/gpubench-"$name" .gpu/variants/test_cuda_ops-"$name" .gpu/variants/test_cuda_matmul-"$name" \
        .gpu/variants/test_cuda_tiled-"$name"
    echo "$name: $flags" >>.gpu/variants/list
    echo "gpu-variants: $name ($flags)" >&2
done
