/*
 * device.h -- where the forward pass computes: a device owns memory and runs operations.
 *
 * Contract
 *   A device (iflow_device) is a vtable (iflow_device_ops) plus what it says of itself
 *   (iflow_device_info). Two backends exist: the CPU (libcore/device/cpu.c, over kernels/cpu)
 *   and CUDA (libcore/device/cuda.c, over kernels/cuda's C entry points). The engine
 *   (libcore/engine/model.c) is written once against the ops below and never asks which
 *   backend it runs on; which device runs which layer is data (iflow_placement in model.h), so
 *   a partition plan plugs in without a new code path.
 *
 *   Memory. Every pointer an op takes is memory of that device: from its alloc(), or weights
 *   placed on it with iflow_device_put(). A device whose memory is the host's (`host_memory`,
 *   the CPU) uses weights in place from the model's mapping, so putting them costs nothing;
 *   any other device copies them once. upload()/download() move bytes between the host and the
 *   device; download() waits for every operation enqueued before it, so operations may run
 *   asynchronously in between (CUDA enqueues them on one stream).
 *
 *   Operations have the contracts of the CPU kernels they are named after (kernels/cpu/
 *   kernels.h): matmul is ifk_matmul (weights of any iflow type; y = x W^T), rmsnorm runs over
 *   T contiguous rows, rope over T rows at positions pos0.., attention is ifk_attention over an
 *   F32 KV cache. Each returns 0 or a negative IFLOW_E* code with the message set (a CUDA
 *   failure names the CUDA call and error); CPU operations never fail.
 *
 *   Lifecycle: iflow_device_open() / iflow_device_close(). A device is used by one thread at a
 *   time; close it after everything placed on it (models, contexts) is closed.
 */
#ifndef IFLOW_DEVICE_H
#define IFLOW_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kvcache.h" /* ifk_kv_layout, ifk_kv_seq: the paged KV cache's layout */

enum { IFLOW_DEVICE_CPU = 0, IFLOW_DEVICE_CUDA = 1 };

typedef struct {
    int      kind;             /* IFLOW_DEVICE_CPU or IFLOW_DEVICE_CUDA                       */
    int      index;            /* cuda:N; 0 for the CPU                                       */
    char     name[16];         /* "cpu", "cuda:0"                                             */
    char     model[96];        /* "NVIDIA H100 80GB HBM3"; the CPU's brand string             */
    uint64_t mem_total;        /* bytes (the CPU: physical memory)                           */
    uint64_t mem_free;         /* bytes available when asked (the CPU: MemAvailable)          */
    int      units;            /* streaming multiprocessors; the CPU: cores                  */
    int      cc_major, cc_minor; /* CUDA compute capability; 0 for the CPU                   */
    double   mem_bw_peak;      /* bytes/s from clocks and bus width; 0 if unknown (the CPU)   */
    char     detail[64];       /* "kernels avx512gfni"; "driver 13.0, runtime 13.0"          */
} iflow_device_info;

typedef struct iflow_device iflow_device;

typedef struct {
    void (*close)(iflow_device *d);
    /* What the device says of itself now (free memory re-read). */
    int  (*query)(const iflow_device *d, iflow_device_info *info);
    int  (*alloc)(iflow_device *d, void **p, size_t nbytes);              /* zeroed memory */
    void (*free)(iflow_device *d, void *p);
    int  (*upload)(iflow_device *d, void *dst, const void *src, size_t nbytes);
    int  (*download)(iflow_device *d, void *dst, const void *src, size_t nbytes);
    /* 1 if matmul computes weights of this iflow dtype code. */
    int  (*supports)(const iflow_device *d, int wtype);
    /* y [T][N] at ldy = x [T][K] at ldx times W [N][K]^T. */
    int  (*matmul)(iflow_device *d, float *y, size_t ldy, const void *W, int wtype, const float *x,
                   size_t ldx, int T, int N, int K);
    /* y[t] = rmsnorm(x[t]) * w for T contiguous rows of n. */
    int  (*rmsnorm)(iflow_device *d, float *y, const float *x, const float *w, int T, int n, float eps);
    /* RoPE in place, T rows of n_heads*head_dim at stride ld, positions pos0..; freq_scale
     * [rot_dim/2] on this device or NULL. */
    int  (*rope)(iflow_device *d, float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim,
                 int pos0, float theta, const float *freq_scale, int layout);
    /* ifk_attention: out, q [T][n_heads*head_dim]; k, v F32 cache rows at stride kv_ld. */
    int  (*attention)(iflow_device *d, float *out, const float *q, const float *k, const float *v,
                      size_t kv_ld, int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale);
    int  (*silu_mul)(iflow_device *d, float *g, const float *u, size_t n);   /* g = silu(g) * u; u NULL: silu(g) */
    int  (*add)(iflow_device *d, float *y, const float *x, size_t n);        /* y += x          */
    /* y[t][i] += b[i], T rows of n at stride ldy. */
    int  (*add_bias)(iflow_device *d, float *y, size_t ldy, const float *b, int T, int n);
    /* *out (host) = index of the largest of x[0..n), the lowest among equals. */
    int  (*argmax)(iflow_device *d, int32_t *out, const float *x, int n);
    /* The paged KV cache (kernels/cpu/kvcache.h; pools in this device's memory, block tables
     * and the sequence list in host memory): ifk_kv_store and ifk_attention_paged. A backend
     * may support a subset (a layout type, one block per sequence) and refuse the rest with
     * IFLOW_EUNSUPPORTED. */
    int  (*kv_store)(iflow_device *d, void *pool, const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs,
                     const float *x, size_t ldx);
    int  (*attention_paged)(iflow_device *d, float *out, const float *q, size_t ld, const void *k, const void *v,
                            const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads, float scale);
    /* ifk_kv_shift (context shift: drop positions, rotate the keys after them back); NULL:
     * the backend cannot (the engine says so with IFLOW_EUNSUPPORTED). */
    int  (*kv_shift)(iflow_device *d, void *k, void *v, const ifk_kv_layout *L, const int32_t *table, int n_past,
                     int keep, int discard, const ifk_rope_params *rp);
    /* g = gelu(g) * u, or gelu(g) when u is NULL (ifk_gelu_mul): GELU's tanh form, or its exact
     * (erf) form when `exact`; NULL: the backend has none (the engine says so). */
    int  (*gelu_mul)(iflow_device *d, float *g, const float *u, size_t n, int exact);
    /* y[t] = layernorm(x[t]) * w + b for T contiguous rows of n (ifk_layernorm); NULL: none. */
    int  (*layernorm)(iflow_device *d, float *y, const float *x, const float *w, const float *b, int T, int n, float eps);
    /* A copy of the host matrix W [N][K] of wtype in a layout of this device's own that its
     * matmul reads faster: *out (this device's memory, freed with its free op) and *out_type,
     * its type code for matmul. *out = NULL: W is computed as it is. NULL op: never. (The CPU
     * packs Q4 and Q8 matrices into 16-row tiles for the int8 product: kernels/cpu/qpack.h.) */
    int  (*pack)(iflow_device *d, void **out, int *out_type, const void *W, int wtype, int N, int K);
    /* An encoder-decoder's attention (cross-attention over a source, T5's relative position
     * bias): T query rows of q (stride ld) over S rows of F32 keys and values (stride kv_ld),
     * grouped-query as ifk_attention; query t sees keys 0 .. S - 1, or with causal0 >= 0 keys
     * 0 .. causal0 + t; bias [n_heads][T][S] (or NULL) is added to the scaled scores; out [T]
     * at stride ld. NULL op: the backend has none (the engine says so). */
    int  (*attention_bias)(iflow_device *d, float *out, const float *q, size_t ld, const float *k, const float *v,
                           size_t kv_ld, int T, int S, int causal0, int n_heads, int n_kv_heads, int head_dim,
                           float scale, const float *bias);
    /* g = max(g, 0) * u, or max(g, 0) when u is NULL (T5's ReLU FFN); NULL: none. */
    int  (*relu_mul)(iflow_device *d, float *g, const float *u, size_t n);
    /* Recording a step (CUDA graphs; NULL on a backend that runs each op as it comes).
     * Between record_begin and record_end the ops are recorded, not run; record_end runs them
     * all at once (a recording like the last one reuses its set-up: far cheaper than the ops
     * one by one). While recording, an op that must wait for the device (a download, a
     * scratch buffer that grows) fails; the caller then calls record_abort, which drops the
     * recording (nothing of it runs), and does the step op by op. */
    int  (*record_begin)(iflow_device *d);
    int  (*record_end)(iflow_device *d);
    void (*record_abort)(iflow_device *d);
    /* A step recorded once and run again (NULL: none). record_at begins a recording (ended by
     * record_end, dropped by record_abort) in which the ops that take the step's position
     * (rope, kv_store, rope_store, and attention_paged of one token) read it on the device,
     * where replay sets it: replay(d, pos0, key) runs the last such recording under key again
     * at position pos0 without recording it (0), or returns 1, running nothing, when it cannot
     * (none kept under this key: CUDA keeps the four keys used last; a buffer it used replaced;
     * pos0 >= max_pos): then record again. The results are those of the ops run one by one at
     * that position. key: the caller's name for everything else the recording depends on
     * (buffers, shapes). */
    int  (*record_at)(iflow_device *d, int pos0, int max_pos, uint64_t key);
    int  (*replay)(iflow_device *d, int pos0, uint64_t key);
    /* Fused ops (NULL: the engine runs the ops they stand for; the same values; the CUDA
     * device leaves them out when IFLOW_CUDA_UNFUSED=1 is in the environment, so that what
     * they save can be measured):
     * add_rmsnorm: x += y, then y = rmsnorm(x) * w, for T contiguous rows of n (the residual add
     * of a block's output in y, and the next block's normed input into y). */
    int  (*add_rmsnorm)(iflow_device *d, float *x, float *y, const float *w, int T, int n, float eps);
    /* rope_store: rope of q (nq heads, stride ldq) and of k (the layout's kv heads), then
     * kv_store of k and v (stride ldkv), for the one sequence seq. */
    int  (*rope_store)(iflow_device *d, float *q, size_t ldq, int nq, float *k, const float *v, size_t ldkv,
                       void *kpool, void *vpool, const ifk_kv_layout *L, const ifk_kv_seq *seq,
                       const ifk_rope_params *rp);
    /* glu: the gated FFN's hidden rows, gate = silu(x Wg^T) * (x Wu^T), Wg and Wu [N][K] of
     * wtype, x [T][K] at ldx, gate [T][N] at ld; up (the same shape) may be used as scratch. */
    int  (*glu)(iflow_device *d, float *gate, float *up, size_t ld, const void *Wg, const void *Wu, int wtype,
                const float *x, size_t ldx, int T, int N, int K);
    /* qkv: the three matmuls of the attention's input, q = x Wq^T [T][Nq] (ldq), k = x Wk^T and
     * v = x Wv^T [T][Nkv] (ldkv), the weights of one wtype. */
    int  (*qkv)(iflow_device *d, float *q, size_t ldq, float *k, float *v, size_t ldkv, const void *Wq, const void *Wk,
                const void *Wv, int wtype, const float *x, size_t ldx, int T, int Nq, int Nkv, int K);
    /* lowrank_up: y [T][N] at ldy += t [T][r] at ldt times b [N][r]^T (F16 in the column tiles
     * bt of kernels.h's ifk_lowrank_up), the up-projection of a low-rank delta (a LoRA adapter's
     * b (a x)). NULL: the device computes no run-time adapter (the engine refuses to place one
     * there). */
    int  (*lowrank_up)(iflow_device *d, float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T,
                       int N, int r);
} iflow_device_ops;

struct iflow_device {
    const iflow_device_ops *ops;
    iflow_device_info info;
    int   host_memory;   /* device memory is host memory: weights are used in place */
    int   n_threads;     /* CPU: threads per operation (<= 0: all cores)           */
    void *impl;          /* the backend's own state                                 */
};

/* Open a device by name: "cpu", "cuda" (= cuda:0) or "cuda:N". n_threads is the CPU's thread
 * count (<= 0: all cores). A CUDA device in a build without CUDA, or on a machine without a
 * driver or GPU, is IFLOW_EUNSUPPORTED or IFLOW_ENOTFOUND with the reason in the message. */
int  iflow_device_open(iflow_device **out, const char *name, int n_threads);
void iflow_device_close(iflow_device *d);

/* "auto": cuda:0 when one can be opened, else the CPU. *fallback (may be NULL) receives why
 * the CPU was chosen (a static or thread-local string; "" when a GPU was opened). */
int  iflow_device_open_auto(iflow_device **out, int n_threads, const char **fallback);

/* Every device this process can use: the CPU first, then cuda:0.. . *n receives the count
 * (at most cap are written). Never fails because there is no GPU; iflow_device_cuda_status()
 * then says why there is none. */
int  iflow_device_list(iflow_device_info *out, int cap, int *n);
/* What d says of itself now (its query op; d NULL: the CPU). */
int  iflow_device_query(const iflow_device *d, iflow_device_info *info);

/* "cuda 13.0 runtime, 1 device"; or why CUDA is unavailable ("this build has no CUDA (built
 * with CUDA=0)", "no CUDA driver ...", "no CUDA-capable device"). Thread-local string. */
const char *iflow_device_cuda_status(void);

/* How the device's recordings went: steps run as one graph, how many of those needed a new
 * graph rather than an update of the last, recordings dropped, and of the steps run, those
 * that ran a positional recording again (replay). All 0 on a device that does not record. */
typedef struct {
    long launches, instantiations, aborts, replays;
} iflow_graph_stats;
void iflow_device_graph_stats(const iflow_device *d, iflow_graph_stats *st);

/* Make n bytes of host data available on d: *out = host itself on a host-memory device (or d
 * NULL, the host), else a new device copy (free it with iflow_device_unput). */
int  iflow_device_put(iflow_device *d, const void **out, const void *host, size_t n);
void iflow_device_unput(iflow_device *d, const void *p);

/* The device's own layout of a host matrix W [N][K] of wtype (its pack op; d NULL: the host
 * CPU, which runs the layers of a model placed on the host): *out a copy in d's memory and
 * *out_type its type code for matmul, or *out = NULL when d computes W as it is. Free the copy
 * with iflow_device_unpack. */
int  iflow_device_pack(iflow_device *d, void **out, int *out_type, const void *W, int wtype, int N, int K);
void iflow_device_unpack(iflow_device *d, void *p);

/* Copy n bytes from src on device a to dst on device b (through the host where neither is the
 * host; stage is a host buffer of at least n bytes for that case). */
int  iflow_device_transfer(iflow_device *b, void *dst, iflow_device *a, const void *src, size_t n, void *stage);

/* Bytes as "1.5 GiB", "12.0 MiB", "512 bytes" into buf. Returns buf. */
const char *iflow_bytes_str(char *buf, size_t n, uint64_t bytes);

#endif
