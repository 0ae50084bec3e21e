/*
 * fuzz_json_config.c -- libFuzzer target: JSON configs on arbitrary bytes.
 *
 * The bytes are parsed with iflow_json_load_buf() and, as config.json of a config-only model
 * directory, with iflow_hfdir_open(); both must agree on whether the input is a usable config.
 * Every getter then runs on a list of real config keys, on every key of the object and of the
 * objects one level down, and on dotted paths built from them.
 */
#include "libcore/base/error.h"
#include "libcore/formats/hfdir.h"
#include "libcore/base/jsonutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256], cfg[300];

static void cleanup(void)
{
    unlink(cfg);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/iflow-fuzz-json-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        abort();
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    atexit(cleanup);
    return 0;
}

static const char *const keys[] = {
    "hidden_size", "num_attention_heads", "num_key_value_heads", "rope_theta", "rms_norm_eps",
    "tie_word_embeddings", "model_type", "rope_scaling.factor", "rope_scaling.type",
    "architectures", "eos_token_id", "a.b.c", ".", "", "..", "a.", ".a",
};

static void query(const json_t *obj, const char *path)
{
    int64_t i;
    double d;
    int b;
    const char *s;
    volatile size_t sink = 0;
    volatile double dsink = 0;
    sink += (size_t)iflow_json_int(obj, path, 0);
    dsink += iflow_json_number(obj, path, 0);
    sink += (size_t)iflow_json_bool(obj, path, 0);
    s = iflow_json_string(obj, path, "");
    sink += strlen(s);
    const json_t *v = iflow_json_lookup(obj, path);
    if (v)
        sink += strlen(iflow_json_type_name(v));
    int rc[4] = {
        iflow_json_get_int(obj, path, &i, "fuzz.json"),
        iflow_json_get_number(obj, path, &d, "fuzz.json"),
        iflow_json_get_bool(obj, path, &b, "fuzz.json"),
        iflow_json_get_string(obj, path, &s, NULL),
    };
    for (int k = 0; k < 4; k++) {
        if (rc[k] != 0 && rc[k] != IFLOW_ENOTFOUND && rc[k] != IFLOW_EFORMAT)
            abort();
        if (rc[k] < 0 && iflow_errmsg()[0] == '\0')
            abort();
        /* Strict and lenient agree on presence. */
        if ((rc[k] == IFLOW_ENOTFOUND) != (!v || json_is_null(v)))
            abort();
    }
    if (rc[3] == 0)
        sink += strlen(s);
    (void)sink, (void)dsink;
}

/* Keys of obj, and "key.sub" for the objects one level down (paths kept short). */
static void query_keys(const json_t *obj, int depth)
{
    const char *k;
    const json_t *v;
    size_t n = 0;
    json_object_foreach((json_t *)obj, k, v) {
        if (++n > 64)
            break;
        query(obj, k);
        if (depth == 0 && json_is_object(v)) {
            const char *k2;
            const json_t *v2;
            size_t n2 = 0;
            json_object_foreach((json_t *)v, k2, v2) {
                char path[256];
                if (++n2 > 16)
                    break;
                snprintf(path, sizeof path, "%s.%s", k, k2);
                query(obj, path);
            }
            query_keys(v, 1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j;
    int rc = iflow_json_load_buf(&j, data, size, "fuzz.json");
    if (rc < 0 && (j || iflow_errmsg()[0] == '\0' || strncmp(iflow_errmsg(), "fuzz.json:", 10)))
        abort();

    /* The same bytes as config.json of a directory. */
    FILE *f = fopen(cfg, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    iflow_hfdir *h;
    int hrc = iflow_hfdir_open(&h, dir, IFLOW_HFDIR_CONFIG_ONLY);
    if ((hrc == 0) != (rc == 0 && json_is_object(j)))
        abort();
    if (hrc == 0 && (!json_equal((json_t *)iflow_hfdir_config(h), j) ||
                     iflow_hfdir_n_tensors(h) != 0))
        abort();
    iflow_hfdir_close(h);

    if (rc == 0) {
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            query(j, keys[i]);
        if (json_is_object(j))
            query_keys(j, 0);
        json_decref(j);
    }
    return 0;
}
