/*
 * test_pytorch.c -- Hugging Face directories with PyTorch weights (pytorch_model.bin, single and
 * sharded with pytorch_model.bin.index.json; hfdir.h through pickle.h).
 *
 * The checkpoints are written here, in torch.save's layout (tests/zipwrite.h: a stored zip of
 * archive/data.pkl and one archive/data/<key> member per storage; test_pickle.c checks that
 * reader on the real xs-ckpt/ckpt.pt), from stories260K's model.safetensors: every tensor
 * under its own name. The reference is the safetensors directory itself: converting the
 * PyTorch directory must give the same tensors byte for byte. A state dict holding a call
 * (os.system through REDUCE) is converted without calling anything and fails on the missing
 * tensor, naming it.
 */
#include "check.h"
#include "testlib.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/formats/convert.h"
#include "libcore/formats/safetensors.h"
#include "libcore/formats/shard.h"
#include "tests/zipwrite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/iflow-test-pytorch-XXXXXX";
static char ref[300];

static const char *const side_files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                         "tokenizer_config.json"};

/* dir/sub with the stories260K side files linked in; returns 0 or -1. */
static int make_dir(const char *sub, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", dir, sub);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", out);
    if (system(cmd) != 0)
        return -1;
    for (size_t i = 0; i < sizeof side_files / sizeof *side_files; i++) {
        char src[4096], dst[1024], rel[128];
        snprintf(rel, sizeof rel, "models/stories260K/hf/%s", side_files[i]);
        if (!test_data(rel))
            return -1;
        snprintf(src, sizeof src, "%s", test_data(rel));
        snprintf(dst, sizeof dst, "%s/%s", out, side_files[i]);
        if (symlink(src, dst) != 0)
            return -1;
    }
    return 0;
}

static const char *storage_type(int dtype)
{
    return dtype == IFLOW_DT_F16 ? "HalfStorage" : dtype == IFLOW_DT_BF16 ? "BFloat16Storage" : "FloatStorage";
}

/* A torch.save-like zip of tensors [t0, t1) of st (archive name "archive"); extra: a pickle
 * fragment pushing one more key and value before the dict is closed, or NULL. */
static void write_pt(const char *path, const iflow_st *st, size_t t0, size_t t1, const zbuf *extra)
{
    zbuf pk = {0}, zip = {0};
    size_t n = t1 - t0;
    zmember *m = calloc(n + 2, sizeof *m);
    char (*keys)[32] = calloc(n + 1, sizeof *keys);
    pk_op(&pk, 0x80), pk_op(&pk, 2);
    pk_global(&pk, "collections", "OrderedDict");
    pk_op(&pk, ')'), pk_op(&pk, 'R'); /* OrderedDict() */
    for (size_t i = 0; i < n; i++) {
        const iflow_src_tensor *t = iflow_st_tensor(st, t0 + i);
        int32_t size[IFLOW_SRC_MAX_DIMS], stride[IFLOW_SRC_MAX_DIMS], numel = 1;
        for (int d = t->n_dims - 1; d >= 0; d--) {
            size[d] = (int32_t)t->shape[d];
            stride[d] = numel;
            numel *= size[d];
        }
        snprintf(keys[i], sizeof keys[i], "%zu", i);
        pk_str(&pk, t->name);
        pk_tensor(&pk, storage_type(t->dtype), keys[i], numel, 0, size, stride, t->n_dims);
        pk_op(&pk, 's');
        char *member = malloc(48);
        snprintf(member, 48, "archive/data/%zu", i);
        m[i] = (zmember){member, t->data, t->nbytes, 0};
    }
    if (extra)
        zb_put(&pk, extra->p, extra->n), pk_op(&pk, 's');
    pk_op(&pk, '.');
    m[n] = (zmember){"archive/data.pkl", pk.p, pk.n, 0};
    m[n + 1] = (zmember){"archive/byteorder", "little", 6, 0};
    zip_write(&zip, m, n + 2);
    test_write_file(path, zip.p, zip.n);
    for (size_t i = 0; i < n; i++)
        free((char *)m[i].name);
    free(m), free(keys), free(pk.p), free(zip.p);
}

static int convert_dir(const char *src, const char *out)
{
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
    return iflow_convert(src, out, &o);
}

static iflow_st *st;

static void test_single(void)
{
    char d[400], path[512], out[512];
    CHECK(make_dir("single", d, sizeof d) == 0, "make %s", d);
    snprintf(path, sizeof path, "%s/pytorch_model.bin", d);
    write_pt(path, st, 0, iflow_st_n_tensors(st), NULL);
    snprintf(out, sizeof out, "%s/single.ifs", dir);
    CHECK(convert_dir(d, out) == 0, "convert pytorch_model.bin: %s", iflow_errmsg());
    int nb, n = test_same_tensors(out, ref, &nb);
    CHECK(n == 47 && nb == 47, "pytorch_model.bin: %d of 47 tensors as from model.safetensors (%d there)", n, nb);
}

static void test_sharded(void)
{
    char d[400], path[512], out[512];
    CHECK(make_dir("sharded", d, sizeof d) == 0, "make %s", d);
    size_t n = iflow_st_n_tensors(st), half = n / 2;
    const char *file[2] = {"pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", d, file[k]);
        write_pt(path, st, k ? half : 0, k ? n : half, NULL);
    }
    json_t *map = json_object();
    for (size_t i = 0; i < n; i++)
        json_object_set_new(map, iflow_st_tensor(st, i)->name, json_string(file[i >= half]));
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
    snprintf(path, sizeof path, "%s/pytorch_model.bin.index.json", d);
    CHECK(json_dump_file(idx, path, 0) == 0, "write %s", path);
    snprintf(out, sizeof out, "%s/sharded.ifs", dir);
    CHECK(convert_dir(d, out) == 0, "convert sharded pytorch_model: %s", iflow_errmsg());
    int nb, same = test_same_tensors(out, ref, &nb);
    CHECK(same == 47 && nb == 47, "two pytorch_model shards: %d of 47 tensors as from model.safetensors (%d there)",
          same, nb);

    /* the index names the wrong shard for a tensor */
    json_object_set_new(map, iflow_st_tensor(st, 0)->name, json_string(file[1]));
    CHECK(json_dump_file(idx, path, 0) == 0, "write %s", path);
    CHECK_ERR(convert_dir(d, out), IFLOW_EFORMAT, "pytorch_model.bin.index.json", "instead");
    json_decref(idx);
}

static void test_no_calls(void)
{
    char d[400], path[512], out[512], marker[512];
    CHECK(make_dir("hostile", d, sizeof d) == 0, "make %s", d);
    snprintf(marker, sizeof marker, "%s/pwned", dir);
    /* every tensor but the embedding, which is os.system("touch marker") instead */
    zbuf extra = {0};
    char cmd[600];
    snprintf(cmd, sizeof cmd, "touch %s", marker);
    pk_str(&extra, "model.embed_tokens.weight");
    pk_global(&extra, "os", "system");
    pk_op(&extra, '(');
    pk_str(&extra, cmd);
    pk_op(&extra, 't');
    pk_op(&extra, 'R');
    size_t skip = 0;
    while (strcmp(iflow_st_tensor(st, skip)->name, "model.embed_tokens.weight") != 0)
        skip++;
    snprintf(path, sizeof path, "%s/pytorch_model.bin", d);
    /* the tensors before and after the embedding in two runs of one dict would need a second
     * writer; the embedding is the first tensor of stories260K's file */
    CHECK(skip == 0, "the embedding is the first tensor (%zu)", skip);
    write_pt(path, st, 1, iflow_st_n_tensors(st), &extra);
    snprintf(out, sizeof out, "%s/hostile.ifs", dir);
    CHECK_ERR(convert_dir(d, out), IFLOW_ENOTFOUND, "model.embed_tokens.weight", "missing tensor");
    CHECK(access(marker, F_OK) != 0, "os.system was called");
    CHECK(access(out, F_OK) != 0, "nothing written");
    free(extra.p);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(ref, sizeof ref, "%s/ref.ifs", dir);
    const char *stp = test_data("models/stories260K/hf/model.safetensors");
    if (!stp || iflow_st_open(&st, stp) < 0 || test_convert("models/stories260K/hf", ref, -1) != 0) {
        fprintf(stderr, "test data missing\n");
        return check_summary("test_pytorch") | 1;
    }
    RUN(test_single);
    RUN(test_sharded);
    RUN(test_no_calls);
    iflow_st_close(st);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_pytorch");
}
