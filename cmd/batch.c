/* batch.c -- iflow-run --batch and --dry-run. See batch.h. */
#include "cmd/batch.h"
#include "cmd/io.h"
#include "cmd/openai.h"
#include "cmd/progress.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/beam.h"
#include "libcore/serving/chat.h"
#include "libcore/serving/metrics.h"
#include "libcore/serving/reasoning.h"
#include "libcore/serving/request.h"
#include "libcore/serving/toolcall.h"
#include "libcore/tokenizers/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a bounded queue of items between two threads ---------------------------------------- */

struct item;
typedef struct { /* what a completion's engine request carries as its user pointer */
    struct item *it;
    int k;                        /* which completion ("n")                                  */
} choice_tag;

typedef struct item {
    struct item *next;
    long line;                    /* 1-based input line                                      */
    long seq;                     /* 0-based: the items before it (blank lines are none)     */
    iflow_request_fields f;       /* the parsed line (f.id: compact JSON, the line number if none) */
    char *error;                  /* a refused request: the message                          */
    iflow_request req;            /* the tokenized prompt (malloc'd) and f's parameters; user = this item */
    iflow_result *res;            /* the finished result (writer side): completion 0's with "n" */
    iflow_result **choices;       /* [f.n] the completions' results as they come (res is [0]) */
    choice_tag *tags;             /* [f.n]                                                   */
    int n_got;                    /* results in so far                                       */
    iflow_beam_run *beam;         /* a beam search while it runs                             */
    iflow_beam *beams;            /* its results, best first (res holds the best one too)   */
    int n_beams;
    struct group *group;          /* one of an OpenAI completions line's prompts, or NULL      */
    int gi;                       /* which one                                               */
} item;

/* The items of an OpenAI completions line whose "prompt" is a list: one a prompt, written as one
 * reply (openai.c: choices prompt by prompt) once every one is in. Its items hold references;
 * the last item_free frees it. */
typedef struct group {
    int n, done;                  /* prompts, and those the writer holds                     */
    int refs;                     /* items alive (atomic)                                    */
    item **members;               /* [n] the finished ones, by prompt (the writer's)         */
    struct group *next_pending;   /* the writer's list of groups it holds members of         */
} group;

enum { MAX_PROMPTS = 2048 };      /* prompts of one completions line (OpenAI's limit for inputs) */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    int n, cap, closed;
} queue;

static void q_init(queue *q, int cap)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->cap = cap;
}

static void q_destroy(queue *q)
{
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

/* Append (waits while full, unless the queue was closed: then 0 and the item is not taken). */
static int q_push(queue *q, item *it)
{
    pthread_mutex_lock(&q->mu);
    while (q->cap > 0 && q->n >= q->cap && !q->closed)
        pthread_cond_wait(&q->cv, &q->mu);
    int ok = !q->closed;
    if (ok) {
        it->next = NULL;
        if (q->tail)
            q->tail->next = it;
        else
            q->head = it;
        q->tail = it;
        q->n++;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

/* Take the first item; `wait`: until there is one or the queue is closed. NULL if none. */
static item *q_pop(queue *q, int wait, int *closed)
{
    pthread_mutex_lock(&q->mu);
    while (wait && !q->head && !q->closed)
        pthread_cond_wait(&q->cv, &q->mu);
    item *it = q->head;
    if (it) {
        q->head = it->next;
        if (!q->head)
            q->tail = NULL;
        q->n--;
        pthread_cond_broadcast(&q->cv);
    }
    if (closed)
        *closed = q->closed && !q->head;
    pthread_mutex_unlock(&q->mu);
    return it;
}

static void q_close(queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void item_free(item *it)
{
    if (!it)
        return;
    if (it->choices) { /* res is choices[0] */
        for (int k = 0; k < it->f.n; k++)
            iflow_result_free(it->choices[k]);
    } else
        iflow_result_free(it->res);
    iflow_request_fields_free(&it->f); /* after the loop over f.n */
    free(it->error);
    free((void *)it->req.prompt);
    free(it->choices);
    free(it->tags);
    iflow_beam_close(it->beam);
    iflow_beams_free(it->beams, it->n_beams);
    if (it->group && __atomic_sub_fetch(&it->group->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        free(it->group->members);
        free(it->group);
    }
    free(it);
}

/* ---- lines from a descriptor, stoppable from another thread ---------------------------------- */

/* getline() cannot be interrupted: a reader blocked in it on a quiet pipe would outlive the run
 * (and the model its tokenizer belongs to). This one waits in poll() on the input and on a stop
 * pipe, so the main thread can always end and join it. */
typedef struct {
    int fd, stop_fd;
    char *buf;
    size_t cap, pos, len;         /* buf[pos..len): read, not yet returned */
} line_in;

#define LINE_MAX_BYTES ((size_t)1 << 30)

/* The next line without its newline (*line points into the buffer until the next call): its
 * length; -1 at the end of the input, on a read error, or when stopped; -2 for a line longer
 * than LINE_MAX_BYTES (or no memory for it). The last line needs no newline. */
static ssize_t line_next(line_in *r, char **line)
{
    size_t scanned = r->pos;
    for (;;) {
        char *nl = r->len > scanned ? memchr(r->buf + scanned, '\n', r->len - scanned) : NULL;
        if (nl) {
            *line = r->buf + r->pos;
            ssize_t n = nl - (r->buf + r->pos);
            r->pos = (size_t)(nl - r->buf) + 1;
            return n;
        }
        scanned = r->len;
        if (r->pos > 0) { /* keep the partial line at the front */
            memmove(r->buf, r->buf + r->pos, r->len - r->pos);
            r->len -= r->pos;
            scanned -= r->pos;
            r->pos = 0;
        }
        if (r->len == r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 1 << 16;
            char *b = cap <= LINE_MAX_BYTES ? realloc(r->buf, cap) : NULL;
            if (!b)
                return -2;
            r->buf = b;
            r->cap = cap;
        }
        struct pollfd pf[2] = {{.fd = r->fd, .events = POLLIN}, {.fd = r->stop_fd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (pf[1].revents)
            return -1;
        ssize_t got = read(r->fd, r->buf + r->len, r->cap - r->len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0) { /* the end: a last line without a newline, then nothing */
            if (r->len == r->pos)
                return -1;
            *line = r->buf + r->pos;
            ssize_t n = (ssize_t)(r->len - r->pos);
            r->pos = r->len;
            return n;
        }
        r->len += (size_t)got;
    }
}

/* ---- the reader: lines -> requests ---------------------------------------------------------- */

typedef struct {
    const batch_opts *o;
    const iflow_model *m;
    queue *out;
    int n_ctx;
    int stop_fd;                  /* readable when the main thread wants the reader to end */
} reader;

static void item_fail(item *it, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void item_fail(item *it, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!it->error)
        it->error = strdup(buf);
}

/* A chat request's prompt: its messages through the chat template, into it->f.prompt. */
static int chat_prompt(const reader *rd, item *it)
{
    if (!rd->o->chat)
        return iflow_seterr(IFLOW_EINVAL, "field 'messages' needs a chat template: %s", rd->o->chat_error);
    return iflow_chat_render(rd->o->chat, it->f.messages, it->f.chat_vars, it->f.add_generation_prompt, &it->f.prompt,
                             &it->f.prompt_len);
}

/* Tokens of a request's text: a chat's as the template made it (chat.h), else with the BOS. */
static int encode(const reader *rd, const item *it, const char *text, size_t len, int32_t **ids, size_t *n)
{
    if (it->f.messages)
        return iflow_chat_encode(rd->o->chat, text, len, ids, n);
    return iflow_tokenizer_encode(iflow_model_tokenizer(rd->m), text, len, IFLOW_TOK_ADD_BOS, ids, n);
}

/* One line -> one item (a request, or an error to report). */
static item *parse_line(const reader *rd, const char *line, size_t len, long line_no)
{
    const batch_opts *o = rd->o;
    item *it = calloc(1, sizeof *it);
    if (!it)
        return NULL;
    it->line = line_no;
    iflow_request_defaults d = {.max_tokens = o->max_tokens, .context_shift = o->context_shift, .keep = o->keep,
                                .sp = o->sp, .logprobs = o->logprobs, .prompt_logprobs = o->prompt_logprobs,
                                .grammar = o->grammar, .tool_format = o->tool_format, .adapters = o->adapters,
                                .n_adapters = o->n_adapters, .bias_ids = o->bias_ids, .bias_values = o->bias_values,
                                .n_bias = o->n_bias, .min_tokens = o->min_tokens, .ignore_eos = o->ignore_eos,
                                .stop_ids = o->stop_ids, .n_stop_ids = o->n_stop_ids,
                                .include_stop = o->include_stop};
    if (iflow_request_parse(&it->f, line, len, line_no, &d) < 0) {
        item_fail(it, "%s", iflow_errmsg());
        if (!it->f.id)
            it->f.id = strdup("null");
        return it;
    }
    iflow_request *q = &it->req;
    *q = (iflow_request){.max_tokens = it->f.max_tokens, .sampling = it->f.sp, .n_stop = it->f.n_stop,
                         .context_shift = it->f.context_shift, .keep = it->f.keep, .user = it,
                         .logprobs = it->f.logprobs, .prompt_logprobs = it->f.prompt_logprobs,
                         .grammar = it->f.grammar, .adapter = it->f.adapter, .bias_ids = it->f.bias_ids,
                         .bias_values = it->f.bias_values, .n_bias = it->f.n_bias, .min_tokens = it->f.min_tokens,
                         .ignore_eos = it->f.ignore_eos, .stop_ids = it->f.stop_ids,
                         .n_stop_ids = it->f.n_stop_ids, .include_stop = it->f.include_stop,
                         .allowed_ids = it->f.allowed_ids, .n_allowed = it->f.n_allowed};
    for (int i = 0; i < it->f.n_stop; i++)
        q->stop[i] = it->f.stop[i];
    if (iflow_request_bad_words(&it->f, iflow_model_tokenizer(rd->m)) < 0) {
        item_fail(it, "%s", iflow_errmsg());
        return it;
    }
    q->bad_ids = it->f.bad_ids, q->bad_lens = it->f.bad_lens, q->n_bad = it->f.n_bad;
    if (it->f.messages && chat_prompt(rd, it) < 0) {
        item_fail(it, "%s", iflow_errmsg());
        return it;
    }
    /* a reasoning model thinks freely: its constraint applies once </think> has come (unless
     * the prompt closed the block already, as Qwen3's template does without thinking) */
    if (rd->o->reasoning && !rd->o->grammar_in_reasoning && it->f.messages && it->f.grammar &&
        !iflow_reasoning_closed(it->f.prompt, it->f.prompt_len))
        q->grammar_after = "</think>";
    int32_t *ids;
    size_t n;
    if (it->f.prompt_ids) { /* token ids as given (the engine checks them against the vocabulary) */
        n = (size_t)it->f.n_prompt_ids;
        ids = it->f.prompt_ids;
        it->f.prompt_ids = NULL, it->f.n_prompt_ids = 0;
    } else if (encode(rd, it, it->f.prompt, it->f.prompt_len, &ids, &n) < 0) {
        item_fail(it, "%s", iflow_errmsg());
        return it;
    }
    if (it->f.continuation && n > 0) { /* score it: the tokens of prompt + continuation after the prompt's count */
        size_t n_context = n, total = it->f.prompt_len + it->f.continuation_len;
        char *both = malloc(total + 1);
        free(ids);
        ids = NULL;
        if (!both) {
            item_fail(it, "out of memory");
            return it;
        }
        memcpy(both, it->f.prompt, it->f.prompt_len);
        memcpy(both + it->f.prompt_len, it->f.continuation, it->f.continuation_len + 1);
        int rc = encode(rd, it, both, total, &ids, &n);
        free(both);
        if (rc < 0) {
            item_fail(it, "%s", iflow_errmsg());
            return it;
        }
        if (n <= n_context)
            item_fail(it, "the continuation adds no tokens to the prompt's %zu", n_context);
        q->prompt_logprobs_from = (int)n_context;
        if (q->prompt_logprobs < 2)
            q->prompt_logprobs = 2; /* the most likely token too: whether the continuation is greedy */
    }
    int keep = it->f.truncate_prompt_tokens < 0 ? rd->n_ctx - 1 : it->f.truncate_prompt_tokens;
    if (keep > 0 && n > (size_t)keep) { /* vLLM's truncate_prompt_tokens: the last `keep` tokens */
        memmove(ids, ids + (n - (size_t)keep), (size_t)keep * sizeof *ids);
        n = (size_t)keep;
    }
    q->prompt = ids;
    q->n_prompt = (int)n;
    if (n == 0)
        item_fail(it, "the prompt is empty and the tokenizer adds no beginning-of-sequence token");
    else if ((int)n >= rd->n_ctx)
        item_fail(it, "the prompt of %zu tokens does not fit the context of %d", n, rd->n_ctx);
    return it;
}

/* An OpenAI completions line whose body's "prompt" is a list of texts or of token-id lists
 * (1 to MAX_PROMPTS): the line once for each, its body's prompt that one, into (*subs)[0..n)
 * (malloc'd); 0 for any other line (parse_line judges it). */
static int prompt_list(const char *line, size_t len, char ***subs)
{
    json_t *o = json_loadb(line, len, 0, NULL), *body = json_object_get(o, "body");
    const json_t *list = json_object_get(body, "prompt"), *first = json_array_get(list, 0);
    size_t n = json_array_size(list), j;
    *subs = NULL;
    if (!json_is_string(json_object_get(o, "url")) || !json_is_array(list) || n == 0 || n > MAX_PROMPTS ||
        !(json_is_string(first) || json_is_array(first)) || !(*subs = calloc(n, sizeof **subs))) {
        json_decref(o);
        return 0;
    }
    json_t *each = json_incref((json_t *)list), *e;
    json_array_foreach(each, j, e)
    {
        json_object_set(body, "prompt", e);
        if (!((*subs)[j] = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
            while (j > 0)
                free((*subs)[--j]);
            free(*subs);
            *subs = NULL;
            n = 0;
            break;
        }
    }
    json_decref(each);
    json_decref(o);
    return (int)n;
}

/* The items of line `line`: one, or one a prompt of a list (a group); *n of them into its[]
 * (malloc'd). */
static item **line_items(const reader *rd, const char *line, size_t len, long line_no, int *n)
{
    char **subs;
    int k = prompt_list(line, len, &subs);
    item **its = calloc(k > 0 ? (size_t)k : 1, sizeof *its);
    group *g = k > 1 ? calloc(1, sizeof *g) : NULL;
    if (g && !(g->members = calloc((size_t)k, sizeof *g->members)))
        free(g), g = NULL;
    *n = 0;
    if (its && k > 1 && !g) {
        free(its);
        its = NULL;
    }
    for (int j = 0; its && j < (k > 0 ? k : 1); j++) {
        item *it = k > 0 ? parse_line(rd, subs[j], strlen(subs[j]), line_no) : parse_line(rd, line, len, line_no);
        if (!it)
            break;
        it->group = g;
        its[(*n)++] = it;
    }
    for (int j = 0; g && j < *n; j++)
        its[j]->gi = j;
    if (g)
        g->n = g->refs = *n;
    if (g && *n == 0)
        free(g->members), free(g);
    for (int j = 0; j < k; j++)
        free(subs[j]);
    free(subs);
    return its;
}

static void *reader_main(void *arg)
{
    const reader *rd = arg;
    line_in in = {.fd = STDIN_FILENO, .stop_fd = rd->stop_fd};
    char *line;
    ssize_t len;
    long line_no = 0, seq = 0;
    while ((len = line_next(&in, &line)) >= 0) {
        line_no++;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (len == 0)
            continue; /* blank lines are not requests */
        int n_items, pushed = 0;
        item **its = line_items(rd, line, (size_t)len, line_no, &n_items);
        for (; its && pushed < n_items; pushed++) {
            its[pushed]->seq = seq++;
            if (!q_push(rd->out, its[pushed]))
                break;
        }
        const int stopped = !its || n_items == 0 || pushed < n_items;
        for (int j = pushed; its && j < n_items; j++) /* not handed on (the run is stopping) */
            item_free(its[j]);
        free(its);
        if (stopped)
            break;
    }
    if (len == -2) { /* report it, then read no further: the rest of the line cannot be skipped */
        item *it = calloc(1, sizeof *it);
        if (it) {
            it->seq = seq;
            it->line = line_no + 1;
            it->f.id = strdup("null");
            item_fail(it, "the line is longer than %zu bytes", LINE_MAX_BYTES);
            if (!q_push(rd->out, it))
                item_free(it);
        }
    }
    free(in.buf);
    q_close(rd->out);
    return NULL;
}

/* ---- the writer: results -> lines ------------------------------------------------------------ */

typedef struct {
    queue *in;
    const iflow_tokenizer *tok;   /* the tokens' text in log-probabilities */
    int reasoning;                /* split chat replies' <think> blocks out (batch_opts) */
    const char *model;            /* the -m argument: an OpenAI reply's model by default */
    /* --ordered: finished items wait in held [seq % window] until those before them are written */
    item **held;                  /* [window], or NULL: written as they finish               */
    long window;
    long next_seq;                /* the next item to write (read by the main thread: atomic) */
    int failed;                   /* a write failed: the output is closed */
    iflow_metrics met;            /* of delivered results (read by the main thread after joining) */
    group *pending;               /* groups some of whose items it holds, the rest not yet in */
} writer;

/* A chat reply read as its parts: with a reasoning parser, "reasoning_content" (reasoning.h:
 * the <think> block, or null) and the answer after it; with tools, the answer's "tool_calls"
 * (toolcall.h) and "tool_calls" as the finish reason when it called any and was not cut short;
 * "content": the answer (outside the calls). */
static int reply_fields(json_t *o, const item *it, const iflow_result *r, const iflow_tokenizer *tok, int reasoning)
{
    reasoning = reasoning && it->f.messages;
    if (!it->f.tool_format && !reasoning)
        return 0;
    char *text, *content;
    size_t len, content_len, r_off = 0, r_len = 0, c_off = 0;
    json_t *calls;
    if (iflow_tool_text(it->f.tool_format, tok, r->tokens, r->n_tokens, r->n_prompt <= 1, r->text ? r->text : "",
                        r->text_len, &text, &len) < 0)
        return -1;
    if (reasoning) {
        int has = iflow_reasoning_split(it->f.prompt, it->f.prompt_len, text, len, &r_off, &r_len, &c_off);
        json_object_set_new(o, "reasoning_content", has ? iflow_json_text(text + r_off, r_len) : json_null());
    }
    if (!it->f.tool_format) {
        json_object_set_new(o, "content", iflow_json_text(text + c_off, len - c_off));
        free(text);
        return 0;
    }
    int n = iflow_tool_parse(it->f.tool_format, text + c_off, len - c_off, it->f.tool_bare, it->f.id, &calls, &content,
                             &content_len);
    free(text);
    if (n < 0)
        return -1;
    json_object_set_new(o, "content", iflow_json_text(content, content_len));
    json_object_set_new(o, "tool_calls", calls);
    free(content);
    if (n > 0 && r->finish != IFLOW_FINISH_LENGTH && r->finish != IFLOW_FINISH_CONTEXT)
        json_object_set_new(o, "finish_reason", json_string("tool_calls"));
    return 0;
}

/* A completion's text, why it ended, and its parts (reply_fields). */
static int text_fields(json_t *o, const item *it, const iflow_result *r, const iflow_tokenizer *tok, int reasoning)
{
    json_object_set_new(o, "text", iflow_json_text(r->text ? r->text : "", r->text_len));
    json_object_set_new(o, "finish_reason", json_string(iflow_finish_name(r->finish)));
    if (r->stop_index >= 0 && r->stop_index < it->f.n_stop)
        json_object_set_new(o, "stop_string", json_string(it->f.stop[r->stop_index]));
    if (r->stop_token >= 0)
        json_object_set_new(o, "stop_token", json_integer(r->stop_token));
    return reply_fields(o, it, r, tok, reasoning);
}

static json_t *result_json(const item *it, const iflow_tokenizer *tok, int reasoning)
{
    json_error_t e;
    json_t *o = json_object(), *id = json_loads(it->f.id, JSON_DECODE_ANY, &e);
    json_object_set_new(o, "id", id ? id : json_string(it->f.id));
    if (it->error) {
        json_object_set_new(o, "line", json_integer(it->line));
        json_object_set_new(o, "error", json_string(it->error));
        return o;
    }
    const iflow_result *r = it->res;
    double gen_s = r->t_done - r->t_first;
    if (text_fields(o, it, r, tok, reasoning) < 0) {
        json_decref(o);
        return NULL;
    }
    json_object_set_new(o, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(o, "completion_tokens", json_integer(r->n_tokens));
    json_object_set_new(o, "ttft_ms", json_real(round((r->t_first - r->t_added) * 1e6) / 1e3));
    json_object_set_new(o, "tokens_per_s",
                        json_real(r->n_tokens > 1 && gen_s > 0 ? round((r->n_tokens - 1) / gen_s * 100) / 100 : 0));
    if (r->logprobs)
        json_object_set_new(o, "logprobs", logprobs_json(tok, r->logprobs, r->n_tokens, it->f.logprobs > 1));
    if (r->prompt_logprobs && it->f.prompt_logprobs)
        json_object_set_new(o, "prompt_logprobs",
                            logprobs_json(tok, r->prompt_logprobs, r->n_prompt, it->f.prompt_logprobs > 1));
    if (r->prompt_logprobs && it->f.continuation) { /* lm-eval's loglikelihood: the sum, and is it greedy */
        double sum = 0;
        int greedy = 1;
        for (int p = it->req.prompt_logprobs_from; p < r->n_prompt; p++) {
            sum += r->prompt_logprobs[p].logprob;
            greedy &= r->prompt_logprobs[p].top_id[0] == r->prompt_logprobs[p].id;
        }
        json_object_set_new(o, "continuation_tokens", json_integer(r->n_prompt - it->req.prompt_logprobs_from));
        json_object_set_new(o, "continuation_logprob", json_real(sum));
        json_object_set_new(o, "continuation_greedy", json_boolean(greedy));
    }
    if (it->beams) { /* every beam, ranked (the best is the text above) */
        json_t *a = json_array();
        for (int i = 0; i < it->n_beams; i++) {
            const iflow_beam *b = &it->beams[i];
            json_t *bj = json_pack("{s:s%, s:f, s:f, s:s, s:i}", "text", b->text, b->text_len, "logprob", b->logprob,
                                   "score", b->score, "finish_reason", iflow_finish_name(b->finish),
                                   "completion_tokens", b->n_tokens);
            if (b->stop_index >= 0 && b->stop_index < it->f.n_stop)
                json_object_set_new(bj, "stop_string", json_string(it->f.stop[b->stop_index]));
            json_array_append_new(a, bj);
        }
        json_object_set_new(o, "beams", a);
    }
    if (it->f.n > 1) { /* every completion, in order (the first is the one above) */
        json_t *a = json_array();
        for (int k = 0; k < it->f.n; k++) {
            const iflow_result *c = it->choices[k];
            json_t *cj = json_pack("{s:i}", "index", k);
            if (!cj || text_fields(cj, it, c, tok, reasoning) < 0) {
                json_decref(cj), json_decref(a), json_decref(o);
                return NULL;
            }
            json_object_set_new(cj, "completion_tokens", json_integer(c->n_tokens));
            if (c->logprobs)
                json_object_set_new(cj, "logprobs", logprobs_json(tok, c->logprobs, c->n_tokens, it->f.logprobs > 1));
            json_array_append_new(a, cj);
        }
        json_object_set_new(o, "choices", a);
    }
    return o;
}

/* it's output line (NULL without memory). */
static json_t *item_line(writer *w, const item *it)
{
    json_t *native = result_json(it, w->tok, w->reasoning);
    return it->f.api ? openai_batch_line(native, &it->f, it->line, w->model) : json_schema(native);
}

/* Write js (taken) unless a write failed before; the metrics of its items its[0..n). */
static void write_line(writer *w, json_t *js, item *const *its, int n)
{
    if (w->failed) {
        json_decref(js);
        return;
    }
    char *s = json_dumps(js, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(js);
    if (!s || progress_write_line(s) == EOF)
        w->failed = 1;
    free(s);
    for (int i = 0; i < n && !w->failed; i++) {
        const item *it = its[i];
        if (it->error)
            iflow_metrics_add_error(&w->met);
        else if (it->choices)
            for (int k = 0; k < it->f.n; k++)
                iflow_metrics_add(&w->met, it->choices[k]);
        else
            iflow_metrics_add(&w->met, it->res);
    }
}

/* A group's one reply: the first refused prompt's, else the first prompt's with every prompt's
 * choices (their indexes prompt by prompt: prompt j's choice k is j * n + k) and usage summed. */
static void write_group(writer *w, group *g)
{
    int bad = -1;
    for (int j = 0; j < g->n && bad < 0; j++)
        bad = g->members[j]->error ? j : -1;
    json_t *out = item_line(w, g->members[bad >= 0 ? bad : 0]);
    json_t *body = json_object_get(json_object_get(out, "response"), "body");
    json_t *choices = json_object_get(body, "choices"), *usage = json_object_get(body, "usage");
    for (int j = 1; bad < 0 && out && j < g->n; j++) {
        json_t *line = item_line(w, g->members[j]), *c;
        json_t *b = json_object_get(json_object_get(line, "response"), "body");
        size_t k;
        json_array_foreach(json_object_get(b, "choices"), k, c)
        {
            json_object_set_new(c, "index", json_integer((json_int_t)j * g->members[j]->f.n + (json_int_t)k));
            json_array_append(choices, c);
        }
        static const char *const keys[] = {"prompt_tokens", "completion_tokens", "total_tokens"};
        for (int i = 0; i < 3; i++)
            json_object_set_new(usage, keys[i],
                                json_integer(json_integer_value(json_object_get(usage, keys[i])) +
                                             json_integer_value(json_object_get(json_object_get(b, "usage"), keys[i]))));
        json_decref(line);
    }
    write_line(w, out, g->members, g->n);
}

/* Write it's result (unless a write failed before) and free it; one of a group's is held until
 * the group is complete, then the group's reply goes out and its items are freed. */
static void write_item(writer *w, item *it)
{
    group *g = it->group;
    if (!g) {
        write_line(w, item_line(w, it), &it, 1);
        item_free(it);
        return;
    }
    if (g->done++ == 0) {
        g->next_pending = w->pending;
        w->pending = g;
    }
    g->members[it->gi] = it;
    if (g->done < g->n)
        return;
    for (group **p = &w->pending; *p; p = &(*p)->next_pending)
        if (*p == g) {
            *p = g->next_pending;
            break;
        }
    write_group(w, g);
    for (int j = 0, n = g->n; j < n; j++) /* the last frees g */
        item_free(g->members[j]);
}

/* Free the items of groups still incomplete when the run ends (it stopped before their last). */
static void drop_pending(writer *w)
{
    while (w->pending) {
        group *g = w->pending;
        w->pending = g->next_pending;
        int left = g->done; /* g lives until the last of them is freed, which may free it */
        for (int j = 0; left > 0; j++)
            if (g->members[j]) {
                item *it = g->members[j];
                left--;
                item_free(it);
            }
    }
}

/* --ordered: it waits for the items before it; then each in turn that is ready goes out. At the
 * end (last), those still held go out in order past the gaps a failed run left. */
static void write_in_order(writer *w, item *it, int last)
{
    if (it)
        w->held[it->seq % w->window] = it;
    long next = __atomic_load_n(&w->next_seq, __ATOMIC_RELAXED);
    for (long k = 0; k < w->window; k++) {
        item **slot = &w->held[(next + k) % w->window];
        if (!*slot && !last)
            break;
        if (*slot) {
            write_item(w, *slot);
            *slot = NULL;
        }
        if (!last)
            __atomic_store_n(&w->next_seq, next + k + 1, __ATOMIC_RELEASE);
    }
}

static void *writer_main(void *arg)
{
    writer *w = arg;
    int closed;
    item *it;
    while ((it = q_pop(w->in, 1, &closed)) != NULL || !closed) {
        if (it && w->held)
            write_in_order(w, it, 0);
        else if (it)
            write_item(w, it);
    }
    if (w->held)
        write_in_order(w, NULL, 1);
    drop_pending(w);
    return NULL;
}

/* ---- the main loop --------------------------------------------------------------------------------- */

/* ---- beam search requests: run beside the batch, one forward step per loop ------------------- */

/* Start it->req as a beam search: 0, or < 0 with the reason. */
static int beam_start(item *it, const iflow_model *m, const iflow_batch_params *bp)
{
    iflow_beam_params p = {.n_beams = it->f.beams, .max_tokens = it->f.max_tokens,
                           .length_penalty = it->f.length_penalty, .n_ctx = bp->n_ctx, .kv_type = bp->kv_type,
                           .n_threads = bp->n_threads, .stop = (const char *const *)it->f.stop,
                           .n_stop = it->f.n_stop, .adapter = it->f.adapter};
    it->res = calloc(1, sizeof *it->res);
    if (!it->res)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    it->res->t_added = it->res->t_started = now_s();
    it->res->n_prompt = it->req.n_prompt;
    it->res->stop_index = -1;
    it->res->stop_token = -1;
    return iflow_beam_open(&it->beam, m, it->req.prompt, it->req.n_prompt, &p);
}

/* One step of it's search: 1 while it runs, 0 when its results are in the item, < 0. */
static int beam_advance(item *it)
{
    int rc = iflow_beam_step(it->beam);
    if (rc > 0) {
        if (it->res->t_first == 0)
            it->res->t_first = now_s(); /* the prompt is in: the first tokens are chosen next */
        return 1;
    }
    if (rc == 0)
        rc = iflow_beam_take(it->beam, &it->beams, &it->n_beams);
    iflow_beam_close(it->beam);
    it->beam = NULL;
    if (rc < 0)
        return rc;
    iflow_result *r = it->res; /* the best beam is the request's result */
    const iflow_beam *best = &it->beams[0];
    r->tokens = malloc(((size_t)best->n_tokens + 1) * sizeof *r->tokens);
    r->text = strdup(best->text);
    if (!r->tokens || !r->text)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memcpy(r->tokens, best->tokens, (size_t)best->n_tokens * sizeof *r->tokens);
    r->n_tokens = best->n_tokens;
    r->text_len = best->text_len;
    r->finish = best->finish;
    r->stop_index = best->stop_index;
    r->t_done = now_s();
    if (r->t_first == 0)
        r->t_first = r->t_done;
    return 0;
}

/* it's completions into the engine (f.n of them, each its own seed). 0; < 0 when the first could
 * not be added (nothing was); 1 when a later one could not (out of memory: the run must stop). */
static int add_choices(iflow_batch *b, item *it)
{
    const int n = it->f.n;
    if (!(it->choices = calloc((size_t)n, sizeof *it->choices)) || !(it->tags = calloc((size_t)n, sizeof *it->tags)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int k = 0; k < n; k++) {
        iflow_request q = it->req;
        q.sampling.seed = iflow_request_choice_seed(it->req.sampling.seed, k);
        it->tags[k] = (choice_tag){.it = it, .k = k};
        q.user = &it->tags[k];
        if (iflow_batch_add(b, &q) < 0)
            return k == 0 ? -1 : 1;
    }
    return 0;
}

/* A finished completion: 1 when its item has all of them (res set), else 0. */
static int took(iflow_result *r)
{
    choice_tag *tag = r->user;
    item *it = tag->it;
    it->choices[tag->k] = r;
    if (++it->n_got < it->f.n)
        return 0;
    it->res = it->choices[0];
    return 1;
}

/* it's id already running or queued in the engine (live[0..n)), but for the other prompts of
 * its own line (a group's items share the line's id). */
static int id_in_flight(item **live, int n, const item *it)
{
    for (int i = 0; i < n; i++)
        if (strcmp(live[i]->f.id, it->f.id) == 0 && !(it->group && live[i]->group == it->group))
            return 1;
    return 0;
}

static void forget(item **live, int *n, const item *it)
{
    for (int i = 0; i < *n; i++)
        if (live[i] == it) {
            live[i] = live[--*n];
            return;
        }
}

int batch_run(const iflow_tool *t, iflow_model *m, const batch_opts *o)
{
    iflow_batch_params p = {.parallel = o->parallel, .n_ctx = o->n_ctx, .kv_type = o->kv_type, .n_threads = o->threads,
                            .no_prefix_cache = o->no_prefix_cache};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &p) < 0 || (o->draft && iflow_batch_set_draft(b, o->draft, o->draft_n, o->draft_top_k, o->draft_top_p) < 0))
        die(t, NULL);
    iflow_batch_set_graphs(b, o->gpu_graphs);
    const iflow_batch_params *bp = iflow_batch_params_of(b);
    signal(SIGPIPE, SIG_IGN); /* a closed output is seen as a failed write */
    int stop[2];
    if (pipe(stop) < 0)
        die(t, "cannot make a pipe: %s", strerror(errno));
    queue in, out;
    q_init(&in, 2 * bp->parallel);
    q_init(&out, 0);
    reader rd = {.o = o, .m = m, .out = &in, .n_ctx = bp->n_ctx, .stop_fd = stop[0]};
    writer w = {.in = &out, .tok = iflow_model_tokenizer(m), .reasoning = o->reasoning, .model = o->model,
                .window = 8L * bp->parallel};
    if (o->ordered && !(w.held = calloc((size_t)w.window, sizeof *w.held)))
        die(t, "out of memory");
    pthread_t rt, wt;
    if (pthread_create(&rt, NULL, reader_main, &rd) || pthread_create(&wt, NULL, writer_main, &w))
        die(t, "cannot start the reader and writer threads");
    const int max_live = 2 * bp->parallel;
    item **live = malloc(sizeof *live * (size_t)max_live);
    int n_live = 0, input_done = 0, rc = 0;
    long n_popped = 0; /* items taken from the reader: the next one's seq */
    item **beams = malloc(sizeof *beams * (size_t)max_live); /* the beam searches running */
    int n_beams = 0;
    double t0 = now_s();
    if (!live || !beams)
        die(t, "out of memory");
    progress pr;
    progress_open(&pr, t->name, o->progress);
    long n_done = 0;
    while (rc == 0 && !w.failed) {
        /* feed the engine: keep up to `parallel` queued behind the running ones */
        int ahead = 0; /* --ordered: the window past the oldest unwritten item is full */
        while (!input_done && n_live < max_live) {
            int closed;
            if ((ahead = w.held && n_popped - __atomic_load_n(&w.next_seq, __ATOMIC_ACQUIRE) >= w.window))
                break;
            item *it = q_pop(&in, iflow_batch_pending(b) == 0 && n_beams == 0, &closed);
            if (!it) {
                input_done = closed;
                break;
            }
            n_popped++;
            if (!it->error && id_in_flight(live, n_live, it))
                item_fail(it, "duplicate id %s: a request with this id is still running", it->f.id);
            int added = it->error ? 0 : it->f.beams ? beam_start(it, m, bp) : add_choices(b, it);
            if (added < 0)
                item_fail(it, "%s", iflow_errmsg());
            if (added > 0) { /* some of its completions are in the engine: freed with the run's end */
                live[n_live++] = it;
                rc = 1;
                break;
            }
            if (it->error) {
                q_push(&out, it);
                n_done++;
                continue;
            }
            live[n_live++] = it;
            if (it->f.beams)
                beams[n_beams++] = it;
        }
        if (iflow_batch_pending(b) == 0 && n_beams == 0) {
            if (input_done)
                break;
            if (ahead) /* nothing runs: the writer is catching up */
                usleep(1000);
            continue;
        }
        for (int i = 0; i < n_beams && rc == 0;) { /* each search one step further */
            item *it = beams[i];
            int s = beam_advance(it);
            if (s < 0)
                rc = 1;
            if (s <= 0) { /* finished (or failed: reported below) */
                beams[i] = beams[--n_beams];
                forget(live, &n_live, it);
                if (s == 0)
                    q_push(&out, it), n_done++;
                else
                    item_free(it);
                continue;
            }
            i++;
        }
        if (rc == 0 && iflow_batch_pending(b) > 0 && iflow_batch_step(b) < 0)
            rc = 1;
        if (rc)
            break;
        iflow_result *r;
        while (iflow_batch_take(b, &r) == 1) {
            item *it = ((choice_tag *)r->user)->it;
            if (!took(r))
                continue;
            forget(live, &n_live, it);
            q_push(&out, it);
            n_done++;
        }
        if (pr.on) {
            iflow_batch_stats st;
            iflow_batch_get_stats(b, &st);
            double el = progress_elapsed(&pr);
            progress_show(&pr, 0, "%ld requests done, %d running, %d queued, %llu tokens, %.1f tok/s", n_done,
                          st.running, st.queued, (unsigned long long)st.generated,
                          el > 0 ? (double)st.generated / el : 0.0);
        }
    }
    progress_end(&pr);
    double wall = now_s() - t0;
    char err[512] = "";
    if (rc)
        snprintf(err, sizeof err, "%s", iflow_errmsg());
    q_close(&out);
    pthread_join(wt, NULL);
    /* the reader ends: at the end of the input, or told to (blocked on the full queue or waiting
     * for input) when the run ended early */
    q_close(&in);
    if (write(stop[1], "", 1) < 0) {
        /* cannot fail on a fresh pipe with room for a byte */
    }
    pthread_join(rt, NULL);
    close(stop[0]);
    close(stop[1]);
    if (o->metrics || o->verbose) {
        json_t *js = json_schema(iflow_metrics_json(&w.met, m, b, wall));
        json_object_set_new(js, "threads", json_integer(o->threads > 0 ? o->threads : omp_get_num_procs()));
        json_object_set_new(js, "peak_rss_mib", json_real(round(peak_rss_mib() * 10) / 10));
        if (o->metrics && json_dump_file(js, o->metrics, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) != 0)
            fprintf(stderr, "%s: cannot write metrics to '%s': %s\n", t->name, o->metrics, strerror(errno));
        if (o->verbose) {
            char *s = json_dumps(js, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
            fprintf(stderr, "%s: %s\n", t->name, s ? s : "");
            free(s);
        }
        json_decref(js);
    }
    iflow_batch_close(b); /* requests still in it (after a failure) go with it; their items below */
    for (int i = 0; i < n_live; i++) /* the beam searches among them too */
        item_free(live[i]);
    free(live);
    free(beams);
    item *it;
    while ((it = q_pop(&out, 0, NULL)) != NULL || (it = q_pop(&in, 0, NULL)) != NULL)
        item_free(it);
    iflow_metrics_free(&w.met);
    free(w.held);
    q_destroy(&in);
    q_destroy(&out);
    if (rc)
        die(t, "%s", err);
    return w.failed ? 1 : 0;
}

/* ---- --dry-run ----------------------------------------------------------------------------------- */

int batch_dry_run(const iflow_tool *t, iflow_model *m, const batch_opts *o)
{
    const iflow_hparams *hp = iflow_model_hparams(m);
    int n_ctx = o->n_ctx > 0 && o->n_ctx < hp->max_seq ? o->n_ctx : hp->max_seq, block = 16;
    int parallel = o->parallel > 0 ? o->parallel : 16;
    uint64_t per_block = iflow_batch_block_bytes(m, o->kv_type, block);
    uint64_t per_req = (uint64_t)((n_ctx + block - 1) / block) * per_block;
    uint64_t weights = 0;
    const iflow_shard *sh = iflow_model_shard(m);
    for (size_t i = 0; i < iflow_shard_n_records(sh); i++)
        weights += iflow_shard_rec_at(sh, i)->nbytes;
    /* scratch: a step's activations on the host (iflow_ctx) and its logits */
    uint64_t D = (uint64_t)hp->dim, Q = (uint64_t)hp->n_heads * hp->head_dim, F = (uint64_t)hp->ffn_dim,
             KV = (uint64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t scratch = IFLOW_MAX_STEP * 4 * (5 * D + 2 * Q + 2 * F + 2 * KV) + IFLOW_MAX_STEP * 4ull * hp->vocab_size;
    const uint64_t adapters = iflow_model_lora_bytes(m); /* run-time LoRA deltas, on the host */
    iflow_device_info info;
    iflow_device_query(NULL, &info);
    uint64_t fixed = weights + adapters + scratch, avail = info.mem_free;
    long fit = avail > fixed ? (long)((avail - fixed) / per_req) : 0;
    if (fit > IFLOW_MAX_STEP)
        fit = IFLOW_MAX_STEP;
    char a[32], b2[32], c[32], d[32], e[32], f[32];
    if (o->json) {
        json_t *js = json_pack("{s:s, s:i, s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}", "model", o->model,
                               "n_ctx", n_ctx, "kv_type", ifk_kv_type_name(o->kv_type), "parallel", parallel,
                               "weights_bytes", (json_int_t)weights, "adapter_bytes", (json_int_t)adapters,
                               "kv_block_bytes", (json_int_t)per_block, "kv_per_request_bytes", (json_int_t)per_req,
                               "kv_total_bytes", (json_int_t)(per_req * (uint64_t)parallel), "scratch_bytes",
                               (json_int_t)scratch, "memory_available_bytes", (json_int_t)avail, "max_parallel",
                               (int)fit);
        js = json_schema(js);
        json_dumpf(js, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(js);
        return 0;
    }
    printf("model             %s: %d layers, dim %d, context %d\n", o->model, hp->n_layers, hp->dim, n_ctx);
    printf("weights           %s\n", iflow_bytes_str(a, sizeof a, weights));
    if (adapters)
        printf("adapters          %s (LoRA deltas applied at run time)\n", iflow_bytes_str(a, sizeof a, adapters));
    printf("kv cache          %s, blocks of %d positions, %s a block\n", ifk_kv_type_name(o->kv_type), block,
           iflow_bytes_str(b2, sizeof b2, per_block));
    printf("kv per request    %s (%d positions)\n", iflow_bytes_str(c, sizeof c, per_req), n_ctx);
    printf("kv total          %s (--parallel %d)\n", iflow_bytes_str(d, sizeof d, per_req * (uint64_t)parallel),
           parallel);
    printf("scratch           %s\n", iflow_bytes_str(e, sizeof e, scratch));
    printf("total             %s\n", iflow_bytes_str(f, sizeof f, fixed + per_req * (uint64_t)parallel));
    printf("memory available  %s (%s)\n", iflow_bytes_str(a, sizeof a, avail), info.name);
    printf("largest parallel  %ld%s\n", fit, fit == IFLOW_MAX_STEP ? " (the most one step holds)" : "");
    return 0;
}
