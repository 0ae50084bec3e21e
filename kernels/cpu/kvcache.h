/*
 * kvcache.h -- the paged KV cache: storing key/value rows into blocks and attending over them.
 *
 * Layout (one pool; a layer part has a K pool and a V pool of the same layout)
 *   A pool is n_blocks blocks of `block` positions. Position p of a sequence lives in block
 *   table[p / block] at slot p % block; the row of that slot, r = table[p / block] * block +
 *   p % block, holds the n_kv_heads * head_dim values of the position:
 *     IFK_KV_F32  float    data[n_blocks * block][KV]
 *     IFK_KV_F16  uint16_t data[n_blocks * block][KV]             (IEEE half, round to nearest even)
 *     IFK_KV_Q8   int8_t   data[n_blocks * block][KV], then
 *                 uint16_t scale[n_blocks][KV / group][block]     (F16; value = q * scale)
 *   where KV = n_kv_heads * head_dim. Q8 is symmetric group quantization (PPL.LLM's INT8 KV):
 *   each run of `group` values of one head at one position has its own scale, maxabs / 127; a
 *   block's scales of one group are adjacent (slot by slot), so 16 keys' scales load at once.
 *   A contiguous cache is the special case of one sequence with table {0, 1, 2, ...}.
 *
 * Contract
 *   A step's rows belong to sequences: sequence s owns rows row0 .. row0 + n_rows - 1 of q/x,
 *   at positions pos0 .. pos0 + n_rows - 1, with its own block table (host memory) covering
 *   positions 0 .. pos0 + n_rows - 1. Tables of different sequences never share a block that
 *   is written.
 *   Results are batch-invariant: the output row of a query depends only on that query, the
 *   sequence's cached rows and the layout, never on which other sequences or rows share the
 *   call, nor on the thread count (keys are taken in fixed chunks of IFK_KV_CHUNK from the
 *   first key the row sees with an online softmax; chunks in parts of IFK_KV_PART keys, each
 *   part's softmax from scratch and the parts merged in order, whether one thread takes them
 *   in turn or each part is a unit of its own; float sums in a fixed order, the same on every
 *   kernel path: products fused where kvcache.c says so, nowhere else).
 *   Over a Q8 pool the query is rounded as the keys are (int8, a scale maxabs / 127 for each
 *   group of `group` values of a head, kept in F32; as llama.cpp rounds it for q8_0 keys) before
 *   its products with the keys, which are then exact integers (vpdpbusd where the CPU has
 *   AVX512_VNNI; the same bits elsewhere).
 *   Kernels never allocate and never fail; threads split units of (up to 16 query rows of a
 *   sequence, kv head), and of a part of their keys when the caller's work lets them (few
 *   units, long rows: one sequence's decoding step deep in its context).
 */
#ifndef IFK_KVCACHE_H
#define IFK_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

enum { IFK_KV_F32 = 0, IFK_KV_F16 = 1, IFK_KV_Q8 = 2 };
#define IFK_KV_CHUNK 64  /* keys per online-softmax step */
#define IFK_KV_PART 512  /* keys per part (a multiple of IFK_KV_CHUNK) */
#define IFK_KV_WORK_MAX ((size_t)1 << 22) /* floats of work a call asks for at most */

typedef struct {
    int type;           /* IFK_KV_*                                      */
    int block;          /* positions per block                          */
    int n_kv_heads, head_dim;
    int group;          /* Q8: values per scale; divides head_dim      */
    int64_t n_blocks;
    int window;         /* sliding-window attention: a query sees the last
                           `window` positions, itself included; 0 = all */
    float softcap;      /* > 0: scaled scores become softcap * tanh(s / softcap) */
    int bidirectional;  /* an encoder's: every query row of a step also sees the positions
                           after it in that step (all of pos0 .. pos0 + n_rows - 1) */
    const float *sinks; /* attention sinks (gpt-oss), [n_kv_heads * heads a kv head] by query
                           head, or NULL: a logit each head's softmax counts in its sum and
                           no value goes with (attention only; the cache ignores it) */
} ifk_kv_layout;

typedef struct {
    int row0, n_rows, pos0;
    const int32_t *table; /* [ceil((pos0 + n_rows) / block)] block ids */
} ifk_kv_seq;

/* The Q8 group for head_dim: 32 when it divides head_dim, else head_dim. */
int ifk_kv_group(int head_dim);
/* Bytes of one pool of layout L; 0 for an unknown type. */
size_t ifk_kv_pool_bytes(const ifk_kv_layout *L);
/* Bytes per position per pool (values and scales). */
size_t ifk_kv_row_bytes(const ifk_kv_layout *L);
/* "f32", "f16", "q8"; NULL for an unknown code. */
const char *ifk_kv_type_name(int type);
/* The code of a name above, or -1. */
int ifk_kv_type_from_name(const char *name);

/* Store each sequence's rows of x (F32 [rows][KV] at stride ldx) at its positions. */
void ifk_kv_store(void *pool, const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, const float *x,
                  size_t ldx, int n_threads);

/* Causal grouped-query attention of every sequence's query rows over its cached positions:
 *   q, out: [rows][n_heads * head_dim] at stride ld; query row row0 + i of sequence s sits at
 *   position p = pos0 + i and attends to positions 0 .. p (already stored), or to the last
 *   L->window of them (p - window + 1 .. p) when L->window > 0; with L->bidirectional, to
 *   0 .. pos0 + n_rows - 1 (the whole step: an encoder's input).
 * Query head h reads kv head h / (n_heads / n_kv_heads). Scores are scaled by `scale`.
 * work [work_floats] (may be NULL) holds the parts' partial results when they are units of their
 * own: with less than ifk_attention_work() asks, the parts are taken in turn (the same bits). */
void ifk_attention_paged(float *out, const float *q, size_t ld, const void *k, const void *v,
                         const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads,
                         float scale, int n_threads, float *work, size_t work_floats);
/* Floats of work with which the call above splits parts over threads; 0 when it would not (one
 * thread, short rows, units enough without), at most IFK_KV_WORK_MAX. */
size_t ifk_attention_work(const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads, int n_threads);

/* Rotary parameters as ifk_rope takes them (kernels.h). */
typedef struct {
    int rot_dim;
    float theta;
    const float *freq_scale; /* [rot_dim / 2] or NULL */
    int layout;              /* IFK_ROPE_HALF or IFK_ROPE_INTERLEAVED */
} ifk_rope_params;

/* Context shift (StreamingLLM's attention sinks; Neural Speed's shift-RoPE-K): of a sequence's
 * n_past cached positions keep 0 .. keep - 1, drop keep .. keep + discard - 1, and move
 * keep + discard .. n_past - 1 down by `discard`. Values move as stored (v NULL: none, a
 * latent attention's values are its keys' rows). Keys are rotated back
 * by `discard` positions instead of being recomputed: RoPE rotates pair i by pos * f_i, so
 * R(-d f_i) R(p f_i) k = R((p - d) f_i) k; each key row is loaded as F32, rotated by ifk_rope
 * at position -discard and stored again (F32 keys lose nothing but the rotation's rounding;
 * F16 and Q8 keys are rounded a second time). tmp: [n_kv_heads * head_dim] scratch. Rows are
 * moved in ascending order, so the ranges may overlap. */
void ifk_kv_shift(void *k, void *v, const ifk_kv_layout *L, const int32_t *table, int n_past, int keep, int discard,
                  const ifk_rope_params *rp, float *tmp);

/* Where block blk of a pool lives: its values (*val, val_bytes) and, for Q8, its scales
 * (*scale, scale_bytes; 0 otherwise), as byte offsets into the pool. */
void ifk_kv_block_extent(const ifk_kv_layout *L, int64_t blk, size_t *val, size_t *val_bytes, size_t *scale,
                         size_t *scale_bytes);

/* One stored row back as F32 (tests, and a CPU fallback): out [KV] = position pos of a
 * sequence with block table `table`. */
void ifk_kv_load_row(float *out, const void *pool, const ifk_kv_layout *L, const int32_t *table, int pos);

#endif
