/*
 * test_plan.c -- partition plans: the ini form, the checks, and running a model split by layer,
 * by tensor (heads and FFN columns over several devices, all-reduced) and hybrid (layer groups
 * x head groups) over virtual CPU devices.
 *
 * Reference: the same model on one device. Layer partition changes only where the hidden state
 * lives, so its logits must be bit-identical. Tensor and hybrid partition sum the o-projection
 * and the FFN down-projection in pieces (one per part, added in part order), so float rounding
 * differs: per-position logits within 1e-4 (absolute; the logits are O(10)) and the same 64
 * greedy tokens, on stories260K and xs-ckpt (8 heads over 4 kv heads: 8 devices replicate each
 * kv head on two). PLAN_SHOW=1 in the environment prints each case's largest logit difference.
 */
#include "tests/unit/testlib.h"
#include "libcore/base/dtype.h"
#include "libcore/device/device.h"
#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"
#include "libcore/formats/quant.h"

#include <math.h>

static char dir[] = "/tmp/iflow-test-plan-XXXXXX";
static char s_f32[512], xs[512], s_q8[512], plan_path[512];

#define N_GEN 64

/* Greedy generation from a short prompt: all logits of the prompt and of each step into out
 * ([(n_prompt + N_GEN)][vocab]), the generated ids into gen. */
static int generate(iflow_model *m, float *out, int32_t *gen)
{
    static const int32_t prompt[] = {1, 403, 407, 261, 378};
    const int np = 5, V = iflow_model_hparams(m)->vocab_size;
    iflow_ctx *c;
    int rc = iflow_ctx_open(&c, m, np + N_GEN + 1, 1);
    if (rc == 0)
        rc = iflow_ctx_eval(c, prompt, np, out, 1);
    float *last = out + (size_t)(np - 1) * V;
    for (int s = 0; s < N_GEN && rc == 0; s++) {
        int32_t next = 0;
        for (int i = 1; i < V; i++)
            if (last[i] > last[next])
                next = i;
        gen[s] = next;
        last = out + (size_t)(np + s) * V;
        rc = iflow_ctx_eval(c, &next, 1, last, 0);
    }
    iflow_ctx_close(c);
    return rc;
}

/* A plan of `groups` layer groups x `heads` head groups (heads 1 = layer partition, groups 1 =
 * tensor partition), over cpu:0.. . Ranges as even as the shape allows: head groups fall on
 * kv-head groups when there are at least as many kv heads as head groups, else within one. */
static void make_plan(iflow_plan *p, const iflow_hparams *hp, int groups, int heads)
{
    memset(p, 0, sizeof *p);
    snprintf(p->strategy, sizeof p->strategy, "%s", heads == 1 ? "layer" : groups == 1 ? "tensor" : "hybrid");
    p->n_layers = hp->n_layers, p->n_heads = hp->n_heads, p->n_kv_heads = hp->n_kv_heads, p->ffn_dim = hp->ffn_dim;
    int group = hp->n_heads / hp->n_kv_heads;
    for (int g = 0; g < groups; g++)
        for (int h = 0; h < heads; h++) {
            iflow_plan_device *d = &p->devices[p->n_devices];
            snprintf(d->name, sizeof d->name, "cpu:%d", p->n_devices);
            p->n_devices++;
            d->threads = 1;
            d->layer0 = hp->n_layers * g / groups, d->layer1 = hp->n_layers * (g + 1) / groups;
            if (heads <= hp->n_kv_heads) {
                d->head0 = hp->n_kv_heads * h / heads * group, d->head1 = hp->n_kv_heads * (h + 1) / heads * group;
            } else {
                d->head0 = hp->n_heads * h / heads, d->head1 = hp->n_heads * (h + 1) / heads;
            }
            d->ffn0 = hp->ffn_dim * h / heads, d->ffn1 = hp->ffn_dim * (h + 1) / heads;
        }
    p->output_device = p->n_devices - 1;
}

static void run_case(const char *path, const char *name, int groups, int heads, const float *ref, const int32_t *ref_gen)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    size_t n = (size_t)(5 + N_GEN) * hp->vocab_size;
    float *out = calloc(n, sizeof(float));
    int32_t gen[N_GEN] = {0};
    iflow_plan p;
    iflow_device *devs[IFLOW_PLAN_MAX_DEVICES] = {0};
    make_plan(&p, hp, groups, heads);
    /* through the file form, so the ini reader and writer take part */
    CHECK(iflow_plan_save(&p, plan_path) == 0, "save: %s", iflow_errmsg());
    iflow_plan q;
    CHECK(iflow_plan_load(&q, plan_path) == 0, "load: %s", iflow_errmsg());
    for (int i = 0; i < p.n_devices; i++) /* an empty layer range reads back as 0-0 ("none") */
        if (p.devices[i].layer1 <= p.devices[i].layer0)
            p.devices[i].layer0 = p.devices[i].layer1 = 0;
    CHECK(memcmp(&p, &q, sizeof p) == 0, "%s: the plan reads back as written", name);
    CHECK(iflow_plan_open_devices(&q, devs) == 0, "open devices: %s", iflow_errmsg());
    int rc = iflow_model_place_plan(m, &q, devs, 5 + N_GEN + 1);
    CHECK(rc == 0, "%s %dx%d: place: %s", name, groups, heads, iflow_errmsg());
    if (rc == 0 && generate(m, out, gen) == 0) {
        double worst = 0;
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, fabs((double)out[i] - ref[i]));
        int same = memcmp(gen, ref_gen, sizeof gen) == 0;
        if (getenv("PLAN_SHOW"))
            fprintf(stderr, "%s %dx%d: max logit diff %g\n", name, groups, heads, worst);
        if (heads == 1)
            CHECK(memcmp(out, ref, n * sizeof(float)) == 0, "%s layer x%d: logits bit-identical (max diff %g)", name,
                  groups, worst);
        else
            CHECK(worst <= 1e-4, "%s %d layer groups x %d head groups: max logit diff %g > 1e-4", name, groups, heads,
                  worst);
        CHECK(same, "%s %dx%d: the single device's %d greedy tokens", name, groups, heads, N_GEN);
    }
    iflow_model_close(m);
    iflow_plan_close_devices(&q, devs);
    free(out);
}

static void model_cases(const char *path, const char *name)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    size_t n = (size_t)(5 + N_GEN) * iflow_model_hparams(m)->vocab_size;
    float *ref = calloc(n, sizeof(float));
    int32_t gen[N_GEN];
    CHECK(generate(m, ref, gen) == 0, "reference: %s", iflow_errmsg());
    iflow_model_close(m);
    static const int shapes[][2] = {
        {1, 1}, {2, 1}, {3, 1}, {4, 1}, {8, 1},   /* layer: 1, 2, 3, 4, 8 devices */
        {1, 2}, {1, 3}, {1, 4}, {1, 8},           /* tensor                          */
        {2, 2}, {3, 2}, {2, 4}, {4, 2},           /* hybrid: 4, 6 and 8 devices      */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        run_case(path, name, shapes[i][0], shapes[i][1], ref, gen);
    free(ref);
}

static void test_stories260K(void) { model_cases(s_f32, "stories260K"); }
static void test_xs_ckpt(void) { model_cases(xs, "xs-ckpt"); }

/* ---- the file form and the checks ---- */

static void write_text(const char *text)
{
    FILE *f = fopen(plan_path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_file_errors(void)
{
    iflow_plan p;
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\nlayers = 0-x\n");
    int rc = iflow_plan_load(&p, plan_path);
    CHECK_ERR(rc, IFLOW_EFORMAT, "line 7", "bad range layers = '0-x'");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\ncolour = red\n");
    rc = iflow_plan_load(&p, plan_path);
    CHECK_ERR(rc, IFLOW_EFORMAT, "line 6", "unknown key 'colour'");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n");
    rc = iflow_plan_load(&p, plan_path);
    CHECK_ERR(rc, IFLOW_EFORMAT, plan_path, "names no device");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\noutput = cuda:3\n[device cpu:0]\n");
    rc = iflow_plan_load(&p, plan_path);
    CHECK_ERR(rc, IFLOW_EFORMAT, "output = cuda:3", "not one of its devices");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\n[device cpu:0]\n");
    rc = iflow_plan_load(&p, plan_path);
    CHECK_ERR(rc, IFLOW_EFORMAT, "cpu:0", "appears twice");
    rc = iflow_plan_load(&p, "/nonexistent/plan.ini");
    CHECK_ERR(rc, IFLOW_EIO, "/nonexistent/plan.ini", "cannot open plan");

    /* a whole-model device: "all" everywhere */
    write_text("[plan]\nstrategy = layer\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\n");
    CHECK(iflow_plan_load(&p, plan_path) == 0, "minimal plan: %s", iflow_errmsg());
    CHECK(p.devices[0].layer1 == 5 && p.devices[0].head1 == 8 && p.devices[0].ffn1 == 172, "all by default");
    CHECK(iflow_plan_check(&p, 5, 8, 4, 172) == 0, "check: %s", iflow_errmsg());
    rc = iflow_plan_check(&p, 6, 8, 4, 172);
    CHECK_ERR(rc, IFLOW_ESHAPE, "5 layers", "this model has 6");

    /* coverage */
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\nheads = 0-3\n"
               "[device cpu:1]\nheads = 2-7\n");
    CHECK(iflow_plan_load(&p, plan_path) == 0, "load: %s", iflow_errmsg());
    rc = iflow_plan_check(&p, 5, 8, 4, 172);
    CHECK_ERR(rc, IFLOW_EINVAL, "query head 2 of layer 0", "on both cpu:0 and cpu:1");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\nheads = 0-3\nffn = 0-99\n"
               "[device cpu:1]\nheads = 4-7\nffn = 101-171\n");
    iflow_plan_load(&p, plan_path);
    rc = iflow_plan_check(&p, 5, 8, 4, 172);
    CHECK_ERR(rc, IFLOW_EINVAL, "FFN column 100 of layer 0", "on no device");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\nlayers = 0-2\n");
    iflow_plan_load(&p, plan_path);
    rc = iflow_plan_check(&p, 5, 8, 4, 172);
    CHECK_ERR(rc, IFLOW_EINVAL, "layer 3", "on no device");
    /* GQA: heads 1-4 split the groups {0,1} and {4,5} and span several */
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\nheads = 0,1\n");
    CHECK(iflow_plan_load(&p, plan_path) == IFLOW_EFORMAT, "'0,1' is not a range");
    write_text("[plan]\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\n[device cpu:0]\nheads = 0\n"
               "[device cpu:1]\nheads = 1-4\n[device cpu:2]\nheads = 5-7\n");
    iflow_plan_load(&p, plan_path);
    rc = iflow_plan_check(&p, 5, 8, 4, 172);
    CHECK_ERR(rc, IFLOW_EINVAL, "cpu:1's heads 1-4", "split a group of 2");
}

/* A quantized model's columns split only on block boundaries: q8_b32 with 172 FFN columns over
 * 2 devices (86 each) is refused, by tensor name, before anything is copied. */
static void test_quantized_split(void)
{
    iflow_model *m;
    if (iflow_model_open(&m, s_q8, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    iflow_plan p;
    iflow_device *devs[IFLOW_PLAN_MAX_DEVICES] = {0};
    make_plan(&p, iflow_model_hparams(m), 1, 2);
    CHECK(iflow_plan_open_devices(&p, devs) == 0, "open devices: %s", iflow_errmsg());
    int rc = iflow_model_place_plan(m, &p, devs, 16);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "blk.0.ffn_down", "block boundaries");
    /* heads on block boundaries and the FFN whole per layer group: fine (wo's 64 columns split
     * 32 + 32 = whole q8_b32 blocks) */
    p.devices[0].ffn1 = 172, p.devices[1].ffn0 = 172, p.devices[1].ffn1 = 172;
    rc = iflow_plan_check(&p, 5, 8, 4, 172);
    CHECK(rc == IFLOW_EINVAL, "an empty FFN range is refused by the check");
    iflow_model_close(m);
    iflow_plan_close_devices(&p, devs);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s_f32, sizeof s_f32, "%s/s.ifs", dir);
    snprintf(xs, sizeof xs, "%s/xs.ifs", dir);
    snprintf(s_q8, sizeof s_q8, "%s/s.q8.ifs", dir);
    snprintf(plan_path, sizeof plan_path, "%s/plan.ini", dir);
    iflow_quant_policy qp;
    int rc = -1;
    if (test_convert("models/stories260K/hf", s_f32, -1) == 0 && test_convert("models/xs-ckpt/hf", xs, -1) == 0 &&
        iflow_quant_policy_init(&qp, IFLOW_DT_Q8_B32) == 0) {
        rc = iflow_quantize_shard(s_f32, s_q8, &qp, 0, NULL);
        iflow_quant_policy_free(&qp);
    }
    if (rc) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_plan") | 1;
    }
    RUN(test_file_errors);
    RUN(test_stories260K);
    RUN(test_xs_ckpt);
    RUN(test_quantized_split);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_plan");
}
