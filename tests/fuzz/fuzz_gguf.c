/* fuzz_gguf.c -- libFuzzer target: the GGUF reader, the GGUF tokenizer loader and the GGUF
 * model source (ggufsrc: metadata as config, tensor conversion) on arbitrary bytes. Every
 * accepted file is walked completely (all keys through every getter, every tensor's first and
 * last data byte), converted tensor by tensor (its own type, F32, F16; a matrix also without
 * its first row, as a spec's row range asks), its metadata resolved by the spec of specs/ that
 * serves its architecture and read by the engine, and, if it holds a vocabulary, used to
 * encode and decode (directly and through ggufsrc's tokenizer blob). Run from the repository
 * root (specs/). */
#include "libcore/base/dtype.h"
#include "libcore/engine/model.h"
#include "libcore/formats/gguf.h"
#include "libcore/formats/ggufsrc.h"
#include "libcore/formats/spec.h"
#include "libcore/tokenizers/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void walk_kv(const iflow_gguf *g, int64_t i)
{
    const char *key = iflow_gguf_key(g, i), *s;
    const iflow_gguf_str *items;
    const int32_t *ia;
    const float *fa;
    const void *raw;
    size_t n, len;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    int b, et;
    sink += (uint64_t)iflow_gguf_kv_type(g, i) + iflow_gguf_arr_count(g, i) + (uint64_t)iflow_gguf_arr_type(g, i);
    if (iflow_gguf_get_str(g, key, &s, &len) == 0)
        sink += len ? (uint8_t)s[len - 1] : 0;
    sink += iflow_gguf_get_u32(g, key, &u32) == 0 ? u32 : 0;
    sink += iflow_gguf_get_i32(g, key, &i32) == 0 ? (uint64_t)i32 : 0;
    sink += iflow_gguf_get_u64(g, key, &u64) == 0 ? u64 : 0;
    sink += iflow_gguf_get_f32(g, key, &f) == 0 && f == f ? 1 : 0;
    sink += iflow_gguf_get_bool(g, key, &b) == 0 ? (uint64_t)b : 0;
    if (iflow_gguf_get_arr_str(g, key, &items, &n) == 0)
        for (size_t k = 0; k < n; k++)
            sink += items[k].len ? (uint8_t)items[k].ptr[items[k].len - 1] : 0;
    if (iflow_gguf_get_arr_i32(g, key, &ia, &n) == 0 && n)
        sink += (uint64_t)ia[n - 1];
    if (iflow_gguf_get_arr_f32(g, key, &fa, &n) == 0 && n)
        sink += fa[n - 1] == fa[n - 1];
    if (iflow_gguf_get_arr(g, key, &et, &raw, &n) == 0 && n)
        sink += ((const uint8_t *)raw)[0];
}

static void walk(const iflow_gguf *g)
{
    for (int64_t i = 0; i < iflow_gguf_n_kv(g); i++)
        walk_kv(g, i);
    for (int64_t i = 0; i < iflow_gguf_n_tensors(g); i++) {
        const iflow_gguf_tensor *t = iflow_gguf_tensor_at(g, i);
        const uint8_t *d = iflow_gguf_tensor_data(g, i);
        sink += iflow_gguf_find_tensor(g, t->name) == i;
        if (t->nbytes)
            sink += d[0] + d[t->nbytes - 1];
    }
}

static void use_tokenizer(const iflow_tokenizer *t, const uint8_t *data, size_t size)
{
    static const char *const texts[] = {"Hello world", " <s>a</s> ", "3333 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x9a\x80", ""};
    for (size_t k = 0; k < 5; k++) {
        const char *text = k < 4 ? texts[k] : (const char *)data;
        size_t len = k < 4 ? strlen(texts[k]) : (size < 256 ? size : 256);
        for (int flags = 0; flags < 4; flags++) {
            int32_t *ids;
            size_t n;
            char *out, buf[32];
            if (iflow_tokenizer_encode(t, text, len, flags, &ids, &n) != 0)
                continue;
            if (iflow_tokenizer_decode(t, ids, n, &out, NULL) == 0)
                free(out);
            for (size_t i = 0; i < n; i++)
                sink += (uint64_t)iflow_tokenizer_piece(t, ids[i], i == 0, buf, sizeof buf);
            free(ids);
        }
    }
    for (int32_t id = 0; id < iflow_tokenizer_n_vocab(t) && id < 512; id++) {
        char buf[8];
        sink += (uint64_t)iflow_tokenizer_piece(t, id, id & 1, buf, sizeof buf);
    }
}

/* The specs serving GGUF architectures, loaded once (with their [gguf] variant applied). */
static iflow_spec *specs_for_gguf[48];

static const iflow_spec *spec_for(const char *arch)
{
    static const char *const archs[] = {
        "llama",     "qwen2",      "gemma",   "gemma2",  "gemma3",    "phi3",     "gpt2",          "gptneox",
        "bert",      "qwen3",      "qwen3moe", "qwen2moe", "olmoe",   "granite",  "granitemoe",    "olmo2",
        "stablelm",  "phi2",       "starcoder2", "smollm3", "command-r", "cohere2", "glm4",         "exaone4",
        "ernie4_5",  "seed_oss",   "olmo",    "arcee",   "nemotron",  "hunyuan-dense", "deepseek2",
        "glm4moe",   "gpt-oss"};
    _Static_assert(sizeof archs / sizeof *archs <= sizeof specs_for_gguf / sizeof *specs_for_gguf, "specs_for_gguf");
    static const char *const dirs[] = {"specs"};
    static int loaded;
    if (!loaded++)
        for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
            if (iflow_spec_find_source(&specs_for_gguf[i], dirs, 1, "gguf", archs[i]) != 0)
                specs_for_gguf[i] = NULL;
    for (size_t i = 0; arch && i < sizeof archs / sizeof *archs; i++)
        if (specs_for_gguf[i] && strcmp(archs[i], arch) == 0)
            return specs_for_gguf[i];
    return NULL;
}

/* The metadata resolved as the converter does ({K} keys, conditional sections) and read by the
 * engine's hyperparameter checks, as converting the file would. */
static void use_spec(iflow_ggufsrc *s)
{
    const iflow_spec *spec = spec_for(iflow_ggufsrc_architecture(s));
    json_t *resolved;
    iflow_hparams hp;
    if (spec && iflow_spec_resolve(spec, iflow_ggufsrc_config(s), &resolved) == 0) {
        sink += iflow_hparams_from_json(&hp, resolved, "fuzz.gguf") == 0 ? (uint64_t)hp.n_layers : 0;
        json_decref(resolved);
    }
}

/* Convert every tensor of up to 1 << 16 elements to its own type, F32 and F16. */
static void use_source(iflow_ggufsrc *s)
{
    static uint8_t buf[(1 << 16) * 4];
    const int types[] = {-2, IFLOW_DT_F32, IFLOW_DT_F16};
    char *cfg = json_dumps(iflow_ggufsrc_config(s), JSON_COMPACT);
    sink += cfg ? strlen(cfg) : 0;
    free(cfg);
    for (size_t i = 0; i < iflow_ggufsrc_n_tensors(s); i++) {
        const iflow_src_tensor *t = iflow_ggufsrc_tensor(s, i);
        int64_t n = 1;
        for (int d = 0; d < t->n_dims; d++)
            n *= t->shape[d];
        sink += iflow_ggufsrc_find(s, t->name) == t;
        if (t->dtype < 0 || n > (1 << 16))
            continue;
        for (int k = 0; k < 3; k++) {
            const void *out;
            int dt = types[k] == -2 ? t->dtype : types[k];
            size_t nb = iflow_tensor_nbytes(dt, t->n_dims, t->shape);
            if (nb <= sizeof buf && iflow_ggufsrc_payload(s, t, dt, &out, buf) == 0 && nb)
                sink += ((const uint8_t *)out)[nb - 1];
        }
        /* rows 1.. in place, as convert.c's NAME[A:B]; of a 3-D tensor, rows of its last dimension */
        const int64_t n_rows = t->n_dims == 3 ? t->shape[0] * t->shape[1] : t->shape[0];
        if ((t->n_dims == 2 || t->n_dims == 3) && n_rows >= 2) {
            iflow_src_tensor rows = *t;
            size_t row = t->nbytes / (size_t)n_rows;
            rows.n_dims = 2, rows.shape[0] = n_rows - 1, rows.shape[1] = t->shape[t->n_dims - 1], rows.shape[2] = 1;
            rows.nbytes -= row, rows.data = (const uint8_t *)t->data + row;
            const void *out;
            size_t nb = iflow_tensor_nbytes(IFLOW_DT_F32, 2, rows.shape);
            if (nb <= sizeof buf && iflow_ggufsrc_payload(s, &rows, IFLOW_DT_F32, &out, buf) == 0 && nb)
                sink += ((const uint8_t *)out)[nb - 1];
        }
    }
    use_spec(s);
    void *blob;
    size_t len;
    iflow_tokenizer *t;
    if (iflow_ggufsrc_tokenizer(s, &blob, &len) == 0) {
        if (iflow_tokenizer_from_gguf(&t, blob, len, "blob.gguf") == 0) {
            sink += (uint64_t)iflow_tokenizer_n_vocab(t);
            iflow_tokenizer_close(t);
        }
        free(blob);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iflow_gguf *g;
    iflow_ggufsrc *s;
    iflow_tokenizer *t;
    if (iflow_gguf_open_mem(&g, data, size, "fuzz.gguf") == 0) {
        walk(g);
        if (iflow_ggufsrc_from(&s, g) == 0) { /* takes g, closed with s (also on failure) */
            use_source(s);
            iflow_ggufsrc_close(s);
        }
    }
    if (iflow_tokenizer_from_gguf(&t, data, size, "fuzz.gguf") == 0) {
        use_tokenizer(t, data, size);
        iflow_tokenizer_close(t);
    }
    return 0;
}
