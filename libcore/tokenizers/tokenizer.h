/*
 * tokenizer.h -- text <-> token ids for the models iflow runs.
 *
 * Contract
 *   An iflow_tokenizer is built from a HF tokenizer.json, from the tokenizer.ggml.* keys of a
 *   GGUF file, from a SentencePiece model (.spm / .model, optionally with a Marian vocab.json),
 *   or by iflow_tokenizer_open() from a path: a tokenizer.json, a GGUF file (by its magic), a
 *   file named *.spm or *.model, or a directory holding tokenizer.json, else tokenizer.gguf,
 *   else Marian's source.spm + vocab.json, else spiece.model (iflow_tokenizer_find() says which
 *   files those are without reading them: the converter stores them in a shard, and
 *   iflow_tokenizer_from_shard() builds the tokenizer back from there). An encoder-decoder
 *   model has a tokenizer per side:
 *   iflow_tokenizer_open() gives the source side (what the encoder reads),
 *   iflow_tokenizer_open_target() the target side (what the decoder's ids mean: Marian's
 *   target.spm with target_vocab.json or vocab.json; for any other path the same tokenizer).
 *   It owns copies of everything it needs: the caller's buffers may be freed right after the
 *   constructor returns. It is immutable once built, so encode/decode may run on one tokenizer
 *   from many threads at once. iflow_tokenizer_close() frees it (NULL is a no-op).
 *
 *   Families: byte-level BPE (GPT-2 byte<->unicode map) with the pre-tokenizer of the file
 *   (GGUF: chosen by tokenizer.ggml.pre -- gpt-2, llama-bpe, qwen2, falcon, deepseek-llm,
 *   deepseek-coder, starcoder, mpt, refact, ...; tokenizer.json: its Split / ByteLevel / Digits /
 *   Punctuation / Whitespace / BertPreTokenizer / Metaspace / Sequence pre_tokenizer, regexes run
 *   through PCRE2 in UTF + UCP mode); SentencePiece-style BPE with byte fallback (GGUF model
 *   'llama': merges by SPM score; tokenizer.json: BPE merges by rank); WordPiece (BERT; GGUF
 *   model 'bert', whose "phantom space" vocabulary is read back into tokenizer.json's form);
 *   unigram (Kudo 2018: the Viterbi segmentation of highest total piece score).
 *
 *   Unigram comes in two sets of rules, each matching its reference exactly. A .spm file (unigram
 *   or BPE) follows the `sentencepiece` library: its normalizer_spec (the precompiled_charsmap applied as it is,
 *   longest rule first -- nmt_nfkc is NFKC plus rules of its own; add_dummy_prefix,
 *   remove_extra_whitespaces, escape_whitespaces to U+2581), user-defined pieces always kept
 *   whole, control pieces never matched by the model, unknown characters as the unknown piece
 *   (min score - 10) with a run of them one token, byte fallback to <0xXX> pieces. A BPE .spm
 *   (M2M100's sentencepiece.bpe.model) merges as sentencepiece's bpe_model.cc: from characters
 *   and whole user-defined pieces (never merged), the pair whose text is the piece of best score
 *   first (leftmost among equals), an unused piece split back into the pair that made it.
 *   Other model types (word, char) are IFLOW_EUNSUPPORTED. With a Marian vocab.json the ids are
 *   vocab.json's: a piece missing from it becomes <unk>, as MarianTokenizer maps it; a run of
 *   unknown characters is looked up there by its text; "</s>", "<unk>" and "<pad>" are the
 *   special tokens; a ">>xx<<" language code at the start of the text is one token. A
 *   tokenizer.json "Unigram" model follows HF tokenizers: its Precompiled normalizer (per
 *   grapheme cluster under 6 bytes, the first rule found), pre-tokenizers and every vocabulary
 *   entry as a piece.
 *
 *   Encoding: added / special tokens are cut out of the text first. Tokens marked special
 *   (tokenizer.json "special": true; GGUF control and unknown tokens) are matched only with
 *   IFLOW_TOK_PARSE_SPECIAL, otherwise their text is tokenized as plain text; non-special added
 *   tokens (GGUF user-defined) are always matched. IFLOW_TOK_ADD_BOS adds what the tokenizer's
 *   own template adds around one sequence: BOS for Llama-style files (GGUF add_bos_token,
 *   default true for SPM; tokenizer.json TemplateProcessing / BertProcessing / RobertaProcessing),
 *   so for BERT it adds [CLS] ... [SEP], for T5 a final </s>; a .spm file (T5's spiece.model,
 *   Marian's source.spm) appends its </s> and adds no BOS, as T5's and Marian's tokenizers do;
 *   for a tokenizer without a template it adds nothing. A .spm's control and unknown pieces are
 *   its special tokens.
 *   Text that is not valid UTF-8 is accepted: invalid bytes are kept as single-byte units
 *   (byte-level BPE and byte fallback encode them losslessly; normalizers that need Unicode
 *   replace them with U+FFFD first). tokenizer.json truncation and padding are ignored.
 *
 *   Decoding: iflow_tokenizer_piece() gives the bytes of one token as it appears in decoded
 *   text; decode() concatenates pieces, with `first` set for the first token that is not a
 *   control token. Control/special tokens decode to "", and so does the unknown token (as with HF's
 *   skip_special_tokens; sentencepiece itself writes " \u2047 "). Byte-level and SPM decoding are
 *   exact inverses of encoding where the vocabulary allows (raw bytes are returned, not repaired
 *   into valid UTF-8). SentencePiece pieces: U+2581 becomes a space, and the leading space of the
 *   first piece is dropped -- with remove_extra_whitespaces, of every piece while the text is still
 *   empty, as sentencepiece does; a Marian tokenizer's decode() also drops trailing spaces
 *   (MarianTokenizer strips its output).
 *
 *   Errors: 0 (or a count) on success, a negative IFLOW_E* code with a message naming the file
 *   and the place on failure (error.h). The library never prints, never exits.
 */
#ifndef IFLOW_TOKENIZER_H
#define IFLOW_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "include/iflow.h" /* IFLOW_TOK_* */
#include "libcore/formats/shard.h"

typedef struct iflow_tokenizer iflow_tokenizer;

/* From the text of a tokenizer.json (len bytes, need not be NUL-terminated); name for messages. */
int iflow_tokenizer_from_hf_json(iflow_tokenizer **out, const char *json, size_t len, const char *name);
/* The special tokens that follow a vocab.json's ids (M2M100's language tokens: ids vocab.json's
 * size + i, as M2M100Tokenizer numbers them), the ids after them that decode to nothing
 * (M2M100's madeup words), and the one the template puts before a text (the source language,
 * "__en__"; "" for none). */
#define IFLOW_TOK_MAX_ADDED 4096
typedef struct {
    const char *const *tokens; /* [n] texts; the caller keeps them while the tokenizer is built */
    int n, hidden;             /* 0 .. IFLOW_TOK_MAX_ADDED each */
    char prefix[64];
} iflow_tok_added;

/* From a SentencePiece model, unigram or BPE (the bytes of a .spm / .model file). With
 * vocab_json (the text of a vocab.json, NULL for none) its ids are vocab.json's: Marian's (a
 * ">>xx<<" code at the start of a text is one token) unless `added` (NULL for none) names the
 * tokens that follow them (M2M100's: then "<s>" is special too, and IFLOW_TOK_ADD_BOS puts
 * added->prefix before the text). spm_name and vocab_name name the two in messages. */
int iflow_tokenizer_from_spm(iflow_tokenizer **out, const void *spm, size_t spm_len, const char *spm_name,
                             const char *vocab_json, size_t vocab_len, const char *vocab_name,
                             const iflow_tok_added *added);
/* From a whole GGUF file in memory (tokenizer.ggml.* keys). */
int iflow_tokenizer_from_gguf(iflow_tokenizer **out, const void *buf, size_t len, const char *name);
/* A tokenizer of `format` ("hf-json", "gguf" or "spm": iflow_tokenizer_files' names) from the
 * bytes of its file; for "spm" with a vocab.json's text (or NULL) and the tokens after it (or
 * NULL), as iflow_tokenizer_from_spm. How a shard's tokenizer records are read back. */
int iflow_tokenizer_from_format(iflow_tokenizer **out, const char *format, const void *data, size_t len,
                                const char *name, const char *vocab, size_t vocab_len, const char *vocab_name,
                                const iflow_tok_added *added);

/* The files a tokenizer is made of, as found for a path (nothing is read). */
enum { IFLOW_TOK_SOURCE = 0, IFLOW_TOK_TARGET = 1 }; /* the side of an encoder-decoder */
typedef struct {
    const char *format;  /* "hf-json" (a tokenizer.json), "gguf" (a GGUF file), "spm" (a SentencePiece model) */
    char file[4096];     /* that file's path */
    char vocab[4096];    /* "spm" with a vocab.json: its path (the ids are its); else "" */
    iflow_tok_added added; /* "spm" with M2M100's vocab.json: its language tokens (n 0: none) */
    int in_dir;          /* found in a directory: a tokenizer.json's bos/eos may come from beside it */
} iflow_tokenizer_files;

/* The files of path's tokenizer for `side`. A file is a GGUF (by its magic), a SentencePiece model
 * (*.spm, *.model) or a tokenizer.json. A directory holds tokenizer.json, else tokenizer.gguf,
 * else Marian's source.spm with vocab.json, else M2M100's sentencepiece.bpe.model with
 * vocab.json, else spiece.model (else IFLOW_ENOTFOUND, naming the directory); its target side is
 * Marian's target.spm with target_vocab.json (else vocab.json) when it has one, else the same
 * files as the source side. M2M100's language tokens are M2M100Tokenizer's: the list its
 * tokenizer_config.json's language_codes names (m2m100, the default: 100 codes; wmt21: 8) as
 * __xx__ after vocab.json's ids, then num_madeup_words (default 8) hidden ids, and the template
 * [__src_lang__] text </s> (src_lang, default en); an unknown list or source language is
 * IFLOW_EUNSUPPORTED naming the file. */
int iflow_tokenizer_find(iflow_tokenizer_files *f, const char *path, int side);
/* Build the tokenizer of found files; for a tokenizer.json found in a directory, bos/eos also
 * come from tokenizer_config.json ("bos_token"/"eos_token") or config.json
 * ("bos_token_id"/"eos_token_id") there when present. */
int iflow_tokenizer_open_files(iflow_tokenizer **out, const iflow_tokenizer_files *f);
/* iflow_tokenizer_find(path, IFLOW_TOK_SOURCE), then iflow_tokenizer_open_files(). */
int iflow_tokenizer_open(iflow_tokenizer **out, const char *path);
/* The tokenizer for the target side of an encoder-decoder model (what its decoder's ids mean):
 * iflow_tokenizer_find(path, IFLOW_TOK_TARGET), then iflow_tokenizer_open_files(). */
int iflow_tokenizer_open_target(iflow_tokenizer **out, const char *path);
/* The tokenizer of a shard's `side` (shard.h: meta "tokenizer", its "target" for
 * IFLOW_TOK_TARGET), built from the records it names; *out NULL when the shard names none (a
 * model without a tokenizer, or with one tokenizer for both sides). A missing or malformed
 * record is an error naming the record, its payload's byte offset and the shard. */
int iflow_tokenizer_from_shard(iflow_tokenizer **out, const iflow_shard *sh, int side);
void iflow_tokenizer_close(iflow_tokenizer *t);

/* Token ids of text[0..len). *ids is malloc'd (NULL when *n_ids == 0); the caller frees it.
 * Returns 0 or < 0. */
int iflow_tokenizer_encode(const iflow_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                           size_t *n_ids);

/* Bytes of one token as it appears in decoded text; `first` = this is the first token of the
 * text after an optional BOS (SentencePiece drops that piece's leading space; HF decoder
 * Strip). Writes at most cap bytes (no NUL) and returns the number written, or < 0
 * (IFLOW_ERANGE for an id outside the vocabulary). Special/control tokens give "". */
int iflow_tokenizer_piece(const iflow_tokenizer *t, int32_t id, int first, char *buf, size_t cap);
/* Bytes enough for any token's piece (an upper bound: the longest token's text plus one, the
 * space WordPiece puts before a word; no decoder makes a piece longer). */
size_t iflow_tokenizer_max_piece(const iflow_tokenizer *t);

/* Text of a whole sequence: *text is malloc'd and NUL-terminated, *len excludes the NUL. */
int iflow_tokenizer_decode(const iflow_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len);
/* The same for tokens that continue a prompt: `starts` says they begin the text (the prompt
 * was at most a BOS), as for the first token of iflow_tokenizer_decode. */
int iflow_tokenizer_continuation(const iflow_tokenizer *t, const int32_t *ids, size_t n, int starts, char **text,
                                 size_t *len);

/* The tokens IFLOW_TOK_ADD_BOS puts before a text (`before` 1: a BOS, M2M100's source language)
 * or after it (0: T5's, Marian's and M2M100's </s>): *ids points into the tokenizer; returns their
 * count (at most 8). */
int iflow_tokenizer_affix(const iflow_tokenizer *t, int before, const int32_t **ids);

int32_t iflow_tokenizer_n_vocab(const iflow_tokenizer *t);
/* The text of token `id` as the vocabulary spells it ("<|im_start|>", "<s>", "\u2581the"): *len
 * bytes in the tokenizer, not NUL-terminated; NULL for an id outside the vocabulary. What a chat
 * template's bos_token and eos_token are. */
const char *iflow_tokenizer_token_text(const iflow_tokenizer *t, int32_t id, size_t *len);
int32_t iflow_tokenizer_bos(const iflow_tokenizer *t); /* -1 if none */
int32_t iflow_tokenizer_eos(const iflow_tokenizer *t); /* -1 if none */
/* "bpe-bytelevel/<pre-tokenizer>", "spm-bpe", "bpe", "wordpiece", "spm-unigram" (a .spm),
 * "unigram" (tokenizer.json). */
const char *iflow_tokenizer_kind(const iflow_tokenizer *t);

#endif
