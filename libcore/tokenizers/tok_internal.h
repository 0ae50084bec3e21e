/*
 * tok_internal.h -- the insides of iflow_tokenizer, shared by tokenizer.c and tok_*.c only.
 *
 * Contract
 *   Not a public header: nothing outside libcore/tok*.c includes it.
 *   The tokenizer owns every pointer in struct iflow_tokenizer (freed by iflow_tokenizer_close).
 *   Token texts live in one arena (tok_text()); the vocab map's keys point into it, so the
 *   arena is allocated once at its final size (tok_vocab_alloc) and never moved.
 *   Encoding runs as: split out added tokens -> normalize (tok_norm.c; SentencePiece's own
 *   normalizer and HF's Precompiled are tok_charsmap.c's) -> pre-tokenize into words
 *   (tok_pretok.c) -> model per word (tok_bpe.c / tok_wordpiece.c / tok_unigram.c). All per-call
 *   state is in a tok_scratch owned by the caller of those functions, so the tokenizer stays const.
 *   A unigram model keeps its pieces in a tok_unigram of its own (t->uni): for a .spm with a
 *   Marian vocab.json they are not the tokenizer's vocabulary, and to_id maps one to the other.
 *   Functions return 0 or a negative IFLOW_E* code with the message set.
 */
#ifndef IFLOW_TOK_INTERNAL_H
#define IFLOW_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "libcore/base/strmap.h"
#include "tokenizer.h"

/* Token attributes; the values are GGUF's tokenizer.ggml.token_type codes. */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

enum { TOK_MODEL_BPE = 1, TOK_MODEL_WORDPIECE = 2, TOK_MODEL_UNIGRAM = 3 };

/* ---- growable buffers ---- */
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;
typedef struct {
    int32_t *p;
    size_t n, cap;
} tok_ids;
typedef struct {
    size_t off, len;
} tok_span;
typedef struct {
    tok_span *p;
    size_t n, cap;
} tok_spans;

int tok_buf_put(tok_buf *b, const void *s, size_t n);
int tok_buf_putc(tok_buf *b, char c);
int tok_buf_put_cp(tok_buf *b, int32_t cp); /* UTF-8 encode */
int tok_ids_push(tok_ids *v, int32_t id);
int tok_spans_push(tok_spans *v, size_t off, size_t len);
int tok_nomem(void);
/* Grow *p (elements of `size` bytes, capacity *cap) to hold at least `need` elements. */
int tok_grow(void **p, size_t *cap, size_t need, size_t size);

/* ---- UTF-8 and Unicode ---- */
/* Length (1..4) of the unit at s (n > 0 bytes left); *cp = code point, or -1 for an invalid byte
 * (then the unit is that one byte). */
int tok_utf8_next(const char *s, size_t n, int32_t *cp);
/* Copy s into out, replacing each invalid byte by U+FFFD. */
int tok_utf8_sanitize(const char *s, size_t n, tok_buf *out);
int tok_is_space(int32_t cp);       /* Unicode White_Space (Rust char::is_whitespace) */
int tok_is_punct(int32_t cp);       /* ASCII punctuation or Unicode P* (BERT's notion) */
/* GPT-2 byte <-> code point map. */
int32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(int32_t cp);     /* -1 if cp is not in the map */

/* ---- pre-tokenizer steps ---- */
enum { PRE_SPLIT = 1, PRE_BYTELEVEL, PRE_METASPACE };
enum { SPLIT_REMOVED = 1, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_NEVER = 0, PREPEND_ALWAYS, PREPEND_FIRST };

typedef struct {
    int kind;
    pcre2_code *re;       /* SPLIT; BYTELEVEL when it splits with the GPT-2 regex */
    int behavior, invert; /* SPLIT */
    int add_prefix_space; /* BYTELEVEL */
    char repl[8];         /* METASPACE replacement (UTF-8) */
    size_t repl_len;
    int prepend;          /* METASPACE PREPEND_* */
    int split;            /* METASPACE: split before each replacement */
} tok_pre;

/* ---- precompiled charsmaps (tok_charsmap.c) ---- */
/* A SentencePiece precompiled_charsmap: a darts-clone double-array trie over UTF-8 prefixes whose
 * values are offsets of NUL-terminated replacements in `norm`. Checked when parsed: every leaf
 * value is inside `norm`, which ends with a NUL and is valid UTF-8. */
typedef struct {
    uint32_t *units;      /* the trie's units, host order */
    size_t n_units;
    char *norm;           /* replacement strings, NUL-terminated */
    size_t norm_len;
} tok_charsmap;

/* Parse blob[0..len) (file offset `at` for messages); an empty blob gives an empty map. */
int tok_charsmap_parse(tok_charsmap *cm, const uint8_t *blob, size_t len, size_t at, const char *name);
void tok_charsmap_free(tok_charsmap *cm);
/* Standard base64 (tokenizer.json's precompiled_charsmap) into out. */
int tok_base64(const char *s, size_t n, tok_buf *out);

/* ---- unigram models (tok_unigram.c) ---- */
typedef struct {
    int32_t child;        /* first child node; the children are contiguous, sorted by byte */
    int32_t value;        /* piece id ending here, -1 if none */
    uint16_t n_child;
    uint8_t byte;         /* label of the edge into this node */
} tok_trie_node;

typedef struct tok_unigram {
    int spm;              /* SentencePiece's rules (a .spm): float sums, user-defined bonus, unused
                             pieces skipped, unknown runs not looked up; else HF tokenizers' */
    int32_t n;            /* pieces */
    char *arena;
    uint32_t *off, *len;
    uint8_t *type;        /* TOK_* */
    double *score;
    int32_t *to_id;       /* piece -> tokenizer id */
    int32_t unk;          /* the unknown piece, -1 if none */
    int32_t byte_piece[256];
    int byte_fallback;
    int lookup_unk;       /* a run of unknown characters is looked up in the tokenizer's vocabulary */
    double unk_score;     /* min score - 10 */
    float max_score;      /* SentencePiece: max(FLT_MIN, best normal score), for user-defined pieces */
    tok_trie_node *nodes; /* the pieces that take part in the Viterbi */
    int32_t n_nodes;
    int32_t root[256];    /* root's child per byte, -1 if none */
    int has_user;         /* some piece is user-defined */
    /* SentencePiece's normalizer_spec */
    tok_charsmap cm;
    int dummy_prefix, extra_ws, escape_ws;
} tok_unigram;

/* Allocate n pieces of `bytes` text bytes in all (types NORMAL, scores 0, to_id identity). */
int tok_unigram_alloc(tok_unigram **out, int32_t n, size_t bytes, int spm);
/* Build the trie and the derived fields once every piece is set (texts, types, scores, unk,
 * byte_fallback). SentencePiece's checks (no empty or duplicate piece, one unknown piece, the
 * 256 byte pieces with byte_fallback) are made here when u->spm. */
int tok_unigram_finish(tok_unigram *u, const char *name);
void tok_unigram_free(tok_unigram *u);
static inline const char *tok_piece_text(const tok_unigram *u, int32_t p) { return u->arena + u->off[p]; }
/* Length of the longest user-defined piece at the start of s[0..n), 0 if none. */
size_t tok_unigram_user_prefix(const tok_unigram *u, const char *s, size_t n);

/* ---- normalizer steps ---- */
enum {
    NORM_PREPEND = 1, NORM_REPLACE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD,
    NORM_LOWER, NORM_STRIP, NORM_STRIP_ACCENTS, NORM_BERT,
    NORM_PRECOMPILED,     /* HF tokenizers' Precompiled: cm per grapheme cluster */
    NORM_SPM              /* SentencePiece's normalizer: uni's charsmap, whitespace rules, dummy prefix */
};

typedef struct {
    int kind;
    char *a, *b;          /* PREPEND a; REPLACE a (literal) -> b */
    size_t alen, blen;
    pcre2_code *re;       /* REPLACE by regex */
    int left, right;      /* STRIP */
    int clean, chinese, strip_accents, lower; /* BERT */
    tok_charsmap *cm;     /* PRECOMPILED (owned) */
    const tok_unigram *uni; /* SPM (the tokenizer's) */
} tok_norm;

/* An added token, matched in raw text before normalization. */
typedef struct {
    int32_t id;
    uint32_t len;         /* of its text */
    uint8_t first;        /* first byte of its text */
    uint8_t special, lstrip, rstrip, single_word;
} tok_added;

struct iflow_tokenizer {
    char *name;
    char kind[96];
    int model;

    int32_t n_vocab;
    uint32_t max_token_len;   /* bytes of the longest token text */
    char *arena;
    uint32_t *tok_off, *tok_len;
    uint8_t *attr;
    float *scores;            /* SPM scores when merging by score, else NULL */
    iflow_strmap vocab;       /* text -> id */
    int32_t bos, eos, unk;

    /* BPE */
    iflow_u64map merges;      /* (left id << 32 | right id) -> (rank, merged id) */
    int by_score;             /* merge the pair whose concatenation has the best score */
    int byte_fallback, ignore_merges, fuse_unk;
    int split_meta;           /* no token has U+2581 right after another character, so a word
                                 can be cut before each such U+2581 without changing the merges */
    int32_t byte_tok[256];    /* id of <0xXX>, -1 if missing */

    /* Unigram */
    tok_unigram *uni;
    int lang_codes;           /* Marian: a ">>xx<<" at the start of a segment is one token */

    /* WordPiece */
    char wp_prefix[16];
    size_t wp_prefix_len;
    int wp_max_chars;

    tok_norm *norm;
    int n_norm;
    tok_pre *pre;
    int n_pre;
    tok_added *added;         /* sorted by first byte, then longest text first */
    int n_added;
    int32_t added_at[257];    /* added[added_at[b] .. added_at[b+1]) start with byte b */

    int32_t prefix[8], suffix[8]; /* what IFLOW_TOK_ADD_BOS adds */
    int n_prefix, n_suffix;

    /* decoder */
    int dec_bytelevel;        /* map GPT-2 code points back to bytes */
    int dec_metaspace;        /* U+2581 -> ' ' */
    int dec_strip_first;      /* drop one leading space of the first piece */
    int dec_strip_empty;      /* ... of every piece while the text is still empty (SentencePiece
                                 with remove_extra_whitespaces) */
    int dec_trim;             /* decode() drops spaces at both ends (MarianTokenizer's strip()) */
    int dec_wordpiece;        /* "##" joins, else a space before each piece */
    int dec_cleanup;          /* WordPiece cleanup (" ." -> ".", ...) */
    int user_raw;             /* user-defined tokens decode to their raw text */
};

static inline const char *tok_text(const iflow_tokenizer *t, int32_t id) { return t->arena + t->tok_off[id]; }

/* ---- per-call scratch ---- */
typedef struct {
    size_t s, e; /* [s, e) in the text */
    int m;       /* a match of the split pattern */
} tok_piece;

typedef struct bpe_sym bpe_sym;
typedef struct bpe_pair bpe_pair;

typedef struct {
    tok_buf na, nb;           /* normalizer ping-pong */
    tok_buf text, text2;      /* pre-tokenizer text (rewritten by ByteLevel / Metaspace) */
    tok_spans spans, spans2;
    tok_piece *pieces;        /* one span's split, before its behavior is applied */
    size_t n_pieces, cap_pieces;
    tok_buf word;             /* WordPiece candidates */
    struct uni_best *best;    /* Viterbi: best path ending at each byte */
    size_t cap_best;
    bpe_sym *syms;
    size_t cap_syms;
    bpe_pair *heap;
    size_t n_heap, cap_heap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
} tok_scratch;

void tok_scratch_free(tok_scratch *s);

/* ---- building (tokenizer.c) ---- */
int tok_new(iflow_tokenizer **out, const char *name);
/* Allocate n tokens and an arena of `bytes` bytes; all tokens start empty and TOK_UNUSED. */
int tok_vocab_alloc(iflow_tokenizer *t, int32_t n, size_t bytes);
/* Store token id's text at arena offset *pos (advanced). */
void tok_vocab_set(iflow_tokenizer *t, int32_t id, const char *s, size_t len, size_t *pos, int attr);
/* Build the text -> id map (later ids win) and the <0xXX> table once all texts are set. */
int tok_vocab_index(iflow_tokenizer *t);
/* Register an added token (its text must already be set); tok_sort_added() indexes them all. */
int tok_add_added(iflow_tokenizer *t, int32_t id, int special, int lstrip, int rstrip, int single_word);
int tok_sort_added(iflow_tokenizer *t);
/* Add a normalizer step (strings copied). */
int tok_norm_add(iflow_tokenizer *t, const tok_norm *step);
/* 1 and the name (in buf) of a known pre-tokenizer whose only split is this pattern, else 0. */
int tok_pre_pattern_name(const char *pat, size_t len, char *buf, size_t cap);

/* ---- regexes (tok_pretok.c) ---- */
/* Compile a PCRE2 pattern (UTF, UCP, invalid UTF allowed, JIT). `literal` quotes it.
 * `where` names the place for messages. */
int tok_regex(pcre2_code **re, const char *pat, size_t len, int literal, const char *where, const char *name);
/* Add steps to t->pre. */
int tok_pre_add_split(iflow_tokenizer *t, const char *pat, size_t len, int literal, int behavior, int invert,
                      const char *where);
int tok_pre_add_bytelevel(iflow_tokenizer *t, int add_prefix_space, int use_regex, const char *where);
int tok_pre_add_metaspace(iflow_tokenizer *t, const char *repl, size_t len, int prepend, int split);
/* The GPT-2 pattern, and the step lists of named (GGUF tokenizer.ggml.pre) pre-tokenizers. */
extern const char tok_gpt2_pattern[];
int tok_pre_add_named(iflow_tokenizer *t, const char *pre, int *ignore_merges);
/* BERT's pre-tokenizer: split at whitespace (removed) and punctuation (isolated, BERT's notion). */
extern const char tok_punct_pattern[];
int tok_pre_add_bert(iflow_tokenizer *t);
/* Run the steps on text: the words are s->spans over s->text. `first` = the text starts the input. */
int tok_pretok_run(const iflow_tokenizer *t, tok_scratch *s, const char *text, size_t len, int first);
void tok_pre_free(tok_pre *p);

/* ---- normalizers (tok_norm.c) ---- */
/* Normalize text; *out points into s (or at text itself when there are no steps). */
int tok_norm_run(const iflow_tokenizer *t, tok_scratch *s, const char *text, size_t len, const char **out,
                 size_t *out_len);
void tok_norm_free(tok_norm *n);

/* ---- models ---- */
int tok_bpe_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out);
int tok_wordpiece_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out);
int tok_unigram_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t n, tok_ids *out);

/* ---- charsmap normalizers (tok_charsmap.c) ---- */
int tok_norm_spm(const tok_unigram *u, const char *w, size_t len, tok_buf *out);
int tok_norm_precompiled(const tok_charsmap *cm, tok_scratch *s, const char *w, size_t len, tok_buf *out);

/* ---- loaders ---- */
struct iflow_gguf;
int tok_from_gguf_handle(iflow_tokenizer **out, const struct iflow_gguf *g);
/* tok_hfjson.c: the vocabulary from a JSON object text -> id (a Marian vocab.json); `where`
 * names it in messages. */
struct json_t;
int tok_vocab_from_json(iflow_tokenizer *t, const struct json_t *vocab, const char *where);

#endif
