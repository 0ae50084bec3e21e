/*
 * test_shardtok.c -- tokenizers carried by a shard (shard.h: meta's "tokenizer" with its
 * "target" side, blob records "tokenizer" and "tokenizer/<file>") and read back by
 * iflow_tokenizer_from_shard():
 *   - SentencePiece models with and without a Marian vocab.json, a target side of its own, and
 *     the old one-record layout (a tokenizer.json) encode as the same files opened directly;
 *   - a shard without a tokenizer, or without a target side, gives NULL;
 *   - a damaged record (a truncated .spm with its checksum right), a missing record, an unknown
 *     format or a description without a record is refused naming the record, the payload's
 *     byte offset and the shard; so are M2M100's added tokens that are not strings or whose
 *     source prefix is not among them, and good ones put their prefix before a text;
 *   - the marian-en-mg fixture converted with opus-mt-en-mg's files (iflow_convert_opts'
 *     tokenizer_path) opens with two tokenizers: the source side encodes refs.json's texts to
 *     its source ids, greedy decoding (the pad token banned, </s> forced at the limit) gives
 *     generate()'s ids and the target side decodes them to its translations; in a context of 6
 *     positions the 6th token is the forced </s>; t5-uni with uni-t5.model has one;
 *   - the converter refuses a tokenizer path that does not exist or a damaged .spm, naming it,
 *     and leaves no output.
 * With IFLOW_WRITE_SEEDS=DIR it also writes DIR/fuzz_shard/tokenizer.ifs, fuzz_shard's seed.
 */
#include "check.h"
#include "testlib.h"
#include "libcore/engine/seq2seq.h"
#include "libcore/tokenizers/tokenizer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char dir[] = "/tmp/iflow-test-shardtok-XXXXXX";

typedef struct {
    const char *name;
    const void *data;
    size_t len;
} blob;

/* A shard of a meta record whose "tokenizer" is the JSON text `tok` (NULL: none) and blobs. */
static void write_shard(const char *path, const char *tok, const blob *b, int n)
{
    char meta[4096];
    snprintf(meta, sizeof meta, "{\"format\": \"iflow-shard\", \"version\": 1%s%s}", tok ? ", \"tokenizer\": " : "",
             tok ? tok : "");
    iflow_shard_writer *w;
    int rc = iflow_shard_writer_open(&w, path, 0);
    if (rc == 0)
        rc = iflow_shard_write_blob(w, "meta", meta, strlen(meta));
    for (int i = 0; i < n && rc == 0; i++)
        rc = iflow_shard_write_blob(w, b[i].name, b[i].data, b[i].len);
    if (rc == 0)
        rc = iflow_shard_writer_close(w);
    CHECK(rc == 0, "write %s: %s", path, iflow_errmsg());
}

/* The bytes of tests/fixtures/rel (malloc'd), or NULL. */
static void *fixture_bytes(const char *rel, size_t *n)
{
    const char *p = test_fixture(rel);
    return p ? test_read_file(p, n) : NULL;
}

/* The tokenizer of shard `path`'s side (NULL on failure, the message set). */
static int from_shard(const char *path, int side, iflow_tokenizer **t)
{
    iflow_shard *sh;
    *t = NULL;
    int rc = iflow_shard_open(&sh, path, 0);
    if (rc == 0) {
        rc = iflow_tokenizer_from_shard(t, sh, side);
        iflow_shard_close(sh);
    }
    return rc;
}

/* a and b give the same ids for text (with the template), and both exist. */
static int same_ids(const iflow_tokenizer *a, const iflow_tokenizer *b, const char *text)
{
    int32_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int ok = a && b && iflow_tokenizer_encode(a, text, strlen(text), IFLOW_TOK_ADD_BOS, &x, &nx) == 0 &&
             iflow_tokenizer_encode(b, text, strlen(text), IFLOW_TOK_ADD_BOS, &y, &ny) == 0 && nx == ny && nx > 0 &&
             memcmp(x, y, nx * sizeof *x) == 0;
    free(x);
    free(y);
    return ok;
}

static const char vocab_json[] = "{\"</s>\": 0, \"<unk>\": 1, \"\\u2581\": 2, \"s\": 3, \"e\": 4, \"<pad>\": 5}";
static const char two_sides[] = "{\"format\": \"spm\", \"record\": \"tokenizer/source.spm\", \"vocab\": "
                                "\"tokenizer/vocab.json\", \"target\": {\"format\": \"spm\", \"record\": "
                                "\"tokenizer/target.spm\"}}";

/* uni-plain.model with a small vocab.json as the source side, and without one as the target
 * (a seed of fuzz_shard: small). */
static void test_sides(void)
{
    size_t n_src, n_tgt;
    void *src = fixture_bytes("tokenizers/uni-plain.model", &n_src),
         *tgt = fixture_bytes("tokenizers/uni-plain.model", &n_tgt);
    if (!src || !tgt)
        SKIP("no tests/fixtures/tokenizers (run from the repository root)");
    char path[300], seed[4096];
    snprintf(path, sizeof path, "%s/sides.ifs", dir);
    blob b[] = {{"tokenizer/source.spm", src, n_src}, {"tokenizer/vocab.json", vocab_json, strlen(vocab_json)},
                {"tokenizer/target.spm", tgt, n_tgt}};
    write_shard(path, two_sides, b, 3);
    const char *seeds = getenv("IFLOW_WRITE_SEEDS");
    if (seeds) {
        snprintf(seed, sizeof seed, "%s/fuzz_shard/tokenizer.ifs", seeds);
        write_shard(seed, two_sides, b, 3);
    }
    iflow_tokenizer *s, *t, *want_s, *want_t;
    CHECK(from_shard(path, IFLOW_TOK_SOURCE, &s) == 0, "source side: %s", iflow_errmsg());
    CHECK(from_shard(path, IFLOW_TOK_TARGET, &t) == 0, "target side: %s", iflow_errmsg());
    CHECK(iflow_tokenizer_from_spm(&want_s, src, n_src, "src", vocab_json, strlen(vocab_json), "vocab", NULL) == 0, "%s",
          iflow_errmsg());
    CHECK(iflow_tokenizer_from_spm(&want_t, tgt, n_tgt, "tgt", NULL, 0, NULL, NULL) == 0, "%s", iflow_errmsg());
    CHECK(s && iflow_tokenizer_n_vocab(s) == 6, "the source side's ids are vocab.json's: %d",
          s ? iflow_tokenizer_n_vocab(s) : -1);
    CHECK(same_ids(s, want_s, "see the seas sessions"), "the source side encodes as source.spm + vocab.json");
    CHECK(same_ids(t, want_t, "The cat sat on the mat."), "the target side encodes as target.spm");
    CHECK(t && iflow_tokenizer_n_vocab(t) == 400, "the target side's ids are its own: %d",
          t ? iflow_tokenizer_n_vocab(t) : -1);
    iflow_tokenizer_close(s), iflow_tokenizer_close(t), iflow_tokenizer_close(want_s), iflow_tokenizer_close(want_t);
    free(src);
    free(tgt);
}

/* The layout of shards written before: {"format": "hf-json", "record": "tokenizer"}, no target. */
static void test_one_record(void)
{
    size_t n;
    void *js = fixture_bytes("tokenizers/uni-t5.json", &n);
    if (!js)
        SKIP("no tests/fixtures/tokenizers/uni-t5.json");
    char path[300], direct_path[4096];
    snprintf(path, sizeof path, "%s/one.ifs", dir);
    snprintf(direct_path, sizeof direct_path, "%s", test_fixture("tokenizers/uni-t5.json"));
    blob b[] = {{"tokenizer", js, n}};
    write_shard(path, "{\"format\": \"hf-json\", \"record\": \"tokenizer\"}", b, 1);
    iflow_tokenizer *s, *t, *want;
    CHECK(from_shard(path, IFLOW_TOK_SOURCE, &s) == 0, "%s", iflow_errmsg());
    CHECK(from_shard(path, IFLOW_TOK_TARGET, &t) == 0 && t == NULL, "no target side: NULL");
    CHECK(iflow_tokenizer_open(&want, direct_path) == 0, "%s", iflow_errmsg());
    CHECK(same_ids(s, want, "The cat sat on the mat."), "the record encodes as the file");
    iflow_tokenizer_close(s), iflow_tokenizer_close(want);
    snprintf(path, sizeof path, "%s/none.ifs", dir);
    write_shard(path, NULL, NULL, 0);
    CHECK(from_shard(path, IFLOW_TOK_SOURCE, &s) == 0 && s == NULL, "no tokenizer: NULL");
    free(js);
}

/* Damaged, missing and unknown records are refused, named with the shard and the offset. */
static void test_damaged(void)
{
    size_t n;
    void *src = fixture_bytes("tokenizers/uni-plain.model", &n);
    if (!src)
        SKIP("no tests/fixtures/tokenizers/uni-plain.model");
    char path[300];
    iflow_tokenizer *t;
    snprintf(path, sizeof path, "%s/damaged.ifs", dir);
    blob cut[] = {{"tokenizer/source.spm", src, 100}, {"tokenizer/vocab.json", vocab_json, strlen(vocab_json)}};
    write_shard(path, two_sides, cut, 2);
    int rc = from_shard(path, IFLOW_TOK_SOURCE, &t);
    CHECK_ERR(rc, IFLOW_ETRUNC, path, "bad tokenizer record 'tokenizer/source.spm' with tokenizer/vocab.json (payload at byte ");
    CHECK(t == NULL, "nothing built");
    CHECK_ERR(from_shard(path, IFLOW_TOK_TARGET, &t), IFLOW_ENOTFOUND, path, "missing tokenizer record 'tokenizer/target.spm'");

    blob no_vocab[] = {{"tokenizer/source.spm", src, n}};
    write_shard(path, two_sides, no_vocab, 1);
    CHECK_ERR(from_shard(path, IFLOW_TOK_SOURCE, &t), IFLOW_ENOTFOUND, path, "missing tokenizer record 'tokenizer/vocab.json'");
    write_shard(path, "{\"format\": \"spm-bpe\", \"record\": \"tokenizer/source.spm\"}", no_vocab, 1);
    CHECK_ERR(from_shard(path, IFLOW_TOK_SOURCE, &t), IFLOW_EUNSUPPORTED, path, "unknown tokenizer format 'spm-bpe'");
    write_shard(path, "{\"format\": \"spm\"}", no_vocab, 1);
    CHECK_ERR(from_shard(path, IFLOW_TOK_SOURCE, &t), IFLOW_EFORMAT, path, "bad tokenizer description");
    /* M2M100's added language tokens: not strings, a prefix not among them, read back */
    blob whole[] = {{"tokenizer/source.spm", src, n}, {"tokenizer/vocab.json", vocab_json, strlen(vocab_json)}};
    const char *m2m = "{\"format\": \"spm\", \"record\": \"tokenizer/source.spm\", \"vocab\": \"tokenizer/vocab.json\", "
                      "\"added\": %s, \"hidden\": 2, \"prefix\": \"%s\"}";
    char desc[400];
    snprintf(desc, sizeof desc, m2m, "[1, 2]", "__en__");
    write_shard(path, desc, whole, 2);
    CHECK_ERR(from_shard(path, IFLOW_TOK_SOURCE, &t), IFLOW_EFORMAT, path, "added token 0 is not a string");
    snprintf(desc, sizeof desc, m2m, "[\"__en__\", \"__fr__\"]", "__de__");
    write_shard(path, desc, whole, 2);
    CHECK_ERR(from_shard(path, IFLOW_TOK_SOURCE, &t), IFLOW_EFORMAT, path, "the source prefix '__de__' is not one of the 2");
    snprintf(desc, sizeof desc, m2m, "[\"__en__\", \"__fr__\"]", "__fr__");
    write_shard(path, desc, whole, 2);
    const int32_t *pre;
    CHECK(from_shard(path, IFLOW_TOK_SOURCE, &t) == 0 && t && iflow_tokenizer_affix(t, 1, &pre) == 1 &&
              pre[0] == iflow_tokenizer_n_vocab(t) - 3,
          "read back: __fr__ (the second of 2 tokens, 2 hidden after) before the text: %s", iflow_errmsg());
    iflow_tokenizer_close(t);
    free(src);
}

/* Fixture `name` converted with the tokenizer at tok_path, opened, and its refs.json. */
static int open_fixture(const char *name, const char *tok_path, iflow_model **m, json_t **refs)
{
    char rel[64], src[4096], tok[4096], out[300], rp[4200];
    snprintf(rel, sizeof rel, "families/%s", name);
    const char *fx = test_fixture(rel);
    if (!fx || !tok_path)
        SKIP_RET(-1, "no fixture or tokenizer for %s", name);
    snprintf(src, sizeof src, "%s", fx);
    snprintf(tok, sizeof tok, "%s", tok_path);
    snprintf(out, sizeof out, "%s/%s.ifs", dir, name);
    snprintf(rp, sizeof rp, "%s/refs.json", src);
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1, .tokenizer_path = tok};
    int rc = iflow_convert(src, out, &o);
    CHECK(rc == 0, "convert %s: %s", name, iflow_errmsg());
    if (rc == 0 && (rc = iflow_model_open(m, out, 0)) < 0)
        CHECK(0, "open %s: %s", out, iflow_errmsg());
    *refs = rc == 0 ? json_load_file(rp, 0, NULL) : NULL;
    return *refs ? 0 : -1;
}

/* Each of refs' texts: encoded by the source side to its src ids, greedy ids as generate()'s
 * (its ending EOS aside), decoded by the target side to its translation. */
static void check_texts(iflow_model *m, const json_t *refs)
{
    const iflow_tokenizer *src_tok = iflow_model_tokenizer(m), *tgt_tok = iflow_model_target_tokenizer(m);
    const int max_new = (int)json_integer_value(json_object_get(refs, "max_new_tokens"));
    iflow_s2s *s;
    size_t i;
    const json_t *t;
    if (iflow_s2s_open(&s, m, 64, 64, 1, 1) < 0) {
        CHECK(0, "s2s: %s", iflow_errmsg());
        return;
    }
    json_array_foreach(json_object_get(refs, "texts"), i, t) {
        const char *text = json_string_value(json_object_get(t, "text"));
        size_t n_want, n_greedy, n, len;
        int32_t *want = test_ids(json_object_get(t, "src"), &n_want), *greedy = test_ids(json_object_get(t, "greedy"), &n_greedy),
                *ids = NULL;
        char *out = NULL;
        iflow_s2s_result r = {0};
        CHECK(iflow_tokenizer_encode(src_tok, text, strlen(text), IFLOW_TOK_ADD_BOS, &ids, &n) == 0 && n == n_want &&
                  memcmp(ids, want, n * sizeof *ids) == 0,
              "text %zu: the source side's ids are MarianTokenizer's", i);
        if (n_greedy && iflow_model_is_eos(m, greedy[n_greedy - 1]))
            n_greedy--;
        CHECK(iflow_s2s_greedy(s, want, (int)n_want, NULL, 0, max_new, &r) == 0 && (size_t)r.n_tokens == n_greedy &&
                  memcmp(r.tokens, greedy, n_greedy * sizeof *greedy) == 0,
              "text %zu: greedy ids are generate()'s", i);
        CHECK(iflow_tokenizer_decode(tgt_tok, greedy, n_greedy, &out, &len) == 0 &&
                  strcmp(out, json_string_value(json_object_get(t, "translation"))) == 0,
              "text %zu: the target side decodes '%s', transformers '%s'", i, out ? out : "?",
              json_string_value(json_object_get(t, "translation")));
        free(want), free(greedy), free(ids), free(out), free(r.tokens);
    }
    iflow_s2s_close(s);
}

/* The context as the limit: with room for decoder_start and 5 tokens, the 6th is the forced </s>
 * (the 6th a context of 6 positions allows), finish context, the first 5 generate()'s. */
static void check_context_limit(iflow_model *m, const json_t *refs)
{
    const json_t *t = json_array_get(json_object_get(refs, "texts"), 0);
    size_t n_src, n_greedy;
    int32_t *src = test_ids(json_object_get(t, "src"), &n_src), *greedy = test_ids(json_object_get(t, "greedy"), &n_greedy);
    iflow_s2s *s;
    iflow_s2s_result r = {0};
    CHECK(iflow_s2s_open(&s, m, 64, 6, 1, 1) == 0 && iflow_s2s_greedy(s, src, (int)n_src, NULL, 0, 100, &r) == 0,
          "greedy in a context of 6: %s", iflow_errmsg());
    CHECK(r.n_tokens == 5 && n_greedy > 5 && memcmp(r.tokens, greedy, 5 * sizeof *greedy) == 0 &&
              r.finish == IFLOW_FINISH_CONTEXT && r.eos == 0,
          "the context's last token is the forced </s>: %d tokens, finish %d, eos %d", r.n_tokens, r.finish, r.eos);
    free(src), free(greedy), free(r.tokens);
    iflow_s2s_close(s);
}

static void test_marian(void)
{
    iflow_model *m;
    json_t *refs;
    if (open_fixture("marian-en-mg", test_data("models/tokenizers/opus-mt-en-mg"), &m, &refs) < 0)
        return;
    const iflow_hparams *hp = iflow_model_hparams(m);
    CHECK(hp->n_banned == 1 && hp->banned[0] == 54687, "banned_tokens: the pad token (bad_words_ids)");
    CHECK(hp->forced_eos == 0, "forced_eos: MarianConfig's default </s> (config.json has none)");
    check_context_limit(m, refs);
    CHECK(iflow_model_target_tokenizer(m) != iflow_model_tokenizer(m), "a target side of its own");
    CHECK(json_integer_value(json_object_get(refs, "pad_picked_without_ban")) > 0, "the fixture tests the ban");
    /* The fixture's margins are for F32 arithmetic and its weights are F16: the exact product
     * (the default rounds x to BF16 where the CPU has AVX512_BF16, kernels/cpu/kernels.h, which
     * a random model of width 8 does not survive greedy for greedy). */
    iflow_kernel_set_f32_activations(1);
    check_texts(m, refs);
    iflow_kernel_set_f32_activations(0);
    json_decref(refs);
    iflow_model_close(m);
}

static void test_t5(void)
{
    iflow_model *m;
    json_t *refs;
    char tok[4096];
    const char *p = test_fixture("tokenizers/uni-t5.model");
    snprintf(tok, sizeof tok, "%s", p ? p : "");
    if (open_fixture("t5-uni", p ? tok : NULL, &m, &refs) < 0)
        return;
    CHECK(iflow_model_target_tokenizer(m) == iflow_model_tokenizer(m), "one tokenizer for both sides");
    check_texts(m, refs);
    json_decref(refs);
    iflow_model_close(m);
}

/* A missing tokenizer path and a damaged .spm are refused at conversion, named; no output. */
static void test_convert_refusals(void)
{
    char src[4096], bad[300], out[300], missing[300];
    const char *p = test_fixture("families/t5-uni"); /* a static buffer */
    snprintf(src, sizeof src, "%s", p ? p : "");
    size_t n;
    void *bytes = p ? fixture_bytes("tokenizers/uni-t5.model", &n) : NULL;
    if (!bytes)
        SKIP("no t5-uni fixture");
    snprintf(bad, sizeof bad, "%s/bad.model", dir);
    test_write_file(bad, bytes, n / 2);
    free(bytes);
    snprintf(out, sizeof out, "%s/refused.ifs", dir);
    snprintf(missing, sizeof missing, "%s/no-such-tokenizer", dir);
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1, .tokenizer_path = missing};
    CHECK_ERR(iflow_convert(src, out, &o), IFLOW_ENOTFOUND, missing, "cannot find the tokenizer");
    o.tokenizer_path = bad;
    int rc = iflow_convert(src, out, &o);
    CHECK(rc < 0 && strstr(iflow_errmsg(), bad), "a damaged .spm is refused naming it: %s", iflow_errmsg());
    struct stat st;
    CHECK(stat(out, &st) != 0, "no output left behind");
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    RUN(test_sides);
    RUN(test_one_record);
    RUN(test_damaged);
    RUN(test_marian);
    RUN(test_t5);
    RUN(test_convert_refusals);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_shardtok");
}
