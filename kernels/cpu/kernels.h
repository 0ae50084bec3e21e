/*
 * kernels.h -- iflow's CPU compute kernels.
 *
 * Contract
 *   Kernels know nothing of models, files or options: they take pointers, shapes, strides and a
 *   thread count, and they never allocate on the caller's behalf (scratch they need is on the
 *   stack or in per-thread or pool buffers they own), never print, never fail. Activations are
 *   F32; weights may be F32, F16 or BF16 (IFK_* codes, equal to libcore's IFLOW_DT_* codes).
 *   Matrices are row-major. A weight matrix W of shape [N][K] (N output rows, K inputs) is the
 *   layout of a PyTorch nn.Linear weight, so y = x W^T.
 *
 *   Each kernel has a scalar reference (kernels/cpu/ref.c) and SIMD paths (AVX2+F16C+FMA,
 *   AVX-512F+BW+VL+DQ; and for the quantized product also AVX512_VNNI, and GFNI; for F16 and
 *   BF16 weights AVX512_BF16) chosen once at run time from cpuid; ifk_set_isa() forces a path
 *   (tests use it to compare each SIMD path against the reference). Results of SIMD paths
 *   differ from the reference only by float summation order, except where a product rounds
 *   its activations: F16 / BF16 weights on the BF16 dot product (ifk_bf16_dot below) and the
 *   quantized product (quant.h); ifk_set_qx_f32(1) turns both roundings off.
 *
 *   Batch invariance: on every path, row t of a matrix product (ifk_matmul, ifk_qmatmul)
 *   depends only on W and x[t], bit for bit: not on T, not on the row's place in the batch,
 *   not on n_threads (decode, T == 1, and prefill, T > 1, sum each output in the same order).
 *   Likewise the output of an attention query depends only on the query, its position and the
 *   cache rows it sees. So a request gives the same tokens alone or in any batch
 *   (tests/unit/test_invariance.c checks every path and weight type). Results may differ
 *   between paths (ifk_set_isa).
 *
 *   Threads: kernels taking n_threads deal their work out in items (ranges of output rows,
 *   blocks of attention queries) on the persistent pool of pool.h, to at most that many
 *   threads; n_threads <= 0 means all cores. A thread that calls ifk_pool_set_take_back(1)
 *   (the CPU device does) lets its products take back an item a preempted worker holds, so
 *   another process on a core slows them by no more than that core's share; it then frees
 *   the weights it multiplies by only after ifk_pool_quiesce().
 */
#ifndef IFK_KERNELS_H
#define IFK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum { IFK_F32 = 0, IFK_F16 = 1, IFK_BF16 = 2 };

/* Paths, each a superset of the one before. IFK_ISA_AVX512GFNI is AVX-512 with AVX512_VNNI and
 * GFNI (Ice Lake, Zen 4 and later): only the quantized product uses the extra instructions
 * (Q3H's unpacking, qmatmul_avx512.c; with AVX512_VBMI, the packed layouts of every type,
 * qpack_avx512.c); every other kernel runs its AVX-512 code. IFK_ISA_AMX is that with AVX512_BF16
 * and AMX tiles (AMX-TILE, AMX-BF16, AMX-INT8: Sapphire Rapids and later, where the OS grants the
 * tile state): packed F16 / BF16 products multiply on tiles (fpack_amx.c); everything else runs
 * as on avx512gfni. */
enum { IFK_ISA_AUTO = -1, IFK_ISA_SCALAR = 0, IFK_ISA_AVX2 = 1, IFK_ISA_AVX512 = 2, IFK_ISA_AVX512GFNI = 3,
       IFK_ISA_AMX = 4 };

/* Best ISA this CPU supports. */
int ifk_isa_detect(void);
/* Force a path (IFK_ISA_AUTO restores the detected one). Returns the path now in use; a path
 * the CPU lacks is refused and the current one kept. Not thread-safe: call before computing. */
int ifk_set_isa(int isa);
/* "scalar", "avx2", "avx512", "avx512gfni", "amx". */
const char *ifk_isa_name(int isa);
/* The path of that name (ifk_isa_name's), or -2 for a name no path has. */
int ifk_isa_by_name(const char *name);
int ifk_isa_current(void);

/* Matrix product with a weight matrix:
 *   y[t][n] = sum_k W[n][k] * x[t][k]      for 0 <= t < T, 0 <= n < N
 * W:  [N][K] of type wtype, rows contiguous (row n starts at W + n*K elements); or a packed
 *     copy of a quantized, F16 or BF16 matrix (qpack.h), wtype its packed code.
 * x:  [T][K] F32, row t at x + t*ldx.     y: [T][N] F32, row t at y + t*ldy.
 * T == 1 is the decode matrix-vector product; T > 1 (prefill) reads each weight row once for
 * all T tokens. Threads split N. Row t of y is bit-identical to a call with x[t] alone (T = 1),
 * whatever T, t and n_threads (batch invariance, above). */
void ifk_matmul(float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx,
                int T, int N, int K, int n_threads);

/* 1 when ifk_matmul multiplies weights of wtype with the BF16 dot product: F16 and BF16 weights
 * on the avx512 paths of a CPU with AVX512_BF16 (vdpbf16ps), unless ifk_set_qx_f32(1) (quant.h)
 * asks for the exact F32 product. Then x is rounded to BF16 (to nearest even) once per call,
 * F16 weights are rounded to BF16 likewise, BF16 weights are used as stored, and the products
 * (exact in F32) are summed in F32, so per output
 *     |y - y_exact| <= (u + u_w + u u_w) sum_k |w_k x_k|  +  n 2^-24 sum_k |w'_k x'_k|
 * with u = 2^-8 (x's rounding), u_w = 2^-8 for F16 weights and 0 for BF16, w', x' the rounded
 * values and n = 2 ceil(min(K, 2048) / 32) + ceil(K / 2048) + 4 (the additions any product
 * goes through; for a packed copy, qpack.h's float pairs, one chain of K additions: n = K + 5);
 * F32 subnormals in x count as 0. Twice the FMA roof (Zen 4: 234 against 118
 * GFLOP/s a core); on the amx path packed copies multiply on AMX tiles (tdpbf16ps: the same
 * roundings and bound, steps of 32 products summed by the hardware; 2280 GFLOP/s a core on the
 * Xeon measured); batch invariant like every product. (The rounded x lives in a per-thread
 * buffer of T x K BF16; a call that cannot grow it runs the F32 product instead.)
 * The rule for F16, by measurement (KL divergence to the F32 model, WikiText-2, 24 windows of
 * 256; docs/PERFORMANCE.md): it takes the BF16 product, because what it then loses is what BF16
 * weights lose there too, dominated by x's rounding: SmolLM2-135M 1.7e-4 (BF16 weights 1.7e-4),
 * stories260K 2.0e-4 (1.8e-4), xs-ckpt 3.6e-4 (3.1e-4), a quarter to a fifth of Q8_B64's, the
 * perplexity within 0.3 %. Exact F16 (the FMA product, 2e-6) is ifk_set_qx_f32(1). */
int ifk_bf16_dot(int wtype);

/* out[k] = W[row][k] as F32, for 0 <= k < K (an embedding lookup). */
void ifk_get_row(float *out, const void *W, int wtype, size_t row, int K);

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], for i < n. y may equal x. */
void ifk_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* Rotary position embedding, in place, on one token's vector of n_heads heads of head_dim.
 * Pair i (0 <= i < rot_dim/2) of each head is rotated by angle pos * theta^(-2i/rot_dim),
 * times freq_scale[i] when freq_scale is non-NULL (context-extension schemes precompute it).
 * Layout IFK_ROPE_HALF (Hugging Face rotate_half): the pair is (x[i], x[i + rot_dim/2]).
 * Layout IFK_ROPE_INTERLEAVED (Meta / GGUF):       the pair is (x[2i], x[2i+1]).
 * Dimensions at or past rot_dim are left alone (partial rotary). */
enum { IFK_ROPE_HALF = 0, IFK_ROPE_INTERLEAVED = 1 };
void ifk_rope(float *x, int n_heads, int head_dim, int rot_dim, int pos, float theta,
              const float *freq_scale, int layout);

/* In-place softmax over n values (max-subtracted, F32). */
void ifk_softmax(float *x, int n);

/* g[i] = silu(g[i]) * u[i]  (SwiGLU); silu(v) = v / (1 + exp(-v)). */
void ifk_silu_mul(float *g, const float *u, int n);
/* g = gelu(g) * u, in double, rounded once. exact = 0: GELU's tanh form (PyTorch's
 * gelu(approximate="tanh"), Gemma's GeGLU), gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
 * exact = 1: gelu(x) = x/2 * (1 + erf(x / sqrt(2))) (PyTorch's gelu, GPT-NeoX's, BERT's). */
void ifk_gelu_mul(float *g, const float *u, int n, int exact); /* u NULL: g = gelu(g) */
/* y = (x - mean) / sqrt(var + eps) * w + b over n (LayerNorm; mean and variance in double; w
 * NULL: 1, b NULL: 0). */
void ifk_layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps);

/* y[i] += x[i]. */
void ifk_add(float *y, const float *x, int n);

/* The up-projection of a low-rank delta (a LoRA adapter's b (a x)): for each of T rows,
 * y[i][n] += sum over q = 0 .. r-1 of t[i][q] * b[n][q], with t [T][r] at stride ldt, y [T][N]
 * at stride ldy and b [N][r] F16 in column tiles bt: the columns in tiles of IFK_LR_TILE (the
 * last one narrower, w = what is left), each tile b's rows q = 0 .. r-1 of its w columns one
 * after the other, so that b[n][q] is at ifk_lr_at(n, q, N, r) and a tile is read as one run.
 * Each element is one F32 fused multiply-add chain in q order from 0, then added to y: the same
 * bits on every path, whatever T and whichever thread (batch invariant), where a matrix product
 * of K = r would spend a row's reduction on 16 values. Tiles are dealt to up to n_threads
 * threads (pool.h) when the work pays for them. */
#define IFK_LR_TILE 64
static inline size_t ifk_lr_at(size_t n, size_t q, size_t N, size_t r)
{
    const size_t tile = n / IFK_LR_TILE, c0 = tile * IFK_LR_TILE;
    const size_t w = N - c0 < IFK_LR_TILE ? N - c0 : IFK_LR_TILE;
    return c0 * r + q * w + (n - c0);
}
void ifk_lowrank_up(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, int r,
                    int n_threads);

/* Causal attention of T query tokens over a KV cache, grouped-query style.
 *   q:   [T][n_heads * head_dim]      query t sits at absolute position pos0 + t
 *   k,v: [n_ctx][n_kv_heads * head_dim] cache rows 0 .. pos0+T-1 are valid (row stride kv_ld)
 *   out: [T][n_heads * head_dim]
 * Query head h reads kv head h / (n_heads / n_kv_heads). Query t attends to rows 0..pos0+t.
 * Scores are scaled by `scale` (usually 1/sqrt(head_dim)). Threads split (t, h) pairs.
 * Output row t is bit-identical to a call with T = 1 for query t at position pos0 + t over the
 * same cache rows, whatever T and n_threads (batch invariance, above). */
void ifk_attention(float *out, const float *q, const float *k, const float *v, size_t kv_ld,
                   int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale,
                   int n_threads);

#endif
