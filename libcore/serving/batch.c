/* batch.c -- continuous batching over a paged KV cache. See batch.h. */
#include "libcore/serving/batch.h"
#include "libcore/base/error.h"
#include "libcore/base/util.h"
#include "libcore/serving/blocks.h"
#include "libcore/serving/grammar.h"
#include "libcore/engine/ppl.h"
#include "libcore/engine/stop.h"
#include "kernels/cpu/kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { QUEUED, PREFILL, DECODE };

/* One request, from add() to its result. */
typedef struct req {
    struct req *next;             /* the queue, then the running list, in arrival order    */
    int state;
    int32_t *prompt;              /* [n_prompt]                                             */
    int n_prompt, max_tokens;
    int adapter;                  /* the model's adapter its steps compute with (0: none)  */
    int32_t stop_ids[IFLOW_MAX_STOP_IDS]; /* tokens that end it (iflow_request.stop_ids)     */
    int n_stop_ids;
    int include_stop;             /* the stop string that ends it stays in the text        */
    int min_tokens;               /* no stop string ends it before this many tokens        */
    int clipped;                  /* max_tokens was cut to what the context holds          */
    const int32_t *fill;          /* PREFILL: the tokens to evaluate from position 0: the
                                   * prompt, or after a RECOMPUTE shift the kept window    */
    int n_fill;
    int n_done;                   /* of fill, the tokens already in the cache              */
    int n_past;                   /* positions in the cache                                */
    int shift, keep;              /* context shift (IFLOW_SHIFT_*) and positions it keeps  */
    int32_t *window;              /* shift: [n_ctx + 1] the token at each cache position   */
    /* speculative decoding (b->draft) */
    iflow_sampler *dsampler;      /* the draft's draws (same settings, its own stream); NULL: no proposals */
    int d_past;                   /* positions of the draft's cache that hold this request's tokens */
    int n_prop;                   /* proposals this step                                   */
    int32_t vids[IFLOW_MAX_DRAFT + 1]; /* this step's rows: the pending token, the proposals */
    int32_t vnext[IFLOW_MAX_DRAFT + 1]; /* greedy: the model's argmax after each row        */
    float *q;                     /* sampled: [n_draft][vocab] the draft's distributions   */
    int32_t pending;              /* DECODE: the last drawn token, not yet in the cache    */
    int32_t *blocks;              /* [n_reserved] block table (n_held filled, shared ones too:
                                   * n_reserved - n_held are still reserved, not yet taken) */
    int n_reserved, n_held;
    int32_t *dblocks;             /* with a draft: [n_reserved] its cache's table (n_dheld filled) */
    int n_dheld;
    /* prefix caching (blocks.h): the prompt's full blocks before its last token */
    iflow_block_name *names;      /* [n_names] their names; n_names 0: r shares nothing     */
    int n_names;
    int n_shared;                 /* blocks[0 .. n_shared) came from the cache at admission */
    int n_waited;                 /* of those, the ones seen ready (r prefills after all)  */
    int n_named;                  /* blocks[n_shared .. n_named) are r's, named for others */
    int n_marked;                 /* of those, the ones r has written and marked ready     */
    iflow_sampler *sampler;
    int greedy;                   /* the sampler always takes the argmax (and no log-probabilities
                                   * are asked: the argmax is then found on the device)    */
    int logprobs, prompt_logprobs; /* iflow_request's                                     */
    int lp_from;                  /* prompt_logprobs: the first position scored (>= 1)     */
    iflow_token_logprob lp_next;  /* logprobs: the entry of the token being drawn          */
    iflow_stop *stop;             /* the stop strings' matcher                             */
    int first_piece;              /* the text starts at the first generated token           */
    iflow_grammar *grammar;       /* constrained decoding (a reference), or NULL            */
    iflow_gstate *gs;             /* with grammar: the text so far, parsed                  */
    int deferred;                 /* the grammar waits for `after` in the text (grammar_after) */
    char after[IFLOW_MAX_GRAMMAR_AFTER + 1];
    char tail[IFLOW_MAX_GRAMMAR_AFTER]; /* deferred: the text's last bytes, shorter than `after` */
    size_t n_after, n_tail;
    void (*on_text)(void *user, const char *text, size_t n);
    iflow_result *res;
} req;

struct iflow_batch {
    const iflow_model *m;
    const iflow_tokenizer *tok;
    char *piece;                  /* [max_piece]: a token's bytes (tokenizer.h's bound)      */
    size_t max_piece;
    iflow_batch_params p;
    iflow_kv *kv;
    iflow_ctx *ctx;
    iflow_blocks *pool;           /* the cache's blocks: who holds which, which are named   */
    int share;                    /* prefix caching on                                      */
    req *queue, *queue_tail;      /* waiting, in arrival order */
    req *running;                 /* in admission order */
    int n_running, n_queued;
    iflow_result **done;          /* finished, waiting for take() (a ring) */
    int done_head, done_n, done_cap;
    float *logits;                /* [step_tokens][vocab] the rows of output of a step     */
    iflow_batch_stats st;
    /* speculative decoding: the draft model, its cache and step context */
    const iflow_model *draft;
    iflow_kv *dkv;
    iflow_blocks *dpool;          /* the draft cache's blocks: its own, never shared        */
    iflow_ctx *dctx;
    int n_draft, accept_top_k;
    float accept_top_p;
    int d_rotates;                /* the draft's cache can rotate its keys (a ROPE shift)   */
    float *dlogits;               /* [parallel][vocab] the draft's logits of a step         */
    float *p_dist;                /* [vocab] scratch: the model's distribution              */
    int32_t dids[IFLOW_MAX_STEP]; /* a catch-up step's tokens                              */
    /* constrained decoding (requests with a grammar), made at the first such request */
    iflow_gvocab *gv;             /* the vocabulary's bytes, as a trie                     */
    uint8_t *gmask;               /* [vocab] the tokens a grammar allows next              */
    float *glogits;               /* [vocab] the logits, those not allowed -inf            */
    int32_t *eos_ids;             /* [n_eos] the tokens that end a sequence                 */
    int n_eos;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *const shift_names[] = {"none", "rope", "recompute"};

const char *iflow_shift_name(int shift)
{
    return shift >= 0 && shift <= IFLOW_SHIFT_RECOMPUTE ? shift_names[shift] : "?";
}

int iflow_shift_from_name(const char *name)
{
    for (int i = 0; i <= IFLOW_SHIFT_RECOMPUTE; i++)
        if (strcmp(name, shift_names[i]) == 0)
            return i;
    return -1;
}

const char *iflow_finish_name(int finish)
{
    static const char *const names[] = {"eos", "length", "stop", "context", "grammar"};
    return finish >= 0 && finish <= IFLOW_FINISH_GRAMMAR ? names[finish] : "?";
}

uint64_t iflow_batch_block_bytes(const iflow_model *m, int kv_type, int block)
{
    return iflow_kv_block_bytes(m, kv_type, block);
}

/* ---- lifecycle ------------------------------------------------------------------------- */

int iflow_batch_open(iflow_batch **out, const iflow_model *m, const iflow_batch_params *p)
{
    const iflow_hparams *hp = iflow_model_hparams(m);
    *out = NULL;
    iflow_batch_params q = *p;
    if (q.parallel <= 0)
        q.parallel = 16;
    if (q.n_ctx <= 0 || q.n_ctx > hp->max_seq)
        q.n_ctx = hp->max_seq;
    if (q.block <= 0) /* CUDA's attention reads one block per sequence so far: a whole context */
        q.block = iflow_model_host_only(m) ? 16 : q.n_ctx;
    if (q.n_blocks <= 0)
        q.n_blocks = q.parallel * ((q.n_ctx + q.block - 1) / q.block);
    if (q.parallel > IFLOW_MAX_STEP)
        return iflow_seterr(IFLOW_EINVAL, "%d parallel requests exceed the %d a step holds", q.parallel,
                            IFLOW_MAX_STEP);
    if (!ifk_kv_type_name(q.kv_type))
        return iflow_seterr(IFLOW_EINVAL, "unknown KV cache type %d", q.kv_type);
    iflow_batch *b = calloc(1, sizeof *b);
    if (!b)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    b->m = m;
    b->tok = iflow_model_tokenizer(m);
    b->max_piece = b->tok ? iflow_tokenizer_max_piece(b->tok) : 1;
    int rc = (b->piece = malloc(b->max_piece)) ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0)
        rc = iflow_ctx_open_steps(&b->ctx, m, q.n_threads);
    if (rc == 0) { /* a step holds the context's pass: 128 tokens, 512 on a GPU placement */
        const int most = iflow_ctx_step_tokens(b->ctx);
        if (q.step_tokens <= 0 || q.step_tokens > most)
            q.step_tokens = most;
        if (q.parallel > q.step_tokens)
            rc = iflow_seterr(IFLOW_EINVAL, "%d parallel requests exceed the %d tokens of a step", q.parallel,
                              q.step_tokens);
    }
    b->p = q;
    if (rc == 0 && !(b->logits = malloc((size_t)q.step_tokens * hp->vocab_size * sizeof(float))))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0)
        rc = iflow_blocks_open(&b->pool, q.n_blocks);
    if (rc == 0 && (rc = iflow_kv_open(&b->kv, m, q.kv_type, q.block, q.n_blocks)) == 0)
        iflow_kv_set_context(b->kv, q.n_ctx); /* longrope: a sequence's context, not the pool's */
    if (rc < 0) {
        iflow_batch_close(b);
        return rc;
    }
    b->share = !q.no_prefix_cache;
    b->st.blocks_total = q.n_blocks;
    *out = b;
    return 0;
}

void iflow_result_free(iflow_result *r)
{
    if (!r)
        return;
    free(r->tokens);
    free(r->text);
    free(r->logprobs);
    free(r->prompt_logprobs);
    free(r);
}

static void req_free(req *r)
{
    if (!r)
        return;
    free(r->prompt);
    free(r->window);
    free(r->blocks);
    free(r->dblocks);
    free(r->names);
    free(r->q);
    iflow_sampler_close(r->dsampler);
    iflow_sampler_close(r->sampler);
    iflow_stop_close(r->stop);
    iflow_gstate_close(r->gs);
    iflow_grammar_close(r->grammar);
    iflow_result_free(r->res);
    free(r);
}

void iflow_batch_close(iflow_batch *b)
{
    if (!b)
        return;
    for (req *lists[] = {b->queue, b->running}, **l = lists; l < lists + 2; l++)
        for (req *r = *l, *n; r; r = n) {
            n = r->next;
            req_free(r);
        }
    for (int i = 0; i < b->done_n; i++)
        iflow_result_free(b->done[(b->done_head + i) % b->done_cap]);
    free(b->done);
    iflow_ctx_close(b->ctx);
    iflow_kv_close(b->kv);
    iflow_ctx_close(b->dctx);
    iflow_kv_close(b->dkv);
    iflow_blocks_close(b->dpool);
    free(b->dlogits);
    free(b->p_dist);
    iflow_gvocab_close(b->gv);
    free(b->gmask);
    free(b->piece);
    free(b->glogits);
    free(b->eos_ids);
    iflow_blocks_close(b->pool);
    free(b->logits);
    free(b);
}

int iflow_batch_set_draft(iflow_batch *b, const iflow_model *draft, int n_draft, int accept_top_k, float accept_top_p)
{
    const iflow_hparams *hp = iflow_model_hparams(b->m), *dp = iflow_model_hparams(draft);
    if (b->draft || b->n_running || b->n_queued)
        return iflow_seterr(IFLOW_EINVAL, "a draft model is set before the first request, once");
    if (n_draft < 1 || n_draft > IFLOW_MAX_DRAFT || accept_top_k < 0 || !(accept_top_p >= 0 && accept_top_p <= 1))
        return iflow_seterr(IFLOW_EINVAL, "%d draft tokens a step: from 1 to %d", n_draft, IFLOW_MAX_DRAFT);
    if (dp->vocab_size != hp->vocab_size)
        return iflow_seterr(IFLOW_EINVAL, "the draft model's vocabulary of %d tokens is not the model's %d",
                            dp->vocab_size, hp->vocab_size);
    if (dp->max_seq < b->p.n_ctx)
        return iflow_seterr(IFLOW_ERANGE, "the draft model holds %d positions, the context is %d", dp->max_seq,
                            b->p.n_ctx);
    int rc = iflow_kv_open(&b->dkv, draft, b->p.kv_type, b->p.block, b->p.n_blocks);
    if (rc == 0) {
        iflow_kv_set_context(b->dkv, b->p.n_ctx);
        rc = iflow_blocks_open(&b->dpool, b->p.n_blocks);
    }
    if (rc == 0)
        rc = iflow_ctx_open_steps(&b->dctx, draft, b->p.n_threads);
    b->dlogits = malloc((size_t)b->p.parallel * hp->vocab_size * sizeof(float));
    float *p = malloc((size_t)hp->vocab_size * sizeof(float));
    if (rc == 0 && (!b->dlogits || !p))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc < 0) {
        free(p);
        iflow_ctx_close(b->dctx);
        iflow_kv_close(b->dkv);
        iflow_blocks_close(b->dpool);
        free(b->dlogits);
        b->dctx = NULL, b->dkv = NULL, b->dlogits = NULL, b->dpool = NULL;
        return rc;
    }
    b->p_dist = p;
    b->draft = draft;
    b->d_rotates = dp->position == IFLOW_POS_ROPE && iflow_kv_can_shift(b->dkv, NULL);
    b->n_draft = n_draft;
    b->accept_top_k = accept_top_k;
    b->accept_top_p = accept_top_p;
    return 0;
}

const iflow_batch_params *iflow_batch_params_of(const iflow_batch *b) { return &b->p; }
int iflow_batch_set_comm(iflow_batch *b, struct iflow_comm *comm)
{
    IFLOW_TRY(iflow_ctx_set_comm(b->ctx, comm));
    if (b->p.step_tokens > iflow_ctx_step_tokens(b->ctx)) /* processes step at IFLOW_MAX_STEP */
        b->p.step_tokens = iflow_ctx_step_tokens(b->ctx);
    return 0;
}
int iflow_batch_pending(const iflow_batch *b) { return b->n_running + b->n_queued; }

void iflow_batch_set_graphs(iflow_batch *b, int mode)
{
    iflow_ctx_set_graphs(b->ctx, mode);
    if (b->dctx)
        iflow_ctx_set_graphs(b->dctx, mode);
}

void iflow_batch_get_stats(const iflow_batch *b, iflow_batch_stats *st)
{
    *st = b->st;
    st->blocks_idle = iflow_blocks_n_idle(b->pool);
    st->blocks_used = b->p.n_blocks - iflow_blocks_n_free(b->pool) - st->blocks_idle;
    st->running = b->n_running;
    st->queued = b->n_queued;
}

/* ---- requests ---------------------------------------------------------------------------- */

static int blocks_for(const iflow_batch *b, int positions) { return (positions + b->p.block - 1) / b->p.block; }

/* What requests with a grammar need, made once: the vocabulary's trie, the end tokens, scratch. */
static int grammar_ready(iflow_batch *b)
{
    if (b->gv)
        return 0;
    if (!b->tok)
        return iflow_seterr(IFLOW_EINVAL, "a grammar needs the model's tokenizer, and this model has none");
    const int V = iflow_model_hparams(b->m)->vocab_size;
    int rc = iflow_gvocab_open(&b->gv, b->tok);
    if (rc == 0 && iflow_gvocab_n(b->gv) != V)
        rc = iflow_seterr(IFLOW_EINVAL, "the tokenizer's %d tokens are not the model's %d", iflow_gvocab_n(b->gv), V);
    b->gmask = malloc((size_t)V);
    b->glogits = malloc((size_t)V * sizeof *b->glogits);
    b->eos_ids = malloc((size_t)V * sizeof *b->eos_ids);
    if (rc == 0 && (!b->gmask || !b->glogits || !b->eos_ids))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int32_t id = 0; rc == 0 && id < V; id++)
        if (iflow_model_is_eos(b->m, id))
            b->eos_ids[b->n_eos++] = id;
    if (rc < 0) { /* nothing kept: the next request with a grammar tries again */
        iflow_gvocab_close(b->gv);
        free(b->gmask);
        free(b->glogits);
        free(b->eos_ids);
        b->gv = NULL, b->gmask = NULL, b->glogits = NULL, b->eos_ids = NULL, b->n_eos = 0;
    }
    return rc;
}

int iflow_batch_check_grammar(iflow_batch *b, const iflow_grammar *g)
{
    IFLOW_TRY(grammar_ready(b));
    return iflow_grammar_check_vocab(g, b->gv);
}

/* q's logit biases on sampler s (which has seen the prompt), its allowed tokens and banned
 * sequences (from the first generated token on), and its end-of-sequence bans: for good
 * (ignore_eos) or until min_tokens more tokens are accepted (its stop tokens too, then). */
static int set_biases(const iflow_hparams *hp, iflow_sampler *s, const iflow_request *q)
{
    for (int i = 0; i < q->n_bias; i++)
        IFLOW_TRY(iflow_sampler_add_bias(s, q->bias_ids[i], q->bias_values[i], -1));
    if (q->n_allowed)
        IFLOW_TRY(iflow_sampler_allow(s, q->allowed_ids, q->n_allowed));
    for (int i = 0, at = 0; i < q->n_bad; at += q->bad_lens[i++])
        IFLOW_TRY(iflow_sampler_ban_sequence(s, q->bad_ids + at, q->bad_lens[i]));
    if (!q->ignore_eos && q->min_tokens <= 0)
        return 0;
    const int until = iflow_sampler_n_accepted(s) + q->min_tokens;
    for (int i = 0; i < hp->n_eos; i++)
        IFLOW_TRY(iflow_sampler_add_bias(s, hp->eos[i], -INFINITY, q->ignore_eos ? -1 : until));
    for (int i = 0; i < q->n_stop_ids && q->min_tokens > 0; i++)
        IFLOW_TRY(iflow_sampler_add_bias(s, q->stop_ids[i], -INFINITY, until));
    return 0;
}

/* Each of ids [n] in the vocabulary, or IFLOW_ERANGE naming the first outside as `what`. */
static int in_vocab(const iflow_hparams *hp, const int32_t *ids, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->vocab_size)
            return iflow_seterr(IFLOW_ERANGE, "%s %d is outside the vocabulary (%d)", what, ids[i], hp->vocab_size);
    return 0;
}

/* q's allowed tokens and banned sequences: within their bounds and the vocabulary. */
static int check_token_lists(const iflow_hparams *hp, const iflow_request *q)
{
    if (q->n_allowed < 0 || q->n_allowed > hp->vocab_size || (q->n_allowed && !q->allowed_ids))
        return iflow_seterr(IFLOW_EINVAL, "%d allowed tokens: at most the vocabulary's %d", q->n_allowed,
                            hp->vocab_size);
    IFLOW_TRY(in_vocab(hp, q->allowed_ids, q->n_allowed, "allowed token"));
    if (q->n_bad < 0 || q->n_bad > IFLOW_MAX_BAD_WORDS || (q->n_bad && (!q->bad_ids || !q->bad_lens)))
        return iflow_seterr(IFLOW_EINVAL, "%d banned sequences: at most %d", q->n_bad, IFLOW_MAX_BAD_WORDS);
    for (int i = 0, total = 0; i < q->n_bad; total += q->bad_lens[i++]) {
        if (q->bad_lens[i] < 1 || q->bad_lens[i] > IFLOW_MAX_BAD_TOKENS - total)
            return iflow_seterr(IFLOW_EINVAL, "banned sequence %d of %d tokens: at least 1, and at most %d tokens "
                                "in all", i + 1, q->bad_lens[i], IFLOW_MAX_BAD_TOKENS);
        for (int k = 0; k < q->bad_lens[i]; k++)
            if (q->bad_ids[total + k] < 0 || q->bad_ids[total + k] >= hp->vocab_size)
                return iflow_seterr(IFLOW_ERANGE, "banned sequence %d: token %d is outside the vocabulary (%d)",
                                    i + 1, q->bad_ids[total + k], hp->vocab_size);
    }
    return 0;
}

int iflow_batch_add(iflow_batch *b, const iflow_request *q)
{
    const iflow_hparams *hp = iflow_model_hparams(b->m);
    if (q->n_prompt <= 0)
        return iflow_seterr(IFLOW_EINVAL, "the prompt has no tokens");
    if (q->max_tokens < 0 || (q->max_tokens == 0 && !q->prompt_logprobs))
        return iflow_seterr(IFLOW_EINVAL, "max_tokens is %d; it must be at least 1 (0 only to score a prompt)",
                            q->max_tokens);
    if (q->n_stop < 0 || q->n_stop > IFLOW_MAX_STOP)
        return iflow_seterr(IFLOW_EINVAL, "%d stop strings: at most %d", q->n_stop, IFLOW_MAX_STOP);
    if (q->logprobs < 0 || q->logprobs > IFLOW_MAX_TOP_LOGPROBS + 1 || q->prompt_logprobs < 0 ||
        q->prompt_logprobs > IFLOW_MAX_TOP_LOGPROBS + 1)
        return iflow_seterr(IFLOW_EINVAL, "log-probabilities of %d and %d: from 0 (none) to %d", q->logprobs,
                            q->prompt_logprobs, IFLOW_MAX_TOP_LOGPROBS + 1);
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= hp->vocab_size)
            return iflow_seterr(IFLOW_ERANGE, "prompt token %d is id %d, outside the vocabulary (%d)", i, q->prompt[i],
                                hp->vocab_size);
    if (q->n_prompt >= b->p.n_ctx)
        return iflow_seterr(IFLOW_ERANGE, "the prompt of %d tokens does not fit the context of %d", q->n_prompt,
                            b->p.n_ctx);
    if (q->context_shift < IFLOW_SHIFT_NONE || q->context_shift > IFLOW_SHIFT_RECOMPUTE)
        return iflow_seterr(IFLOW_EINVAL, "unknown context shift %d", q->context_shift);
    if (q->adapter < 0 || q->adapter > iflow_model_n_adapters(b->m))
        return iflow_seterr(IFLOW_EINVAL, "adapter %d: the model has %d", q->adapter, iflow_model_n_adapters(b->m));
    if (q->n_bias < 0 || q->n_bias > IFLOW_MAX_BIAS || (q->n_bias && (!q->bias_ids || !q->bias_values)))
        return iflow_seterr(IFLOW_EINVAL, "%d logit biases: at most %d, with their ids and values", q->n_bias,
                            IFLOW_MAX_BIAS);
    if (q->min_tokens < 0 || q->min_tokens > q->max_tokens)
        return iflow_seterr(IFLOW_EINVAL, "min_tokens %d: from 0 to max_tokens (%d)", q->min_tokens, q->max_tokens);
    if (q->n_stop_ids < 0 || q->n_stop_ids > IFLOW_MAX_STOP_IDS || (q->n_stop_ids && !q->stop_ids))
        return iflow_seterr(IFLOW_EINVAL, "%d stop tokens: at most %d", q->n_stop_ids, IFLOW_MAX_STOP_IDS);
    IFLOW_TRY(in_vocab(hp, q->stop_ids, q->n_stop_ids, "stop token"));
    IFLOW_TRY(check_token_lists(hp, q));
    int shift = q->context_shift, keep = q->keep < 0 || q->keep > q->n_prompt ? q->n_prompt : q->keep;
    if (shift && keep > b->p.n_ctx - 2)
        return iflow_seterr(IFLOW_ERANGE, "keeping %d positions leaves nothing to shift in a context of %d", keep,
                            b->p.n_ctx);
    const char *dev;
    if (shift == IFLOW_SHIFT_ROPE && !iflow_kv_can_shift(b->kv, &dev))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "context shift 'rope' is not implemented on %s (use 'recompute')", dev);
    int max_tokens = q->max_tokens;
    if (!shift && max_tokens > b->p.n_ctx - q->n_prompt)
        max_tokens = b->p.n_ctx - q->n_prompt;
    /* the last drawn token is never stored: the cache holds n_prompt + max_tokens - 1 positions
     * (at most n_ctx when the context shifts) */
    int64_t span = (int64_t)q->n_prompt + (max_tokens ? max_tokens : 1) - 1;
    int need = blocks_for(b, span < b->p.n_ctx ? (int)span : b->p.n_ctx);
    if (need > b->p.n_blocks)
        return iflow_seterr(IFLOW_ERANGE, "the request needs %d KV blocks; the cache has %d", need, b->p.n_blocks);
    req *r = calloc(1, sizeof *r);
    if (!r)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    r->res = calloc(1, sizeof *r->res);
    r->prompt = malloc((size_t)q->n_prompt * sizeof *r->prompt);
    r->blocks = malloc((size_t)need * sizeof *r->blocks);
    if (shift)
        r->window = malloc(((size_t)b->p.n_ctx + 1) * sizeof *r->window);
    if (b->draft)
        r->dblocks = malloc((size_t)need * sizeof *r->dblocks);
    /* prefix caching: the prompt's full blocks before its last token (that one is always
     * evaluated, for the logits); not where the cache moves (a shift) */
    const int lp_from = q->prompt_logprobs_from > 1 ? q->prompt_logprobs_from : 1;
    r->n_names = b->share && !shift ? (q->n_prompt - 1) / b->p.block : 0;
    if (q->prompt_logprobs && r->n_names > (lp_from - 1) / b->p.block) /* the rows scored are evaluated */
        r->n_names = (lp_from - 1) / b->p.block;
    if (r->n_names)
        r->names = malloc((size_t)r->n_names * sizeof *r->names);
    if (r->res) {
        r->res->tokens = malloc((size_t)(max_tokens ? max_tokens : 1) * sizeof *r->res->tokens);
        if (q->logprobs)
            r->res->logprobs = malloc((size_t)(max_tokens ? max_tokens : 1) * sizeof *r->res->logprobs);
        if (q->prompt_logprobs)
            r->res->prompt_logprobs = malloc((size_t)q->n_prompt * sizeof *r->res->prompt_logprobs);
    }
    if (!r->res || !r->prompt || !r->blocks || !r->res->tokens || (shift && !r->window) ||
        (r->n_names && !r->names) || (b->draft && !r->dblocks) || (q->logprobs && !r->res->logprobs) ||
        (q->prompt_logprobs && !r->res->prompt_logprobs)) {
        req_free(r);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    /* the sampler sees the prompt (not its BOS), as iflow-run's plain mode does */
    int rc = iflow_sampler_open(&r->sampler, &q->sampling, hp->vocab_size);
    for (int i = q->prompt[0] == hp->bos; i < q->n_prompt && rc == 0; i++)
        rc = iflow_sampler_accept(r->sampler, q->prompt[i]);
    if (rc == 0)
        rc = set_biases(hp, r->sampler, q);
    if (rc == 0)
        rc = iflow_stop_open(&r->stop, q->stop, q->n_stop);
    if (rc == 0 && q->grammar && (rc = iflow_batch_check_grammar(b, q->grammar)) == 0) {
        r->grammar = iflow_grammar_ref((iflow_grammar *)q->grammar);
        rc = iflow_gstate_open(&r->gs, q->grammar);
        r->n_after = q->grammar_after ? strlen(q->grammar_after) : 0;
        if (r->n_after > IFLOW_MAX_GRAMMAR_AFTER)
            rc = iflow_seterr(IFLOW_EINVAL, "grammar_after: %zu bytes, at most %d", r->n_after,
                              IFLOW_MAX_GRAMMAR_AFTER);
        else if ((r->deferred = r->n_after > 0))
            memcpy(r->after, q->grammar_after, r->n_after + 1);
    }
    /* the draft's own stream (not with log-probabilities: a proposal accepted has no draw). With a
     * grammar the draft proposes freely: the model's draws follow the grammar, so a proposal it
     * refuses is never accepted (fewer are, the tokens are the same) */
    if (rc == 0 && b->draft && !q->logprobs && iflow_sampler_has_dist(r->sampler)) {
        iflow_sampler_params dsp = q->sampling;
        dsp.seed ^= 0x9e3779b97f4a7c15ull;
        rc = iflow_sampler_open(&r->dsampler, &dsp, hp->vocab_size);
        for (int i = q->prompt[0] == hp->bos; i < q->n_prompt && rc == 0; i++)
            rc = iflow_sampler_accept(r->dsampler, q->prompt[i]);
        if (rc == 0) /* the draft proposes what the biases let the model choose */
            rc = set_biases(hp, r->dsampler, q);
        if (rc == 0 && !iflow_sampler_is_greedy(r->sampler) &&
            !(r->q = malloc((size_t)b->n_draft * hp->vocab_size * sizeof *r->q)))
            rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    if (rc < 0) {
        req_free(r);
        return rc;
    }
    r->logprobs = q->logprobs;
    r->prompt_logprobs = q->prompt_logprobs;
    r->greedy = iflow_sampler_is_greedy(r->sampler) && !q->logprobs && !q->prompt_logprobs && !q->grammar;
    r->lp_from = lp_from;
    for (int p = 0; q->prompt_logprobs && p < q->n_prompt && p < lp_from; p++) /* not scored */
        r->res->prompt_logprobs[p] = (iflow_token_logprob){.id = q->prompt[p], .logprob = NAN};
    memcpy(r->prompt, q->prompt, (size_t)q->n_prompt * sizeof *r->prompt);
    iflow_blocks_names(r->prompt, r->n_names, b->p.block, (uint64_t)q->adapter, r->names);
    r->adapter = q->adapter;
    r->n_prompt = q->n_prompt;
    r->max_tokens = max_tokens;
    r->clipped = max_tokens < q->max_tokens;
    r->fill = r->prompt;
    r->n_fill = q->n_prompt;
    r->shift = shift;
    r->keep = keep;
    if (shift)
        memcpy(r->window, q->prompt, (size_t)q->n_prompt * sizeof *r->window);
    r->n_reserved = need;
    r->first_piece = q->n_prompt == 1 && q->prompt[0] == hp->bos;
    r->on_text = q->on_text;
    r->res->user = q->user;
    r->res->stop_index = -1;
    r->res->stop_token = -1;
    memcpy(r->stop_ids, q->stop_ids ? q->stop_ids : r->stop_ids, (size_t)q->n_stop_ids * sizeof *r->stop_ids);
    r->n_stop_ids = q->n_stop_ids;
    r->include_stop = q->include_stop;
    r->min_tokens = q->min_tokens;
    r->res->n_prompt = q->n_prompt;
    r->res->t_added = now();
    r->state = QUEUED;
    if (b->queue_tail)
        b->queue_tail->next = r;
    else
        b->queue = r;
    b->queue_tail = r;
    b->n_queued++;
    return 0;
}

/* table[*n_held ..] filled from pool (from its reservation) to cover positions 0 .. end - 1. */
static void take_blocks(const iflow_batch *b, iflow_blocks *pool, int32_t *table, int *n_held, int end)
{
    for (int need = blocks_for(b, end); *n_held < need;)
        table[(*n_held)++] = iflow_blocks_take(pool);
}

/* Blocks of r's table for positions 0 .. end - 1. */
static void hold_blocks(iflow_batch *b, req *r, int end) { take_blocks(b, b->pool, r->blocks, &r->n_held, end); }

/* r starts: it shares the blocks of its prompt's longest prefix that the cache holds (their
 * positions are not evaluated again), reserves the rest, and names the other full blocks of
 * its prompt at once so that the requests admitted after it find them (they wait until r's
 * prefill has written them). */
static void start(iflow_batch *b, req *r, int m)
{
    iflow_blocks_share(b->pool, r->names, m, r->blocks);
    r->n_held = r->n_shared = m;
    iflow_blocks_reserve(b->pool, r->n_reserved - m);
    r->n_done = r->n_past = m * b->p.block;
    b->st.prompt_cached += (uint64_t)r->n_done;
    hold_blocks(b, r, r->n_names * b->p.block);
    r->n_named = r->n_marked = m;
    while (r->n_named < r->n_names && iflow_blocks_name(b->pool, r->blocks[r->n_named], &r->names[r->n_named]))
        r->n_named++;
    if (b->dpool) /* the draft's cache shares nothing: it catches up from position 0 */
        iflow_blocks_reserve(b->dpool, r->n_reserved);
}

/* With a draft: its cache's blocks for positions 0 .. end - 1 of r. */
static void hold_draft_blocks(iflow_batch *b, req *r, int end)
{
    take_blocks(b, b->dpool, r->dblocks, &r->n_dheld, end);
}

/* Start queued requests while there is room (arrival order: the first that does not fit
 * waits, and so do the ones behind it). Sharing an idle block takes room as a new one does. */
static int admit(iflow_batch *b)
{
    while (b->queue && b->n_running < b->p.parallel) {
        req *r = b->queue;
        int pins = 0, m = iflow_blocks_match(b->pool, r->names, r->n_names, &pins);
        if (r->n_reserved - m + pins > iflow_blocks_room(b->pool) ||
            (b->dpool && r->n_reserved > iflow_blocks_room(b->dpool)))
            break;
        b->queue = r->next;
        if (!b->queue)
            b->queue_tail = NULL;
        b->n_queued--;
        r->next = NULL;
        req **tail = &b->running;
        while (*tail)
            tail = &(*tail)->next;
        *tail = r;
        b->n_running++;
        start(b, r, m);
        r->state = PREFILL;
        r->res->t_started = now();
    }
    return 0;
}

/* Final text of r: into its result, and to its on_text. */
static int put_text(req *r, const char *text, size_t n)
{
    iflow_result *res = r->res;
    if (n == 0)
        return 0;
    char *t = realloc(res->text, res->text_len + n + 1);
    if (!t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memcpy(t + res->text_len, text, n);
    res->text = t;
    res->text_len += n;
    t[res->text_len] = 0;
    if (r->on_text)
        r->on_text(res->user, text, n);
    return 0;
}

/* r is done: its blocks go back, its result to the done ring. */
static int finish(iflow_batch *b, req *r, int why)
{
    if (b->done_n == b->done_cap) {
        int cap = b->done_cap ? 2 * b->done_cap : 16;
        iflow_result **d = malloc((size_t)cap * sizeof *d);
        if (!d)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        for (int i = 0; i < b->done_n; i++)
            d[i] = b->done[(b->done_head + i) % b->done_cap];
        free(b->done);
        b->done = d;
        b->done_head = 0;
        b->done_cap = cap;
    }
    /* the tail held back for a stop string that did not come (a stop token is no stop string) */
    if (why != IFLOW_FINISH_STOP || r->res->stop_token >= 0) {
        const char *e;
        size_t ne;
        iflow_stop_flush(r->stop, &e, &ne);
        if (put_text(r, e, ne) < 0)
            return -1;
    }
    r->res->finish = why;
    r->res->t_done = now();
    b->done[(b->done_head + b->done_n++) % b->done_cap] = r->res;
    r->res = NULL;
    iflow_blocks_release(b->pool, r->blocks, r->n_held, r->n_reserved - r->n_held);
    if (b->dpool)
        iflow_blocks_release(b->dpool, r->dblocks, r->n_dheld, r->n_reserved - r->n_dheld);
    r->n_held = r->n_dheld = 0;
    for (req **p = &b->running; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    b->n_running--;
    req_free(r);
    return 0;
}

int iflow_batch_take(iflow_batch *b, iflow_result **out)
{
    *out = NULL;
    if (b->done_n == 0)
        return 0;
    *out = b->done[b->done_head];
    b->done_head = (b->done_head + 1) % b->done_cap;
    b->done_n--;
    return 1;
}

/* Append a token's text, piece [n]: 1 if a stop string now appears in the text (it then ends
 * before it), 0 if not, < 0 on failure. */
static int append_text(req *r, const char *piece, int n)
{
    if (n <= 0)
        return 0;
    const char *emit;
    size_t n_emit;
    iflow_stop_arm(r->stop, r->res->n_tokens >= r->min_tokens); /* the token is counted already */
    int hit = iflow_stop_feed(r->stop, piece, (size_t)n, &emit, &n_emit);
    if (hit < 0)
        return hit;
    if (put_text(r, emit, n_emit) < 0)
        return -1;
    if (hit)
        r->res->stop_index = iflow_stop_which(r->stop);
    if (hit && r->include_stop) {
        const char *s = iflow_stop_string(r->stop, r->res->stop_index);
        if (put_text(r, s, strlen(s)) < 0)
            return -1;
    }
    return hit;
}

/* r is done (why: IFLOW_FINISH_*): 1, or < 0 on failure. */
static int ended(iflow_batch *b, req *r, int why) { return finish(b, r, why) < 0 ? -1 : 1; }

/* e = the log-probabilities at a position of logits [vocab]: token id's and the n_top largest. */
static void logprob_of(const float *logits, int V, int32_t id, int n_top, iflow_token_logprob *e)
{
    const double lse = iflow_logsumexp(logits, V);
    e->id = id;
    e->logprob = (float)(logits[id] - lse);
    e->n_top = 0;
    for (int i = 0; i < V && n_top > 0; i++) { /* insertion into the sorted few: strict >, lower ids first */
        int at = e->n_top;
        while (at > 0 && logits[i] > logits[e->top_id[at - 1]])
            at--;
        if (at == n_top)
            continue;
        int last = e->n_top < n_top ? e->n_top : n_top - 1;
        memmove(e->top_id + at + 1, e->top_id + at, (size_t)(last - at) * sizeof *e->top_id);
        e->top_id[at] = i;
        e->n_top = last + 1;
    }
    for (int k = 0; k < e->n_top; k++)
        e->top_logprob[k] = (float)(logits[e->top_id[k]] - lse);
}

/* b->piece = the bytes token id adds to r's text at its next position: their count, or < 0. */
static int token_piece(iflow_batch *b, req *r, int32_t id)
{
    return b->tok ? iflow_tokenizer_piece(b->tok, id, r->first_piece && r->res->n_tokens == 0, b->piece, b->max_piece)
                  : 0;
}

/* r's grammar constrains its next token: it has one, not waiting for its marker. */
static int gs_on(const req *r) { return r->gs && !r->deferred; }

/* r waits for its grammar's marker: the token's bytes [n] are looked through (with the text's
 * last bytes before them) and, where the marker ends, the grammar begins with the token's bytes
 * after it, JSON whitespace right after the marker gone by (bytes it refuses there are let go:
 * it begins at the next token instead). 0, or < 0 on failure. */
static int watch_marker(req *r, const char *bytes, size_t n)
{
    char buf[IFLOW_MAX_GRAMMAR_AFTER + 1];
    for (size_t k = 0; k < n; k++) { /* byte by byte: the marker may end anywhere in the token */
        memcpy(buf, r->tail, r->n_tail);
        buf[r->n_tail] = bytes[k];
        const size_t m = r->n_tail + 1, keep = m < r->n_after - 1 ? m : r->n_after - 1;
        if (m == r->n_after && memcmp(buf, r->after, m) == 0) {
            r->deferred = 0, r->n_tail = 0;
            size_t i = iflow_skip_ws(bytes, k + 1, n);
            int rc = i < n ? iflow_gstate_advance(r->gs, bytes + i, n - i) : 0;
            return rc == IFLOW_EINVAL ? 0 : rc;
        }
        memcpy(r->tail, buf + m - keep, keep); /* the text's last n_after - 1 bytes */
        r->n_tail = keep;
    }
    return 0;
}

/* b->gmask = the tokens r's grammar allows next: the trie's walk, or, for a text's first token
 * whose piece loses its leading space there (sentencepiece), each token's piece tested. Returns
 * how many, or < 0. */
static int grammar_mask(iflow_batch *b, req *r)
{
    if (!(r->first_piece && r->res->n_tokens == 0))
        return iflow_gstate_mask(r->gs, b->gv, b->gmask);
    const int V = iflow_gvocab_n(b->gv);
    int count = 0;
    for (int32_t id = 0; id < V; id++) {
        int n = token_piece(b, r, id), ok = 0;
        if (n >= 0 && (ok = iflow_gstate_test_token(r->gs, b->gv, id, b->piece, (size_t)n)) < 0)
            return ok;
        b->gmask[id] = (uint8_t)(ok > 0);
        count += ok > 0;
    }
    return count;
}

#define NO_TOKEN (-0x40000000) /* draw_constrained(): the grammar allows no token */

/* May end token e come next under r's grammar: where the text may end, or where a token
 * reference names it. */
static int end_allowed(const iflow_batch *b, const req *r, int32_t e)
{
    return iflow_gstate_can_end(r->gs) || iflow_gstate_token_allows(r->gs, b->gv, e);
}

/* b->gmask = what r's grammar allows next, the end tokens included as end_allowed() says, and
 * b->glogits = logits [vocab] with the rest at -inf. Returns how many are allowed (0: none), or
 * < 0. */
static int constrained_logits(iflow_batch *b, req *r, const float *logits)
{
    const int V = iflow_model_hparams(b->m)->vocab_size;
    int n = grammar_mask(b, r);
    if (n < 0)
        return n;
    for (int i = 0; i < b->n_eos; i++) {
        int32_t e = b->eos_ids[i];
        uint8_t ok = (uint8_t)end_allowed(b, r, e);
        n += (int)ok - (int)b->gmask[e];
        b->gmask[e] = ok;
    }
    for (int i = 0; i < V; i++)
        b->glogits[i] = b->gmask[i] ? logits[i] : -INFINITY;
    return n;
}

/* r's draw under its grammar: the sampler sees the logits with every token the grammar does
 * not allow next at -inf (the end tokens allowed where the text may end). A greedy sampler's
 * argmax is tried first: when the grammar takes it, it is the choice and the mask is not made.
 * The token, NO_TOKEN, or < 0 on failure. */
static int32_t draw_constrained(iflow_batch *b, req *r, const float *logits)
{
    const int V = iflow_model_hparams(b->m)->vocab_size;
    if (iflow_sampler_is_greedy(r->sampler) && !(r->first_piece && r->res->n_tokens == 0)) {
        int32_t id = iflow_argmax(logits, V);
        int ok = iflow_model_is_eos(b->m, id) ? end_allowed(b, r, id) : iflow_gstate_allows(r->gs, b->gv, id);
        if (ok != 0)
            return ok < 0 ? ok : id;
    }
    int n = constrained_logits(b, r, logits);
    return n < 0 ? n : n == 0 ? NO_TOKEN : iflow_sampler_sample(r->sampler, b->glogits);
}

/* r draws its next token from logits [vocab] (its sampler's choice), noting its log-probabilities
 * when it reports them. */
static int32_t draw(iflow_batch *b, req *r, const float *logits)
{
    const int V = iflow_model_hparams(b->m)->vocab_size;
    int32_t id = gs_on(r) ? draw_constrained(b, r, logits) : iflow_sampler_sample(r->sampler, logits);
    if (id >= 0 && r->logprobs)
        logprob_of(logits, V, id, r->logprobs - 1, &r->lp_next);
    return id;
}

/* r drew token id after its last cached position: record it, and finish r if it ends there.
 * 0 if r goes on, 1 if it ended (r is gone), < 0 on failure. */
static int accept(iflow_batch *b, req *r, int32_t id)
{
    iflow_result *res = r->res;
    if (id < 0 && id != NO_TOKEN)
        return id; /* the grammar failed */
    if (res->n_tokens == 0)
        res->t_first = now();
    if (id == NO_TOKEN)
        return ended(b, r, IFLOW_FINISH_GRAMMAR);
    if (iflow_model_is_eos(b->m, id))
        return ended(b, r, IFLOW_FINISH_EOS);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (id == r->stop_ids[i]) {
            res->stop_token = id;
            return ended(b, r, IFLOW_FINISH_STOP);
        }
    /* the piece once, before the token is counted (`first` is that of its position): the
     * grammar's state and the text take the same bytes */
    int n = token_piece(b, r, id), rc = n < 0 ? n : 0;
    if (rc == 0 && gs_on(r))
        rc = iflow_gstate_advance_token(r->gs, b->gv, id, b->piece, (size_t)n);
    else if (rc == 0 && r->gs)
        rc = watch_marker(r, b->piece, (size_t)n);
    if (rc < 0)
        return rc;
    res->tokens[res->n_tokens++] = id;
    if (res->logprobs)
        res->logprobs[res->n_tokens - 1] = r->lp_next;
    b->st.generated++;
    int stop = iflow_sampler_accept(r->sampler, id);
    if (stop == 0 && r->dsampler)
        stop = iflow_sampler_accept(r->dsampler, id);
    if (stop == 0)
        stop = append_text(r, b->piece, n);
    if (stop < 0)
        return stop;
    if (stop)
        return ended(b, r, IFLOW_FINISH_STOP);
    if (gs_on(r) && iflow_gstate_is_done(r->gs)) /* only an end could follow: it is taken as given */
        return ended(b, r, IFLOW_FINISH_GRAMMAR);
    if (res->n_tokens == r->max_tokens) /* clipped by the context, or max_tokens itself */
        return ended(b, r, r->clipped ? IFLOW_FINISH_CONTEXT : IFLOW_FINISH_LENGTH);
    r->pending = id;
    r->state = DECODE;
    return 0;
}

/* ---- a step ---------------------------------------------------------------------------------- */

/* r's context is full: keep its first positions, drop the older half of the rest. ROPE moves
 * the cache (keys rotated); RECOMPUTE sends the kept window, with the pending token, back
 * through prefill. A draft's cache loses the same positions: rotated too when it holds them
 * all and can rotate, else cut back to what is still in place (the kept positions; none for
 * RECOMPUTE) and brought up to the model's again from the window before it next proposes. */
static int shift_context(iflow_batch *b, req *r)
{
    int discard = (r->n_past - r->keep) / 2, rc;
    if (r->shift == IFLOW_SHIFT_ROPE && (rc = iflow_kv_shift(b->kv, r->blocks, r->n_past, r->keep, discard)) < 0)
        return rc;
    if (b->draft) {
        if (r->shift == IFLOW_SHIFT_ROPE && b->d_rotates && r->d_past >= r->keep + discard) {
            if ((rc = iflow_kv_shift(b->dkv, r->dblocks, r->d_past, r->keep, discard)) < 0)
                return rc;
            r->d_past -= discard;
        } else {
            int kept = r->shift == IFLOW_SHIFT_ROPE ? r->keep : 0;
            r->d_past = r->d_past < kept ? r->d_past : kept;
        }
    }
    memmove(r->window + r->keep, r->window + r->keep + discard,
            (size_t)(r->n_past - r->keep - discard) * sizeof *r->window);
    r->n_past -= discard;
    b->st.shifts++;
    if (r->shift == IFLOW_SHIFT_RECOMPUTE) {
        r->window[r->n_past] = r->pending;
        r->fill = r->window;
        r->n_fill = r->n_past + 1;
        r->n_done = r->n_past = 0;
        r->state = PREFILL;
        b->st.recomputed += (uint64_t)r->n_fill;
    }
    return 0;
}

/* r may prefill: the blocks it shares have been written (by the requests that named them). */
static int shared_ready(const iflow_batch *b, req *r)
{
    while (r->n_waited < r->n_shared && iflow_blocks_ready(b->pool, r->blocks[r->n_waited]))
        r->n_waited++;
    return r->n_waited == r->n_shared;
}

/* Sequence n of the step is r's last row before a draw: its logits for r's sampler, or for a
 * greedy request only the argmax (found where the logits are; only the id crosses). */
static void wants_token(iflow_batch *b, req *r, iflow_step_seq *q, int rows, int *out_row)
{
    q->n_out = rows;
    if (r->greedy)
        q->next = r->vnext;
    else
        q->logits = b->logits + (size_t)*out_row * iflow_model_hparams(b->m)->vocab_size;
    *out_row += rows;
}

/* The token at cache position pos of r: the window's when the context shifts, else the
 * prompt's, then what r generated. */
static int32_t token_at(const req *r, int pos)
{
    if (r->window)
        return r->window[pos];
    return pos < r->n_prompt ? r->prompt[pos] : r->res->tokens[pos - r->n_prompt];
}

/* Speculative decoding, before the model's step: how many tokens each decoding request may
 * propose (within the step's budget and its max_tokens), the draft's cache brought up to the
 * model's for those, then n_prop draft steps of one token for all of them at once. */
static int draft_phase(iflow_batch *b)
{
    const int V = iflow_model_hparams(b->m)->vocab_size;
    iflow_step_seq seqs[IFLOW_MAX_STEP];
    req *who[IFLOW_MAX_STEP];
    int n_dec = 0, max_k = 0, rc;
    for (req *r = b->running; r; r = r->next)
        n_dec += r->state == DECODE;
    int extra = b->p.step_tokens - n_dec;
    for (req *r = b->running; r; r = r->next) {
        if (r->state != DECODE)
            continue;
        /* the proposals stay inside the context: a shift comes only at a full one, as without them */
        int k = b->n_draft, left = r->max_tokens - r->res->n_tokens - 1, room = b->p.n_ctx - r->n_past - 1;
        left = left < room ? left : room;
        k = !r->dsampler ? 0 : k < left ? k : left;
        k = k < extra ? k : extra;
        r->n_prop = k > 0 ? k : 0;
        extra -= r->n_prop;
        max_k = r->n_prop > max_k ? r->n_prop : max_k;
        if (r->n_prop) {
            hold_blocks(b, r, r->n_past + r->n_prop + 1);
            hold_draft_blocks(b, r, r->n_past + r->n_prop);
        }
    }
    for (;;) { /* catch up: the positions the model has and the draft has not */
        int n = 0, tokens = 0;
        for (req *r = b->running; r && tokens < IFLOW_MAX_STEP; r = r->next) {
            if (r->state != DECODE || !r->n_prop || r->d_past >= r->n_past)
                continue;
            int chunk = r->n_past - r->d_past;
            chunk = chunk < IFLOW_MAX_STEP - tokens ? chunk : IFLOW_MAX_STEP - tokens;
            for (int i = 0; i < chunk; i++)
                b->dids[tokens + i] = token_at(r, r->d_past + i);
            seqs[n] = (iflow_step_seq){.ids = b->dids + tokens, .n = chunk, .pos0 = r->d_past, .table = r->dblocks};
            who[n++] = r;
            tokens += chunk;
        }
        if (n == 0)
            break;
        if ((rc = iflow_ctx_step(b->dctx, b->dkv, seqs, n)) < 0)
            return rc;
        for (int i = 0; i < n; i++)
            who[i]->d_past += seqs[i].n;
    }
    for (int j = 0; j < max_k; j++) { /* proposals: one token each per draft step */
        int n = 0;
        for (req *r = b->running; r; r = r->next) {
            if (r->state != DECODE || r->n_prop <= j)
                continue;
            if (j == 0)
                r->vids[0] = r->pending;
            seqs[n] = (iflow_step_seq){.ids = &r->vids[j], .n = 1, .pos0 = r->n_past + j, .table = r->dblocks};
            if (iflow_sampler_is_greedy(r->dsampler))
                seqs[n].next = &r->vids[j + 1];
            else
                seqs[n].logits = b->dlogits + (size_t)n * V;
            who[n++] = r;
        }
        if ((rc = iflow_ctx_step(b->dctx, b->dkv, seqs, n)) < 0)
            return rc;
        for (int i = 0; i < n; i++) {
            req *r = who[i];
            r->d_past = r->n_past + j + 1;
            if (seqs[i].logits) {
                float *q = r->q + (size_t)j * V;
                if ((rc = iflow_sampler_dist(r->dsampler, seqs[i].logits, q)) < 0)
                    return rc;
                r->vids[j + 1] = iflow_sampler_draw(r->dsampler, q);
            }
            if ((rc = iflow_sampler_accept(r->dsampler, r->vids[j + 1])) < 0)
                return rc;
        }
        b->st.drafted += (uint64_t)n;
    }
    return 0;
}

/* After the model's step: r's rows were its pending token and n_prop proposals. Keep the
 * proposals the model accepts, then one token of its own (the correction of the first it
 * rejects, or the next after all of them). 0, 1 if r ended (it is gone), or < 0. */
static int verify(iflow_batch *b, req *r, const iflow_step_seq *q)
{
    const int V = iflow_model_hparams(b->m)->vocab_size, k = r->n_prop, P = r->n_past;
    int rc = 0;
    if (r->dsampler) /* the draft's history back to the model's: the proposals go */
        iflow_sampler_truncate(r->dsampler, iflow_sampler_n_accepted(r->sampler));
    r->n_prop = 0;
    r->n_past = P + 1; /* the pending token is in the cache now */
    for (int i = 0; i <= k; i++) {
        int32_t tok;
        int acc = 0;
        const float *logits = q->logits + (size_t)i * V;
        if (r->greedy) {
            tok = q->next[i];
            acc = i < k && tok == r->vids[i + 1];
        } else if (i < k && gs_on(r) && iflow_sampler_is_greedy(r->sampler)) { /* the grammar's greedy choice */
            tok = draw(b, r, logits);
            acc = tok == r->vids[i + 1];
        } else if (i < k) {
            int allowed = gs_on(r) ? constrained_logits(b, r, logits) : 1; /* p: the grammar's distribution */
            if (allowed <= 0) {
                tok = allowed < 0 ? allowed : NO_TOKEN;
            } else {
                if ((rc = iflow_sampler_dist(r->sampler, gs_on(r) ? b->glogits : logits, b->p_dist)) < 0)
                    return rc;
                double u1 = iflow_sampler_uniform(r->sampler), u2 = iflow_sampler_uniform(r->sampler);
                tok = iflow_spec_verify(b->p_dist, r->q + (size_t)i * V, V, r->vids[i + 1], u1, u2,
                                        b->accept_top_k, b->accept_top_p, &acc);
                if (acc && gs_on(r) && !b->gmask[tok]) { /* a looser acceptance took what the grammar refuses */
                    acc = 0;
                    tok = iflow_argmax(b->p_dist, V);
                }
            }
        } else {
            tok = draw(b, r, logits);
        }
        if (i < k)
            b->st.accepted += (uint64_t)acc;
        if ((rc = accept(b, r, tok)) != 0)
            return rc; /* ended (r is gone) or failed */
        if (!acc)
            break;
        if (r->window)
            r->window[r->n_past] = r->vids[i + 1];
        r->n_past++; /* the accepted proposal is in the cache */
    }
    if (r->d_past > r->n_past)
        r->d_past = r->n_past;
    return 0;
}

int iflow_batch_step(iflow_batch *b)
{
    const int V = iflow_model_hparams(b->m)->vocab_size;
    iflow_step_seq seqs[IFLOW_MAX_STEP];
    req *who[IFLOW_MAX_STEP];
    int n = 0, tokens = 0, out_row = 0, rc;
    if ((rc = admit(b)) < 0)
        return rc;
    for (req *r = b->running; r; r = r->next) /* full contexts shift first (the draft's too) */
        if (r->state == DECODE && r->n_past == b->p.n_ctx && (rc = shift_context(b, r)) < 0)
            return rc;
    if (b->draft && (rc = draft_phase(b)) < 0)
        return rc;
    /* decode tokens first (one each, and the draft's proposals), then prompt chunks in
     * admission order */
    for (req *r = b->running; r && tokens < b->p.step_tokens; r = r->next)
        if (r->state == DECODE) {
            int pos = r->n_past;
            if (r->window)
                r->window[pos] = r->pending;
            r->vids[0] = r->pending; /* then the proposals, if any */
            hold_blocks(b, r, pos + 1 + r->n_prop);
            seqs[n] = (iflow_step_seq){.ids = r->vids, .n = 1 + r->n_prop, .pos0 = pos, .table = r->blocks,
                                       .adapter = r->adapter};
            wants_token(b, r, &seqs[n], 1 + r->n_prop, &out_row);
            who[n++] = r;
            tokens += 1 + r->n_prop;
        }
    for (req *r = b->running; r && tokens < b->p.step_tokens; r = r->next)
        if (r->state == PREFILL && shared_ready(b, r)) {
            int chunk = r->n_fill - r->n_done;
            if (chunk > b->p.step_tokens - tokens)
                chunk = b->p.step_tokens - tokens;
            hold_blocks(b, r, r->n_done + chunk);
            int last = r->n_done + chunk == r->n_fill;
            seqs[n] = (iflow_step_seq){.ids = r->fill + r->n_done, .n = chunk, .pos0 = r->n_done, .table = r->blocks,
                                       .adapter = r->adapter};
            int rows = 0; /* of logits: those of the positions scored, and the last one for a draw */
            if (r->prompt_logprobs && r->fill == r->prompt) {
                int first = r->lp_from - 1 > r->n_done ? r->lp_from - 1 : r->n_done;
                rows = r->n_done + chunk - first > 0 ? r->n_done + chunk - first : 0;
            }
            if (last && rows == 0)
                rows = 1;
            if (rows)
                wants_token(b, r, &seqs[n], rows, &out_row);
            who[n++] = r;
            tokens += chunk;
        }
    if (n == 0)
        return iflow_batch_pending(b);
    if ((rc = iflow_ctx_step(b->ctx, b->kv, seqs, n)) < 0)
        return rc;
    b->st.steps++;
    b->st.step_tokens += (uint64_t)tokens;
    b->st.running_sum += (uint64_t)b->n_running;
    int used = b->p.n_blocks - iflow_blocks_n_free(b->pool) - iflow_blocks_n_idle(b->pool);
    if (used > b->st.blocks_peak)
        b->st.blocks_peak = used;
    for (int i = 0; i < n; i++) {
        req *r = who[i];
        if (r->state == DECODE) {
            if ((rc = verify(b, r, &seqs[i])) < 0)
                return rc;
            continue;
        }
        if (r->prompt_logprobs && r->fill == r->prompt && seqs[i].logits) { /* the last n_out rows */
            const int first = r->n_done + seqs[i].n - seqs[i].n_out; /* row j: the logits after first + j */
            for (int j = 0, p; j < seqs[i].n_out && (p = first + j + 1) < r->n_prompt; j++)
                if (p >= r->lp_from)
                    logprob_of(seqs[i].logits + (size_t)j * V, V, r->prompt[p], r->prompt_logprobs - 1,
                               &r->res->prompt_logprobs[p]);
        }
        r->n_done += seqs[i].n;
        r->n_past = r->n_done;
        for (int full = r->n_done / b->p.block; r->n_marked < full && r->n_marked < r->n_named; r->n_marked++)
            iflow_blocks_set_ready(b->pool, r->blocks[r->n_marked]);
        if (r->fill == r->prompt)
            b->st.prompt += (uint64_t)seqs[i].n;
        if (r->n_done < r->n_fill)
            continue;
        if (r->max_tokens == 0) { /* a prompt scored, nothing to generate */
            r->res->t_first = now();
            if ((rc = finish(b, r, IFLOW_FINISH_LENGTH)) < 0)
                return rc;
            continue;
        }
        int32_t id = r->greedy ? r->vnext[0] : draw(b, r, seqs[i].logits + (size_t)(seqs[i].n_out - 1) * V);
        if ((rc = accept(b, r, id)) < 0)
            return rc;
    }
    return iflow_batch_pending(b);
}
