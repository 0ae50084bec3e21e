/* llama2c.c -- llama2.c checkpoints and tokenizers as a GGUF (contract and layout in llama2c.h). */
#include "llama2c.h"
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
    int version; /* 0 (legacy) or 1 */
    int dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len, shared;
    size_t header; /* bytes before the weights */
    uint64_t len;  /* the file length the header implies */
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
        if (h->version != 1)
            return iflow_seterr(IFLOW_EUNSUPPORTED,
                                "llama2.c checkpoint '%s' is version %d (byte 4): iflow reads the legacy format and version 1",
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
        int x = i == 5 && h->version == 0 ? (v[i] < 0 ? -v[i] : v[i]) : v[i];
        int max = i == 2 ? LAYERS_MAX : DIM_MAX;
        if (x < 1 || x > max || v[i] == INT32_MIN)
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

int iflow_llama2c_check_header(const void *buf, size_t len, const char *name)
{
    l2c_header h;
    int rc = parse_header(&h, buf, len, name);
    if (rc == 0 && h.len != len)
        rc = iflow_seterr(h.len > len ? IFLOW_ETRUNC : IFLOW_EFORMAT,
                          "llama2.c checkpoint '%s' is %zu bytes; its header (dim %d, hidden %d, %d layers, vocab %d) "
                          "needs %llu",
                          name, len, h.dim, h.hidden, h.n_layers, h.vocab, (unsigned long long)h.len);
    return rc;
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

/* Writes the tensor table (or counts its entries when b is NULL) with offsets = pad + file offset. */
static int put_tensors(buf *b, const l2c_header *h, uint64_t pad)
{
    const int *order = h->version ? order_v1 : order_v0;
    int n_order = h->version ? (int)(sizeof order_v1 / sizeof *order_v1) : (int)(sizeof order_v0 / sizeof *order_v0);
    uint64_t off = h->header;
    int count = 0;
    for (int k = 0; k < n_order; k++) {
        l2c_array a = array_of(h, order[k]);
        if (order[k] == T_WCLS && h->shared)
            continue;
        for (int l = 0; l < (a.per_layer ? h->n_layers : 1); l++) {
            if (a.name) {
                count++;
                if (b) {
                    char name[64];
                    int n = snprintf(name, sizeof name, a.name, l);
                    put_str(b, name, (size_t)n);
                    put_u32(b, a.ne1 > 1 ? 2 : 1);
                    put_u64(b, a.ne0);
                    if (a.ne1 > 1)
                        put_u64(b, a.ne1);
                    put_u32(b, 0); /* F32 */
                    put_u64(b, pad + off);
                }
            }
            off += 4 * a.ne0 * a.ne1;
        }
    }
    return count;
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
    if (rd_u32(b) == L2C_MAGIC)
        return 1;
    l2c_header h;
    return parse_header(&h, b, sizeof b, path) == 0 && h.len == (uint64_t)sb.st_size;
}

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
    l2c_header h;
    int rc = parse_header(&h, hb, (size_t)got, path);
    if (rc == 0 && h.len != (uint64_t)sb.st_size)
        rc = iflow_seterr(h.len > (uint64_t)sb.st_size ? IFLOW_ETRUNC : IFLOW_EFORMAT,
                          "llama2.c checkpoint '%s' is %lld bytes; its header (dim %d, hidden %d, %d layers, vocab %d) "
                          "needs %llu",
                          path, (long long)sb.st_size, h.dim, h.hidden, h.n_layers, h.vocab, (unsigned long long)h.len);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    /* the tokenizer: given, or tokenizer.bin beside the checkpoint */
    char tpath[4096];
    if (tokenizer_path) {
        snprintf(tpath, sizeof tpath, "%s", tokenizer_path);
    } else {
        const char *slash = strrchr(path, '/');
        snprintf(tpath, sizeof tpath, "%.*s%stokenizer.bin", slash ? (int)(slash - path) : 0, path, slash ? "/" : "");
        if (access(tpath, R_OK) != 0) {
            close(fd);
            return iflow_seterr(IFLOW_ENOTFOUND,
                                "llama2.c checkpoint '%s' needs its tokenizer: no '%s' (give one with --tokenizer)", path,
                                tpath);
        }
    }
    unsigned char *tok = NULL;
    size_t tok_len = 0;
    if ((rc = read_whole(tpath, &tok, &tok_len)) < 0) {
        close(fd);
        return rc;
    }
    /* the GGUF header: magic, version, counts, key-values, tensor table */
    buf b = {0};
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int n_tensors = put_tensors(NULL, &h, 0);
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n_tensors);
    put_u64(&b, 19);
    kv_str(&b, "general.architecture", "llama");
    kv_str(&b, "general.name", base);
    kv_u32(&b, "general.alignment", 4);
    kv_u32(&b, "llama.context_length", (uint32_t)h.seq_len);
    kv_u32(&b, "llama.embedding_length", (uint32_t)h.dim);
    kv_u32(&b, "llama.feed_forward_length", (uint32_t)h.hidden);
    kv_u32(&b, "llama.block_count", (uint32_t)h.n_layers);
    kv_u32(&b, "llama.attention.head_count", (uint32_t)h.n_heads);
    kv_u32(&b, "llama.attention.head_count_kv", (uint32_t)h.n_kv);
    kv_u32(&b, "llama.rope.dimension_count", (uint32_t)(h.dim / h.n_heads));
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);                /* run.c's */
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f); /* run.c's */
    kv_str(&b, "tokenizer.ggml.model", "llama");
    if ((rc = put_vocab(&b, tok, tok_len, h.vocab, tpath)) < 0) {
        free(tok), free(b.p), close(fd);
        return rc;
    }
    free(tok);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&b, "tokenizer.ggml.unknown_token_id", 0);
    /* the table's size does not depend on the offsets: write it once with pad 0 to measure */
    size_t kv_end = b.n;
    put_tensors(&b, &h, 0);
    uint64_t data_off = (b.n + 3) & ~(uint64_t)3, head = (data_off + PAGE - 1) & ~(uint64_t)(PAGE - 1);
    b.n = kv_end;
    put_tensors(&b, &h, head - data_off);
    if (b.oom) {
        free(b.p), close(fd);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", path);
    }
    /* [generated header, zero padding][the checkpoint], one range: the checkpoint's first byte
     * at page `head`, mapped over the reserved range */
    size_t total = (size_t)head + (size_t)sb.st_size;
    unsigned char *map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        free(b.p), close(fd);
        return iflow_seterr(IFLOW_ENOMEM, "cannot reserve %zu bytes of address space for '%s': %s", total, path,
                            strerror(e));
    }
    memcpy(map, b.p, b.n);
    free(b.p);
    if (mmap(map + head, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED ||
        mprotect(map, (size_t)head, PROT_READ) != 0) {
        int e = errno;
        munmap(map, total), close(fd);
        return iflow_seterr(IFLOW_EIO, "cannot map '%s': %s", path, strerror(e));
    }
    close(fd);
    return iflow_gguf_open_mapped(out, map, total, path);
}
