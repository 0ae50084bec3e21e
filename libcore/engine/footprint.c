/* footprint.c -- the bytes the engine keeps on a device. See footprint.h. */
#include "footprint.h"
#include "model_impl.h"
#include "libcore/base/dtype.h"

uint64_t iflow_matrix_bytes(int type, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    return iflow_tensor_nbytes(type, 2, (int64_t[]){rows, cols});
}

int iflow_part_kv0(const iflow_hparams *hp, int q0) { return q0 / (hp->n_heads / hp->n_kv_heads); }

int iflow_part_kv_heads(const iflow_hparams *hp, int q0, int q1)
{
    return q1 > q0 ? iflow_part_kv0(hp, q1 - 1) - iflow_part_kv0(hp, q0) + 1 : 0;
}

void iflow_part_matrix_bytes(const iflow_hparams *hp, const int *t, int q0, int q1, int f0, int f1,
                             uint64_t out[IFLOW_PM_COUNT])
{
    int64_t D = hp->dim, hd = hp->head_dim, nq = (int64_t)(q1 - q0) * hd,
            nkv = (int64_t)iflow_part_kv_heads(hp, q0, q1) * hd, nf = f1 - f0;
    out[IFLOW_PM_WQ] = iflow_matrix_bytes(t[IFLOW_PM_WQ], nq, D);
    out[IFLOW_PM_WK] = iflow_matrix_bytes(t[IFLOW_PM_WK], nkv, D);
    out[IFLOW_PM_WV] = iflow_matrix_bytes(t[IFLOW_PM_WV], nkv, D);
    out[IFLOW_PM_WO] = iflow_matrix_bytes(t[IFLOW_PM_WO], D, nq);
    if (hp->kv_lora_rank) { /* latent attention, whole layers: wq_a with wq, wkv_a with wk_b, wv_b, wo */
        const int64_t H = hp->n_heads, R = hp->kv_lora_rank, QR = hp->q_lora_rank, VO = H * hp->v_head_dim;
        const int64_t QH = H * (hp->qk_nope_dim + hp->rope_dim);
        out[IFLOW_PM_WQ] = QR ? iflow_matrix_bytes(t[IFLOW_PM_WQ], QH, QR) + iflow_matrix_bytes(t[IFLOW_PM_WQ], QR, D)
                              : iflow_matrix_bytes(t[IFLOW_PM_WQ], QH, D);
        out[IFLOW_PM_WK] = iflow_matrix_bytes(t[IFLOW_PM_WK], R + hp->rope_dim, D) +
                           iflow_matrix_bytes(t[IFLOW_PM_WK], H * R, hp->qk_nope_dim);
        out[IFLOW_PM_WV] = iflow_matrix_bytes(t[IFLOW_PM_WV], VO, R);
        out[IFLOW_PM_WO] = iflow_matrix_bytes(t[IFLOW_PM_WO], D, VO);
    }
    out[IFLOW_PM_GATE] = hp->ffn == IFLOW_FFN_GATED ? iflow_matrix_bytes(t[IFLOW_PM_GATE], nf, D) : 0;
    out[IFLOW_PM_UP] = iflow_matrix_bytes(t[IFLOW_PM_UP], nf, D);
    out[IFLOW_PM_DOWN] = iflow_matrix_bytes(t[IFLOW_PM_DOWN], D, nf);
}

iflow_part_bytes iflow_part_weight_bytes(const iflow_hparams *hp, const int *t, int q0, int q1, int f0, int f1)
{
    int64_t D = hp->dim, hd = hp->head_dim, nq = (int64_t)(q1 - q0) * hd,
            nkv = (int64_t)iflow_part_kv_heads(hp, q0, q1) * hd, nf = f1 - f0;
    uint64_t mb[IFLOW_PM_COUNT];
    iflow_part_matrix_bytes(hp, t, q0, q1, f0, f1, mb);
    iflow_part_bytes b;
    b.attn = mb[IFLOW_PM_WQ] + mb[IFLOW_PM_WK] + mb[IFLOW_PM_WV] + mb[IFLOW_PM_WO] + (uint64_t)D * sizeof(float);
    const int gated = hp->ffn == IFLOW_FFN_GATED;
    b.ffn = mb[IFLOW_PM_GATE] + mb[IFLOW_PM_UP] + mb[IFLOW_PM_DOWN] + (uint64_t)D * sizeof(float);
    if (iflow_norm_biased(hp))
        b.attn += (uint64_t)D * sizeof(float), b.ffn += (uint64_t)D * sizeof(float);
    if (hp->qkv_bias)
        b.attn += (uint64_t)(nq + 2 * nkv) * sizeof(float);
    if (hp->kv_lora_rank) /* q_a_norm, kv_a_norm */
        b.attn += (uint64_t)(hp->q_lora_rank + hp->kv_lora_rank) * sizeof(float);
    if (hp->attn_bias)
        b.attn += (uint64_t)D * sizeof(float);
    if (hp->post_norms)
        b.attn += (uint64_t)D * sizeof(float), b.ffn += (uint64_t)D * sizeof(float);
    if (hp->qk_norm) /* each head's, or the whole projections' (a whole layer) */
        b.attn += (hp->qk_norm_full ? (uint64_t)(hp->n_heads + hp->n_kv_heads) : 2ull) * (uint64_t)hp->head_dim *
                  sizeof(float);
    if (hp->mlp_bias)
        b.ffn += (uint64_t)((gated ? 2 : 1) * nf + D) * sizeof(float);
    return b;
}

uint64_t iflow_part_kv_bytes(const iflow_hparams *hp, int n_kv_heads, int n_ctx)
{
    /* latent attention: the values are the keys' latent part, no pool of their own */
    return (hp->kv_lora_rank ? 1ull : 2ull) * (uint64_t)n_ctx * (uint64_t)n_kv_heads * (uint64_t)hp->head_dim *
           sizeof(float);
}

uint64_t iflow_mla_scratch(const iflow_hparams *hp)
{
    if (!hp->kv_lora_rank)
        return 0;
    /* q_a (or nothing) and the whole query rows [H * (nope + rope)] */
    return (uint64_t)hp->q_lora_rank + (uint64_t)hp->n_heads * (uint64_t)(hp->qk_nope_dim + hp->rope_dim);
}

uint64_t iflow_scratch_bytes(const iflow_hparams *hp, int rows)
{
    uint64_t n = rows > MAX_BATCH ? (uint64_t)rows : MAX_BATCH;
    uint64_t D = hp->dim, Q = (uint64_t)hp->n_heads * hp->head_dim, F = hp->ffn_dim,
             KV = (uint64_t)hp->n_kv_heads * hp->head_dim;
    /* forward.c's scratch_alloc: x, xb (and xa), q, att, gate, up, kx, vx; latent attention's mla */
    return n * ((hp->parallel_residual ? 3 : 2) * D + 2 * Q + 2 * F + 2 * KV + iflow_mla_scratch(hp)) * sizeof(float);
}

uint64_t iflow_output_bytes(const iflow_hparams *hp, int output_type)
{
    if (hp->layout == IFLOW_LAYOUT_ENCODER) /* no output norm or matrix: the pooled states are the output */
        return 0;
    return iflow_matrix_bytes(output_type, hp->vocab_size, hp->dim) + (uint64_t)hp->dim * sizeof(float);
}
