/* translate.c -- iflow-run --translate (translate.h). */
#include "cmd/translate.h"
#include "cmd/io.h"
#include "cmd/model.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/engine/seq2seq.h"
#include "libcore/serving/beam.h"
#include "libcore/tokenizers/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const iflow_tool *tool;
    const translate_opts *o;
    const iflow_model *m;
    const iflow_tokenizer *src_tok;  /* encodes the source text                             */
    const iflow_tokenizer *tgt_tok;  /* decodes the translation, encodes --decoder-prefix    */
    iflow_s2s *s;
    int32_t *prefix;       /* [n_prefix] --decoder-prefix's tokens */
    size_t n_prefix;
    int max_src, max_new;
    long index, n_src_tokens, n_tokens;
} translator;

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The text of generated ids, by the target side's tokenizer (control tokens such as </s> decode
 * to nothing). */
static char *text_of(translator *t, const int32_t *ids, int n, size_t *len)
{
    char *text;
    if (iflow_tokenizer_decode(t->tgt_tok, ids, (size_t)n, &text, len) < 0)
        die(t->tool, "cannot decode the translation of input %ld: %s", t->index, iflow_errmsg());
    return text;
}

/* One hypothesis as JSON: its ids, translation and why it stopped (and, from a beam search, its
 * log-probability and score). */
static json_t *hyp_json(translator *t, const int32_t *ids, int n, int finish, const iflow_beam *b)
{
    size_t len;
    char *text = text_of(t, ids, n, &len);
    json_t *o = json_pack("{s:o, s:s%, s:s}", "ids", ids_json(ids, (size_t)n), "translation", text, len, "stop",
                          iflow_finish_name(finish));
    if (o && b) {
        json_object_set_new(o, "logprob", json_real(b->logprob));
        json_object_set_new(o, "score", json_real(b->score));
    }
    free(text);
    return o;
}

/* {"schema", "index", "source", "source_ids", "truncated"} and the best hypothesis's fields (and
 * with beams, "beams": every one). */
static void print_json(translator *t, const char *src, size_t src_len, const int32_t *ids, size_t n_ids, int truncated,
                       json_t *best, json_t *beams)
{
    json_t *o = json_schema(json_pack("{s:I, s:s%, s:o, s:b}", "index", (json_int_t)t->index, "source", src, src_len,
                                      "source_ids", ids_json(ids, n_ids), "truncated", truncated));
    if (o && best)
        json_object_update(o, best);
    if (o && beams)
        json_object_set(o, "beams", beams);
    if (!o || !best || json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER) < 0 || fputc('\n', stdout) == EOF)
        die(t->tool, "cannot write the translation of input %ld", t->index);
    json_decref(o);
}

/* The beam search's hypotheses, best first; *best: the first one's JSON. */
static json_t *search(translator *t, const int32_t *ids, size_t n, json_t **best)
{
    iflow_beam_params bp = {.n_beams = t->o->beams, .max_tokens = t->max_new, .length_penalty = t->o->length_penalty};
    iflow_beam_run *run;
    iflow_beam *b = NULL;
    int nb = 0, rc = iflow_beam_open_s2s(&run, t->m, t->s, ids, (int)n, t->prefix, (int)t->n_prefix, &bp);
    if (rc == 0) {
        while ((rc = iflow_beam_step(run)) > 0)
            ;
        if (rc == 0)
            rc = iflow_beam_take(run, &b, &nb);
    }
    if (rc < 0 || nb == 0)
        die(t->tool, "cannot translate input %ld: %s", t->index, rc < 0 ? iflow_errmsg() : "no hypothesis");
    json_t *all = json_array();
    for (int i = 0; all && i < nb; i++)
        json_array_append_new(all, hyp_json(t, b[i].tokens, b[i].n_tokens, b[i].finish, &b[i]));
    *best = json_incref(json_array_get(all, 0));
    t->n_tokens += b[0].n_tokens;
    iflow_beams_free(b, nb);
    iflow_beam_close(run);
    return all;
}

/* One input: tokenized by the source side's tokenizer with its template's tokens (Marian's and
 * T5's final </s>), truncated to the source context, decoded, printed. */
static void translate_one(translator *t, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (iflow_tokenizer_encode(t->src_tok, text, len, IFLOW_TOK_ADD_BOS, &ids, &n) < 0)
        die(t->tool, "cannot tokenize input %ld: %s", t->index, iflow_errmsg());
    if (n == 0)
        die(t->tool, "input %ld is empty and the tokenizer adds no tokens of its own", t->index);
    int truncated = n > (size_t)t->max_src;
    if (truncated) { /* the first max_src - 1 tokens, then the closing one */
        ids[t->max_src - 1] = ids[n - 1];
        n = (size_t)t->max_src;
    }
    json_t *best = NULL, *beams = NULL;
    if (t->o->beams > 1) {
        beams = search(t, ids, n, &best);
    } else {
        iflow_s2s_result r;
        if (iflow_s2s_greedy(t->s, ids, (int)n, t->prefix, (int)t->n_prefix, t->max_new, &r) < 0)
            die(t->tool, "cannot translate input %ld: %s", t->index, iflow_errmsg());
        best = hyp_json(t, r.tokens, r.n_tokens, r.finish, NULL);
        t->n_tokens += r.n_tokens;
        free(r.tokens);
    }
    const char *out = json_string_value(json_object_get(best, "translation"));
    size_t out_len = json_string_length(json_object_get(best, "translation"));
    if (t->o->json)
        print_json(t, text, len, ids, n, truncated, best, beams);
    else if (!out || fwrite(out, 1, out_len, stdout) != out_len || fputc('\n', stdout) == EOF)
        die(t->tool, "cannot write the translation of input %ld", t->index);
    fflush(stdout);
    t->index++;
    t->n_src_tokens += (long)n;
    json_decref(best);
    json_decref(beams);
    free(ids);
}

static void translate_line(void *t, const char *line, size_t len) { translate_one(t, line, len); }

/* The model, checked to be an encoder-decoder with a tokenizer. */
static iflow_model *open_model(const iflow_tool *tool, const translate_opts *o)
{
    iflow_model *m;
    if (cmd_model_open(&m, o->model, 0) < 0)
        die(tool, NULL);
    int layout = iflow_model_hparams(m)->layout;
    if (layout != IFLOW_LAYOUT_ENCODER_DECODER)
        die(tool, "model '%s' is %s: --translate needs an encoder-decoder (Marian, M2M100, T5)", o->model,
                  layout == IFLOW_LAYOUT_ENCODER ? "an encoder" : "a decoder");
    if (!iflow_model_tokenizer(m))
        die(tool, "model '%s' has no tokenizer", o->model);
    return m;
}

int translate_run(const iflow_tool *tool, const translate_opts *o)
{
    double t0 = now_s();
    iflow_model *m = open_model(tool, o);
    const iflow_hparams *hp = iflow_model_hparams(m);
    translator t = {.tool = tool, .o = o, .m = m, .src_tok = iflow_model_tokenizer(m),
                    .tgt_tok = iflow_model_target_tokenizer(m)};
    int n_ctx = o->n_ctx ? o->n_ctx : hp->max_seq;
    t.max_src = n_ctx;
    if (o->prefix && iflow_tokenizer_encode(t.tgt_tok, o->prefix, strlen(o->prefix), IFLOW_TOK_PARSE_SPECIAL,
                                            &t.prefix, &t.n_prefix) < 0)
        die(tool, "cannot tokenize the decoder prefix: %s", iflow_errmsg());
    if ((int)t.n_prefix + 1 >= n_ctx)
        die_usage(tool, "the decoder prefix of %zu tokens leaves no room in a context of %d", t.n_prefix, n_ctx);
    t.max_new = o->max_new >= 0 && o->max_new < n_ctx - 1 - (int)t.n_prefix ? o->max_new : n_ctx - 1 - (int)t.n_prefix;
    device_opts dev = o->dev;
    if ((!dev.device || strcmp(dev.device, "auto") == 0) && !dev.plan) /* auto: an encoder-decoder runs on the CPU */
        dev.device = "cpu";
    placed pl;
    devices_place(tool, m, &dev, &pl);
    /* a sequence per beam and one per child while they fork (beam.h) */
    if (iflow_s2s_open(&t.s, m, n_ctx, n_ctx, o->beams > 1 ? 2 * o->beams + 1 : 1, o->threads) < 0)
        die(tool, NULL);
    double t1 = now_s();
    if (o->text)
        translate_one(&t, o->text, strlen(o->text));
    else
        each_line(stdin, translate_line, &t);
    double dt = now_s() - t1;
    if (o->verbose)
        fprintf(stderr, "%s: load %.3f s; %ld inputs, %ld source tokens, %ld generated tokens in %.3f s (%.1f tok/s)\n",
                tool->name, t1 - t0, t.index, t.n_src_tokens, t.n_tokens, dt, t.n_tokens / (dt > 0 ? dt : 1));
    free(t.prefix);
    iflow_s2s_close(t.s);
    iflow_model_close(m);
    devices_release(&pl);
    return 0;
}
