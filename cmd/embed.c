/* embed.c -- iflow-run --embed (embed.h). */
#include "cmd/embed.h"
#include "cmd/io.h"
#include "cmd/model.h"
#include "cmd/openai.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/serving/request.h"
#include "libcore/tokenizers/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const iflow_tool *tool;
    iflow_ctx *c;
    const iflow_tokenizer *tok;
    int limit, dim;
    float *vec; /* [dim] */
    long index, n_tokens;
    const char *model; /* -m: an OpenAI reply's model by default */
    long line;         /* --batch: the input line */
} embedder;

/* One input: tokenized with the template's tokens, truncated to e->limit, embedded, printed. */
static void embed_one(embedder *e, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (iflow_tokenizer_encode(e->tok, text, len, IFLOW_TOK_ADD_BOS, &ids, &n) < 0)
        die(e->tool, "cannot tokenize input %ld: %s", e->index, iflow_errmsg());
    if (n == 0)
        die(e->tool, "input %ld is empty and the tokenizer adds no tokens of its own", e->index);
    int truncated = n > (size_t)e->limit;
    if (truncated) { /* the first limit - 1 tokens, then the closing one */
        ids[e->limit - 1] = ids[n - 1];
        n = (size_t)e->limit;
    }
    if (iflow_ctx_embed(e->c, ids, (int)n, e->vec) < 0)
        die(e->tool, "cannot embed input %ld: %s", e->index, iflow_errmsg());
    json_t *v = json_array();
    for (int d = 0; v && d < e->dim; d++)
        json_array_append_new(v, json_real(e->vec[d]));
    json_t *o = json_schema(
        json_pack("{s:I, s:I, s:b, s:o}", "index", (json_int_t)e->index, "n_tokens", (json_int_t)n, "truncated", truncated,
                  "embedding", v));
    if (!o || json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(9)) < 0 || fputc('\n', stdout) == EOF)
        die(e->tool, "cannot write the embedding of input %ld", e->index);
    json_decref(o);
    free(ids);
    e->index++;
    e->n_tokens += (long)n;
}

static void embed_line(void *e, const char *line, size_t len) { embed_one(e, line, len); }

/* The embeddings of f's inputs into data; "" or why the line is refused in why[]. */
static void embed_inputs(embedder *e, const iflow_embed_fields *f, json_t *data, long *tokens, char *why, size_t cap)
{
    if (f->dimensions && f->dimensions != e->dim) {
        snprintf(why, cap, "field 'dimensions': %d, but this model's embeddings have %d", f->dimensions, e->dim);
        return;
    }
    for (int k = 0; k < f->n_inputs; k++) {
        int32_t *ids = f->ids[k];
        size_t n = (size_t)f->n_ids[k];
        if (f->texts[k] && iflow_tokenizer_encode(e->tok, f->texts[k], f->lens[k], IFLOW_TOK_ADD_BOS, &ids, &n) < 0) {
            snprintf(why, cap, "input %d: %s", k + 1, iflow_errmsg());
            return;
        }
        if (n > (size_t)e->limit)
            snprintf(why, cap, "input %d has %zu tokens, more than the %d this model takes", k + 1, n, e->limit);
        else if (iflow_ctx_embed(e->c, ids, (int)n, e->vec) < 0)
            die(e->tool, "cannot embed input %d of line %ld: %s", k + 1, e->line, iflow_errmsg());
        if (ids != f->ids[k])
            free(ids);
        if (why[0])
            return;
        json_array_append_new(data, openai_embedding(e->vec, e->dim, k, f->base64));
        *tokens += (long)n;
    }
}

/* --batch: one OpenAI embeddings line, answered. */
static void embed_batch_line(void *arg, const char *line, size_t len)
{
    embedder *e = arg;
    e->line++;
    if (len == 0)
        return; /* blank lines are not requests */
    iflow_embed_fields f;
    char why[1024] = "";
    json_t *data = json_array();
    long tokens = 0;
    if (iflow_embed_request_parse(&f, line, len, e->line) < 0)
        snprintf(why, sizeof why, "%s", iflow_errmsg());
    else
        embed_inputs(e, &f, data, &tokens, why, sizeof why);
    json_t *o = openai_embedding_line(f.id ? f.id : "null", e->line, f.model ? f.model : e->model, data, tokens,
                                      why[0] ? why : NULL);
    if (!o || json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(9)) < 0 || fputc('\n', stdout) == EOF)
        die(e->tool, "cannot write the reply to line %ld", e->line);
    json_decref(o);
    e->index += f.n_inputs;
    e->n_tokens += tokens;
    iflow_embed_fields_free(&f);
}

int embed_run(const iflow_tool *tool, const embed_opts *o)
{
    iflow_model *m;
    double t0 = now_s();
    if (cmd_model_open(&m, o->model, 0) < 0)
        die(tool, NULL);
    const iflow_hparams *hp = iflow_model_hparams(m);
    if (hp->layout != IFLOW_LAYOUT_ENCODER)
        die(tool, "model '%s' is %s: --embed needs an encoder (a BERT-like model)", o->model,
            hp->layout == IFLOW_LAYOUT_ENCODER_DECODER ? "an encoder-decoder" : "a decoder");
    embedder e = {.tool = tool, .tok = iflow_model_tokenizer(m), .dim = hp->dim, .model = o->model};
    if (!e.tok)
        die(tool, "model '%s' has no tokenizer", o->model);
    int n_ctx = o->n_ctx ? o->n_ctx : hp->max_seq;
    e.limit = n_ctx < IFLOW_MAX_STEP ? n_ctx : IFLOW_MAX_STEP;
    placed pl;
    devices_place(tool, m, &o->dev, &pl);
    if (iflow_ctx_open(&e.c, m, e.limit, o->threads) < 0 || !(e.vec = malloc(sizeof(float) * (size_t)e.dim)))
        die(tool, NULL);
    double t1 = now_s();
    if (o->text)
        embed_one(&e, o->text, strlen(o->text));
    else
        each_line(stdin, o->batch ? embed_batch_line : embed_line, &e);
    if (fflush(stdout) != 0)
        die(tool, "cannot write the embeddings");
    double t = now_s() - t1;
    if (o->verbose)
        fprintf(stderr, "%s: load %.3f s; %ld inputs, %ld tokens in %.3f s (%.1f inputs/s, %.1f tok/s)\n", tool->name,
                t1 - t0, e.index, e.n_tokens, t, e.index / (t > 0 ? t : 1), e.n_tokens / (t > 0 ? t : 1));
    free(e.vec);
    iflow_ctx_close(e.c);
    iflow_model_close(m);
    devices_release(&pl);
    return 0;
}
