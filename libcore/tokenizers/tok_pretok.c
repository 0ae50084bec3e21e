/* tok_pretok.c -- pre-tokenizer steps (regex splits, ByteLevel, Metaspace) and the named
 * pre-tokenizers of GGUF files (tokenizer.ggml.pre). */
#include "libcore/base/error.h"
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- regex patterns (public data from the models' tokenizer.json files) ------------------- */

const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char re_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_cjk[] = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";
/* Cased letters (Unicode Lu/Ll/Lt) of the Latin, Greek, Cyrillic, ... blocks. */
static const char re_ds_latin[] =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-"
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"
    "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}"
    "\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-"
    "\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
static const char re_ds_punct[] = "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+";
static const char re_ds3[] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                             "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_bloom[] = " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+";
static const char re_tekken[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_gpt4o[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct {
    const char *names;          /* '|'-separated tokenizer.ggml.pre values */
    const char *pats[7];        /* Isolated splits, in order; then the byte-level map */
    int ignore_merges;          /* a word that is a token is not merged */
} named_pre;

static const named_pre named[] = {
    {"default|gpt-2|gpt2|mpt|gpt-neox|phi-2|phi-3|olmo|jais|roberta-bpe|trillion|granite-docling|jina-es|jina-de|"
     "jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code",
     {tok_gpt2_pattern}, 0},
    {"llama3|llama-v3|llama-bpe|falcon3", {re_llama3}, 1},
    {"dbrx|smaug-bpe|chatglm-bpe", {re_llama3}, 0},
    {"qwen2|deepseek-r1-qwen|stablelm2|megrez|hunyuan", {re_qwen2}, 0},
    {"deepseek-llm", {"[\\r\\n]", re_ds_latin, re_ds_punct, "\\s+$", re_cjk, "\\p{N}+"}, 0},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", re_cjk, "\\p{N}"}, 0},
    {"deepseek-v3", {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", re_ds3}, 0},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", tok_gpt2_pattern, "[0-9][0-9][0-9]"}, 0},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", {"\\p{N}", tok_gpt2_pattern}, 0},
    {"poro-chat|bloom|gpt3-finnish", {re_bloom}, 0},
    {"viking", {re_bloom, "\\p{N}"}, 0},
    {"tekken", {re_tekken}, 0},
    {"gpt-4o", {re_gpt4o}, 0},
    {"chameleon",
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", tok_gpt2_pattern},
     0},
};

/* Is `name` one of the '|'-separated names? */
static int name_in(const char *names, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = names; p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0)
            return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* ---- building steps ----------------------------------------------------------------------- */

int tok_regex(pcre2_code **re, const char *pat, size_t len, int literal, const char *where, const char *name)
{
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    int err;
    PCRE2_SIZE eoff;
    *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &eoff, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return iflow_seterr(IFLOW_EFORMAT, "bad regex in %s of '%s' at offset %zu: %s", where, name, (size_t)eoff,
                            (const char *)msg);
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return 0;
}

static int pre_push(iflow_tokenizer *t, const tok_pre *step)
{
    tok_pre *p = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *p);
    if (!p)
        return tok_nomem();
    t->pre = p;
    t->pre[t->n_pre++] = *step;
    return 0;
}

int tok_pre_add_split(iflow_tokenizer *t, const char *pat, size_t len, int literal, int behavior, int invert,
                      const char *where)
{
    tok_pre step = {.kind = PRE_SPLIT, .behavior = behavior, .invert = invert};
    int rc = tok_regex(&step.re, pat, len, literal, where, t->name);
    if (rc < 0)
        return rc;
    if ((rc = pre_push(t, &step)) < 0)
        pcre2_code_free(step.re);
    return rc;
}

int tok_pre_add_bytelevel(iflow_tokenizer *t, int add_prefix_space, int use_regex, const char *where)
{
    tok_pre step = {.kind = PRE_BYTELEVEL, .add_prefix_space = add_prefix_space};
    int rc = use_regex ? tok_regex(&step.re, tok_gpt2_pattern, sizeof tok_gpt2_pattern - 1, 0, where, t->name) : 0;
    if (rc < 0)
        return rc;
    if ((rc = pre_push(t, &step)) < 0)
        pcre2_code_free(step.re);
    return rc;
}

int tok_pre_add_metaspace(iflow_tokenizer *t, const char *repl, size_t len, int prepend, int split)
{
    tok_pre step = {.kind = PRE_METASPACE, .prepend = prepend, .split = split};
    if (len == 0 || len >= sizeof step.repl)
        return iflow_seterr(IFLOW_EFORMAT, "bad Metaspace replacement of %zu bytes in '%s'", len, t->name);
    memcpy(step.repl, repl, len);
    step.repl_len = len;
    return pre_push(t, &step);
}

const char tok_punct_pattern[] = "[\\p{P}!-/:-@\\[-`{-~]";

int tok_pre_add_bert(iflow_tokenizer *t)
{
    int rc = tok_pre_add_split(t, "\\s+", 3, 0, SPLIT_REMOVED, 0, "pre_tokenizer");
    return rc < 0 ? rc : tok_pre_add_split(t, tok_punct_pattern, strlen(tok_punct_pattern), 0, SPLIT_ISOLATED, 0, "pre_tokenizer");
}

int tok_pre_add_named(iflow_tokenizer *t, const char *pre, int *ignore_merges)
{
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        if (!name_in(named[i].names, pre))
            continue;
        for (int k = 0; k < 7 && named[i].pats[k]; k++) {
            int rc = tok_pre_add_split(t, named[i].pats[k], strlen(named[i].pats[k]), 0, SPLIT_ISOLATED, 0,
                                       "pre-tokenizer");
            if (rc < 0)
                return rc;
        }
        *ignore_merges = named[i].ignore_merges;
        return tok_pre_add_bytelevel(t, 0, 0, "pre-tokenizer");
    }
    return iflow_seterr(IFLOW_EUNSUPPORTED, "unknown pre-tokenizer '%s' in '%s'", pre, t->name);
}

void tok_pre_free(tok_pre *p)
{
    if (p && p->re)
        pcre2_code_free(p->re);
}

/* ---- running ------------------------------------------------------------------------------ */

static int piece_push(tok_scratch *s, size_t a, size_t b, int m)
{
    if (tok_grow((void **)&s->pieces, &s->cap_pieces, s->n_pieces + 1, sizeof *s->pieces) < 0)
        return IFLOW_ENOMEM;
    s->pieces[s->n_pieces++] = (tok_piece){a, b, m};
    return 0;
}

static int match_setup(tok_scratch *s)
{
    if (!s->md && !(s->md = pcre2_match_data_create(1, NULL)))
        return tok_nomem();
    return 0;
}

/* The JIT's default 32 KiB stack was too small: give it up to 8 MiB. */
static int bigger_stack(tok_scratch *s)
{
    if (s->jit)
        return 0;
    s->mctx = pcre2_match_context_create(NULL);
    s->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->mctx || !s->jit)
        return 0;
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    return 1;
}

/* Split text[off, off+len) by re into s->pieces (absolute offsets, matches flagged). */
static int find_pieces(const pcre2_code *re, tok_scratch *s, const char *text, size_t off, size_t len)
{
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + off);
    size_t pos = 0, prev = 0;
    s->n_pieces = 0;
    while (pos < len) {
        int rc = pcre2_match(re, subj, len, pos, 0, s->md, s->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && bigger_stack(s))
            continue;
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return iflow_seterr(IFLOW_EINVAL, "pre-tokenizer regex failed at byte %zu: %s", off + pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        if (ov[1] <= ov[0]) { /* empty match: step over one unit */
            int32_t cp;
            pos = (ov[0] > pos ? ov[0] : pos) + (size_t)tok_utf8_next(text + off + ov[0], len - ov[0], &cp);
            continue;
        }
        if ((ov[0] > prev && piece_push(s, off + prev, off + ov[0], 0) < 0) || piece_push(s, off + ov[0], off + ov[1], 1) < 0)
            return IFLOW_ENOMEM;
        prev = pos = ov[1];
    }
    if (prev < len && piece_push(s, off + prev, off + len, 0) < 0)
        return IFLOW_ENOMEM;
    return 0;
}

/* Append s->pieces to out as HF's SplitDelimiterBehavior says (pieces are in text order). */
static int emit_forward(tok_scratch *s, int behavior, int invert, tok_spans *out)
{
    size_t first = out->n;
    int prev = 0;
    for (size_t i = 0; i < s->n_pieces; i++) {
        const tok_piece *p = &s->pieces[i];
        int m = p->m ^ (invert != 0);
        int have = out->n > first;
        int merge = have && ((behavior == SPLIT_MERGED_PREV && m && !prev) || (behavior == SPLIT_CONTIGUOUS && m == prev));
        prev = m;
        if (behavior == SPLIT_REMOVED && m)
            continue;
        if (merge)
            out->p[out->n - 1].len = p->e - out->p[out->n - 1].off;
        else if (tok_spans_push(out, p->s, p->e - p->s) < 0)
            return IFLOW_ENOMEM;
    }
    return 0;
}

/* MergedWithNext: a match joins the piece after it (unless that one is a match too). */
static int emit_merged_next(tok_scratch *s, int invert, tok_spans *out)
{
    size_t first = out->n;
    int next = 0;
    for (size_t i = s->n_pieces; i-- > 0;) {
        const tok_piece *p = &s->pieces[i];
        int m = p->m ^ (invert != 0);
        if (m && !next && out->n > first) {
            tok_span *last = &out->p[out->n - 1];
            last->len += last->off - p->s;
            last->off = p->s;
        } else if (tok_spans_push(out, p->s, p->e - p->s) < 0) {
            return IFLOW_ENOMEM;
        }
        next = m;
    }
    for (size_t a = first, b = out->n; b > a + 1; a++, b--) {
        tok_span t = out->p[a];
        out->p[a] = out->p[b - 1];
        out->p[b - 1] = t;
    }
    return 0;
}

static int emit_pieces(tok_scratch *s, int behavior, int invert, tok_spans *out)
{
    return behavior == SPLIT_MERGED_NEXT ? emit_merged_next(s, invert, out) : emit_forward(s, behavior, invert, out);
}

static void swap_spans(tok_scratch *s)
{
    tok_spans t = s->spans;
    s->spans = s->spans2;
    s->spans2 = t;
    s->spans2.n = 0;
}

static void swap_text(tok_scratch *s)
{
    tok_buf t = s->text;
    s->text = s->text2;
    s->text2 = t;
    s->text2.n = 0;
}

static int run_split(const pcre2_code *re, int behavior, int invert, tok_scratch *s)
{
    int rc = match_setup(s);
    s->spans2.n = 0;
    for (size_t i = 0; rc == 0 && i < s->spans.n; i++) {
        rc = find_pieces(re, s, s->text.p, s->spans.p[i].off, s->spans.p[i].len);
        if (rc == 0)
            rc = emit_pieces(s, behavior, invert, &s->spans2);
    }
    if (rc == 0)
        swap_spans(s);
    return rc;
}

/* Rewrite each span through fn into text2/spans2, then make them current. */
typedef int (*rewrite_fn)(const tok_pre *p, tok_scratch *s, const char *w, size_t n, int first_span);

static int rewrite(const tok_pre *p, tok_scratch *s, rewrite_fn fn, int first)
{
    s->text2.n = 0;
    s->spans2.n = 0;
    for (size_t i = 0; i < s->spans.n; i++) {
        int rc = fn(p, s, s->text.p + s->spans.p[i].off, s->spans.p[i].len, first && s->spans.p[i].off == 0);
        if (rc < 0)
            return rc;
    }
    swap_text(s);
    swap_spans(s);
    return 0;
}

static int add_prefix_space(const tok_pre *p, tok_scratch *s, const char *w, size_t n, int first_span)
{
    (void)p, (void)first_span;
    size_t start = s->text2.n;
    if ((n == 0 || w[0] != ' ') && tok_buf_putc(&s->text2, ' ') < 0)
        return IFLOW_ENOMEM;
    if (tok_buf_put(&s->text2, w, n) < 0)
        return IFLOW_ENOMEM;
    return tok_spans_push(&s->spans2, start, s->text2.n - start);
}

static int map_bytes(const tok_pre *p, tok_scratch *s, const char *w, size_t n, int first_span)
{
    (void)p, (void)first_span;
    size_t start = s->text2.n;
    if (tok_grow((void **)&s->text2.p, &s->text2.cap, s->text2.n + 2 * n + 1, 1) < 0)
        return IFLOW_ENOMEM;
    char *o = s->text2.p + s->text2.n;
    for (size_t i = 0; i < n; i++) {
        int32_t cp = tok_byte_to_cp((uint8_t)w[i]);
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else {
            *o++ = (char)(0xC0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    s->text2.n = (size_t)(o - s->text2.p);
    s->text2.p[s->text2.n] = 0;
    return tok_spans_push(&s->spans2, start, s->text2.n - start);
}

static int run_bytelevel(const tok_pre *p, tok_scratch *s, int first)
{
    int rc = 0;
    if (p->add_prefix_space)
        rc = rewrite(p, s, add_prefix_space, first);
    if (rc == 0 && p->re)
        rc = run_split(p->re, SPLIT_ISOLATED, 0, s);
    return rc < 0 ? rc : rewrite(p, s, map_bytes, first);
}

/* Metaspace: spaces -> replacement, optional prefix, optional split before each replacement. */
static int metaspace(const tok_pre *p, tok_scratch *s, const char *w, size_t n, int first_span)
{
    size_t start = s->text2.n;
    int starts = n >= p->repl_len && memcmp(w, p->repl, p->repl_len) == 0;
    int prepend = !starts && (n == 0 || w[0] != ' ') &&
                  (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first_span));
    if (prepend && tok_buf_put(&s->text2, p->repl, p->repl_len) < 0)
        return IFLOW_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = w[i] == ' ' ? tok_buf_put(&s->text2, p->repl, p->repl_len) : tok_buf_putc(&s->text2, w[i]);
        if (rc < 0)
            return rc;
    }
    size_t end = s->text2.n;
    if (!p->split)
        return tok_spans_push(&s->spans2, start, end - start);
    /* each replacement starts a new word */
    size_t a = start;
    for (size_t i = start + 1; i + p->repl_len <= end; i++) {
        if (memcmp(s->text2.p + i, p->repl, p->repl_len) == 0) {
            if (tok_spans_push(&s->spans2, a, i - a) < 0)
                return IFLOW_ENOMEM;
            a = i;
            i += p->repl_len - 1;
        }
    }
    return end > a ? tok_spans_push(&s->spans2, a, end - a) : 0;
}

int tok_pretok_run(const iflow_tokenizer *t, tok_scratch *s, const char *text, size_t len, int first)
{
    s->text.n = 0;
    s->spans.n = 0;
    if (tok_buf_put(&s->text, text, len) < 0 || (len && tok_spans_push(&s->spans, 0, len) < 0))
        return IFLOW_ENOMEM;
    for (int i = 0; i < t->n_pre; i++) {
        const tok_pre *p = &t->pre[i];
        int rc = p->kind == PRE_SPLIT       ? run_split(p->re, p->behavior, p->invert, s)
                 : p->kind == PRE_BYTELEVEL ? run_bytelevel(p, s, first)
                                            : rewrite(p, s, metaspace, first);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int tok_pre_pattern_name(const char *pat, size_t len, char *buf, size_t cap)
{
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        const char *p = named[i].pats[0];
        if (named[i].pats[1] || strlen(p) != len || memcmp(p, pat, len) != 0)
            continue;
        const char *names = strncmp(named[i].names, "default|", 8) == 0 ? named[i].names + 8 : named[i].names;
        size_t n = strcspn(names, "|");
        snprintf(buf, cap, "%.*s", (int)n, names);
        return 1;
    }
    return 0;
}
