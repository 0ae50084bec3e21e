/*
 * cuda_kernels.h -- iflow's CUDA kernels behind C entry points (the .cu files of kernels/cuda).
 *
 * Contract
 *   Like kernels/cpu, these know nothing of models, files or options: device pointers, shapes,
 *   strides. Unlike the CPU kernels they can fail (no driver, no device, out of memory, a
 *   launch error), so every entry point returns 0 or a negative IFKC_E* code and records a
 *   one-line message, read with ifkc_errmsg() (thread-local, lowercase, naming the CUDA call
 *   and the CUDA error: "cudaMalloc of 4.0 GiB on cuda:0: out of memory"). Nothing prints,
 *   nothing exits. Every CUDA runtime and cuBLAS call is checked.
 *
 *   A device handle (ifkc_dev) owns one GPU's stream, its cuBLAS handle and the scratch buffers
 *   the kernels need (dequantized weight tiles for cuBLAS, F16 copies of activations, the
 *   partial results of split attention); the caller owns everything else. Operations are
 *   enqueued on the handle's stream in call order; ifkc_download() and ifkc_sync() wait for
 *   them. A handle is used by one host thread at a time.
 *
 *   Element types: activations are F32. Weights are any iflow type, with the codes of
 *   kernels/cpu/kernels.h (IFK_F32/F16/BF16) and kernels/cpu/quant.h (IFK_Q8_B32 .. IFK_Q2_B32),
 *   in the byte layouts those headers define, read in place (a quantized matrix is never
 *   expanded in device memory; prefill dequantizes a tile at a time into scratch). A weight
 *   matrix W is [N][K] row-major (a row is ifk_qrow_bytes(type, K) bytes for quantized types),
 *   and y = x W^T, as on the CPU. KV caches are F32 or F16 (IFK_F32, IFK_F16).
 *
 *   Each kernel has a CPU reference it is tested against (tests/gpu/test_cuda_*.c, make check-gpu):
 *   ifk_matmul / ifk_qmatmul_ref, ifk_attention, ifk_rmsnorm, ifk_rope, ifk_silu_mul, ifk_add.
 *
 *   Built by nvcc when the Makefile finds it (CUDA=1, the default then); `make CUDA=0` leaves
 *   this directory out and libcore reports that the build has no CUDA.
 */
#ifndef IFKC_CUDA_KERNELS_H
#define IFKC_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    IFKC_OK = 0,
    IFKC_ENODEV = -1,      /* no CUDA driver, no device, or a device index out of range */
    IFKC_ENOMEM = -2,      /* device (or pinned host) memory exhausted                  */
    IFKC_ECUDA = -3,       /* any other CUDA runtime or cuBLAS failure                   */
    IFKC_EUNSUPPORTED = -4,/* a weight type, KV type or head_dim these kernels lack      */
    IFKC_EINVAL = -5       /* a bad argument (negative size, NULL pointer)               */
};

/* The message of the last failure on this thread ("" if none). */
const char *ifkc_errmsg(void);

/* ---- devices ------------------------------------------------------------------------------ */

/* Number of CUDA devices. With no driver or no GPU this is IFKC_ENODEV with a message saying
 * which ("no CUDA driver (libcuda.so not found)", "no CUDA-capable device"), never a crash. */
int ifkc_device_count(int *n);

typedef struct {
    char     name[96];        /* "NVIDIA H100 80GB HBM3"                          */
    uint64_t mem_total;       /* bytes                                             */
    uint64_t mem_free;        /* bytes, at the time of the call                    */
    int      cc_major, cc_minor;
    int      sm_count;
    double   mem_bw_peak;     /* bytes/s from the memory clock and bus width (0 if unknown) */
    int      runtime_version; /* cudaRuntimeGetVersion, e.g. 13000                 */
    int      driver_version;  /* cudaDriverGetVersion                              */
} ifkc_device_info;

int ifkc_device_info_get(int index, ifkc_device_info *out);

typedef struct ifkc_dev ifkc_dev;

/* Open device `index`: a stream and a cuBLAS handle. */
int  ifkc_open(ifkc_dev **out, int index);
void ifkc_close(ifkc_dev *d);
/* Overlapped launches (programmatic dependent launch; off when opened): each kernel may be
 * started while the kernel before it in the stream finishes, waiting for it on the device, and
 * the decode products fetch their weight rows into L2 before that wait. It hides the gap
 * between kernels that a decode step has a few times a layer; results are the same bits. Only
 * on compute capability 9.0 and up (elsewhere it stays off). Applies to what is launched or
 * recorded after the call (recorded steps are dropped when it changes). Returns whether it is
 * on. */
int  ifkc_set_overlap(ifkc_dev *d, int on);

/* Device memory. ifkc_malloc'd memory is not zeroed (ifkc_memset0 does that). */
int  ifkc_malloc(ifkc_dev *d, void **p, size_t nbytes);
void ifkc_free(ifkc_dev *d, void *p);
int  ifkc_memset0(ifkc_dev *d, void *p, size_t nbytes);
/* Host -> device; the host buffer may be reused when this returns. */
int  ifkc_upload(ifkc_dev *d, void *dst, const void *src, size_t nbytes);
/* Device -> host; waits for everything enqueued before it. */
int  ifkc_download(ifkc_dev *d, void *dst, const void *src, size_t nbytes);
/* Device -> device on the same device. */
int  ifkc_copy(ifkc_dev *d, void *dst, const void *src, size_t nbytes);
/* Make d's GPU the calling thread's current device. The operations below assume it is (one
 * thread driving several GPUs calls this before each one's work). */
int  ifkc_make_current(ifkc_dev *d);
/* Wait for every enqueued operation; reports an asynchronous kernel fault. */
int  ifkc_sync(ifkc_dev *d);

/* Timing on the device's own clock (CUDA events), for benchmarks: ifkc_mark enqueues mark
 * `slot` (0 <= slot < IFKC_MARKS) after what is enqueued before it; ifkc_marks_ms waits for
 * mark b and gives the device time between marks a and b in milliseconds. */
#define IFKC_MARKS 4
int  ifkc_mark(ifkc_dev *d, int slot);
int  ifkc_marks_ms(ifkc_dev *d, int a, int b, float *ms);

/* Recording (CUDA graphs): between ifkc_graph_begin and ifkc_graph_end the operations on d are
 * recorded, not run; ifkc_graph_end then runs them all with one launch. A recording with the
 * same operations in the same order as the last one (arguments may differ: positions, lengths,
 * grid sizes) updates the last instantiated graph in place, which costs far less than
 * instantiating a new one. Nothing recorded may wait for the device: ifkc_download, ifkc_sync
 * and a scratch buffer that has to grow fail while recording (IFKC_EUNSUPPORTED); the caller
 * then calls ifkc_graph_abort (nothing recorded runs) and does the work without recording. */
typedef struct {
    long launches;        /* graphs run                                          */
    long instantiations;  /* of which needed a new instantiation (not an update) */
    long aborts;          /* recordings dropped                                  */
    long replays;         /* of the launches, positional graphs run again (ifkc_graph_replay) */
} ifkc_graph_stats;
int  ifkc_graph_begin(ifkc_dev *d);
int  ifkc_graph_end(ifkc_dev *d);
void ifkc_graph_abort(ifkc_dev *d);
/* Positional recording: as ifkc_graph_begin, but the operations that take the step's position
 * (ifkc_rope, ifkc_kv_store, ifkc_rope_store, and ifkc_attention with T = 1) read it on the
 * device, from a slot set to pos0 now and by each ifkc_graph_replay, so that the graph can run
 * again at the next position without being recorded again; their own position arguments must
 * be pos0. Decoding attention is launched for up to max_pos positions (blocks past the step's
 * keys return at once), so its chunks, and so its results, are those of a call made op by op
 * at the same position. Everything else in the recording must not depend on the position.
 * key: the caller's name for what the graph computes (its buffers, its shapes).
 * ifkc_graph_replay: runs the graph last recorded under key again at position pos0 and returns
 * 0; returns 1, running nothing, when there is none to run: none under this key (a handle keeps
 * the graphs of its four most recently used keys, so contexts taking turns keep theirs), a
 * scratch buffer it uses was replaced since, or pos0 >= its max_pos; then record again. A
 * dropped recording grows the scratch it lacked, so the next one finds it. */
int  ifkc_graph_begin_at(ifkc_dev *d, int pos0, int max_pos, unsigned long long key);
int  ifkc_graph_replay(ifkc_dev *d, int pos0, unsigned long long key);
void ifkc_graph_stats_get(const ifkc_dev *d, ifkc_graph_stats *out);

/* ---- collectives between GPUs (kernels/cuda/nccl.cu) ----------------------------------------- */

/* NCCL, dlopen()ed on first use as cuBLAS is (libnccl.so.2 on the loader's path, then the CUDA
 * toolkit's lib and lib64; IFLOW_NCCL: a path). A communicator is one rank of `size`, on one GPU
 * (d, whose stream it uses); every rank calls the same operations in the same order. A buffer
 * in d's memory is used in place (the operation is enqueued on d's stream, after the kernels
 * before it); a host buffer is staged through device memory, and the call returns with its
 * result on the host.
 * Without the library: IFKC_ENODEV, "cannot load NCCL (libnccl.so.2): ...". */
#define IFKC_NCCL_ID_BYTES 128
typedef struct ifkc_nccl ifkc_nccl;
/* 0 when NCCL loads (else IFKC_ENODEV with the reason). */
int  ifkc_nccl_available(void);
/* A new unique id (rank 0 makes it; every rank passes it to ifkc_nccl_open). */
int  ifkc_nccl_id(void *id);
int  ifkc_nccl_open(ifkc_nccl **out, ifkc_dev *d, int rank, int size, const void *id);
void ifkc_nccl_close(ifkc_nccl *c);
int  ifkc_nccl_bcast(ifkc_nccl *c, void *buf, size_t bytes, int root);
int  ifkc_nccl_allreduce_sum(ifkc_nccl *c, float *buf, size_t n);   /* buf [n] = the sum over ranks */
int  ifkc_nccl_send(ifkc_nccl *c, const void *buf, size_t bytes, int peer);
int  ifkc_nccl_recv(ifkc_nccl *c, void *buf, size_t bytes, int peer);

/* ---- matrix products (kernels/cuda/matmul.cu) ------------------------------------------------ */

/* 1 if ifkc_matmul computes weights of this type. */
int ifkc_supports_wtype(int wtype);

/* y[t][n] = sum_k W[n][k] * x[t][k] for 0 <= t < T, 0 <= n < N; x [T][K] at stride ldx, y [T][N]
 * at stride ldy (elements), all on the device.
 * T <= IFKC_MATVEC_MAX_T: the decode kernels, which read W once in place for all T rows and
 * accumulate in F32 (quantized blocks as min * sum(x) + delta * sum(q * x), the padding of a
 * row's last block skipped). T larger: cuBLAS, F32 weights with SGEMM, F16 and BF16 weights
 * with tensor cores (x rounded once to the weight's 16-bit type, F32 accumulation), quantized
 * weights dequantized to F16 a tile of rows at a time into the handle's scratch. */
#define IFKC_MATVEC_MAX_T 8
/* 1 when the decode kernels round x to int8 for weights of this type (a build with
 * IFKC_MV_DP4A=1: blocks of 32 values, scale max |x| / 127), which costs an output at most
 * sum_k |w_k| max|x|_block(k) / 254 beside the float error; 0 otherwise. */
int ifkc_matvec_int8_x(int wtype);

int ifkc_matmul(ifkc_dev *d, float *y, size_t ldy, const void *W, int wtype, const float *x,
                size_t ldx, int T, int N, int K);

/* Warp tiles (qtiled.cu, layout in qtile.cuh): a copy of a host Q4_B32, Q4_B64, Q8_B32 or Q8_B64
 * matrix W [N][K] (the file's layout) in device memory (*out, freed with ifkc_free) whose decode
 * products read 16 level bytes a lane and compute on int8 activations, rounded as the CPU's
 * int8 products round them (kernels/cpu/qimpl.h: per-group scales, the residual's correction,
 * the outliers taken out), so that they cost an output what they cost it on the CPU. Its type
 * code *out_type = IFKC_TILED + wtype goes to ifkc_matmul, ifkc_matmul_glu and
 * ifkc_matmul_qkv in place of wtype. The copy has the same size as W; a matrix that cannot be
 * tiled (another type, or rows that are not whole 16-byte units: ceil(K / B) not a multiple
 * of 4) gets *out = NULL, *out_type = wtype, and 0. */
#define IFKC_TILED 128
int ifkc_tile_pack(ifkc_dev *d, void **out, int *out_type, const void *W, int wtype, int N, int K);
/* Once ifkc_tile_pack has made tiles of one type on d, ifkc_rmsnorm and ifkc_add_rmsnorm of up to
 * IFKC_MATVEC_MAX_T rows of 513 to 8192 values also round their output to int8 for that type in
 * the same launch, and a tiled product reading that output next skips its own rounding (the
 * same values). ifkc_tile_norm sets the type they round for (0: none; tests, measurements). */
int ifkc_tile_norm(ifkc_dev *d, int type);

/* The gated FFN's hidden layer: y[t][n] = silu(x[t] . Wg[n]) * (x[t] . Wu[n]), the values of
 * ifkc_matmul with Wg into y, with Wu into u, then ifkc_silu_mul. Up to IFKC_MATVEC_MAX_T
 * tokens (16-byte aligned rows) it is one kernel, a warp computing the gate and up rows of one
 * output; otherwise the three operations, with u [T][ldy] as the up projection's output. */
int ifkc_matmul_glu(ifkc_dev *d, float *y, float *u, size_t ldy, const void *Wg, const void *Wu, int wtype,
                    const float *x, size_t ldx, int T, int N, int K);

/* The attention's three input projections in one launch: yq = x Wq^T ([T][Nq] at ldq), yk =
 * x Wk^T and yv = x Wv^T ([T][Nkv] at ldkv), all of wtype: the values of three ifkc_matmul
 * calls, which it makes instead when T, the rows or the alignment do not allow one launch. */
int ifkc_matmul_qkv(ifkc_dev *d, float *yq, size_t ldq, float *yk, float *yv, size_t ldkv, const void *Wq,
                    const void *Wk, const void *Wv, int wtype, const float *x, size_t ldx, int T, int Nq, int Nkv,
                    int K);

/* ---- attention (kernels/cuda/attention.cu) --------------------------------------------------- */

/* Causal grouped-query attention, the contract of ifk_attention (kernels/cpu/kernels.h):
 *   q [T][n_heads*head_dim] F32, query t at position pos0 + t; out likewise;
 *   k, v [n_ctx][n_kv_heads*head_dim] of kv_type (IFK_F32 or IFK_F16), row stride kv_ld
 *   elements; rows 0 .. pos0+T-1 valid. Query head h reads kv head h / (n_heads/n_kv_heads).
 * head_dim: 8, 16, 32, 64, 80, 96, 128 or 256 (others: IFKC_EUNSUPPORTED).
 * T == 1 runs the decoding kernel: the context is split into chunks, each block computes a
 * partial softmax (running max, sum, weighted V) for its chunk and all query heads of one KV
 * head, and a second kernel merges the partials (flash-decoding). T > 1 runs the prefill
 * kernel: query tiles against K/V tiles with an online softmax, so memory stays linear in the
 * context. Both are also callable alone. */
int ifkc_attention(ifkc_dev *d, float *out, const float *q, const void *k, const void *v,
                   int kv_type, size_t kv_ld, int T, int pos0, int n_heads, int n_kv_heads,
                   int head_dim, float scale);
int ifkc_attention_decode(ifkc_dev *d, float *out, const float *q, const void *k, const void *v,
                          int kv_type, size_t kv_ld, int n_pos, int n_heads, int n_kv_heads,
                          int head_dim, float scale);
int ifkc_attention_prefill(ifkc_dev *d, float *out, const float *q, const void *k, const void *v,
                           int kv_type, size_t kv_ld, int T, int pos0, int n_heads,
                           int n_kv_heads, int head_dim, float scale);
/* 1 when prefill of T tokens over a cache of kv_type and head_dim runs on tensor cores in this
 * build (kernels/cuda/attention.cu built with IFKC_PF_TC=1; F16 caches with 16-byte aligned
 * rows, head_dim 64, 80, 96 or 128, T >= 16): Q and P are then rounded to F16, and results are
 * within a few 1e-3 of the F32 kernel's rather than 1e-6. */
int ifkc_attention_prefill_tensor_cores(int kv_type, int head_dim, int T);
/* 1 when decoding attention over a cache of kv_type and head_dim with groups of `group` query
 * heads runs on tensor cores in this build (IFKC_DEC_TC=1; F16 caches, head_dim 64, 80, 96 or
 * 128, groups of 2 to 16): Q and the probabilities are then rounded to F16. */
int ifkc_attention_decode_tensor_cores(int kv_type, int head_dim, int group);

/* Store T rows of n F32 values (src, stride ld_src) into cache rows pos0.. of kv_type (F32 or
 * F16, round-to-nearest-even), stride ld_dst. */
int ifkc_kv_store(ifkc_dev *d, void *cache, int kv_type, size_t ld_dst, int pos0,
                  const float *src, size_t ld_src, int T, int n);

/* Context shift of one contiguous cache (kernels/cpu/kvcache.h's ifk_kv_shift): rows
 * keep + discard .. n_past - 1 of k and v (kv_type F32 or F16, n_kv_heads * head_dim values a
 * row, stride ld) move down by discard; the keys are rotated as ifk_rope at position -discard
 * (freq_scale: device array or NULL). Rows move in launches of `discard` rows, so sources are
 * read before they are overwritten. */
int ifkc_kv_shift(ifkc_dev *d, void *k, void *v, int kv_type, size_t ld, int n_kv_heads, int head_dim, int rot_dim,
                  int n_past, int keep, int discard, float theta, const float *freq_scale, int layout);

/* ---- element-wise and per-token operations (kernels/cuda/ops.cu) ----------------------------- */

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for T rows of n (contiguous rows). y may equal x. */
int ifkc_rmsnorm(ifkc_dev *d, float *y, const float *x, const float *w, int T, int n, float eps);
/* x[t] += r[t] (stored), then y[t] = rmsnorm(x[t]) * w: the residual add and the next norm in
 * one launch, the values of ifkc_add then ifkc_rmsnorm. y may equal r, not x. (Rows past 8192
 * values take two launches.) */
int ifkc_add_rmsnorm(ifkc_dev *d, float *x, float *y, const float *w, int T, int n, float eps);
/* RoPE in place on T tokens (row stride ld elements) at positions pos0..pos0+T-1; the rest as
 * ifk_rope (freq_scale: device array [rot_dim/2] or NULL; layout IFK_ROPE_HALF/INTERLEAVED).
 * Angles are computed in double from pos and the frequency, as the CPU reference does. */
int ifkc_rope(ifkc_dev *d, float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim,
              int pos0, float theta, const float *freq_scale, int layout);
/* A step's new keys and values: ifkc_rope on q (nq heads, stride ldq) and on k (nkv heads,
 * stride ldkv), then ifkc_kv_store of k's and v's rows (stride ldkv) into kcache and vcache
 * (kv_type, stride ldc) at rows pos0.., in one launch: the same values. */
int ifkc_rope_store(ifkc_dev *d, float *q, size_t ldq, int nq, float *k, const float *v, size_t ldkv, int nkv,
                    void *kcache, void *vcache, int kv_type, size_t ldc, int T, int head_dim, int rot_dim,
                    int pos0, float theta, const float *freq_scale, int layout);
/* g[i] = silu(g[i]) * u[i] for i < n. */
int ifkc_silu_mul(ifkc_dev *d, float *g, const float *u, size_t n);
/* y[i] += x[i] for i < n. */
int ifkc_add(ifkc_dev *d, float *y, const float *x, size_t n);
/* y[t][i] += b[i] for T rows of n at stride ldy. */
int ifkc_add_bias(ifkc_dev *d, float *y, size_t ldy, const float *b, int T, int n);
/* The index of the largest of x[0..n) (the lowest index among equals), copied to the host. */
int ifkc_argmax(ifkc_dev *d, int32_t *out, const float *x, int n);
/* The same in two halves, so that the first can be recorded: ifkc_argmax_start enqueues it and
 * keeps the result on the device; ifkc_argmax_fetch waits for it and copies it to *out. */
int ifkc_argmax_start(ifkc_dev *d, const float *x, int n);
int ifkc_argmax_fetch(ifkc_dev *d, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif
