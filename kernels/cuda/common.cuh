/*
 * common.cuh -- what the .cu files of kernels/cuda share: the device handle, error recording,
 * scratch buffers. Internal to kernels/cuda; the C contract is cuda_kernels.h.
 *
 * Error handling: every CUDA runtime call goes through IFKC_CK(call, "what"), every cuBLAS call
 * through IFKC_CKB(call, "what"), every launch is ifkc_launch checked by IFKC_CKL(launch,
 * "kernel name"). On failure they record "what: <CUDA error name>: <CUDA message>" with
 * ifkc_seterr() and return the mapped IFKC_E* code from the enclosing function.
 *
 * Overlapped launches (ifkc_set_overlap): with programmatic dependent launch (compute
 * capability 9.0 and up) a kernel may be started while the kernel before it in the stream is
 * still running, so that the gap between two kernels (about 2 us on an H200, a few times a
 * layer) is spent on the next kernel's set-up instead of nothing. The rule every kernel of
 * kernels/cuda keeps, so that any of them may be launched that way: each thread calls
 * ifkc_grid_begin() before it reads or writes global memory that an earlier kernel may write or
 * read, and before it returns (so that a grid never completes before the grid it depends on,
 * which keeps the order transitive). Before it a kernel may read only what no kernel it can
 * overlap writes (its arguments; the weights; a positional recording's step position, set
 * before the graph is launched), and may prefetch any memory into L2 (ifkc_prefetch_l2: L2 is
 * where the GPU's writes go, so a prefetched line is never stale, and nothing is loaded into
 * the SM): the decode products prefetch their weight rows, decoding attention its chunk of the
 * cache. The CPU emulation (tests/cuda-emu) checks the second half of the rule: a thread of an
 * overlapped launch that returns without ifkc_grid_begin() stops the test.
 */
#ifndef IFKC_COMMON_CUH
#define IFKC_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#include "kernels/cuda/cuda_kernels.h"

/* Scratch slots of a handle: each grows on demand and is reused by later calls. */
enum {
    IFKC_SCRATCH_W16 = 0,   /* dequantized / converted weight tiles for cuBLAS (F16 or BF16) */
    IFKC_SCRATCH_X16 = 1,   /* activations rounded to F16 / BF16 for cuBLAS                  */
    IFKC_SCRATCH_ATTN = 2,  /* partial softmax results of split decoding attention          */
    IFKC_SCRATCH_MISC = 3,  /* small results (argmax)                                         */
    IFKC_SCRATCH_XQ = 4,    /* activations rounded to int8 and their scales (tiles, IFKC_MV_DP4A) */
    IFKC_SCRATCH_N_
};

enum { IFKC_GRAPH_SLOTS = 4 }; /* positional graphs a handle keeps (ifkc_graph_begin_at) */

struct ifkc_dev {
    int            index;
    cudaStream_t   stream;
    int            cc;        /* compute capability, major * 10 + minor                         */
    int            overlap;   /* ifkc_set_overlap: launches with programmatic stream serialization */
    cublasHandle_t blas;
    int            sm_count;
    void          *scratch[IFKC_SCRATCH_N_];
    size_t         scratch_bytes[IFKC_SCRATCH_N_];
    /* Recording (ifkc_graph_*): the stream is being captured; the last instantiated graph. */
    int             recording;
    cudaGraphExec_t graph;
    ifkc_graph_stats gstats;
    /* Positional recording (ifkc_graph_begin_at): while pos_on, the operations that take the
     * step's position read it from pos_dev (device int) and decoding attention is launched for
     * up to pos_max positions. Each graph it makes goes to a slot of `at` under the caller's
     * key (a key's new recording replaces its graph; a new key the least recently used), so
     * that contexts taking turns on one device (a draft model's and its target's) keep theirs;
     * a slot is valid while no scratch buffer is replaced (scratch_gen == gen). scratch_want:
     * what a scratch buffer had to grow to during a recording, grown when it is dropped. */
    int            *pos_dev;
    int             pos_on, pos_max;
    unsigned long long pos_key;
    struct {
        cudaGraphExec_t exec;
        unsigned long long key;
        long gen, used;
        int max_pos;
    } at[IFKC_GRAPH_SLOTS];
    long            at_clock;
    long            scratch_gen;
    size_t          scratch_want[IFKC_SCRATCH_N_];
    int            *argmax_res;   /* [1] device: where ifkc_argmax_start left its result */
    /* Warp tiles (qtiled.cu). seq counts the work enqueued (launches, copies, cuBLAS calls);
     * tile_type is the base type of the tiles ifkc_tile_pack made here (-1: several; 0: none,
     * or ifkc_tile_norm turned it off); xq says which norm output the int8 rounding in
     * IFKC_SCRATCH_XQ is of, made by that norm's kernel at seq (valid while seq is unchanged). */
    unsigned long long seq;
    int             tile_type;
    struct {
        const float *src;
        int T, K, type;
        unsigned long long seq;
    } xq;
    cudaEvent_t     mark[IFKC_MARKS]; /* ifkc_mark's events, made on first use               */
};

/* Record a message (printf format) and return code. */
int ifkc_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Map a CUDA error to an IFKC code and record "what: name: message". */
int ifkc_cuda_err(cudaError_t e, const char *what);
int ifkc_blas_err(cublasStatus_t s, const char *what);
/* Libraries loaded on first use (cuBLAS: blas.cu, NCCL: nccl.cu). ifkc_dl_open: the file of
 * $env_var if set, else each of paths[0 .. n) in turn (the soname first); NULL with
 * "cannot load WHAT (paths[0]): <dlerror>" in why. ifkc_dl_sym: *slot = symbol `name`; 0 with
 * "cannot load WHAT: paths[0] has no NAME" in why when it is missing. */
void *ifkc_dl_open(const char *what, const char *env_var, const char *const *paths, int n, char *why, size_t cap);
int ifkc_dl_sym(void *lib, const char *what, const char *soname, const char *name, void **slot, char *why, size_t cap);
/* A scratch slot of at least nbytes (device memory, contents undefined). */
int ifkc_scratch(ifkc_dev *d, int slot, size_t nbytes, void **p);
/* Where an operation takes the step's position from: NULL (its argument) unless a positional
 * recording is on (ifkc_graph_begin_at). */
static inline const int *ifkc_pos_slot(const ifkc_dev *d) { return d->pos_on ? d->pos_dev : NULL; }

#define IFKC_CK(call, what)                                                                       \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess)                                                                    \
            return ifkc_cuda_err(e_, what);                                                       \
    } while (0)

#define IFKC_CKB(call, what)                                                                      \
    do {                                                                                          \
        cublasStatus_t s_ = (call);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return ifkc_blas_err(s_, what);                                                       \
    } while (0)

/* Launch kernel k on d's stream: k<<<grid, block, smem, d->stream>>>(args...), and with
 * d->overlap programmatic stream serialization (the kernel may start before the one before it
 * has finished; it waits for it in ifkc_grid_begin). A bad configuration is returned now (and
 * not left for a later cudaGetLastError); faults inside the kernel come with the next
 * synchronizing call (ifkc_download, ifkc_sync). */
template <typename... P, typename... A>
static inline cudaError_t ifkc_launch(ifkc_dev *d, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                      A &&...args)
{
    d->seq++;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid, c.blockDim = block, c.dynamicSmemBytes = smem, c.stream = d->stream;
    c.attrs = at, c.numAttrs = d->overlap ? 1u : 0u;
    cudaError_t e = cudaLaunchKernelEx(&c, k, std::forward<A>(args)...);
    if (e != cudaSuccess)
        (void)cudaGetLastError(); /* reported through e */
    return e;
}
#define IFKC_CKL(launch, name) IFKC_CK(launch, "launch of " name)

/* A kernel's first step (see "Overlapped launches" above): wait until the kernels before it in
 * the stream have finished and their writes are visible, then let the next kernel start
 * launching. Nothing on GPUs before compute capability 9.0, where launches never overlap. */
static __device__ __forceinline__ void ifkc_grid_begin(void)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/* Ask for the bytes [p, p + n) in L2, 128-byte lines spread over the `lanes` threads (this one
 * is `lane`); loads nothing into registers. On the host (the CPU emulation) lane 0 reads the
 * range's first and last byte instead, so that a range outside its buffer shows there. */
static __device__ __forceinline__ void ifkc_prefetch_l2(const void *p, size_t n, int lane, int lanes)
{
#if defined(__CUDA_ARCH__)
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)127);
    const char *end = (const char *)p + n;
    for (c += (size_t)lane * 128; c < end; c += (size_t)lanes * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c));
#else
    if (lane == 0 && n > 0)
        (void)(*(const volatile char *)p + *((const volatile char *)p + n - 1));
    (void)lanes;
#endif
}

/* RoPE pair i at position pos, as ifk_rope: the angle pos * theta^(-2i/rot_dim) (times fs[i]
 * when fs is not NULL) in double, its cosine and sine rounded to float, and the indices of the
 * pair in a head (interleaved: 2i, 2i+1; half: i, i + rot_dim/2). */
static __device__ __forceinline__ void ifkc_rope_pair(double pos, int i, int rot_dim, float theta, const float *fs,
                                                      int interleaved, float *c, float *s, int *ia, int *ib)
{
    double angle = pos * pow((double)theta, -2.0 * i / rot_dim);
    if (fs)
        angle *= fs[i];
    double sd, cd;
    sincos(angle, &sd, &cd);
    *c = (float)cd, *s = (float)sd;
    *ia = interleaved ? 2 * i : i;
    *ib = interleaved ? 2 * i + 1 : i + rot_dim / 2;
}

/* (x0, x1) rotated by (c, s), without FMA contraction (the CPU's rounding). */
static __device__ __forceinline__ void ifkc_rotate(float x0, float x1, float c, float s, float *y0, float *y1)
{
    *y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* A value stored into an F32 or F16 KV cache (F16: round to nearest even). */
static __device__ __forceinline__ void ifkc_kv_put(float *p, float x) { *p = x; }
static __device__ __forceinline__ void ifkc_kv_put(__half *p, float x) { *p = __float2half_rn(x); }

static inline unsigned ifkc_cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

#endif
