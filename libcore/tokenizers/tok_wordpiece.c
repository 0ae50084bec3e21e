/* tok_wordpiece.c -- WordPiece (BERT): greedy longest-match-first over one word, later pieces
 * carrying the continuation prefix ("##"); a word with an unmatched rest, or longer than
 * max_input_chars_per_word characters, becomes [UNK]. */
#include "libcore/base/error.h"
#include "tok_internal.h"

static size_t count_chars(const char *w, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; c++) {
        int32_t cp;
        i += (size_t)tok_utf8_next(w + i, n - i, &cp);
    }
    return c;
}

/* Start of the character before byte `end` (end > start). */
static size_t prev_char(const char *w, size_t start, size_t end)
{
    size_t i = end - 1;
    while (i > start && ((unsigned char)w[i] & 0xC0) == 0x80 && end - i < 4)
        i--;
    int32_t cp;
    return i + (size_t)tok_utf8_next(w + i, end - i, &cp) == end ? i : end - 1;
}

/* End of the longest whole-character prefix of w[start, n) of at most max bytes. */
static size_t clamp_end(const char *w, size_t start, size_t n, size_t max)
{
    size_t e = start;
    while (e < n) {
        int32_t cp;
        size_t k = (size_t)tok_utf8_next(w + e, n - e, &cp);
        if (e + k - start > max)
            break;
        e += k;
    }
    return e;
}

/* Longest token matching w[start, end') for some end' <= end; its end in *end_out, or -1. */
static int32_t longest(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t start, size_t n,
                       size_t *end_out)
{
    for (size_t end = clamp_end(w, start, n, t->max_token_len); end > start; end = prev_char(w, start, end)) {
        int32_t id;
        if (start == 0) {
            id = iflow_strmap_get(&t->vocab, w, end);
        } else {
            s->word.n = 0;
            if (tok_buf_put(&s->word, t->wp_prefix, t->wp_prefix_len) < 0 ||
                tok_buf_put(&s->word, w + start, end - start) < 0)
                return IFLOW_ENOMEM;
            id = iflow_strmap_get(&t->vocab, s->word.p, s->word.n);
        }
        if (id >= 0) {
            *end_out = end;
            return id;
        }
    }
    return -1;
}

static int push_unk(const iflow_tokenizer *t, tok_ids *out)
{
    if (t->unk < 0)
        return iflow_seterr(IFLOW_EFORMAT, "word has no wordpiece tokens and there is no unk token in '%s'", t->name);
    return tok_ids_push(out, t->unk);
}

int tok_wordpiece_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out)
{
    size_t mark = out->n;
    if (n == 0)
        return 0;
    if (count_chars(w, n) > (size_t)t->wp_max_chars)
        return push_unk(t, out);
    for (size_t start = 0, end = 0; start < n; start = end) {
        int32_t id = longest(t, s, w, start, n, &end);
        if (id == IFLOW_ENOMEM)
            return id;
        if (id < 0) {
            out->n = mark;
            return push_unk(t, out);
        }
        if (tok_ids_push(out, id) < 0)
            return IFLOW_ENOMEM;
    }
    return 0;
}
