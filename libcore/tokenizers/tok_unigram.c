/* tok_unigram.c -- the unigram model (Kudo 2018): pieces with log-probability scores in a byte
 * trie, and the Viterbi segmentation of a word into the pieces of highest total score, as
 * SentencePiece's optimized encoder and HF tokenizers' Unigram run it. Unknown characters get
 * the unknown piece at min score - 10; a run of them becomes one token (or its bytes with byte
 * fallback). SentencePiece (u->spm) sums in float, gives user-defined pieces a bonus so they
 * always win and skips unused pieces; HF sums in double over every piece of its vocabulary. */
#include "libcore/base/error.h"
#include "tok_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct uni_best {
    double score;  /* of the best path ending here */
    int32_t start; /* where its last piece starts, -1: not reached */
    int32_t piece; /* its last piece (u->unk for an unknown character) */
} uni_best;

/* ---- building ----------------------------------------------------------------------------- */

int tok_unigram_alloc(tok_unigram **out, int32_t n, size_t bytes, int spm)
{
    tok_unigram *u = calloc(1, sizeof *u);
    *out = u;
    if (!u)
        return tok_nomem();
    u->spm = spm;
    u->n = n;
    u->unk = -1;
    u->arena = malloc(bytes + 1);
    u->off = calloc((size_t)n + 1, sizeof *u->off);
    u->len = calloc((size_t)n + 1, sizeof *u->len);
    u->type = malloc((size_t)n + 1);
    u->score = calloc((size_t)n + 1, sizeof *u->score);
    u->to_id = malloc(((size_t)n + 1) * sizeof *u->to_id);
    if (!u->arena || !u->off || !u->len || !u->type || !u->score || !u->to_id)
        return tok_nomem();
    memset(u->type, TOK_NORMAL, (size_t)n + 1);
    for (int32_t i = 0; i < n; i++)
        u->to_id[i] = i;
    for (int b = 0; b < 256; b++)
        u->byte_piece[b] = -1;
    return 0;
}

void tok_unigram_free(tok_unigram *u)
{
    if (!u)
        return;
    free(u->arena);
    free(u->off);
    free(u->len);
    free(u->type);
    free(u->score);
    free(u->to_id);
    free(u->nodes);
    tok_charsmap_free(&u->cm);
    free(u);
}

/* Does piece p take part in the Viterbi? SentencePiece's trie holds normal, user-defined and
 * unused pieces (control, unknown and byte pieces are matched by id only); HF's holds all. */
static int in_trie(const tok_unigram *u, int32_t p)
{
    int a = u->type[p];
    return !u->spm || a == TOK_NORMAL || a == TOK_USER || a == TOK_UNUSED;
}

typedef struct {
    const char *s;
    uint32_t len;
    int32_t id;
} piece_key;

static int piece_cmp(const void *pa, const void *pb)
{
    const piece_key *a = pa, *b = pb;
    int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
    if (c == 0 && a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return c ? c : (a->id > b->id) - (a->id < b->id);
}

/* The trie pieces sorted by text (ties by id); *m of them. */
static int sorted_pieces(const tok_unigram *u, int32_t **out, int32_t *m)
{
    piece_key *keys = malloc(((size_t)u->n + 1) * sizeof *keys);
    int32_t *idx = malloc(((size_t)u->n + 1) * sizeof *idx), k = 0;
    if (!keys || !idx) {
        free(keys);
        free(idx);
        return tok_nomem();
    }
    for (int32_t p = 0; p < u->n; p++)
        if (in_trie(u, p) && u->len[p])
            keys[k++] = (piece_key){tok_piece_text(u, p), u->len[p], p};
    qsort(keys, (size_t)k, sizeof *keys, piece_cmp);
    for (int32_t i = 0; i < k; i++)
        idx[i] = keys[i].id;
    free(keys);
    *out = idx;
    *m = k;
    return 0;
}

static int duplicate(const tok_unigram *u, int32_t a, int32_t b, const char *name)
{
    return iflow_seterr(IFLOW_EFORMAT, "pieces %d and %d are both '%.*s' in '%s'", a, b,
                        (int)(u->len[a] > 40 ? 40 : u->len[a]), tok_piece_text(u, a), name);
}

/* Breadth-first over sorted pieces: node i covers idx[lo[i], hi[i]) at depth dep[i]; its
 * children get consecutive nodes. Duplicate texts: SentencePiece refuses them, HF keeps the
 * last id (its token -> id map is filled in order). */
typedef struct {
    int32_t *lo, *hi, *dep;
} trie_ranges;

/* The piece ending at this node (*value, -1 if none), consuming those entries of idx[*lo..hi). */
static int trie_node_value(tok_unigram *u, const int32_t *idx, int32_t *lo, int32_t hi, int32_t depth, int32_t *value,
                           const char *name)
{
    *value = -1;
    for (; *lo < hi && (int32_t)u->len[idx[*lo]] == depth; (*lo)++) {
        if (*value >= 0 && u->spm)
            return duplicate(u, *value, idx[*lo], name);
        *value = idx[*lo];
    }
    return 0;
}

static void trie_children(tok_unigram *u, const int32_t *idx, trie_ranges *r, int32_t i, int32_t lo, int32_t hi)
{
    int32_t d = r->dep[i];
    u->nodes[i].child = u->n_nodes;
    while (lo < hi) {
        uint8_t b = (uint8_t)tok_piece_text(u, idx[lo])[d];
        int32_t e = lo + 1;
        while (e < hi && (uint8_t)tok_piece_text(u, idx[e])[d] == b)
            e++;
        int32_t c = u->n_nodes++;
        u->nodes[c] = (tok_trie_node){.child = -1, .value = -1, .byte = b};
        r->lo[c] = lo;
        r->hi[c] = e;
        r->dep[c] = d + 1;
        u->nodes[i].n_child++;
        lo = e;
    }
}

static int build_trie(tok_unigram *u, const int32_t *idx, int32_t m, size_t cap, const char *name)
{
    trie_ranges r = {malloc(cap * sizeof(int32_t)), malloc(cap * sizeof(int32_t)), malloc(cap * sizeof(int32_t))};
    int rc = 0;
    if (!(u->nodes = calloc(cap, sizeof *u->nodes)) || !r.lo || !r.hi || !r.dep)
        rc = tok_nomem();
    if (rc == 0) {
        u->nodes[0] = (tok_trie_node){.child = -1, .value = -1};
        r.lo[0] = 0, r.hi[0] = m, r.dep[0] = 0;
        u->n_nodes = 1;
    }
    for (int32_t i = 0; rc == 0 && i < u->n_nodes; i++) {
        int32_t lo = r.lo[i];
        rc = trie_node_value(u, idx, &lo, r.hi[i], r.dep[i], &u->nodes[i].value, name);
        if (rc == 0)
            trie_children(u, idx, &r, i, lo, r.hi[i]);
    }
    free(r.lo);
    free(r.hi);
    free(r.dep);
    return rc;
}

static void index_root(tok_unigram *u)
{
    for (int b = 0; b < 256; b++)
        u->root[b] = -1;
    for (int32_t c = 0; c < u->nodes[0].n_child; c++)
        u->root[u->nodes[u->nodes[0].child + c].byte] = u->nodes[0].child + c;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The value of "<0xXX>" (upper-case hex, as SentencePiece writes it), or -1. */
static int byte_value(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || hex_digit(s[3]) < 0 || hex_digit(s[4]) < 0)
        return -1;
    return hex_digit(s[3]) * 16 + hex_digit(s[4]);
}

/* SentencePiece's InitializePieces checks, and the unknown and byte pieces. */
static int spm_pieces(tok_unigram *u, const char *name)
{
    int32_t n_unk = 0, n_bytes = 0;
    for (int32_t p = 0; p < u->n; p++) {
        int b = u->type[p] == TOK_BYTE ? byte_value(tok_piece_text(u, p), u->len[p]) : 0;
        if (u->len[p] == 0)
            return iflow_seterr(IFLOW_EFORMAT, "piece %d is empty in '%s'", p, name);
        if (u->type[p] == TOK_UNKNOWN)
            u->unk = n_unk++ ? u->unk : p;
        if (u->type[p] == TOK_BYTE && (!u->byte_fallback || b < 0))
            return iflow_seterr(IFLOW_EFORMAT, "byte piece %d ('%.*s') %s in '%s'", p, (int)(u->len[p] > 20 ? 20 : u->len[p]),
                                tok_piece_text(u, p), b < 0 ? "is not <0xXX>" : "without byte_fallback", name);
        if (u->type[p] == TOK_BYTE && u->byte_piece[b] < 0)
            u->byte_piece[b] = p, n_bytes++;
    }
    if (n_unk != 1)
        return iflow_seterr(IFLOW_EFORMAT, "%s unknown piece in '%s'", n_unk ? "more than one" : "no", name);
    if (u->byte_fallback && n_bytes != 256)
        return iflow_seterr(IFLOW_EFORMAT, "byte_fallback with %d of the 256 byte pieces in '%s'", n_bytes, name);
    return 0;
}

/* Reserved pieces (control, unknown, byte) are looked up by text too: no two may share one. */
static int spm_reserved_unique(const tok_unigram *u, const char *name)
{
    iflow_strmap seen = {0};
    int rc = 0;
    for (int32_t p = 0; rc == 0 && p < u->n; p++) {
        if (in_trie(u, p))
            continue;
        int32_t q = iflow_strmap_get(&seen, tok_piece_text(u, p), u->len[p]);
        rc = q >= 0 ? duplicate(u, q, p, name) : iflow_strmap_put(&seen, tok_piece_text(u, p), u->len[p], p);
        rc = rc > 0 ? 0 : rc;
    }
    iflow_strmap_free(&seen);
    return rc;
}

/* SentencePiece: min and max over normal pieces, the max starting at FLT_MIN (so an all-negative
 * model keeps it); HF: min over all pieces. The unknown piece scores min - 10. */
static void set_scores(tok_unigram *u)
{
    double lo = u->spm ? FLT_MAX : HUGE_VAL;
    float hi = FLT_MIN;
    for (int32_t p = 0; p < u->n; p++) {
        u->has_user |= u->spm && u->type[p] == TOK_USER;
        if (u->spm && u->type[p] != TOK_NORMAL)
            continue;
        lo = u->score[p] < lo ? u->score[p] : lo;
        hi = (float)u->score[p] > hi ? (float)u->score[p] : hi;
    }
    u->unk_score = u->spm ? (double)((float)lo - 10.0f) : lo - 10.0;
    u->max_score = hi;
}

int tok_unigram_finish(tok_unigram *u, const char *name)
{
    int32_t *idx = NULL, m = 0;
    size_t bytes = 1;
    int rc = u->spm ? spm_pieces(u, name) : 0;
    if (rc == 0 && u->spm)
        rc = spm_reserved_unique(u, name);
    if (rc == 0)
        rc = sorted_pieces(u, &idx, &m);
    for (int32_t i = 0; rc == 0 && i < m; i++)
        bytes += u->len[idx[i]];
    if (rc == 0)
        rc = build_trie(u, idx, m, bytes, name);
    free(idx);
    if (rc < 0)
        return rc;
    index_root(u);
    set_scores(u);
    return 0;
}

/* ---- matching ----------------------------------------------------------------------------- */

static int32_t child(const tok_unigram *u, int32_t node, uint8_t b)
{
    if (node == 0)
        return u->root[b];
    int32_t lo = u->nodes[node].child, hi = lo + u->nodes[node].n_child;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (u->nodes[mid].byte < b)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < u->nodes[node].child + u->nodes[node].n_child && u->nodes[lo].byte == b ? lo : -1;
}

size_t tok_unigram_user_prefix(const tok_unigram *u, const char *s, size_t n)
{
    size_t best = 0;
    for (int32_t node = 0, i = 0; (size_t)i < n && (node = child(u, node, (uint8_t)s[i])) >= 0; i++) {
        int32_t v = u->nodes[node].value;
        if (v >= 0 && u->type[v] == TOK_USER)
            best = (size_t)i + 1;
    }
    return best;
}

/* SentencePiece's OneCharLen: the length a UTF-8 lead byte announces (1 for anything else). */
static size_t char_len(uint8_t c)
{
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Score of the path through `base` extended by piece p of len bytes (p == u->unk for an unknown
 * character), in the arithmetic of the reference: SentencePiece adds floats, except that a
 * user-defined piece scores len * max_score - 0.1 in double; HF adds doubles. */
static double extend(const tok_unigram *u, double base, int32_t p, size_t len, int unknown)
{
    double sc = unknown ? u->unk_score : u->score[p];
    if (!u->spm)
        return sc + base;
    if (!unknown && u->type[p] == TOK_USER)
        return (double)((float)len * u->max_score) - 0.1 + base;
    return (double)((float)sc + (float)base);
}

static void relax(const tok_unigram *u, uni_best *b, int32_t start, double cand, int32_t piece)
{
    if (b->start < 0 || cand > b->score) {
        b->score = u->spm ? (double)(float)cand : cand;
        b->start = start;
        b->piece = piece;
    }
}

/* Every piece starting at pos; 1 when one of them is exactly the character of mblen bytes. */
static int pieces_at(const tok_unigram *u, uni_best *best, const char *w, size_t n, size_t pos, size_t mblen)
{
    int single = 0;
    double base = best[pos].score;
    int32_t node = 0;
    for (size_t i = pos; i < n && (node = child(u, node, (uint8_t)w[i])) >= 0; i++) {
        int32_t p = u->nodes[node].value;
        if (p < 0 || (u->spm && u->type[p] == TOK_UNUSED))
            continue;
        relax(u, &best[i + 1], (int32_t)pos, extend(u, base, p, i + 1 - pos, 0), p);
        single |= i + 1 - pos == mblen;
    }
    return single;
}

static int viterbi(const tok_unigram *u, uni_best *best, const char *w, size_t n)
{
    for (size_t i = 0; i <= n; i++)
        best[i] = (uni_best){0.0, -1, -1};
    for (size_t pos = 0; pos < n;) {
        size_t mblen = char_len((uint8_t)w[pos]);
        mblen = mblen < n - pos ? mblen : n - pos;
        if (!pieces_at(u, best, w, n, pos, mblen)) {
            if (u->unk < 0)
                return iflow_seterr(IFLOW_EINVAL, "no token for '%.*s' and no unknown token", (int)mblen, w + pos);
            relax(u, &best[pos + mblen], (int32_t)pos, extend(u, best[pos].score, u->unk, mblen, 1), u->unk);
        }
        pos += mblen;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------------------------- */

static int push_bytes(const iflow_tokenizer *t, const char *s, size_t n, tok_ids *out)
{
    const tok_unigram *u = t->uni;
    for (size_t i = 0; i < n; i++) {
        int32_t p = u->spm ? u->byte_piece[(uint8_t)s[i]] : -1;
        int32_t id = u->spm ? u->to_id[p] : t->byte_tok[(uint8_t)s[i]];
        if (tok_ids_push(out, id) < 0)
            return IFLOW_ENOMEM;
    }
    return 0;
}

static int has_all_bytes(const iflow_tokenizer *t, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (t->byte_tok[(uint8_t)s[i]] < 0)
            return 0;
    return 1;
}

/* A run of unknown characters s[0..n): its bytes (SentencePiece with byte fallback), else the
 * vocabulary's token of that text (HF; a Marian vocab.json), else its bytes (HF with byte
 * fallback), else the unknown token. */
static int push_unknown(const iflow_tokenizer *t, const char *s, size_t n, tok_ids *out)
{
    const tok_unigram *u = t->uni;
    int32_t id = -1;
    if (u->spm && u->byte_fallback)
        return push_bytes(t, s, n, out);
    if (u->lookup_unk)
        id = iflow_strmap_get(&t->vocab, s, n);
    if (id < 0 && !u->spm && u->byte_fallback && has_all_bytes(t, s, n))
        return push_bytes(t, s, n, out);
    return tok_ids_push(out, id >= 0 ? id : t->unk);
}

/* Walk the best path back from n, reversing the links in place, then emit forward. */
static int emit(const iflow_tokenizer *t, uni_best *best, const char *w, size_t n, tok_ids *out)
{
    const tok_unigram *u = t->uni;
    int32_t next = (int32_t)n;
    for (int32_t end = (int32_t)n; end > 0;) {
        int32_t start = best[end].start;
        best[end].start = next; /* now: where the piece ending at `end`'s successor ends */
        next = end;
        end = start;
    }
    int rc = 0;
    for (int32_t s = 0, e = next; rc == 0 && s < (int32_t)n;) {
        int32_t p = best[e].piece, stop = e;
        if (p == u->unk) {
            while (stop < (int32_t)n && best[best[stop].start].piece == u->unk)
                stop = best[stop].start;
            rc = push_unknown(t, w + s, (size_t)(stop - s), out);
        } else {
            rc = tok_ids_push(out, u->to_id[p]);
        }
        s = stop;
        e = best[stop].start;
    }
    return rc;
}

int tok_unigram_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out)
{
    if (n == 0)
        return 0;
    if (n >= INT32_MAX)
        return iflow_seterr(IFLOW_ERANGE, "a word of %zu bytes is too long", n);
    if (tok_grow((void **)&s->best, &s->cap_best, n + 1, sizeof *s->best) < 0)
        return IFLOW_ENOMEM;
    int rc = viterbi(t->uni, s->best, w, n);
    return rc < 0 ? rc : emit(t, s->best, w, n, out);
}
