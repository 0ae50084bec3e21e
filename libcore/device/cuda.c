/* cuda.c -- the CUDA device: kernels/cuda's C entry points behind the device vtable. See device.h.
 *
 * Built in every configuration: with IFLOW_HAVE_CUDA (make found nvcc) it calls kernels/cuda;
 * without, opening a CUDA device says that the build has none. kernels/cuda reports failures
 * as IFKC_E* codes with their own message; each is turned into an IFLOW_E* code here with the
 * message kept.
 */
#include "device_impl.h"
#include "libcore/base/error.h"
#include "libcore/engine/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if IFLOW_HAVE_CUDA

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda_kernels.h"

/* An IFKC_E* code as an IFLOW_E* code, the message carried over, prefixed with the device. */
static int fail(const iflow_device *d, int rc)
{
    int code = rc == IFKC_ENOMEM        ? IFLOW_ENOMEM
               : rc == IFKC_ENODEV      ? IFLOW_ENOTFOUND
               : rc == IFKC_EUNSUPPORTED ? IFLOW_EUNSUPPORTED
               : rc == IFKC_EINVAL      ? IFLOW_EINVAL
                                         : IFLOW_EIO;
    if (d)
        return iflow_seterr(code, "%s: %s", d->info.name, ifkc_errmsg());
    return iflow_seterr(code, "%s", ifkc_errmsg());
}

#define DEV(d) ((ifkc_dev *)(d)->impl)
/* Every operation first makes its GPU current, so one thread may drive several. */
#define CALL(d, expr)                                                                              \
    do {                                                                                           \
        int rc_ = ifkc_make_current(DEV(d));                                                       \
        if (rc_ == 0)                                                                              \
            rc_ = (expr);                                                                          \
        return rc_ ? fail(d, rc_) : 0;                                                             \
    } while (0)

static void cu_close(iflow_device *d)
{
    ifkc_close(DEV(d));
    free(d);
}

static int cu_alloc(iflow_device *d, void **p, size_t n)
{
    int rc = ifkc_malloc(DEV(d), p, n);
    if (rc == 0 && (rc = ifkc_memset0(DEV(d), *p, n)) != 0) {
        ifkc_free(DEV(d), *p);
        *p = NULL;
    }
    return rc ? fail(d, rc) : 0;
}

static void cu_free(iflow_device *d, void *p) { ifkc_free(DEV(d), p); }
static int cu_upload(iflow_device *d, void *dst, const void *src, size_t n) { CALL(d, ifkc_upload(DEV(d), dst, src, n)); }
static int cu_download(iflow_device *d, void *dst, const void *src, size_t n) { CALL(d, ifkc_download(DEV(d), dst, src, n)); }
static int cu_supports(const iflow_device *d, int wtype) { return ifkc_supports_wtype(wtype); }

static int cu_matmul(iflow_device *d, float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx, int T,
                     int N, int K)
{
    CALL(d, ifkc_matmul(DEV(d), y, ldy, W, wtype, x, ldx, T, N, K));
}

static int cu_rmsnorm(iflow_device *d, float *y, const float *x, const float *w, int T, int n, float eps)
{
    CALL(d, ifkc_rmsnorm(DEV(d), y, x, w, T, n, eps));
}

static int cu_rope(iflow_device *d, float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                   float theta, const float *freq_scale, int layout)
{
    CALL(d, ifkc_rope(DEV(d), x, ld, T, n_heads, head_dim, rot_dim, pos0, theta, freq_scale, layout));
}

static int cu_attention(iflow_device *d, float *out, const float *q, const float *k, const float *v, size_t kv_ld,
                        int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale)
{
    CALL(d, ifkc_attention(DEV(d), out, q, k, v, IFK_F32, kv_ld, T, pos0, n_heads, n_kv_heads, head_dim, scale));
}

static int cu_silu_mul(iflow_device *d, float *g, const float *u, size_t n)
{
    if (!u)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: block ffn = plain with activation silu is not implemented on cuda yet",
                            d->info.name);
    CALL(d, ifkc_silu_mul(DEV(d), g, u, n));
}
static int cu_add(iflow_device *d, float *y, const float *x, size_t n) { CALL(d, ifkc_add(DEV(d), y, x, n)); }

static int cu_add_bias(iflow_device *d, float *y, size_t ldy, const float *b, int T, int n)
{
    CALL(d, ifkc_add_bias(DEV(d), y, ldy, b, T, n));
}

static int cu_argmax(iflow_device *d, int32_t *out, const float *x, int n) { CALL(d, ifkc_argmax(DEV(d), out, x, n)); }

/* The paged KV cache on a GPU: F32 and F16 pools, each sequence's positions within its first
 * block (one block per sequence, as iflow_ctx uses it). Paged attention over several blocks,
 * and Q8 pools, are not implemented on CUDA yet. */
static int cu_kv_check(const iflow_device *d, const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs)
{
    if (L->type != IFK_KV_F32 && L->type != IFK_KV_F16)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: a %s KV cache is not implemented on cuda yet", d->info.name,
                            ifk_kv_type_name(L->type));
    if (L->sinks)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: attention sinks are not implemented on cuda yet", d->info.name);
    if (L->softcap > 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: attention soft-capping is not implemented on cuda yet", d->info.name);
    if (L->bidirectional)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: an encoder's attention is not implemented on cuda yet", d->info.name);
    if (L->window > 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: sliding-window attention (window %d) is not implemented on cuda yet",
                            d->info.name, L->window);
    for (int s = 0; s < n_seqs; s++)
        if (seqs[s].pos0 + seqs[s].n_rows > L->block)
            return iflow_seterr(IFLOW_EUNSUPPORTED,
                                "%s: attention over several KV blocks is not implemented on cuda yet (position %d, "
                                "block of %d)", d->info.name, seqs[s].pos0 + seqs[s].n_rows - 1, L->block);
    return 0;
}

/* Start of block b of a pool, and the element type the kernels take. */
static void *cu_block(void *pool, const ifk_kv_layout *L, int32_t b)
{
    return (char *)pool + (size_t)b * L->block * ifk_kv_row_bytes(L);
}

static int cu_kv_store(iflow_device *d, void *pool, const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs,
                       const float *x, size_t ldx)
{
    int rc = cu_kv_check(d, L, seqs, n_seqs), KV = L->n_kv_heads * L->head_dim;
    int wtype = L->type == IFK_KV_F16 ? IFK_F16 : IFK_F32;
    for (int s = 0; s < n_seqs && rc == 0; s++) {
        rc = ifkc_make_current(DEV(d));
        if (rc == 0)
            rc = ifkc_kv_store(DEV(d), cu_block(pool, L, seqs[s].table[0]), wtype, (size_t)KV, seqs[s].pos0,
                               x + (size_t)seqs[s].row0 * ldx, ldx, seqs[s].n_rows, KV);
        if (rc < 0)
            return fail(d, rc);
    }
    return rc;
}

static int cu_kv_shift(iflow_device *d, void *k, void *v, const ifk_kv_layout *L, const int32_t *table, int n_past,
                       int keep, int discard, const ifk_rope_params *rp)
{
    ifk_kv_seq whole = {.row0 = 0, .n_rows = n_past, .pos0 = 0, .table = table};
    int rc = cu_kv_check(d, L, &whole, 1);
    if (rc < 0)
        return rc;
    rc = ifkc_make_current(DEV(d));
    if (rc == 0)
        rc = ifkc_kv_shift(DEV(d), cu_block(k, L, table[0]), cu_block(v, L, table[0]),
                           L->type == IFK_KV_F16 ? IFK_F16 : IFK_F32, (size_t)L->n_kv_heads * L->head_dim, L->n_kv_heads,
                           L->head_dim, rp->rot_dim, n_past, keep, discard, rp->theta, rp->freq_scale, rp->layout);
    return rc < 0 ? fail(d, rc) : 0;
}

static int cu_attention_paged(iflow_device *d, float *out, const float *q, size_t ld, const void *k, const void *v,
                              const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads, float scale)
{
    int rc = cu_kv_check(d, L, seqs, n_seqs), KV = L->n_kv_heads * L->head_dim;
    int wtype = L->type == IFK_KV_F16 ? IFK_F16 : IFK_F32;
    if (ld != (size_t)n_heads * L->head_dim && rc == 0)
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "%s: paged attention needs contiguous query rows", d->info.name);
    for (int s = 0; s < n_seqs && rc == 0; s++) {
        size_t off = (size_t)seqs[s].row0 * ld;
        rc = ifkc_make_current(DEV(d));
        if (rc == 0)
            rc = ifkc_attention(DEV(d), out + off, q + off, cu_block((void *)k, L, seqs[s].table[0]),
                                cu_block((void *)v, L, seqs[s].table[0]), wtype, (size_t)KV, seqs[s].n_rows,
                                seqs[s].pos0, n_heads, L->n_kv_heads, L->head_dim, scale);
        if (rc < 0)
            return fail(d, rc);
    }
    return rc;
}

/* An encoder-decoder's attention (cross-attention, relative position bias): not on CUDA yet. */
static int cu_attention_bias(iflow_device *d, float *out, const float *q, size_t ld, const float *k, const float *v,
                             size_t kv_ld, int T, int S, int causal0, int n_heads, int n_kv_heads, int head_dim,
                             float scale, const float *bias)
{
    return iflow_seterr(IFLOW_EUNSUPPORTED, "%s: an encoder-decoder's attention (cross-attention, relative position "
                        "bias) is not implemented on cuda yet", d->info.name);
}

static int cu_query(const iflow_device *d, iflow_device_info *info) { return iflow_cuda_info(d->info.index, info); }

static int cu_add_rmsnorm(iflow_device *d, float *x, float *y, const float *w, int T, int n, float eps)
{
    CALL(d, ifkc_add_rmsnorm(DEV(d), x, y, w, T, n, eps));
}

static int cu_rope_store(iflow_device *d, float *q, size_t ldq, int nq, float *k, const float *v, size_t ldkv,
                         void *kpool, void *vpool, const ifk_kv_layout *L, const ifk_kv_seq *seq,
                         const ifk_rope_params *rp)
{
    int rc = cu_kv_check(d, L, seq, 1);
    if (rc < 0)
        return rc;
    const int kv_type = L->type == IFK_KV_F16 ? IFK_F16 : IFK_F32;
    CALL(d, ifkc_rope_store(DEV(d), q, ldq, nq, k, v, ldkv, L->n_kv_heads, cu_block(kpool, L, seq->table[0]),
                            cu_block(vpool, L, seq->table[0]), kv_type, (size_t)L->n_kv_heads * L->head_dim,
                            seq->n_rows, L->head_dim, rp->rot_dim, seq->pos0, rp->theta, rp->freq_scale, rp->layout));
}

static int cu_glu(iflow_device *d, float *gate, float *up, size_t ld, const void *Wg, const void *Wu, int wtype,
                  const float *x, size_t ldx, int T, int N, int K)
{
    CALL(d, ifkc_matmul_glu(DEV(d), gate, up, ld, Wg, Wu, wtype, x, ldx, T, N, K));
}

static int cu_qkv(iflow_device *d, float *q, size_t ldq, float *k, float *v, size_t ldkv, const void *Wq,
                  const void *Wk, const void *Wv, int wtype, const float *x, size_t ldx, int T, int Nq, int Nkv, int K)
{
    CALL(d, ifkc_matmul_qkv(DEV(d), q, ldq, k, v, ldkv, Wq, Wk, Wv, wtype, x, ldx, T, Nq, Nkv, K));
}

/* Q4 and Q8 matrices as warp tiles (IFLOW_CUDA_TILED=1): their decode products read 16 level
 * bytes a lane against int8 activations (kernels/cuda/qtiled.cu). Off by default until measured
 * on a GPU. */
static int cu_pack(iflow_device *d, void **out, int *out_type, const void *W, int wtype, int N, int K)
{
    CALL(d, ifkc_tile_pack(DEV(d), out, out_type, W, wtype, N, K));
}

static int cu_record_begin(iflow_device *d) { CALL(d, ifkc_graph_begin(DEV(d))); }
static int cu_record_at(iflow_device *d, int pos0, int max_pos, uint64_t key)
{
    CALL(d, ifkc_graph_begin_at(DEV(d), pos0, max_pos, key));
}
static int cu_replay(iflow_device *d, int pos0, uint64_t key)
{
    int rc = ifkc_graph_replay(DEV(d), pos0, key);
    return rc < 0 ? fail(d, rc) : rc;
}
static int cu_record_end(iflow_device *d) { CALL(d, ifkc_graph_end(DEV(d))); }
static void cu_record_abort(iflow_device *d) { ifkc_graph_abort(DEV(d)); }

static const iflow_device_ops cuda_ops = {
    cu_close, cu_query, cu_alloc, cu_free, cu_upload, cu_download, cu_supports, cu_matmul, cu_rmsnorm,
    cu_rope, cu_attention, cu_silu_mul, cu_add, cu_add_bias, cu_argmax, cu_kv_store, cu_attention_paged,
    cu_kv_shift,
    NULL, /* gelu_mul: none yet (the engine refuses gelu blocks on CUDA) */
    NULL, /* layernorm: none yet */
    NULL, /* pack: the row layout, unless IFLOW_CUDA_TILED=1 (cu_pack) */
    cu_attention_bias,
    NULL, /* relu_mul: none yet */
    cu_record_begin, cu_record_end, cu_record_abort, cu_record_at, cu_replay,
    cu_add_rmsnorm, cu_rope_store, cu_glu, cu_qkv,
};

/* cuda_ops as the environment changes them, the same for every device: without the fused ops
 * (IFLOW_CUDA_UNFUSED=1: what they save, measured), with the warp tiles (IFLOW_CUDA_TILED=1). */
static iflow_device_ops cuda_ops_env;

void iflow_cuda_graph_stats(const iflow_device *d, iflow_graph_stats *out)
{
    ifkc_graph_stats st;
    ifkc_graph_stats_get(DEV(d), &st);
    out->launches = st.launches;
    out->instantiations = st.instantiations;
    out->aborts = st.aborts;
    out->replays = st.replays;
}

int iflow_cuda_count(const char **why)
{
    int n = 0;
    if (ifkc_device_count(&n) < 0) {
        static __thread char msg[512];
        snprintf(msg, sizeof msg, "%s", ifkc_errmsg());
        *why = msg;
        return 0;
    }
    *why = NULL;
    return n;
}

int iflow_cuda_info(int index, iflow_device_info *info)
{
    ifkc_device_info k;
    memset(info, 0, sizeof *info);
    int rc = ifkc_device_info_get(index, &k);
    if (rc)
        return fail(NULL, rc);
    info->kind = IFLOW_DEVICE_CUDA;
    info->index = index;
    snprintf(info->name, sizeof info->name, "cuda:%d", index);
    snprintf(info->model, sizeof info->model, "%s", k.name);
    info->mem_total = k.mem_total;
    info->mem_free = k.mem_free;
    info->units = k.sm_count;
    info->cc_major = k.cc_major;
    info->cc_minor = k.cc_minor;
    info->mem_bw_peak = k.mem_bw_peak;
    snprintf(info->detail, sizeof info->detail, "cuda driver %d.%d, runtime %d.%d", k.driver_version / 1000,
             k.driver_version % 1000 / 10, k.runtime_version / 1000, k.runtime_version % 1000 / 10);
    return 0;
}

int iflow_cuda_open(iflow_device **out, int index)
{
    *out = NULL;
    iflow_device *d = calloc(1, sizeof *d);
    if (!d)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int rc = iflow_cuda_info(index, &d->info);
    if (rc == 0) {
        ifkc_dev *k;
        if ((rc = ifkc_open(&k, index)) < 0)
            rc = fail(NULL, rc);
        else
            d->impl = k;
    }
    if (rc < 0) {
        free(d);
        return iflow_preperr(rc, "cannot open cuda:%d", index);
    }
    d->ops = &cuda_ops;
    const char *unfused = getenv("IFLOW_CUDA_UNFUSED"), *tiled = getenv("IFLOW_CUDA_TILED");
    const int no_fused = unfused && strcmp(unfused, "1") == 0, tiles = tiled && strcmp(tiled, "1") == 0;
    if (no_fused || tiles) {
        cuda_ops_env = cuda_ops;
        if (no_fused) {
            cuda_ops_env.add_rmsnorm = NULL;
            cuda_ops_env.rope_store = NULL;
            cuda_ops_env.glu = NULL;
            cuda_ops_env.qkv = NULL;
        }
        if (tiles)
            cuda_ops_env.pack = cu_pack;
        d->ops = &cuda_ops_env;
    }
    const char *overlap = getenv("IFLOW_CUDA_OVERLAP"); /* off until measured on a GPU */
    if (overlap && strcmp(overlap, "1") == 0)
        ifkc_set_overlap(DEV(d), 1);
    *out = d;
    return 0;
}

/* ---- comm.h's transport between GPUs: NCCL ---- */

typedef struct {
    ifkc_nccl *k;
    iflow_device *gpu;
} nccl_comm;

#define NC(c) ((nccl_comm *)(c)->impl)
#define NC_CALL(c, expr)                                                                           \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        return rc_ ? fail(NC(c)->gpu, rc_) : 0;                                                    \
    } while (0)

static int nc_bcast(iflow_comm *c, void *buf, size_t bytes, int root) { NC_CALL(c, ifkc_nccl_bcast(NC(c)->k, buf, bytes, root)); }
static int nc_allreduce(iflow_comm *c, float *buf, size_t n) { NC_CALL(c, ifkc_nccl_allreduce_sum(NC(c)->k, buf, n)); }
static int nc_send(iflow_comm *c, const void *buf, size_t bytes, int to) { NC_CALL(c, ifkc_nccl_send(NC(c)->k, buf, bytes, to)); }
static int nc_recv(iflow_comm *c, void *buf, size_t bytes, int from) { NC_CALL(c, ifkc_nccl_recv(NC(c)->k, buf, bytes, from)); }

static const iflow_comm_ops nccl_ops = {nc_bcast, nc_allreduce, nc_send, nc_recv};

int iflow_comm_nccl_open(iflow_comm **out, iflow_device *gpu, iflow_comm *boot)
{
    *out = NULL;
    if (!gpu || gpu->info.kind != IFLOW_DEVICE_CUDA)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "NCCL runs between GPUs: this process's device is %s",
                            gpu ? gpu->info.name : "the cpu");
    const int rank = boot ? boot->rank : 0, size = boot ? boot->size : 1;
    char id[IFKC_NCCL_ID_BYTES] = {0};
    int rc = ifkc_nccl_available();
    if (rc == 0 && rank == 0)
        rc = ifkc_nccl_id(id);
    if (rc)
        rc = fail(gpu, rc);
    if (boot) { /* all start NCCL or none: a rank left alone would wait in ncclCommInitRank */
        float failed = rc != 0;
        int brc = boot->ops->allreduce_sum(boot, &failed, 1);
        if (brc == 0 && rc == 0 && failed > 0)
            rc = iflow_seterr(IFLOW_EIO, "NCCL failed to start on %.0f of the %d processes", failed, size);
        if (brc == 0 && rc == 0)
            brc = boot->ops->bcast(boot, id, sizeof id, 0);
        if (brc)
            return brc;
    }
    nccl_comm *nc = rc ? NULL : calloc(1, sizeof *nc);
    iflow_comm *c = rc ? NULL : calloc(1, sizeof *c);
    if (rc == 0 && (!nc || !c))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0 && (rc = ifkc_nccl_open(&nc->k, DEV(gpu), rank, size, id)) != 0)
        rc = fail(gpu, rc);
    if (rc) {
        free(nc);
        free(c);
        return iflow_preperr(rc, "cannot start NCCL as rank %d of %d", rank, size);
    }
    nc->gpu = gpu;
    *c = (iflow_comm){.ops = &nccl_ops, .rank = rank, .size = size, .device_buffers = 1, .impl = nc};
    *out = c;
    return 0;
}

void iflow_comm_nccl_close(iflow_comm *c)
{
    if (!c)
        return;
    ifkc_nccl_close(NC(c)->k);
    free(c->impl);
    free(c);
}

#else /* no CUDA in this build */

static const char no_cuda[] = "this build has no CUDA (built with CUDA=0 or without nvcc)";

int iflow_cuda_count(const char **why)
{
    *why = no_cuda;
    return 0;
}

int iflow_cuda_info(int index, iflow_device_info *info)
{
    memset(info, 0, sizeof *info);
    return iflow_seterr(IFLOW_EUNSUPPORTED, "%s", no_cuda);
}

int iflow_cuda_open(iflow_device **out, int index)
{
    *out = NULL;
    return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot open cuda:%d: %s", index, no_cuda);
}

void iflow_cuda_graph_stats(const iflow_device *d, iflow_graph_stats *st) { (void)d, (void)st; }

int iflow_comm_nccl_open(iflow_comm **out, iflow_device *gpu, iflow_comm *boot)
{
    *out = NULL;
    return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot start NCCL: %s", no_cuda);
}

void iflow_comm_nccl_close(iflow_comm *c) { (void)c; }

#endif
