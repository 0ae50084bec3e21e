/*
 * iflow.h -- the public C API of libiflow: run transformer language models from a C program.
 *
 * This is the one header a program outside this repository includes. It declares a small,
 * stable subset of libiflow: open a model, tokenize and detokenize, evaluate tokens into
 * logits, sample, generate, measure perplexity, and run many requests at once (continuous
 * batching). Build against an installed copy with
 *
 *     cc prog.c $(pkg-config --cflags --libs iflow)              # libiflow.so
 *     cc prog.c $(pkg-config --cflags --libs --static iflow)     # libiflow.a and its dependencies
 *
 * examples/generate.c is a complete program (a prompt in, a continuation out).
 *
 * Versioning
 *   IFLOW_VERSION_MAJOR/MINOR/PATCH are the version this header belongs to; iflow_version_number()
 *   is the version of the library actually loaded (compare them to catch a header/library
 *   mismatch). Within one major version the API and ABI only grow: a function, a field or a
 *   code is never removed, renumbered or changed in meaning, and a struct the caller allocates
 *   gains fields only at its end. The shared library's soname carries the major version
 *   (libiflow.so.0). Everything not declared here (the headers under libcore/) is internal and
 *   is not exported from libiflow.so.
 *
 * Conventions
 *   - Errors. A function that can fail returns 0 (or a non-negative count) on success and a
 *     negative IFLOW_E* code on failure. Before failing it records a one-line message saying
 *     what failed and where (file, tensor, line, byte); iflow_errmsg() returns it, per thread,
 *     until the next failure on that thread. iflow_strerror() names a code ("io", "format", ...)
 *     and iflow_error_describe() says what the code means in a sentence.
 *   - The library never prints and never exits. Long work reports progress only through the
 *     callbacks given to it.
 *   - Ownership. A constructor (iflow_*_open) gives the caller an object to close with the
 *     matching iflow_*_close (NULL is a no-op). Arrays and strings returned through an out
 *     parameter (token ids, decoded text) are malloc'd: free them with iflow_free() (or free()).
 *     Pointers returned by accessors are borrowed and live as long as their owner.
 *   - Threads. A model is read-only once opened and placed: several contexts, samplers and
 *     batches may use it from different threads, one thread per context, sampler or batch.
 *     A tokenizer may encode and decode from many threads at once.
 *   - Shapes. Token ids are int32_t; logits are float [n_vocab] per position, row-major.
 *
 * A minimal session
 *
 *     iflow_model *m;
 *     if (iflow_model_open(&m, "model.ifs", 0) < 0) { fprintf(stderr, "%s\n", iflow_errmsg()); ... }
 *     iflow_generate_params gp;
 *     iflow_generate_params_default(&gp);        // 128 tokens, temperature 0.8, top-k 40, top-p 0.95
 *     gp.sampling.temp = 0;                      // greedy
 *     iflow_result *r;
 *     if (iflow_generate(m, "Once upon a time", &gp, &r) == 0) { puts(r->text); iflow_result_free(r); }
 *     iflow_model_close(m);
 *
 * Models are shard files written by iflow-convert (see iflow-shard(5)), or a directory of
 * per-device shards written by iflow-partition --split. In this version, the API computes on
 * the CPU (all cores unless a thread count is given); GPU placement is reached through the
 * programs (iflow-run --device) only.
 */
#ifndef IFLOW_H
#define IFLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define IFLOW_API __attribute__((visibility("default")))
#else
#define IFLOW_API
#endif

/* ---- version ------------------------------------------------------------------------------ */

#define IFLOW_VERSION_MAJOR 0
#define IFLOW_VERSION_MINOR 1
#define IFLOW_VERSION_PATCH 0
#define IFLOW_VERSION_NUMBER (IFLOW_VERSION_MAJOR * 10000 + IFLOW_VERSION_MINOR * 100 + IFLOW_VERSION_PATCH)
#define IFLOW_VERSION_STRINGIFY_(a, b, c) #a "." #b "." #c
#define IFLOW_VERSION_STRINGIFY(a, b, c) IFLOW_VERSION_STRINGIFY_(a, b, c)
#define IFLOW_VERSION_STRING IFLOW_VERSION_STRINGIFY(IFLOW_VERSION_MAJOR, IFLOW_VERSION_MINOR, IFLOW_VERSION_PATCH)

/* The version of the library in use: MAJOR * 10000 + MINOR * 100 + PATCH, and as "M.m.p". */
IFLOW_API unsigned iflow_version_number(void);
IFLOW_API const char *iflow_version_string(void);

/* ---- errors ------------------------------------------------------------------------------- */

/* The codes are stable: never renumbered, only added to. */
enum {
    IFLOW_OK          = 0,
    IFLOW_EIO         = -1,  /* a read, write, open or rename failed (errno in the message)    */
    IFLOW_ENOMEM      = -2,  /* allocation failed                                               */
    IFLOW_EFORMAT     = -3,  /* a file is malformed: bad magic, bad header, bad field            */
    IFLOW_ETRUNC      = -4,  /* a file ends before its declared contents                         */
    IFLOW_ECHECKSUM   = -5,  /* a stored checksum does not match the data                        */
    IFLOW_EUNSUPPORTED= -6,  /* a valid input uses something iflow lacks (dtype, block, ...)     */
    IFLOW_EINVAL      = -7,  /* a caller passed a bad argument or option value                   */
    IFLOW_ENOTFOUND   = -8,  /* a named file, tensor, key or token does not exist                */
    IFLOW_ESHAPE      = -9,  /* a tensor has the wrong shape or dtype for its role               */
    IFLOW_ESPEC       = -10, /* a spec file is malformed or does not fit the checkpoint          */
    IFLOW_ERANGE      = -11, /* a value is out of its allowed range (context too long, id > vocab)*/
    IFLOW_E_COUNT_    = 12
};

/* The code's name: "ok", "io", "nomem", "format", "truncated", "checksum", "unsupported",
 * "invalid", "notfound", "shape", "spec", "range"; "unknown" for anything else. */
IFLOW_API const char *iflow_strerror(int code);
/* What the code means, one sentence ("a file is malformed"); "unknown error code" otherwise. */
IFLOW_API const char *iflow_error_describe(int code);
/* The last failure's message on this thread ("" if none). */
IFLOW_API const char *iflow_errmsg(void);

/* Free memory the library handed over (token arrays, decoded text). */
IFLOW_API void iflow_free(void *p);

/* ---- tokenizer ---------------------------------------------------------------------------- */

typedef struct iflow_tokenizer iflow_tokenizer;

/* IFLOW_TOK_ADD_BOS: add what the tokenizer's template adds around one sequence (a BOS for
 * Llama-style models). IFLOW_TOK_PARSE_SPECIAL: read special-token text such as "<s>" as the
 * special token (otherwise it is plain text). */
enum { IFLOW_TOK_ADD_BOS = 1, IFLOW_TOK_PARSE_SPECIAL = 2 };

/* A tokenizer on its own, from a tokenizer.json, a GGUF file, a SentencePiece model (*.spm,
 * *.model), or a directory holding a tokenizer.json (else tokenizer.gguf, else a Marian
 * source.spm + vocab.json, else spiece.model). A model carries its own: iflow_model_tokenizer(),
 * and an encoder-decoder's target side iflow_model_target_tokenizer(). */
IFLOW_API int  iflow_tokenizer_open(iflow_tokenizer **out, const char *path);
IFLOW_API void iflow_tokenizer_close(iflow_tokenizer *t);
/* Token ids of text[0..len). *ids is malloc'd (NULL when *n_ids is 0). */
IFLOW_API int iflow_tokenizer_encode(const iflow_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                                     size_t *n_ids);
/* Text of a sequence: *text is malloc'd and NUL-terminated; *len excludes the NUL. */
IFLOW_API int iflow_tokenizer_decode(const iflow_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len);
/* Bytes of one token as it appears in decoded text (`first`: the first token after an optional
 * BOS, whose leading space SentencePiece drops). Writes at most cap bytes, no NUL; returns the
 * count, or IFLOW_ERANGE for an id outside the vocabulary. Control tokens give "". */
IFLOW_API int iflow_tokenizer_piece(const iflow_tokenizer *t, int32_t id, int first, char *buf, size_t cap);
/* A cap that holds any token's piece (tokens may be long: GPT-NeoX's vocabulary has 1024-byte ones). */
IFLOW_API size_t iflow_tokenizer_max_piece(const iflow_tokenizer *t);
IFLOW_API int32_t iflow_tokenizer_n_vocab(const iflow_tokenizer *t);
IFLOW_API int32_t iflow_tokenizer_bos(const iflow_tokenizer *t); /* -1 if none */
IFLOW_API int32_t iflow_tokenizer_eos(const iflow_tokenizer *t); /* -1 if none */

/* ---- model -------------------------------------------------------------------------------- */

typedef struct iflow_model iflow_model;

enum { IFLOW_MODEL_NO_VERIFY = 1 }; /* iflow_model_open flag: skip the payload checksums */

/* Open a shard file (path, or "-" for standard input) or a directory of split shards, check
 * every tensor the model needs (the error names the tensor) and load its tokenizer. The
 * weights are used in place from the file mapping. */
IFLOW_API int  iflow_model_open(iflow_model **out, const char *path, int flags);
IFLOW_API void iflow_model_close(iflow_model *m);
/* The model's tokenizer (borrowed), or NULL when the shard has none: what encodes text for it
 * (an encoder-decoder's source side). */
IFLOW_API const iflow_tokenizer *iflow_model_tokenizer(const iflow_model *m);
/* The tokenizer of the ids the model generates (borrowed): an encoder-decoder's target side when
 * its shard carries one (Marian's target.spm), else the same as iflow_model_tokenizer(). */
IFLOW_API const iflow_tokenizer *iflow_model_target_tokenizer(const iflow_model *m);
/* 1 if id is one of the model's end-of-sequence tokens. */
IFLOW_API int iflow_model_is_eos(const iflow_model *m, int32_t id);
/* Apply the LoRA adapter at path (a PEFT directory, or its adapter_model.safetensors beside its
 * adapter_config.json, or a llama.cpp GGUF adapter), its deltas times scale, at run time on the
 * CPU (q, k, v, o, gate, up, down of a decoder-only model): to every sequence (per_request 0:
 * returns 0), or only to the batch requests that ask for it (per_request 1: returns its number
 * for iflow_request.adapter, 1 for the first). spec_path: the directories (':' between them) in
 * which to find the spec the model was converted with (its NAME.ini: the repository's specs/ or
 * the installed share/iflow/specs), to name the model's tensors as the adapter does. On an error
 * the model is as it was. */
IFLOW_API int iflow_model_load_lora(iflow_model *m, const char *path, double scale, int per_request,
                                    const char *spec_path);

typedef struct {
    int n_vocab;        /* logits per position                                     */
    int n_ctx_train;    /* the longest context the model was trained for           */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim;
    int32_t bos;        /* beginning-of-sequence token, -1 if none                 */
    int32_t eos;        /* the first end-of-sequence token, -1 if none             */
} iflow_model_info;

IFLOW_API void iflow_model_get_info(const iflow_model *m, iflow_model_info *info);

/* ---- evaluation: tokens in, logits out ----------------------------------------------------- */

typedef struct iflow_ctx iflow_ctx;

/* A context: a KV cache of n_ctx positions (<= 0: the model's n_ctx_train) and scratch,
 * computing with n_threads threads (<= 0: all cores). The cache holds F32; iflow_ctx_open_kv
 * takes its type as iflow_batch_params.kv_type does (0: F32, 1: F16, 2: INT8 with a scale per
 * group; IFLOW_EINVAL for another). */
IFLOW_API int  iflow_ctx_open(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads);
IFLOW_API int  iflow_ctx_open_kv(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads, int kv_type);
IFLOW_API void iflow_ctx_close(iflow_ctx *c);
/* Forget every position (the cache is reused). */
IFLOW_API void iflow_ctx_reset(iflow_ctx *c);
IFLOW_API int  iflow_ctx_n_past(const iflow_ctx *c);
IFLOW_API int  iflow_ctx_n_ctx(const iflow_ctx *c);
IFLOW_API int  iflow_ctx_n_vocab(const iflow_ctx *c);
/* Run n tokens at positions n_past .. n_past+n-1. logits: NULL; or float [n_vocab] for the
 * last token; or, with all_logits, float [n][n_vocab]. IFLOW_ERANGE when the cache would
 * overflow or an id is outside the vocabulary. */
IFLOW_API int  iflow_ctx_eval(iflow_ctx *c, const int32_t *ids, int n, float *logits, int all_logits);
/* As iflow_ctx_eval, and *next = the most likely token after the last one (lowest id on ties). */
IFLOW_API int  iflow_ctx_eval_argmax(iflow_ctx *c, const int32_t *ids, int n, int32_t *next);
/* An encoder model (an embedding model such as all-MiniLM-L6-v2): out = float [dim] (see
 * iflow_model_info), the pooled last hidden states of one input of n <= IFLOW_MAX_STEP tokens
 * (every position seeing every other; the model's pooling and normalization). Each call stands
 * alone. IFLOW_EUNSUPPORTED on a decoder, as is iflow_ctx_eval on an encoder. */
IFLOW_API int  iflow_ctx_embed(iflow_ctx *c, const int32_t *ids, int n, float *out);
/* log_softmax(logits)[id] in double precision; index of the largest of x[0..n). */
IFLOW_API double  iflow_logprob(const float *logits, int n_vocab, int32_t id);
IFLOW_API int32_t iflow_argmax(const float *x, int n);

/* ---- sampling ----------------------------------------------------------------------------- */

enum { IFLOW_SAMPLER_CHAIN, IFLOW_SAMPLER_GREEDY, IFLOW_SAMPLER_MIROSTAT, IFLOW_SAMPLER_MIROSTAT2,
       IFLOW_SAMPLER_FSD, IFLOW_SAMPLER_RFSD, IFLOW_SAMPLER_KINDS_ };

/* Every field is "off" or its default at zero, so a zeroed struct is greedy decoding. The
 * chain (kind 0) is llama.cpp's order: penalties -> top-k -> tail-free -> typical -> top-p ->
 * min-p -> temperature -> a seeded draw. Set fields by name with iflow_sampler_params_set()
 * ("temperature", "top_k", "min_p", "seed", "sampler", ...; see iflow-run(1)). */
typedef struct {
    float temp;              /* 0: greedy */
    int top_k;               /* <= 0: off */
    float top_p;             /* 0 or >= 1: off */
    uint64_t seed;
    int kind;                /* IFLOW_SAMPLER_*; 0: the chain */
    float min_p;             /* 0: off */
    float typical_p;         /* 0 or >= 1: off */
    float tfs_z;             /* 0 or >= 1: off */
    float mirostat_tau;      /* target surprise in bits; 0: 5 */
    float mirostat_eta;      /* learning rate; 0: 0.1 */
    float repeat_penalty;    /* 0 or 1: off */
    int repeat_last_n;       /* window of the penalties; 0: 64; -1: every accepted token */
    float frequency_penalty; /* per occurrence in the window; 0: off */
    float presence_penalty;  /* once if in the window; 0: off */
    float fsd_alpha;         /* weight of the anti-LM; 0: 0.65 */
    int fsd_k;               /* candidates; 0: 3 */
    int fsd_n;               /* n-gram order of the anti-LM; 0: 3 */
    float fsd_beta;          /* smoothing of the anti-LM; 0: 0.9 */
    int fsd_random_steps;    /* rfsd: samples drawn at random; 0: all */
} iflow_sampler_params;

typedef struct iflow_sampler iflow_sampler;

/* iflow-run's defaults: the chain with temp 0.8, top-k 40, top-p 0.95, seed 0, the rest off. */
IFLOW_API void iflow_sampler_params_default(iflow_sampler_params *p);
/* Set one field from text by name; IFLOW_EINVAL for an unknown name or a bad value. */
IFLOW_API int  iflow_sampler_params_set(iflow_sampler_params *p, const char *name, const char *value);
/* One sampler per sequence: accept() every token of the sequence (the prompt's, then each
 * generated one), sample() the next; reset() starts a new sequence (the accepted tokens are
 * forgotten, the seeded generator runs on). The sampler owns its scratch; logits are only read. */
IFLOW_API int  iflow_sampler_open(iflow_sampler **out, const iflow_sampler_params *p, int n_vocab);
IFLOW_API void iflow_sampler_close(iflow_sampler *s);
IFLOW_API void iflow_sampler_reset(iflow_sampler *s);
IFLOW_API int  iflow_sampler_accept(iflow_sampler *s, int32_t token);
IFLOW_API int32_t iflow_sampler_sample(iflow_sampler *s, const float *logits);
/* Add bias to token id's logit before every other stage, while fewer than `until` tokens have
 * been accepted since the last reset (until < 0: always); -INFINITY bans the token. Biases stay
 * through reset() until clear_bias(). */
IFLOW_API int  iflow_sampler_add_bias(iflow_sampler *s, int32_t id, float bias, int until);
/* Only tokens ids [n] may be drawn (vLLM's allowed_token_ids; n 0: any again). */
IFLOW_API int  iflow_sampler_allow(iflow_sampler *s, const int32_t *ids, int n);
/* Ban ids [n] as a sequence (vLLM's bad_words): its last token may not follow its first n - 1
 * among the tokens accepted from now on (one token: never drawn). clear_bias() drops these too. */
IFLOW_API int  iflow_sampler_ban_sequence(iflow_sampler *s, const int32_t *ids, int n);
IFLOW_API void iflow_sampler_clear_bias(iflow_sampler *s);
/* The chain as it runs, one line, into buf (cap bytes); returns buf. */
IFLOW_API const char *iflow_sampler_describe(const iflow_sampler *s, char *buf, int cap);

/* ---- batch generation: many requests share every step (continuous batching) ----------------
 *
 * Add requests (tokenized prompts), run steps, take finished results. A step admits queued
 * requests in arrival order while fewer than `parallel` run and the free KV blocks cover the
 * prompt plus max_tokens; prefill chunks and decode tokens go through one forward step
 * together. A request's tokens depend only on the model, its prompt and its sampling
 * parameters, never on the other requests. One thread drives a batch. */

#define IFLOW_MAX_STEP 128 /* requests in one step; tokens in one step and in one forward pass of
                            * iflow_ctx_eval too, but 512 where no layer and not the output runs
                            * in host memory (a GPU placement) */
#define IFLOW_MAX_STOP 8   /* stop strings per request */

typedef struct {
    int parallel;      /* requests running at once (decoding or prefilling); default 16      */
    int n_ctx;         /* positions per request; <= 0: the model's n_ctx_train               */
    int kv_type;       /* 0: F32 (default), 1: F16, 2: INT8 with a scale per group           */
    int block;         /* positions per KV block; <= 0: 16                                   */
    int n_blocks;      /* blocks in the cache; <= 0: enough for parallel requests of n_ctx */
    int step_tokens;   /* tokens per step; <= 0 or more than a step holds: the most (128, or
                        * 512 on a GPU placement: IFLOW_MAX_STEP's comment)                */
    int n_threads;     /* <= 0: all cores                                                   */
    int no_prefix_cache; /* 1: every request evaluates its whole prompt. By default a request
                        * takes the KV blocks of the longest run of full prompt blocks that an
                        * earlier request's prompt had alike (the same tokens from position 0),
                        * instead of evaluating them: the same keys and values, so the same
                        * tokens; the blocks stay cached when their requests end, until their
                        * room is needed. Not for a request with a context shift.              */
} iflow_batch_params;

/* GRAMMAR: the request's grammar (iflow_request.grammar) is complete and nothing may follow,
 * or no token of the vocabulary can continue the text under it. */
enum { IFLOW_FINISH_EOS = 0, IFLOW_FINISH_LENGTH, IFLOW_FINISH_STOP, IFLOW_FINISH_CONTEXT, IFLOW_FINISH_GRAMMAR };
/* "eos", "length", "stop", "context", "grammar". */
IFLOW_API const char *iflow_finish_name(int finish);

/* What a request does when its context is full (iflow_request.context_shift):
 *   NONE       it ends there (finish reason "context"; max_tokens is clipped at admission);
 *   ROPE       keep the first `keep` positions (attention sinks), drop the older half of the
 *              rest, and rotate the cached keys after them back to their new positions (no
 *              recomputation, one pass over the cache);
 *   RECOMPUTE  the same tokens kept, their cache recomputed from the tokens (a prefill of
 *              the kept window).
 * Either way generation goes on up to max_tokens, in the KV blocks of one context: memory
 * stays flat however long the request runs. */
enum { IFLOW_SHIFT_NONE = 0, IFLOW_SHIFT_ROPE, IFLOW_SHIFT_RECOMPUTE };
/* "none", "rope", "recompute"; and back (-1 for another name). */
IFLOW_API const char *iflow_shift_name(int shift);
IFLOW_API int iflow_shift_from_name(const char *name);

#define IFLOW_MAX_TOP_LOGPROBS 20
#define IFLOW_MAX_BIAS 1024 /* iflow_request.n_bias */
#define IFLOW_MAX_STOP_IDS 16 /* iflow_request.n_stop_ids */
#define IFLOW_MAX_BAD_WORDS 128 /* iflow_request.n_bad: sequences (vLLM's bounds) */
#define IFLOW_MAX_BAD_TOKENS 1024 /* and their tokens together */
/* A position's log-probabilities, natural log, of the model's own distribution (log_softmax of
 * its logits in double precision, before any sampling step): the token's, and those of the
 * n_top most likely tokens there, most likely first (the lower id first among equals). */
typedef struct {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[IFLOW_MAX_TOP_LOGPROBS];
    float top_logprob[IFLOW_MAX_TOP_LOGPROBS];
} iflow_token_logprob;

typedef struct {
    const int32_t *prompt;          /* [n_prompt] token ids (a BOS included if wanted)       */
    int n_prompt;
    int max_tokens;                 /* tokens to generate at most (>= 1; 0 with prompt_logprobs) */
    iflow_sampler_params sampling;  /* temp 0: greedy                                        */
    const char *stop[IFLOW_MAX_STOP]; /* stop strings (copied, none empty); the text ends before one */
    int n_stop;
    int context_shift;              /* IFLOW_SHIFT_* (0: none)                               */
    int keep;                       /* positions a shift keeps (BOS included; at most the
                                     * prompt's length; -1: the whole prompt)               */
    void *user;                     /* handed back in the result and to on_text             */
    /* Optional: called during a step with each piece of text as it becomes final (a tail
     * that may start a stop string is held back until it is settled). */
    void (*on_text)(void *user, const char *text, size_t n);
    int logprobs;                   /* 0: none; n >= 1: each generated token's log-probability
                                     * and the n - 1 most likely at its position (at most
                                     * IFLOW_MAX_TOP_LOGPROBS + 1): iflow_result.logprobs     */
    int prompt_logprobs;            /* the same for each prompt token after the first, given the
                                     * ones before it (scoring). Neither changes the tokens; a
                                     * request with logprobs takes no draft proposals        */
    int prompt_logprobs_from;       /* with prompt_logprobs: the first position scored (<= 1:
                                     * the second token; those before get a NAN entry). The
                                     * blocks wholly before the position before it may come from
                                     * the prefix cache; max_tokens may then be 0: score only */
    /* Optional: the generated text must follow this grammar (constrained decoding: each draw
     * only among the tokens it allows, end-of-sequence only where it may end). The batch holds
     * a reference (iflow_grammar_open's object may be closed after iflow_batch_add). With a
     * draft, its proposals are not constrained; the model's draws are, so a proposal the grammar
     * refuses is never kept */
    const struct iflow_grammar *grammar;
    /* Optional, with grammar: the grammar applies only once the generated text has held this
     * marker (at most IFLOW_MAX_GRAMMAR_AFTER bytes; a reasoning model's "</think>": it thinks
     * freely, then answers under the grammar), from the bytes after it, JSON whitespace right
     * after it skipped (what the grammar refuses of the marker's own token is let go: it then
     * begins at the next token). NULL or "": from the first token */
    const char *grammar_after;
    /* Optional: the model's LoRA adapter this request computes with (1, 2, ...: the numbers
     * iflow_model_load_lora gave with per_request), or 0: none. Requests of different adapters share
     * every step (the base weights read once for all); the prefix cache shares blocks only among
     * requests of the same adapter. A draft model proposes without it */
    int adapter;
    /* Optional: logit biases (OpenAI's logit_bias, llama.cpp's --logit-bias): bias_values[i] is
     * added to token bias_ids[i]'s logit before any sampling step, -INFINITY bans it (copied; at
     * most IFLOW_MAX_BIAS; a token may appear more than once: the biases add up). A biased
     * request's draws are made on the host (the device's argmax is for plain greedy ones); its
     * log-probabilities are still the model's own */
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias;
    int min_tokens;                 /* the model's end-of-sequence tokens are banned, and no
                                     * stop string ends the text, until this many tokens are
                                     * generated (vLLM's min_tokens; a stop string that the
                                     * token reaching it completes counts); <= max_tokens   */
    int ignore_eos;                 /* 1: they are banned throughout (llama.cpp's --ignore-eos):
                                     * the text ends at max_tokens, a stop string, the context or
                                     * the grammar                                          */
    /* Optional: more tokens that end the text as an end-of-sequence token does (vLLM's
     * stop_token_ids: a chat model's end of turn its config does not list): the token is left
     * out of the tokens and the text, the finish is IFLOW_FINISH_STOP and iflow_result.stop_token
     * names it; min_tokens bans them too, ignore_eos does not (copied; at most
     * IFLOW_MAX_STOP_IDS) */
    const int32_t *stop_ids;
    int n_stop_ids;
    int include_stop;               /* 1: the stop string that ended the text stays at its end
                                     * (vLLM's include_stop_str_in_output; what followed it in
                                     * the same token still goes)                          */
    /* Optional: only these tokens may be generated (vLLM's allowed_token_ids; copied; the
     * end-of-sequence tokens too only if listed) */
    const int32_t *allowed_ids;
    int n_allowed;
    /* Optional: banned token sequences (vLLM's bad_words, tokenized): the last token of each may
     * not follow the rest of it among the generated tokens (one token: never generated).
     * bad_ids holds them end to end, bad_lens [n_bad] their lengths (>= 1; copied; at most
     * IFLOW_MAX_BAD_WORDS sequences of IFLOW_MAX_BAD_TOKENS tokens together) */
    const int32_t *bad_ids;
    const int *bad_lens;
    int n_bad;
} iflow_request;

#define IFLOW_MAX_GRAMMAR_AFTER 63

typedef struct {
    void *user;
    int32_t *tokens;                /* [n_tokens] generated (an ending EOS not included)     */
    int n_tokens, n_prompt;
    char *text;                     /* the generated text, NUL-terminated, cut before a stop */
    size_t text_len;
    int finish;                     /* IFLOW_FINISH_*                                        */
    int stop_index;                 /* IFLOW_FINISH_STOP: which stop string; else -1         */
    int32_t stop_token;             /* IFLOW_FINISH_STOP by a stop token (iflow_request.stop_ids):
                                     * which; else -1                                        */
    double t_added, t_started, t_first, t_done; /* seconds (CLOCK_MONOTONIC)                */
    /* [n_tokens] with iflow_request.logprobs, else NULL */
    iflow_token_logprob *logprobs;
    /* [n_prompt] with iflow_request.prompt_logprobs (entry 0, nothing before it: logprob NAN),
     * else NULL */
    iflow_token_logprob *prompt_logprobs;
} iflow_result;

typedef struct {
    uint64_t steps, step_tokens;    /* steps run and the tokens they held                   */
    uint64_t running_sum;           /* sum over steps of the requests running               */
    uint64_t generated, prompt;     /* tokens generated, prompt tokens prefilled            */
    uint64_t prompt_cached;         /* prompt tokens taken from the prefix cache instead    */
    uint64_t shifts, recomputed;    /* context shifts, and the tokens re-evaluated for them */
    uint64_t drafted, accepted;     /* draft tokens proposed, and those the model accepted  */
    int blocks_total, blocks_used, blocks_peak; /* used: held by requests                   */
    int blocks_idle;                /* cached, held by none: reused, or taken when needed   */
    int running, queued;            /* now                                                  */
} iflow_batch_stats;

typedef struct iflow_batch iflow_batch;

/* p: NULL or zeroed fields for the defaults. */
IFLOW_API int  iflow_batch_open(iflow_batch **out, const iflow_model *m, const iflow_batch_params *p);
IFLOW_API void iflow_batch_close(iflow_batch *b);
/* Queue a request (its memory is copied). A request that can never run (empty, a token
 * outside the vocabulary, a prompt that fills the context) is refused, nothing queued. */
IFLOW_API int  iflow_batch_add(iflow_batch *b, const iflow_request *r);
/* One step. Returns the number of requests running or queued after it (0: idle), or < 0 (an
 * engine failure: close the batch). */
IFLOW_API int  iflow_batch_step(iflow_batch *b);
/* 1 and *out set to a finished result (free with iflow_result_free), or 0 if none is ready. */
IFLOW_API int  iflow_batch_take(iflow_batch *b, iflow_result **out);
IFLOW_API void iflow_result_free(iflow_result *r);
IFLOW_API int  iflow_batch_pending(const iflow_batch *b);
IFLOW_API void iflow_batch_get_stats(const iflow_batch *b, iflow_batch_stats *st);

/* ---- generation: one prompt, one continuation ----------------------------------------------- */

typedef struct {
    int max_tokens;                   /* at most this many tokens (default 128)              */
    iflow_sampler_params sampling;    /* default: iflow_sampler_params_default()            */
    const char *stop[IFLOW_MAX_STOP]; /* stop strings; the text ends before the first found */
    int n_stop;
    int n_ctx;                        /* <= 0: the model's n_ctx_train                       */
    int n_threads;                    /* <= 0: all cores                                     */
    int add_bos;                      /* add the tokenizer's BOS before the prompt (default 1) */
    /* Optional: each piece of text as it becomes final, while generating. */
    void (*on_text)(void *user, const char *text, size_t n);
    void *user;
    const struct iflow_grammar *grammar; /* NULL, or the text must follow it (iflow_request.grammar) */
    const int32_t *bias_ids;          /* logit biases, min_tokens, ignore_eos: iflow_request's */
    const float *bias_values;
    int n_bias;
    int min_tokens, ignore_eos;
    const int32_t *stop_ids;          /* stop tokens, include_stop, allowed tokens: iflow_request's */
    int n_stop_ids;
    int include_stop;
    const int32_t *allowed_ids;
    int n_allowed;
    const char *const *bad_words;     /* [n_bad_words] texts never generated (vLLM's bad_words: each */
    int n_bad_words;                  /* tokenized as it is and after a space; iflow_request.bad_ids) */
} iflow_generate_params;

IFLOW_API void iflow_generate_params_default(iflow_generate_params *p);
/* Tokenize prompt (NUL-terminated) with the model's tokenizer and generate its continuation
 * through the batch engine (so it gives the same tokens as the same request in a batch).
 * *out: the result, free it with iflow_result_free(). */
IFLOW_API int iflow_generate(const iflow_model *m, const char *prompt, const iflow_generate_params *p,
                             iflow_result **out);

/* ---- chat ------------------------------------------------------------------------------------
 *
 * A conversation made into prompt tokens by a chat template (the Jinja template a Hugging Face
 * checkpoint carries), as transformers' apply_chat_template(tokenize=True) does. */

typedef struct iflow_chat iflow_chat;

/* The chat template of model m (its checkpoint's: a GGUF's tokenizer.chat_template, a model
 * directory's chat_template.jinja or tokenizer_config.json "chat_template"), or with
 * template_path non-NULL that file's. IFLOW_ENOTFOUND when the model has none. */
IFLOW_API int  iflow_chat_open(iflow_chat **out, const iflow_model *m, const char *template_path);
IFLOW_API void iflow_chat_close(iflow_chat *c);
/* The prompt tokens of a conversation: messages_json is the JSON text of a list of messages,
 * [{"role": "system" | "user" | "assistant" | ..., "content": "..."}, ...]; with
 * add_generation_prompt the template opens the assistant's reply. *ids is malloc'd. Give them
 * to iflow_batch_add() (iflow_request.prompt); the reply ends at the model's end-of-turn token. */
IFLOW_API int iflow_chat_tokens(const iflow_chat *c, const char *messages_json, size_t len, int add_generation_prompt,
                                int32_t **ids, size_t *n_ids);

/* ---- grammars (constrained decoding) --------------------------------------------------------
 *
 * A grammar in GBNF (llama.cpp's grammar language: rules `name ::= ...`, "literals",
 * [classes], ( ), * + ? {m,n}; the whole language in libcore/serving/grammar.h), or made from
 * a JSON Schema or a regular expression. Give it to a request (iflow_request.grammar). */

typedef struct iflow_grammar iflow_grammar;

/* text [len] GBNF; root: the start rule (NULL: "root"). IFLOW_EINVAL naming line and column. */
IFLOW_API int  iflow_grammar_open(iflow_grammar **out, const char *text, size_t len, const char *root);
IFLOW_API void iflow_grammar_close(iflow_grammar *g);
/* GBNF text (malloc'd, root rule "root") for JSON valid under a JSON Schema [len] (NULL or "{}":
 * any JSON value); refuses, naming them, the keywords it cannot enforce. */
IFLOW_API int  iflow_grammar_from_json_schema(const char *schema, size_t len, char **out);
/* GBNF rules (malloc'd) for text that a regular expression [len] matches whole; the first rule
 * is `name`. */
IFLOW_API int  iflow_grammar_from_regex(const char *re, size_t len, const char *name, char **out);

/* ---- perplexity ----------------------------------------------------------------------------
 *
 * IFLOW_PPL_WINDOWS: non-overlapping windows of n_ctx-1 text tokens, each after a BOS from an
 * empty cache; every token is predicted once. IFLOW_PPL_LLAMACPP: llama.cpp's llama-perplexity
 * (chunks of n_ctx, the second half of each scored). Sums are in double precision;
 * perplexity = exp(nll_sum / n_scored). */
enum { IFLOW_PPL_WINDOWS = 0, IFLOW_PPL_LLAMACPP = 1 };

typedef struct {
    int protocol;       /* IFLOW_PPL_*                                                         */
    int n_ctx;          /* window length c, at most the context's n_ctx                        */
    long max_windows;   /* 0: as many as the text gives                                        */
    iflow_ctx *base;    /* NULL, or a reference model's context: KL divergence against it     */
} iflow_ppl_opts;

typedef struct {
    double nll_sum;     /* sum of -log p over scored positions */
    long n_scored;
    long n_windows;
    /* with a base model */
    double base_nll_sum;   /* the base's sum of -log p over the same positions  */
    double kld_sum;        /* sum of KL(P_base || P_model)                       */
    double kld_max;
    long top1_same;        /* positions where both models' argmax agree          */
} iflow_ppl_result;

/* Called once per scored position: position is the index of the predicting token in
 * [BOS] x_1..x_n, so it predicts x_{position+1}, with log-probability logprob. */
typedef void (*iflow_ppl_cb)(void *user, long position, long window, int window_pos, int32_t input_id,
                             int32_t next_id, double logprob);

/* Perplexity of text_ids with context ctx (its n_ctx at least o->n_ctx): tokenize the text
 * without IFLOW_TOK_ADD_BOS and pass the model's BOS (iflow_model_info.bos), which starts
 * every window. cb (may be NULL) sees every scored position, in order. */
IFLOW_API int iflow_ppl_run(iflow_ctx *ctx, const int32_t *text_ids, size_t n, int32_t bos, const iflow_ppl_opts *o,
                            iflow_ppl_result *res, iflow_ppl_cb cb, void *user);
/* The windows iflow_ppl_run scores for n text tokens under o. */
IFLOW_API long iflow_ppl_windows(size_t n, const iflow_ppl_opts *o);

#ifdef __cplusplus
}
#endif

#endif
