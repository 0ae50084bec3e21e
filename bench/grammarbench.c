/* grammarbench -- what constrained decoding costs (libcore/serving/grammar.h), as JSON on stdout.
 *
 *   grammarbench TOKENIZER
 *       With the vocabulary of TOKENIZER (a tokenizer.json, a GGUF, ...) and the grammar of any
 *       JSON value (iflow_grammar_from_json_schema of {}):
 *       the time to build the vocabulary's trie; then at three parser states -- the start of a
 *       value (narrow: few tokens allowed), inside a string (wide: nearly every token), after a
 *       digit of a number -- the time of a mask walked afresh (a new state each round, advanced
 *       to the same place: the cache empty), of the same mask again (from the state's cache),
 *       and of one token tested alone (the greedy path's check of the argmax). Best and median
 *       of the rounds, in milliseconds (a token's test in microseconds), and the tokens allowed.
 * Compare a step's mask with the model's decode time per token: iflow-run -v prints both.
 */
#include "bench/bench.h"
#include "libcore/base/error.h"
#include "libcore/serving/grammar.h"
#include "libcore/tokenizers/tokenizer.h"

#include <jansson.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "grammarbench: %s: %s\n", what, iflow_errmsg());
    exit(1);
}

#define ROUNDS 15

/* A state of g advanced through text. */
static iflow_gstate *state_at(const iflow_grammar *g, const char *text)
{
    iflow_gstate *s;
    if (iflow_gstate_open(&s, g) < 0 || iflow_gstate_advance(s, text, strlen(text)) < 0)
        die(text);
    return s;
}

static json_t *at(const iflow_grammar *g, const iflow_gvocab *v, const char *name, const char *text)
{
    const int V = iflow_gvocab_n(v);
    uint8_t *mask = bench_need("grammarbench", malloc((size_t)V), (size_t)V);
    double fresh[ROUNDS], cached[ROUNDS], one[ROUNDS], b[3], md[3];
    int allowed = 0;
    for (int r = 0; r < ROUNDS; r++) {
        iflow_gstate *s = state_at(g, text);
        double t0 = bench_now();
        allowed = iflow_gstate_mask(s, v, mask);
        double t1 = bench_now();
        if (allowed < 0 || iflow_gstate_mask(s, v, mask) != allowed)
            die("mask");
        double t2 = bench_now();
        for (int32_t id = 0; id < 64; id++)
            if (iflow_gstate_allows(s, v, id * (V / 64)) < 0)
                die("allows");
        double t3 = bench_now();
        fresh[r] = (t1 - t0) * 1e3, cached[r] = (t2 - t1) * 1e3, one[r] = (t3 - t2) * 1e6 / 64;
        iflow_gstate_close(s);
    }
    bench_best_median(fresh, ROUNDS, &b[0], &md[0]);
    bench_best_median(cached, ROUNDS, &b[1], &md[1]);
    bench_best_median(one, ROUNDS, &b[2], &md[2]);
    free(mask);
    return json_pack("{s:s, s:s, s:i, s:{s:f, s:f}, s:{s:f, s:f}, s:{s:f, s:f}}", "state", name, "text", text,
                     "allowed", allowed, "mask_walk_ms", "best", b[0], "median", md[0], "mask_cached_ms", "best",
                     b[1], "median", md[1], "one_token_us", "best", b[2], "median", md[2]);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: grammarbench TOKENIZER\n");
        return 2;
    }
    iflow_tokenizer *tok;
    iflow_gvocab *v = NULL;
    iflow_grammar *g;
    if (iflow_tokenizer_open(&tok, argv[1]) < 0)
        die(argv[1]);
    double build[5], bb, bm;
    for (int r = 0; r < 5; r++) {
        iflow_gvocab_close(v);
        double t0 = bench_now();
        if (iflow_gvocab_open(&v, tok) < 0)
            die("vocabulary");
        build[r] = (bench_now() - t0) * 1e3;
    }
    bench_best_median(build, 5, &bb, &bm);
    if (iflow_grammar_open_as(&g, IFLOW_GRAMMAR_JSON_SCHEMA, "{}", 2) < 0) /* any JSON value */
        die("grammar");
    json_t *states = json_array();
    json_array_append_new(states, at(g, v, "value start", "{\"a\": "));
    json_array_append_new(states, at(g, v, "inside a string", "{\"a\": [\"some text"));
    json_array_append_new(states, at(g, v, "in a number", "{\"a\": [\"x\", 12"));
    json_t *out = json_pack("{s:s, s:i, s:{s:f, s:f}, s:o}", "grammar", "json schema {} (any JSON value)", "vocab_tokens",
                            iflow_gvocab_n(v), "vocab_build_ms", "best", bb, "median", bm, "states", states);
    json_dumpf(out, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(4));
    putchar('\n');
    json_decref(out);
    iflow_grammar_close(g);
    iflow_gvocab_close(v);
    iflow_tokenizer_close(tok);
    return 0;
}
