/* tok_bpe.c -- BPE merging of one word: by merge rank (HF BPE, GGUF gpt2) or by the score of
 * the merged piece (SentencePiece BPE: GGUF llama's vocabulary, or a BPE .spm's pieces).
 * Symbols form a linked list over the word; candidate pairs sit in a binary heap ordered by
 * (priority, left position), and stale candidates are skipped when popped, so a word of n units
 * costs O(n log n). A BPE .spm (t->spm_bpe) follows sentencepiece's bpe_model.cc: the symbols
 * start as characters (OneCharLen) or whole user-defined pieces, which never merge; a pair
 * merges when its text is a normal, user-defined or unused piece, the best score first; an
 * unused piece is split back into the two parts that made it (the last such pair queued); a
 * character that is no piece is unknown, and a run of them is one token (or its bytes). */
#include "libcore/base/error.h"
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct bpe_sym {
    int32_t id;          /* token id (a .spm: piece), -1 if the text is none (score mode only) */
    int32_t prev, next;  /* neighbours in the list, -1 at the ends */
    uint32_t start, len; /* bytes of the word; len 0 = merged away */
    int frozen;          /* a .spm's user-defined piece: never merged */
};

struct bpe_pair {
    float prio;          /* lower merges first: the rank, or minus the score */
    int32_t left, right;
    int32_t id;          /* token the merge makes */
    uint32_t size;       /* left.len + right.len when queued */
};

/* ---- heap --------------------------------------------------------------------------------- */

static int pair_less(const bpe_pair *a, const bpe_pair *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(tok_scratch *s, bpe_pair p)
{
    if (tok_grow((void **)&s->heap, &s->cap_heap, s->n_heap + 1, sizeof *s->heap) < 0)
        return IFLOW_ENOMEM;
    size_t i = s->n_heap++;
    while (i > 0 && pair_less(&p, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = p;
    return 0;
}

static bpe_pair heap_pop(tok_scratch *s)
{
    bpe_pair top = s->heap[0], last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_less(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!pair_less(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n)
        s->heap[i] = last;
    return top;
}

/* ---- symbols ------------------------------------------------------------------------------ */

static int sym_push(tok_scratch *s, size_t *n, int32_t id, size_t start, size_t len)
{
    if (tok_grow((void **)&s->syms, &s->cap_syms, *n + 1, sizeof *s->syms) < 0)
        return IFLOW_ENOMEM;
    s->syms[*n] = (bpe_sym){id, (int32_t)*n - 1, (int32_t)*n + 1, (uint32_t)start, (uint32_t)len, 0};
    (*n)++;
    return 0;
}

/* A character that is not a token: byte fallback, else <unk> (fused), else dropped (as HF). */
static int sym_unknown(const iflow_tokenizer *t, tok_scratch *s, size_t *n, const char *w, size_t i, size_t k)
{
    int all = t->byte_fallback;
    for (size_t j = 0; all && j < k; j++)
        all = t->byte_tok[(uint8_t)w[i + j]] >= 0;
    if (all) {
        for (size_t j = 0; j < k; j++)
            if (sym_push(s, n, t->byte_tok[(uint8_t)w[i + j]], i + j, 1) < 0)
                return IFLOW_ENOMEM;
        return 0;
    }
    if (t->unk < 0)
        return 0;
    bpe_sym *last = *n ? &s->syms[*n - 1] : NULL;
    if (t->fuse_unk && last && last->id == t->unk && last->start + last->len == i) {
        last->len += (uint32_t)k;
        return 0;
    }
    return sym_push(s, n, t->unk, i, k);
}

/* A .spm's symbols: each user-defined piece at the start of the rest (the longest; frozen), else
 * one character as sentencepiece's OneCharLen measures it, with its piece or -1. */
static int init_spm_syms(const tok_unigram *u, tok_scratch *s, const char *w, size_t n, size_t *nsym)
{
    for (size_t i = 0; i < n;) {
        size_t k = u->has_user ? tok_unigram_user_prefix(u, w + i, n - i) : 0, c = tok_spm_char_len((uint8_t)w[i]);
        int frozen = k > 0;
        k = k ? k : c < n - i ? c : n - i;
        if (sym_push(s, nsym, tok_unigram_find(u, w + i, k), i, k) < 0)
            return IFLOW_ENOMEM;
        s->syms[*nsym - 1].frozen = frozen;
        i += k;
    }
    return 0;
}

/* One symbol per character (UTF-8 unit); returns the count or < 0. */
static int init_syms(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, size_t *nsym)
{
    *nsym = 0;
    if (t->spm_bpe) {
        int rc = init_spm_syms(t->uni, s, w, n, nsym);
        if (rc < 0)
            return rc;
        if (*nsym)
            s->syms[*nsym - 1].next = -1;
        return 0;
    }
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = (size_t)tok_utf8_next(w + i, n - i, &cp);
        int32_t id = iflow_strmap_get(&t->vocab, w + i, k);
        int rc = id >= 0 || t->by_score ? sym_push(s, nsym, id, i, k) : sym_unknown(t, s, nsym, w, i, k);
        if (rc < 0)
            return rc;
        i += k;
    }
    if (*nsym)
        s->syms[*nsym - 1].next = -1;
    return 0;
}

/* ---- merging ------------------------------------------------------------------------------ */

/* Queue the pair (left, right) if it can merge. */
static int try_pair(const iflow_tokenizer *t, tok_scratch *s, const char *w, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    const bpe_sym *l = &s->syms[left], *r = &s->syms[right];
    bpe_pair p = {0, left, right, -1, l->len + r->len};
    if (t->spm_bpe) {
        const tok_unigram *u = t->uni;
        if (l->frozen || r->frozen || (p.id = tok_unigram_find(u, w + l->start, p.size)) < 0)
            return 0;
        p.prio = -(float)u->score[p.id];
        if (u->type[p.id] == TOK_UNUSED && (tok_ids_push(&s->rev, p.id) < 0 || tok_ids_push(&s->rev, (int32_t)l->len) < 0))
            return IFLOW_ENOMEM;
    } else if (t->by_score) {
        p.id = iflow_strmap_get(&t->vocab, w + l->start, p.size);
        if (p.id < 0)
            return 0;
        p.prio = -t->scores[p.id];
    } else {
        int32_t rank;
        if (l->id < 0 || r->id < 0 || !iflow_u64map_get(&t->merges, (uint64_t)l->id << 32 | (uint32_t)r->id, &rank, &p.id))
            return 0;
        p.prio = (float)rank;
    }
    return heap_push(s, p);
}

static int stale(const tok_scratch *s, const bpe_pair *p)
{
    const bpe_sym *l = &s->syms[p->left], *r = &s->syms[p->right];
    return l->len == 0 || r->len == 0 || l->next != p->right || l->len + r->len != p->size;
}

/* Merge right into left, then queue the new neighbours. */
static int merge(const iflow_tokenizer *t, tok_scratch *s, const char *w, const bpe_pair *p)
{
    bpe_sym *l = &s->syms[p->left], *r = &s->syms[p->right];
    l->len += r->len;
    l->id = p->id;
    l->next = r->next;
    if (r->next >= 0)
        s->syms[r->next].prev = p->left;
    r->len = 0;
    int rc = try_pair(t, s, w, l->prev, p->left);
    return rc < 0 ? rc : try_pair(t, s, w, p->left, l->next);
}

static int run_merges(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t nsym)
{
    s->n_heap = 0;
    for (size_t i = 1; i < nsym; i++) {
        int rc = try_pair(t, s, w, (int32_t)i - 1, (int32_t)i);
        if (rc < 0)
            return rc;
    }
    while (s->n_heap) {
        bpe_pair p = heap_pop(s);
        if (stale(s, &p))
            continue;
        int rc = merge(t, s, w, &p);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* A symbol whose text is no token (score mode): its bytes as <0xXX> tokens, else <unk>. */
static int emit_bytes(const iflow_tokenizer *t, const char *w, const bpe_sym *sym, tok_ids *out)
{
    int all = 1;
    for (uint32_t j = 0; all && j < sym->len; j++)
        all = t->byte_tok[(uint8_t)w[sym->start + j]] >= 0;
    if (!all)
        return t->unk >= 0 ? tok_ids_push(out, t->unk) : 0;
    for (uint32_t j = 0; j < sym->len; j++)
        if (tok_ids_push(out, t->byte_tok[(uint8_t)w[sym->start + j]]) < 0)
            return IFLOW_ENOMEM;
    return 0;
}

/* ---- a .spm's output --------------------------------------------------------------------- */

/* A run of unknown characters waiting for its end (sentencepiece makes one token of it). */
typedef struct {
    size_t start, len;
} unk_run;

static int flush_unknown(const iflow_tokenizer *t, const char *w, unk_run *run, tok_ids *out)
{
    int rc = run->len ? tok_unigram_unknown(t, w + run->start, run->len, out) : 0;
    run->len = 0;
    return rc;
}

/* The bytes of the left part of the last queued pair that made unused piece p, 0 if none. */
static uint32_t rev_left(const tok_scratch *s, int32_t p)
{
    for (size_t i = s->rev.n; i >= 2; i -= 2)
        if (s->rev.p[i - 2] == p)
            return (uint32_t)s->rev.p[i - 1];
    return 0;
}

/* Symbol text w[start, start + len) with piece p (-1: unknown): an unused piece split back
 * into its parts (recursively), an unknown one added to the run, a piece's id emitted. */
static int spm_emit(const iflow_tokenizer *t, const tok_scratch *s, const char *w, uint32_t start, uint32_t len, int32_t p,
                    unk_run *run, tok_ids *out)
{
    const tok_unigram *u = t->uni;
    uint32_t left = p >= 0 && u->type[p] == TOK_UNUSED ? rev_left(s, p) : 0;
    int rc;
    if (left > 0 && left < len) {
        rc = spm_emit(t, s, w, start, left, tok_unigram_find(u, w + start, left), run, out);
        return rc < 0 ? rc : spm_emit(t, s, w, start + left, len - left, tok_unigram_find(u, w + start + left, len - left),
                                      run, out);
    }
    if (p < 0) {
        run->start = run->len ? run->start : start;
        run->len += len;
        return 0;
    }
    rc = flush_unknown(t, w, run, out);
    return rc < 0 ? rc : tok_ids_push(out, u->to_id[p]);
}

static int spm_output(const iflow_tokenizer *t, const tok_scratch *s, const char *w, size_t nsym, tok_ids *out)
{
    unk_run run = {0, 0};
    int rc = 0;
    for (int32_t i = nsym ? 0 : -1; i >= 0 && rc == 0; i = s->syms[i].next)
        rc = spm_emit(t, s, w, s->syms[i].start, s->syms[i].len, s->syms[i].id, &run, out);
    return rc < 0 ? rc : flush_unknown(t, w, &run, out);
}

static int bpe_piece(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out)
{
    size_t nsym;
    s->rev.n = 0;
    int rc = init_syms(t, s, w, n, &nsym);
    if (rc < 0 || (rc = run_merges(t, s, w, nsym)) < 0)
        return rc;
    if (t->spm_bpe)
        return spm_output(t, s, w, nsym, out);
    for (int32_t i = nsym ? 0 : -1; i >= 0; i = s->syms[i].next) {
        const bpe_sym *sym = &s->syms[i];
        rc = sym->id >= 0 ? tok_ids_push(out, sym->id) : emit_bytes(t, w, sym, out);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Where the next piece starts: before a U+2581 that follows another character (see split_meta). */
static size_t next_cut(const char *w, size_t n, size_t from)
{
    for (const char *p = w + from; (p = memchr(p, 0xE2, n - (size_t)(p - w))); p++) {
        size_t i = (size_t)(p - w);
        if (i + 3 <= n && memcmp(p, "\xE2\x96\x81", 3) == 0 && (i < 3 || memcmp(p - 3, "\xE2\x96\x81", 3) != 0))
            return i;
    }
    return n;
}

int tok_bpe_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out)
{
    if (n == 0)
        return 0;
    if (n > INT32_MAX)
        return iflow_seterr(IFLOW_ERANGE, "word of %zu bytes is too long to tokenize", n);
    if (t->ignore_merges) {
        int32_t id = iflow_strmap_get(&t->vocab, w, n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    if (!t->split_meta)
        return bpe_piece(t, s, w, n, out);
    /* long SentencePiece texts: merge word by word, which gives the same result */
    for (size_t a = 0, b; a < n; a = b) {
        b = next_cut(w, n, a + 1);
        int rc = bpe_piece(t, s, w + a, b - a, out);
        if (rc < 0)
            return rc;
    }
    return 0;
}
