/* llama2c.c -- llama2.c checkpoints and tokenizers as a GGUF (contract and layout in llama2c.h). */
#include "llama2c.h"
#include "pickle.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define L2C_MAGIC 0x616b3432u /* "ak42" */
#define V1_HEADER 256
#define V0_HEADER 28
#define DIM_MAX (1 << 24)     /* any one dimension */
#define LAYERS_MAX 4096
#define PAGE 4096

typedef struct {
    int version; /* 0 (legacy), 1, or 2 (int8 groups) */
    int gs;      /* version 2: weights per scale */
    int dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len, shared;
    size_t header; /* bytes before the weights */
    uint64_t len;  /* the file length the header implies */
    uint64_t image; /* version 2: bytes of the weights as F32 */
} l2c_header;

/* ---- header ------------------------------------------------------------------------------ */

static int32_t rd_i32(const unsigned char *p) { return (int32_t)rd_u32(p); }

/* total += a * b * c (floats), 0 on overflow. */
static int add_floats(uint64_t *total, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t ab, abc;
    return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, &abc) &&
           !__builtin_add_overflow(*total, abc, total);
}

static int parse_header(l2c_header *h, const unsigned char *b, size_t len, const char *name)
{
    memset(h, 0, sizeof *h);
    if (len < V0_HEADER)
        return iflow_seterr(IFLOW_ETRUNC, "llama2.c checkpoint '%s' is %zu bytes, shorter than its %d-byte header", name,
                            len, V0_HEADER);
    const unsigned char *f = b; /* the 7 fields */
    if (rd_u32(b) == L2C_MAGIC) {
        if (len < V1_HEADER)
            return iflow_seterr(IFLOW_ETRUNC, "llama2.c checkpoint '%s' is %zu bytes, shorter than its %d-byte header",
                                name, len, V1_HEADER);
        h->version = rd_i32(b + 4);
        if (h->version != 1 && h->version != 2)
            return iflow_seterr(IFLOW_EUNSUPPORTED,
                                "llama2.c checkpoint '%s' is version %d (byte 4): iflow reads the legacy format and "
                                "versions 1 and 2",
                                name, h->version);
        f = b + 8;
        h->header = V1_HEADER;
    } else {
        h->header = V0_HEADER;
    }
    static const char *const field[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    int v[7];
    for (int i = 0; i < 7; i++) {
        v[i] = rd_i32(f + 4 * i);
        /* a legacy vocab_size may be negative (an unshared classifier); INT32_MIN has no magnitude */
        long long x = i == 5 && h->version == 0 ? llabs((long long)v[i]) : v[i];
        int max = i == 2 ? LAYERS_MAX : DIM_MAX;
        if (x < 1 || x > max)
            return iflow_seterr(IFLOW_EFORMAT, "bad llama2.c header in '%s': %s %d at byte %zu (1 to %d)", name, field[i],
                                v[i], (size_t)(f - b) + 4 * (size_t)i, max);
    }
    h->dim = v[0], h->hidden = v[1], h->n_layers = v[2], h->n_heads = v[3], h->n_kv = v[4], h->seq_len = v[6];
    h->vocab = v[5] < 0 ? -v[5] : v[5];
    h->shared = h->version == 0 ? v[5] > 0 : b[36] != 0;
    if (h->dim % h->n_heads || h->n_heads % h->n_kv)
        return iflow_seterr(IFLOW_EFORMAT,
                            "bad llama2.c header in '%s': dim %d, n_heads %d, n_kv_heads %d (dim must be a multiple of "
                            "n_heads, n_heads of n_kv_heads)",
                            name, h->dim, h->n_heads, h->n_kv);
    const uint64_t D = (uint64_t)h->dim, L = (uint64_t)h->n_layers, H = (uint64_t)h->hidden, V = (uint64_t)h->vocab;
    const uint64_t hd = D / (uint64_t)h->n_heads, kv = hd * (uint64_t)h->n_kv;
    uint64_t n = 0;
    if (h->version == 2) {
        /* norms in F32, then each matrix as int8 values and one F32 scale per group */
        h->gs = rd_i32(b + 37);
        if (h->gs < 1 || h->gs > DIM_MAX || h->dim % h->gs)
            return iflow_seterr(IFLOW_EFORMAT, "bad llama2.c header in '%s': group size %d at byte 37 (it must divide dim %d)",
                                name, h->gs, h->dim);
        uint64_t q = 0, norms = 0;
        int ok = add_floats(&q, V, D, h->shared ? 1 : 2) && add_floats(&q, L, D, D * 2) && add_floats(&q, L, kv, D * 2) &&
                 add_floats(&q, L, H, D * 3) && add_floats(&norms, L, D, 2) && add_floats(&norms, D, 1, 1) &&
                 q <= UINT64_MAX / 2 && norms <= UINT64_MAX / 8;
        if (!ok)
            return iflow_seterr(IFLOW_EFORMAT, "bad llama2.c header in '%s': its sizes overflow", name);
        h->len = h->header + 4 * norms + q + 4 * (q / (uint64_t)h->gs);
        h->image = 4 * (norms + q);
        return 0;
    }
    int ok = add_floats(&n, V, D, 1) && add_floats(&n, L, D, 2) /* norms */ && add_floats(&n, L, D, D) /* wq */ &&
             add_floats(&n, L, kv, D * 2) /* wk, wv */ && add_floats(&n, L, D, D) /* wo */ &&
             add_floats(&n, L, H, D * 3) /* w1, w2, w3 */ && add_floats(&n, D, 1, 1) /* final norm */ &&
             (h->shared || add_floats(&n, V, D, 1)) &&
             (h->version == 1 || add_floats(&n, (uint64_t)h->seq_len, hd / 2, 2)); /* freq_cis */
    if (!ok || n > (UINT64_MAX - h->header) / 4)
        return iflow_seterr(IFLOW_EFORMAT, "bad llama2.c header in '%s': its sizes overflow", name);
    h->len = h->header + 4 * n;
    return 0;
}

/* The file's length must be the one its header implies. */
static int check_length(const l2c_header *h, uint64_t len, const char *name)
{
    if (h->len == len)
        return 0;
    return iflow_seterr(h->len > len ? IFLOW_ETRUNC : IFLOW_EFORMAT,
                        "llama2.c checkpoint '%s' is %llu bytes; its header (dim %d, hidden %d, %d layers, vocab %d) "
                        "needs %llu",
                        name, (unsigned long long)len, h->dim, h->hidden, h->n_layers, h->vocab,
                        (unsigned long long)h->len);
}

int iflow_llama2c_check_header(const void *buf, size_t len, const char *name)
{
    l2c_header h;
    int rc = parse_header(&h, buf, len, name);
    return rc < 0 ? rc : check_length(&h, len, name);
}

/* ---- a growing byte buffer (the GGUF header being written) ------------------------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v)
{
    unsigned char x[4];
    wr_u32(x, v);
    put(b, x, 4);
}

static void put_u64(buf *b, uint64_t v)
{
    unsigned char x[8];
    wr_u64(x, v);
    put(b, x, 8);
}

static void put_str(buf *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}

static void kv_key(buf *b, const char *key, uint32_t type)
{
    put_str(b, key, strlen(key));
    put_u32(b, type);
}

static void kv_u32(buf *b, const char *key, uint32_t v) { kv_key(b, key, IFLOW_GGUF_U32), put_u32(b, v); }

static void kv_f32(buf *b, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    kv_key(b, key, IFLOW_GGUF_F32), put_u32(b, u);
}

static void kv_str(buf *b, const char *key, const char *s) { kv_key(b, key, IFLOW_GGUF_STR), put_str(b, s, strlen(s)); }

/* ---- tokenizer ---------------------------------------------------------------------------- */

/* Appends tokenizer.ggml.{tokens, scores, token_type} (3 keys) for `vocab` tokens of tok. */
static int put_vocab(buf *b, const unsigned char *tok, size_t len, int vocab, const char *name)
{
    if (len < 4)
        return iflow_seterr(IFLOW_ETRUNC, "llama2.c tokenizer '%s' is %zu bytes, shorter than its 4-byte header", name, len);
    size_t *at = malloc(sizeof *at * (size_t)vocab); /* each token's score offset */
    if (!at)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", name);
    size_t off = 4;
    for (int i = 0; i < vocab; i++) {
        if (len - off < 8) {
            free(at);
            return iflow_seterr(IFLOW_ETRUNC, "llama2.c tokenizer '%s' ends at byte %zu in token %d of %d", name, len, i,
                                vocab);
        }
        int32_t n = rd_i32(tok + off + 4);
        if (n < 0 || (size_t)n > len - off - 8) {
            free(at);
            return iflow_seterr(n < 0 ? IFLOW_EFORMAT : IFLOW_ETRUNC,
                                "llama2.c tokenizer '%s': token %d at byte %zu has length %d (%zu bytes left)", name, i,
                                off + 4, n, len - off - 8);
        }
        at[i] = off;
        off += 8 + (size_t)n;
    }
    if (b) {
        kv_key(b, "tokenizer.ggml.tokens", IFLOW_GGUF_ARR);
        put_u32(b, IFLOW_GGUF_STR);
        put_u64(b, (uint64_t)vocab);
        for (int i = 0; i < vocab; i++) {
            /* SentencePiece's U+2581 where llama2.c's export wrote a space */
            const char *s = (const char *)tok + at[i] + 8;
            size_t n = (size_t)rd_i32(tok + at[i] + 4), spaces = 0;
            for (size_t k = 0; k < n; k++)
                spaces += s[k] == ' ';
            put_u64(b, n + 2 * spaces);
            for (size_t k = 0; k < n; k++)
                put(b, s[k] == ' ' ? "\xe2\x96\x81" : s + k, s[k] == ' ' ? 3 : 1);
        }
        kv_key(b, "tokenizer.ggml.scores", IFLOW_GGUF_ARR);
        put_u32(b, IFLOW_GGUF_F32);
        put_u64(b, (uint64_t)vocab);
        for (int i = 0; i < vocab; i++)
            put(b, tok + at[i], 4);
        kv_key(b, "tokenizer.ggml.token_type", IFLOW_GGUF_ARR);
        put_u32(b, IFLOW_GGUF_I32);
        put_u64(b, (uint64_t)vocab);
        for (int i = 0; i < vocab; i++) {
            const char *s = (const char *)tok + at[i] + 8;
            size_t n = (size_t)rd_i32(tok + at[i] + 4);
            /* SentencePiece's types: 1 normal, 2 unknown, 3 control, 6 byte */
            uint32_t type = n == 5 && !memcmp(s, "<unk>", 5)                              ? 2
                            : (n == 3 && !memcmp(s, "<s>", 3)) || (n == 4 && !memcmp(s, "</s>", 4)) ? 3
                            : n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>'                ? 6
                                                                                          : 1;
            put_u32(b, type);
        }
    }
    free(at);
    return 0;
}

int iflow_llama2c_check_tokenizer(const void *buf_, size_t len, int vocab, const char *name)
{
    return vocab < 1 ? iflow_seterr(IFLOW_EINVAL, "vocabulary of %d tokens", vocab) : put_vocab(NULL, buf_, len, vocab, name);
}

/* ---- the tensor table ---------------------------------------------------------------------- */

enum { T_EMB, T_RMS_ATT, T_WQ, T_WK, T_WV, T_WO, T_RMS_FFN, T_W1, T_W2, T_W3, T_RMS_FINAL, T_FREQ, T_WCLS };

/* The arrays of a checkpoint in file order. */
static const int order_v0[] = {T_EMB, T_RMS_ATT, T_WQ, T_WK, T_WV, T_WO, T_RMS_FFN, T_W1, T_W2, T_W3, T_RMS_FINAL, T_FREQ, T_WCLS};
static const int order_v1[] = {T_RMS_ATT, T_RMS_FFN, T_RMS_FINAL, T_EMB, T_WQ, T_WK, T_WV, T_WO, T_W1, T_W2, T_W3, T_WCLS};

typedef struct {
    const char *name; /* GGUF name; "%d" for the layer */
    int per_layer;
    uint64_t ne0, ne1; /* ggml order: ne0 the inner (input) dimension; ne1 1 for a vector */
} l2c_array;

static l2c_array array_of(const l2c_header *h, int kind)
{
    const uint64_t D = (uint64_t)h->dim, H = (uint64_t)h->hidden, V = (uint64_t)h->vocab;
    const uint64_t hd = D / (uint64_t)h->n_heads, kv = hd * (uint64_t)h->n_kv;
    switch (kind) {
    case T_EMB: return (l2c_array){"token_embd.weight", 0, D, V};
    case T_RMS_ATT: return (l2c_array){"blk.%d.attn_norm.weight", 1, D, 1};
    case T_WQ: return (l2c_array){"blk.%d.attn_q.weight", 1, D, D};
    case T_WK: return (l2c_array){"blk.%d.attn_k.weight", 1, D, kv};
    case T_WV: return (l2c_array){"blk.%d.attn_v.weight", 1, D, kv};
    case T_WO: return (l2c_array){"blk.%d.attn_output.weight", 1, D, D};
    case T_RMS_FFN: return (l2c_array){"blk.%d.ffn_norm.weight", 1, D, 1};
    case T_W1: return (l2c_array){"blk.%d.ffn_gate.weight", 1, D, H};
    case T_W2: return (l2c_array){"blk.%d.ffn_down.weight", 1, H, D};
    case T_W3: return (l2c_array){"blk.%d.ffn_up.weight", 1, D, H};
    case T_RMS_FINAL: return (l2c_array){"output_norm.weight", 0, D, 1};
    case T_FREQ: return (l2c_array){NULL, 0, (uint64_t)h->seq_len * (hd / 2), 2}; /* real and imaginary: skipped */
    default: return (l2c_array){h->shared ? NULL : "output.weight", 0, D, V};
    }
}

/* One tensor of the generated GGUF: F32/F16/BF16 bytes at `off` in the checkpoint file. */
typedef struct {
    char name[96];
    uint64_t ne0, ne1;  /* ggml order; ne1 1 for a vector */
    uint32_t type;      /* ggml: 0 F32, 1 F16, 30 BF16 */
    uint64_t off;
} l2c_tensor;

/* The tensors of a .bin checkpoint in file order (*n of them, malloc'd into *out). */
static int bin_tensors(const l2c_header *h, l2c_tensor **out, int *n)
{
    const int *order = h->version ? order_v1 : order_v0; /* version 2: its F32 image (dequantize_v2) */
    int n_order = h->version ? (int)(sizeof order_v1 / sizeof *order_v1) : (int)(sizeof order_v0 / sizeof *order_v0);
    l2c_tensor *t = calloc((size_t)h->n_layers * 9 + 4, sizeof *t);
    if (!t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    uint64_t off = h->version == 2 ? 0 : h->header;
    int k = 0;
    for (int o = 0; o < n_order; o++) {
        l2c_array a = array_of(h, order[o]);
        if (order[o] == T_WCLS && h->shared)
            continue;
        for (int l = 0; l < (a.per_layer ? h->n_layers : 1); l++) {
            if (a.name) {
                snprintf(t[k].name, sizeof t[k].name, a.name, l);
                t[k].ne0 = a.ne0, t[k].ne1 = a.ne1, t[k].type = 0, t[k].off = off;
                k++;
            }
            off += 4 * a.ne0 * a.ne1;
        }
    }
    *out = t, *n = k;
    return 0;
}

/* The tensor table, offsets = pad + file offset. */
static void put_table(buf *b, const l2c_tensor *t, int n, uint64_t pad)
{
    for (int i = 0; i < n; i++) {
        put_str(b, t[i].name, strlen(t[i].name));
        put_u32(b, t[i].ne1 > 1 ? 2 : 1);
        put_u64(b, t[i].ne0);
        if (t[i].ne1 > 1)
            put_u64(b, t[i].ne1);
        put_u32(b, t[i].type);
        put_u64(b, pad + t[i].off);
    }
}

/* ---- opening -------------------------------------------------------------------------------- */

static int read_whole(const char *path, unsigned char **data, size_t *len)
{
    char *p;
    int rc = iflow_read_file(path, (size_t)1 << 30, &p, len);
    if (rc < 0)
        return iflow_preperr(rc, "llama2.c tokenizer");
    *data = (unsigned char *)p;
    return 0;
}

int iflow_is_llama2c_file(const char *path)
{
    unsigned char b[V0_HEADER];
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && read(fd, b, sizeof b) == (ssize_t)sizeof b;
    close(fd);
    if (!ok)
        return 0;
    if (rd_u32(b) == L2C_MAGIC || !memcmp(b, "PK\3\4", 4)) /* version 1; a PyTorch zip */
        return 1;
    l2c_header h;
    return parse_header(&h, b, sizeof b, path) == 0 && h.len == (uint64_t)sb.st_size;
}

/* The tokenizer's bytes: tokenizer_path, or tokenizer.bin beside `path`. */
static int read_tokenizer(const char *path, const char *tokenizer_path, unsigned char **tok, size_t *len, char *tpath,
                          size_t cap)
{
    if (tokenizer_path) {
        snprintf(tpath, cap, "%s", tokenizer_path);
    } else {
        const char *slash = strrchr(path, '/');
        snprintf(tpath, cap, "%.*s%stokenizer.bin", slash ? (int)(slash - path) : 0, path, slash ? "/" : "");
        if (access(tpath, R_OK) != 0)
            return iflow_seterr(IFLOW_ENOTFOUND, "llama2.c checkpoint '%s' needs its tokenizer: no '%s' (give one with --tokenizer)",
                                path, tpath);
    }
    return read_whole(tpath, tok, len);
}

/* Version 2's weights as F32 into img (h->image bytes, in order_v1's order): the norms as they
 * are, each matrix's int8 values times their group's scale (runq.c's dequantization). */
static void dequantize_v2(float *img, const unsigned char *file, const l2c_header *h)
{
    const uint64_t D = (uint64_t)h->dim, L = (uint64_t)h->n_layers, norms = 2 * L * D + D;
    const unsigned char *p = file + h->header;
    memcpy(img, p, 4 * norms);
    img += norms, p += 4 * norms;
    static const int mats[] = {T_EMB, T_WQ, T_WK, T_WV, T_WO, T_W1, T_W2, T_W3, T_WCLS};
    for (size_t m = 0; m < sizeof mats / sizeof *mats; m++) {
        l2c_array a = array_of(h, mats[m]);
        if (mats[m] == T_WCLS && h->shared)
            continue;
        for (int l = 0; l < (a.per_layer ? h->n_layers : 1); l++) {
            const uint64_t n = a.ne0 * a.ne1;
            const int8_t *q = (const int8_t *)p;
            const unsigned char *sc = p + n;
            for (uint64_t g = 0; g < n / (uint64_t)h->gs; g++) {
                float s;
                memcpy(&s, sc + 4 * g, 4);
                for (int i = 0; i < h->gs; i++)
                    img[g * (uint64_t)h->gs + (uint64_t)i] = (float)q[g * (uint64_t)h->gs + (uint64_t)i] * s;
            }
            img += n, p += n + 4 * (n / (uint64_t)h->gs);
        }
    }
}

/* The GGUF of checkpoint `path` (open as fd, file_len bytes): header h's hyperparameters, the
 * tokenizer's vocabulary, tensors t[0..n) in the file; then the file mapped after it. */
static int make_gguf(iflow_gguf **out, const char *path, int fd, uint64_t file_len, const l2c_header *h,
                     const l2c_tensor *t, int n, const char *tokenizer_path)
{
    /* version 2: the data are the F32 image made from the file, not the file */
    const uint64_t data_len = h->version == 2 ? h->image : file_len;
    char tpath[4096];
    unsigned char *tok = NULL;
    size_t tok_len = 0;
    int rc = read_tokenizer(path, tokenizer_path, &tok, &tok_len, tpath, sizeof tpath);
    if (rc < 0)
        return rc;
    buf b = {0};
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n);
    put_u64(&b, 19);
    kv_str(&b, "general.architecture", "llama");
    kv_str(&b, "general.name", base);
    kv_u32(&b, "general.alignment", 2);
    kv_u32(&b, "llama.context_length", (uint32_t)h->seq_len);
    kv_u32(&b, "llama.embedding_length", (uint32_t)h->dim);
    kv_u32(&b, "llama.feed_forward_length", (uint32_t)h->hidden);
    kv_u32(&b, "llama.block_count", (uint32_t)h->n_layers);
    kv_u32(&b, "llama.attention.head_count", (uint32_t)h->n_heads);
    kv_u32(&b, "llama.attention.head_count_kv", (uint32_t)h->n_kv);
    kv_u32(&b, "llama.rope.dimension_count", (uint32_t)(h->dim / h->n_heads));
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);                /* run.c's */
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f); /* run.c's */
    kv_str(&b, "tokenizer.ggml.model", "llama");
    rc = put_vocab(&b, tok, tok_len, h->vocab, tpath);
    free(tok);
    if (rc < 0) {
        free(b.p);
        return rc;
    }
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&b, "tokenizer.ggml.unknown_token_id", 0);
    /* the table's size does not depend on the offsets: write it once with pad 0 to measure */
    size_t kv_end = b.n;
    put_table(&b, t, n, 0);
    uint64_t data_off = (b.n + 1) & ~(uint64_t)1, head = (data_off + PAGE - 1) & ~(uint64_t)(PAGE - 1);
    b.n = kv_end;
    put_table(&b, t, n, head - data_off);
    if (b.oom) {
        free(b.p);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", path);
    }
    /* [generated header, zero padding][the checkpoint], one range: the checkpoint's first byte
     * at page `head`, mapped over the reserved range */
    size_t total = (size_t)head + (size_t)data_len;
    unsigned char *map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        free(b.p);
        return iflow_seterr(IFLOW_ENOMEM, "cannot reserve %zu bytes of address space for '%s': %s", total, path,
                            strerror(e));
    }
    memcpy(map, b.p, b.n);
    free(b.p);
    int failed;
    if (h->version == 2) {
        void *file = mmap(NULL, (size_t)file_len, PROT_READ, MAP_PRIVATE, fd, 0);
        failed = file == MAP_FAILED;
        if (!failed) {
            dequantize_v2((float *)(map + head), file, h);
            munmap(file, (size_t)file_len);
        }
        failed = failed || mprotect(map, total, PROT_READ) != 0;
    } else {
        failed = mmap(map + head, (size_t)file_len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED ||
                 mprotect(map, (size_t)head, PROT_READ) != 0;
    }
    if (failed) {
        int e = errno;
        munmap(map, total);
        return iflow_seterr(IFLOW_EIO, "cannot map '%s': %s", path, strerror(e));
    }
    return iflow_gguf_open_mapped(out, map, total, path);
}

static int pt_open(iflow_gguf **out, const char *path, const char *tokenizer_path);

int iflow_llama2c_open(iflow_gguf **out, const char *path, const char *tokenizer_path)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return iflow_seterr(IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
    unsigned char hb[V1_HEADER] = {0};
    ssize_t got = fstat(fd, &sb) == 0 ? pread(fd, hb, sizeof hb, 0) : -1;
    if (got < 0) {
        int e = errno;
        close(fd);
        return iflow_seterr(IFLOW_EIO, "cannot read '%s': %s", path, strerror(e));
    }
    if (got >= 4 && !memcmp(hb, "PK\3\4", 4)) { /* a zip: torch.save's format */
        close(fd);
        return pt_open(out, path, tokenizer_path);
    }
    l2c_header h;
    int rc = parse_header(&h, hb, (size_t)got, path);
    if (rc == 0)
        rc = check_length(&h, (uint64_t)sb.st_size, path);
    l2c_tensor *t = NULL;
    int n = 0;
    if (rc == 0)
        rc = bin_tensors(&h, &t, &n);
    if (rc == 0)
        rc = make_gguf(out, path, fd, (uint64_t)sb.st_size, &h, t, n, tokenizer_path);
    free(t);
    close(fd);
    return rc;
}

/* ---- llama2.c's PyTorch training checkpoint (ckpt.pt) ------------------------------------------ */

/* llama2.c names under model. (or model._orig_mod. after torch.compile) -> GGUF names. */
static const struct {
    const char *pt, *gguf;
    int per_layer;
} pt_names[] = {
    {"tok_embeddings.weight", "token_embd.weight", 0},
    {"norm.weight", "output_norm.weight", 0},
    {"output.weight", "output.weight", 0},
    {"layers.%d.attention_norm.weight", "blk.%d.attn_norm.weight", 1},
    {"layers.%d.attention.wq.weight", "blk.%d.attn_q.weight", 1},
    {"layers.%d.attention.wk.weight", "blk.%d.attn_k.weight", 1},
    {"layers.%d.attention.wv.weight", "blk.%d.attn_v.weight", 1},
    {"layers.%d.attention.wo.weight", "blk.%d.attn_output.weight", 1},
    {"layers.%d.ffn_norm.weight", "blk.%d.ffn_norm.weight", 1},
    {"layers.%d.feed_forward.w1.weight", "blk.%d.ffn_gate.weight", 1},
    {"layers.%d.feed_forward.w2.weight", "blk.%d.ffn_down.weight", 1},
    {"layers.%d.feed_forward.w3.weight", "blk.%d.ffn_up.weight", 1},
};

static int arg_int(const json_t *args, const char *key, int fallback, int max, int *v, const char *path)
{
    const json_t *x = json_object_get(args, key);
    if (!x || json_is_null(x)) {
        if (fallback < 0)
            return iflow_seterr(IFLOW_EFORMAT, "llama2.c checkpoint '%s': model_args has no %s", path, key);
        *v = fallback;
        return 0;
    }
    json_int_t i = json_integer_value(x);
    if (!json_is_integer(x) || i < 1 || i > max)
        return iflow_seterr(IFLOW_EFORMAT, "llama2.c checkpoint '%s': model_args.%s is not a size from 1 to %d", path,
                            key, max);
    *v = (int)i;
    return 0;
}

/* The pt tensor prefix+name, checked: contiguous, F32/F16/BF16, of shape [d0] or [d0, d1]
 * (d1 0 for a vector); its table entry into *e. */
static int pt_entry(const iflow_pt *pt, const char *full, const char *gguf, int64_t d0, int64_t d1, l2c_tensor *e)
{
    const iflow_strided_tensor *s = iflow_pt_find(pt, full);
    if (!s)
        return iflow_seterr(IFLOW_ENOTFOUND, "llama2.c checkpoint '%s' has no tensor '%s'", iflow_pt_path(pt), full);
    const iflow_src_tensor *t = &s->t;
    int es = t->dtype == IFLOW_DT_F32 ? 4 : t->dtype == IFLOW_DT_F16 || t->dtype == IFLOW_DT_BF16 ? 2 : 0;
    if (!es || !s->contiguous)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' in '%s' is %s%s (iflow reads contiguous F32, F16, BF16)",
                            full, iflow_pt_path(pt), s->contiguous ? "" : "a strided view of ", t->dtype_name);
    if (t->n_dims != (d1 ? 2 : 1) || t->shape[0] != d0 || (d1 && t->shape[1] != d1))
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld], model_args give [%lld, %lld]",
                            full, iflow_pt_path(pt), (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)d0, (long long)d1);
    snprintf(e->name, sizeof e->name, "%s", gguf);
    e->ne0 = (uint64_t)(d1 ? d1 : d0), e->ne1 = d1 ? (uint64_t)d0 : 1;
    e->type = t->dtype == IFLOW_DT_F32 ? 0 : t->dtype == IFLOW_DT_F16 ? 1 : 30;
    e->off = t->file_offset + (uint64_t)s->storage_offset * (uint64_t)es;
    return 0;
}

static int pt_open(iflow_gguf **out, const char *path, const char *tokenizer_path)
{
    *out = NULL;
    iflow_pt *pt;
    int rc = iflow_pt_open(&pt, path);
    if (rc < 0)
        return rc;
    const json_t *args = json_object_get(iflow_pt_data(pt), "model_args");
    const char *prefix = iflow_pt_find(pt, "model._orig_mod.tok_embeddings.weight") ? "model._orig_mod." : "model.";
    char full[160];
    snprintf(full, sizeof full, "%stok_embeddings.weight", prefix);
    l2c_header h = {0};
    if (!json_is_object(args) || !iflow_pt_find(pt, full)) {
        iflow_pt_close(pt);
        return iflow_seterr(IFLOW_EFORMAT,
                            "PyTorch checkpoint '%s' is not a llama2.c training checkpoint (no model_args and "
                            "model.tok_embeddings.weight; a Hugging Face model is a directory)",
                            path);
    }
    if ((rc = arg_int(args, "dim", -1, DIM_MAX, &h.dim, path)) < 0 ||
        (rc = arg_int(args, "n_layers", -1, LAYERS_MAX, &h.n_layers, path)) < 0 ||
        (rc = arg_int(args, "n_heads", -1, DIM_MAX, &h.n_heads, path)) < 0 ||
        (rc = arg_int(args, "n_kv_heads", h.n_heads, DIM_MAX, &h.n_kv, path)) < 0 ||
        (rc = arg_int(args, "vocab_size", -1, DIM_MAX, &h.vocab, path)) < 0 ||
        (rc = arg_int(args, "max_seq_len", -1, DIM_MAX, &h.seq_len, path)) < 0) {
        iflow_pt_close(pt);
        return rc;
    }
    if (h.dim % h.n_heads || h.n_heads % h.n_kv) {
        iflow_pt_close(pt);
        return iflow_seterr(IFLOW_EFORMAT, "llama2.c checkpoint '%s': dim %d, n_heads %d, n_kv_heads %d do not divide",
                            path, h.dim, h.n_heads, h.n_kv);
    }
    /* the FFN width is w1's (model_args may derive it from multiple_of) */
    snprintf(full, sizeof full, "%slayers.0.feed_forward.w1.weight", prefix);
    const iflow_strided_tensor *w1 = iflow_pt_find(pt, full);
    h.hidden = w1 && w1->t.n_dims == 2 && w1->t.shape[0] > 0 && w1->t.shape[0] <= DIM_MAX ? (int)w1->t.shape[0] : 0;
    if (!h.hidden) {
        iflow_pt_close(pt);
        return iflow_seterr(IFLOW_EFORMAT, "llama2.c checkpoint '%s' has no 2-D tensor '%s'", path, full);
    }
    /* tied: output.weight absent, or the embedding's own bytes */
    const iflow_strided_tensor *emb = iflow_pt_find(pt, (snprintf(full, sizeof full, "%stok_embeddings.weight", prefix), full));
    const iflow_strided_tensor *outw = iflow_pt_find(pt, (snprintf(full, sizeof full, "%soutput.weight", prefix), full));
    h.shared = !outw || (outw->storage_data == emb->storage_data && outw->storage_offset == emb->storage_offset);
    const int64_t D = h.dim, H = h.hidden, V = h.vocab, kv = (int64_t)(h.dim / h.n_heads) * h.n_kv;
    const int64_t shape[][2] = {{V, D}, {D, 0}, {V, D}, {D, 0}, {D, D}, {kv, D}, {kv, D}, {D, D}, {D, 0}, {H, D}, {D, H}, {H, D}};
    l2c_tensor *t = calloc((size_t)h.n_layers * 9 + 3, sizeof *t);
    int n = 0;
    rc = t ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t k = 0; k < sizeof pt_names / sizeof *pt_names && rc == 0; k++) {
        if (k == 2 && h.shared)
            continue;
        for (int l = 0; l < (pt_names[k].per_layer ? h.n_layers : 1) && rc == 0; l++) {
            char name[96], gguf[96];
            snprintf(name, sizeof name, pt_names[k].pt, l);
            snprintf(gguf, sizeof gguf, pt_names[k].gguf, l);
            snprintf(full, sizeof full, "%s%s", prefix, name);
            rc = pt_entry(pt, full, gguf, shape[k][0], shape[k][1], &t[n++]);
        }
    }
    int fd = rc == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat sb;
    if (rc == 0 && (fd < 0 || fstat(fd, &sb) != 0))
        rc = iflow_seterr(IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
    iflow_pt_close(pt); /* its checks are done; the GGUF maps the file again */
    if (rc == 0)
        rc = make_gguf(out, path, fd, (uint64_t)sb.st_size, &h, t, n, tokenizer_path);
    if (fd >= 0)
        close(fd);
    free(t);
    return rc;
}
