/* test_quant.c -- quantizing a model: the quantized dtypes (names, aliases, sizes with the
 * padding rule), the policy (defaults, --keep lists, the refusals, with exact messages), and
 * whole shards quantized to every type and read back: every tensor's shape, the meta's
 * quantization object, the tokenizer unchanged, and every weight within its type's bound.
 *
 * Bound (kernels/cpu/quant_ref.c: levels from the true block min/max, then min and delta stored
 * as f16): for a block of real weights with range r = max - min and L levels,
 *     |w - w'| <= r / (L-1) / 2  +  (|min| + r) * 2^-10  +  1e-7
 * (half a step, plus the f16 rounding of min and of delta times up to L-1 levels). That holds for
 * every element with --method minmax; the default search only keeps a block's squared error at
 * most the min/max rule's, so there the root mean square of each block's error is held to it. */
#include "check.h"
#include "testlib.h"
#include "libcore/formats/convert.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/formats/quant.h"
#include "libcore/formats/shard.h"
#include "kernels/cpu/quant.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

static char dir[] = "/tmp/iflow-test-quant-XXXXXX";
static char s_f32[300], xs_f32[300];

static const char *path_of(const char *name)
{
    static char buf[4][320];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

/* ---- the types ---------------------------------------------------------------------------- */

static void test_names(void)
{
    static const char *const names[] = {"q8_b32", "q8_b64", "q6", "q5", "q4_b32", "q4_b64", "q3h", "q3_b32", "q2"};
    for (int dt = IFLOW_DT_QFIRST; dt < IFLOW_DT_QEND_; dt++) {
        const char *n = names[dt - IFLOW_DT_QFIRST];
        CHECK(iflow_dtype_name(dt) && strcmp(iflow_dtype_name(dt), n) == 0, "name of %d: %s", dt, iflow_dtype_name(dt));
        CHECK(iflow_dtype_from_name(n) == dt, "from_name(%s)", n);
        CHECK(iflow_dtype_is_quant(dt) && !iflow_dtype_is_float(dt), "%s is quantized", n);
        CHECK(iflow_dtype_nbytes(dt, 64) == 0, "%s has no element size", n);
        CHECK(ifk_qtype(dt) != NULL, "the kernels know %s", n);
    }
    static const struct { const char *alias; int dt; } aliases[] = {
        {"q8", IFLOW_DT_Q8_B32},      {"Q8_B64", IFLOW_DT_Q8_B64},   {"q6_b64", IFLOW_DT_Q6_B64}, {"Q6", IFLOW_DT_Q6_B64},
        {"q5_b64", IFLOW_DT_Q5_B64},  {"q3h_b64", IFLOW_DT_Q3H_B64}, {"Q3H", IFLOW_DT_Q3H_B64},   {"q2_b32", IFLOW_DT_Q2_B32},
        {"Q4_B64", IFLOW_DT_Q4_B64},  {"f16", IFLOW_DT_F16},         {"bfloat16", IFLOW_DT_BF16},
    };
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        CHECK(iflow_dtype_from_name(aliases[i].alias) == aliases[i].dt, "alias %s", aliases[i].alias);
    CHECK(iflow_dtype_from_name("q4") == -1 && strcmp(iflow_dtype_ambiguity("q4"), "q4_b32 or q4_b64") == 0, "q4 is ambiguous");
    CHECK(iflow_dtype_from_name("Q3") == -1 && strcmp(iflow_dtype_ambiguity("Q3"), "q3h or q3_b32") == 0, "q3 is ambiguous");
    CHECK(iflow_dtype_ambiguity("q4_b32") == NULL && iflow_dtype_ambiguity("q7") == NULL, "no ambiguity elsewhere");
    CHECK(iflow_dtype_from_name("q7") == -1 && iflow_dtype_from_name("q8_b16") == -1 && iflow_dtype_from_name("") == -1,
          "unknown names");
    CHECK(iflow_dtype_name(5) == NULL && iflow_dtype_name(15) == NULL && iflow_dtype_name(25) == NULL, "gaps have no name");
    CHECK(!iflow_dtype_is_quant(IFLOW_DT_F32) && !iflow_dtype_is_quant(25) && !iflow_dtype_is_quant(15), "is_quant range");
}

/* The padding rule: rows x ceil(K/B) x block bytes, for stories260K's 172-wide FFN. */
static void test_tensor_nbytes(void)
{
    for (int dt = IFLOW_DT_QFIRST; dt < IFLOW_DT_QEND_; dt++) {
        iflow_qtype_info q;
        CHECK(iflow_qtype_describe(dt, &q) == 0, "describe %d", dt);
        size_t blocks = (172 + (size_t)q.block - 1) / (size_t)q.block;
        CHECK(iflow_tensor_nbytes(dt, 2, (int64_t[]){64, 172}) == 64 * blocks * (size_t)q.block_bytes,
              "%s [64][172]: %zu bytes", q.name, iflow_tensor_nbytes(dt, 2, (int64_t[]){64, 172}));
        CHECK(iflow_tensor_nbytes(dt, 2, (int64_t[]){172, 64}) == 172 * (64 / (size_t)q.block) * (size_t)q.block_bytes,
              "%s [172][64]", q.name);
        CHECK(iflow_tensor_nbytes(dt, 3, (int64_t[]){2, 3, 64}) == 6 * ifk_qrow_bytes(dt, 64), "%s rank 3", q.name);
        CHECK(iflow_tensor_nbytes(dt, 1, (int64_t[]){1}) == (size_t)q.block_bytes, "%s one weight: one block", q.name);
        CHECK(iflow_tensor_nbytes(dt, 2, (int64_t[]){INT64_MAX / 4, 64}) == SIZE_MAX, "%s overflow", q.name);
        CHECK(iflow_tensor_nbytes(dt, 2, (int64_t[]){4, (int64_t)1 << 40}) == SIZE_MAX, "%s row too long", q.name);
        CHECK(iflow_tensor_nbytes(dt, 0, NULL) == 0, "%s no dimensions", q.name);
    }
    CHECK(iflow_tensor_nbytes(IFLOW_DT_Q4_B64, 2, (int64_t[]){64, 172}) == 6912, "the man page's example");
}

static void test_describe(void)
{
    static const double bpw[] = {9, 8.5, 6.5, 5.5, 5, 4.5, 4, 4, 3}, paper[] = {9, 8.5, 6.5, 5.5, 5, 4.5, 4, 4, 0},
                        bits[] = {8, 8, 6, 5, 4, 4, 3.5, 3, 2};
    for (int dt = IFLOW_DT_QFIRST; dt < IFLOW_DT_QEND_; dt++) {
        iflow_qtype_info q;
        int i = dt - IFLOW_DT_QFIRST;
        CHECK(iflow_qtype_describe(dt, &q) == 0 && q.dtype == dt && strcmp(q.name, iflow_dtype_name(dt)) == 0, "describe %d", dt);
        CHECK(q.bits_per_weight == bpw[i] && q.paper_bits == paper[i] && q.bits == bits[i], "%s: %g bits, %g b/w, paper %g",
              q.name, q.bits, q.bits_per_weight, q.paper_bits);
        CHECK(q.levels == (dt == IFLOW_DT_Q3H_B64 ? 11 : 1 << (int)q.bits), "%s levels %d", q.name, q.levels);
    }
    iflow_qtype_info q;
    CHECK(iflow_qtype_describe(IFLOW_DT_F16, &q) == 0 && q.bits == 16 && q.block == 1 && q.bits_per_weight == 16 &&
              strcmp(q.name, "f16") == 0,
          "f16 is a target: 16 bits a weight");
    CHECK(iflow_qtype_describe(IFLOW_DT_F32, &q) == IFLOW_EINVAL, "f32 is not a target");
}

static void test_quality_table(void)
{
    const char *t = "# type\tquality\ntype\tquality\nq4_b64\tKLD 0.01 (SmolLM2-135M)\r\nq4_b32\t\nq8_b32\tnear lossless";
    char out[64];
    CHECK(iflow_quant_quality(t, "q4_b64", out, sizeof out) == 1 && strcmp(out, "KLD 0.01 (SmolLM2-135M)") == 0, "q4_b64: '%s'", out);
    CHECK(iflow_quant_quality(t, "q8_b32", out, sizeof out) == 1 && strcmp(out, "near lossless") == 0, "last line without newline");
    CHECK(iflow_quant_quality(t, "q4_b32", out, sizeof out) == 1 && strcmp(out, "") == 0, "empty text");
    CHECK(iflow_quant_quality(t, "q4", out, sizeof out) == 0, "a prefix is not a match");
    CHECK(iflow_quant_quality(t, "q2", out, sizeof out) == 0, "no line");
    CHECK(iflow_quant_quality(t, "q4_b64", out, 4) == 1 && strcmp(out, "KLD") == 0, "cut to the buffer");
    CHECK(iflow_quant_quality("", "q2", out, sizeof out) == 0, "empty table");
}

/* ---- the policy --------------------------------------------------------------------------- */

static int choose(const iflow_quant_policy *p, const char *name, int n_dims, int src, int tied)
{
    return iflow_quant_choose(p, name, n_dims, src, tied);
}

static void test_defaults(void)
{
    for (int dt = IFLOW_DT_QFIRST; dt < IFLOW_DT_QEND_; dt++) {
        iflow_quant_policy p;
        CHECK(iflow_quant_policy_init(&p, dt) == 0, "init %s", iflow_dtype_name(dt));
        int low = dt >= IFLOW_DT_Q5_B64, edge = low ? IFLOW_DT_Q6_B64 : dt;
        CHECK(p.n_rules == (low ? 2u : 0u), "%s: %zu default rules", iflow_dtype_name(dt), p.n_rules);
        for (int tied = 0; tied < 2; tied++) {
            CHECK(choose(&p, "tok_embd", 2, IFLOW_DT_F32, tied) == edge, "%s tok_embd", iflow_dtype_name(dt));
            CHECK(choose(&p, "output", 2, IFLOW_DT_F16, tied) == edge, "%s output", iflow_dtype_name(dt));
            CHECK(choose(&p, "blk.0.wq", 2, IFLOW_DT_BF16, tied) == dt, "%s blk.0.wq", iflow_dtype_name(dt));
            CHECK(choose(&p, "blk.0.ffn_down", 2, IFLOW_DT_F32, tied) == dt, "%s ffn_down", iflow_dtype_name(dt));
            CHECK(choose(&p, "blk.0.attn_norm", 1, IFLOW_DT_F32, tied) == IFLOW_DT_F32, "%s norm", iflow_dtype_name(dt));
            CHECK(choose(&p, "blk.0.bq", 1, IFLOW_DT_F16, tied) == IFLOW_DT_F32, "%s f16 bias -> f32", iflow_dtype_name(dt));
            CHECK(choose(&p, "output_norm", 1, IFLOW_DT_F32, tied) == IFLOW_DT_F32, "%s output_norm", iflow_dtype_name(dt));
        }
        iflow_quant_policy_free(&p);
    }
    iflow_quant_policy p;
    CHECK(iflow_quant_policy_init(&p, IFLOW_DT_BF16) == 0 && p.n_rules == 0, "bf16: a target without exceptions");
    CHECK(iflow_quant_choose(&p, "output", 2, IFLOW_DT_F32, 0) == IFLOW_DT_BF16 &&
              iflow_quant_choose(&p, "tok_embd", 2, IFLOW_DT_F32, 0) == IFLOW_DT_BF16 &&
              iflow_quant_choose(&p, "blk.0.wq", 2, IFLOW_DT_Q8_B32, 0) == IFLOW_DT_BF16 &&
              iflow_quant_choose(&p, "output_norm", 1, IFLOW_DT_F32, 0) == IFLOW_DT_F32,
          "bf16: every matrix, a quantized one dequantized; vectors f32");
    iflow_quant_policy_free(&p);
    CHECK(iflow_quant_policy_init(&p, IFLOW_DT_F32) == IFLOW_EINVAL && p.n_rules == 0, "f32 is refused as a target");
    CHECK(strcmp(iflow_errmsg(), "f32 is not a quantized type, f16 or bf16") == 0, "message: %s", iflow_errmsg());
}

static void test_keep_lists(void)
{
    iflow_quant_policy p;
    iflow_quant_policy_init(&p, IFLOW_DT_Q4_B64);
    CHECK(iflow_quant_policy_add_keep(&p, "embed,output=q8") == 0, "issue example: %s", iflow_errmsg());
    CHECK(p.n_rules == 4 && strcmp(p.rules[2].pattern, "embed") == 0 && p.rules[2].dtype == IFLOW_QUANT_KEEP_SOURCE &&
              !p.rules[2].is_default && strcmp(p.rules[3].pattern, "output") == 0 && p.rules[3].dtype == IFLOW_DT_Q8_B32,
          "issue example: rules");
    CHECK(iflow_quant_policy_add_keep(&p, " blk.*.ffn_down = Q5 ,blk.0.*") == 0, "blanks: %s", iflow_errmsg());
    CHECK(p.n_rules == 6 && strcmp(p.rules[4].pattern, "blk.*.ffn_down") == 0 && p.rules[4].dtype == IFLOW_DT_Q5_B64 &&
              strcmp(p.rules[5].pattern, "blk.0.*") == 0,
          "blanks are trimmed");
    static const struct { const char *list, *msg; } bad[] = {
        {"", "bad --keep list '': empty entry"},
        {"embed,", "bad --keep list 'embed,': empty entry"},
        {",embed", "bad --keep list ',embed': empty entry"},
        {"a,,b", "bad --keep list 'a,,b': empty entry"},
        {"=q8", "bad --keep entry '=q8': no pattern before '='"},
        {"a, =q8", "bad --keep entry ' =q8': no pattern before '='"},
        {"embed=", "bad --keep entry 'embed=': no type after '='"},
        {"embed=q7", "unknown type 'q7' in --keep entry 'embed=q7'"},
        {"x,embed=q4,y", "ambiguous type 'q4' in --keep entry 'embed=q4': say q4_b32 or q4_b64"},
        {"embed=i32", "type 'i32' in --keep entry 'embed=i32' cannot hold weights (a quantized type, f32, f16 or bf16)"},
        {"embed=u8", "type 'u8' in --keep entry 'embed=u8' cannot hold weights (a quantized type, f32, f16 or bf16)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(iflow_quant_policy_add_keep(&p, bad[i].list) == IFLOW_EINVAL, "'%s' is refused", bad[i].list);
        CHECK(strcmp(iflow_errmsg(), bad[i].msg) == 0, "'%s': message '%s'", bad[i].list, iflow_errmsg());
        CHECK(p.n_rules == 6, "'%s' leaves the policy unchanged (%zu rules)", bad[i].list, p.n_rules);
    }
    CHECK(iflow_quant_policy_add_keep(&p, "tok_embd=f16,output=bf16,x=f32") == 0, "float types are allowed");
    iflow_quant_policy_free(&p);
    CHECK(p.n_rules == 0 && p.rules == NULL, "free empties the policy");
}

static void test_matching(void)
{
    iflow_quant_rule embed = {"embed", IFLOW_DT_Q8_B32, 0}, output = {"output", IFLOW_DT_Q8_B32, 0},
                     glob = {"blk.*.ffn_*", IFLOW_DT_Q8_B32, 0}, exact = {"blk.1.wq", IFLOW_DT_Q8_B32, 0},
                     one = {"blk.?.wq", IFLOW_DT_Q8_B32, 0}, set = {"blk.[02].wk", IFLOW_DT_Q8_B32, 0};
    CHECK(iflow_quant_rule_matches(&embed, "tok_embd", 0) && iflow_quant_rule_matches(&embed, "tok_embd", 1), "embed");
    CHECK(!iflow_quant_rule_matches(&embed, "output", 0) && !iflow_quant_rule_matches(&embed, "embed", 0), "embed only");
    CHECK(iflow_quant_rule_matches(&output, "output", 0) && !iflow_quant_rule_matches(&output, "tok_embd", 0), "output untied");
    CHECK(iflow_quant_rule_matches(&output, "tok_embd", 1), "output of a tied model is tok_embd");
    CHECK(!iflow_quant_rule_matches(&output, "output_norm", 1), "output is not output_norm");
    CHECK(iflow_quant_rule_matches(&glob, "blk.12.ffn_down", 0) && iflow_quant_rule_matches(&glob, "blk.0.ffn_up_b", 0) &&
              !iflow_quant_rule_matches(&glob, "blk.0.wq", 0),
          "glob");
    CHECK(iflow_quant_rule_matches(&exact, "blk.1.wq", 0) && !iflow_quant_rule_matches(&exact, "blk.11.wq", 0), "exact");
    CHECK(iflow_quant_rule_matches(&one, "blk.3.wq", 0) && !iflow_quant_rule_matches(&one, "blk.13.wq", 0), "?");
    CHECK(iflow_quant_rule_matches(&set, "blk.2.wk", 0) && !iflow_quant_rule_matches(&set, "blk.1.wk", 0), "[]");
}

static void test_choose(void)
{
    iflow_quant_policy p;
    iflow_quant_policy_init(&p, IFLOW_DT_Q3H_B64);
    iflow_quant_policy_add_keep(&p, "embed,output=q8,blk.*.ffn_down=q4_b32,blk.1.*,blk.2.*=f16");
    /* untied: each alias its own tensor */
    CHECK(choose(&p, "tok_embd", 2, IFLOW_DT_F32, 0) == IFLOW_DT_F32, "embed keeps its source");
    CHECK(choose(&p, "tok_embd", 2, IFLOW_DT_BF16, 0) == IFLOW_DT_BF16, "embed keeps its source (bf16)");
    CHECK(choose(&p, "output", 2, IFLOW_DT_F32, 0) == IFLOW_DT_Q8_B32, "output=q8");
    /* tied: output names tok_embd too, and the later entry wins */
    CHECK(choose(&p, "tok_embd", 2, IFLOW_DT_F32, 1) == IFLOW_DT_Q8_B32, "tied: the later entry wins");
    CHECK(choose(&p, "blk.0.ffn_down", 2, IFLOW_DT_F32, 0) == IFLOW_DT_Q4_B32, "ffn_down override");
    CHECK(choose(&p, "blk.0.ffn_up", 2, IFLOW_DT_F32, 0) == IFLOW_DT_Q3H_B64, "target elsewhere");
    CHECK(choose(&p, "blk.1.ffn_down", 2, IFLOW_DT_F16, 0) == IFLOW_DT_F16, "blk.1.* (later) keeps the source");
    CHECK(choose(&p, "blk.2.wq", 2, IFLOW_DT_F32, 0) == IFLOW_DT_F16, "blk.2.*=f16");
    CHECK(choose(&p, "blk.2.attn_norm", 1, IFLOW_DT_F32, 0) == IFLOW_DT_F32, "typed entries skip vectors");
    CHECK(choose(&p, "blk.1.attn_norm", 1, IFLOW_DT_F16, 0) == IFLOW_DT_F16, "a bare entry keeps a vector too");
    /* quantized sources */
    CHECK(choose(&p, "blk.0.wq", 2, IFLOW_DT_Q3H_B64, 0) == IFLOW_DT_Q3H_B64, "same type: copied");
    CHECK(choose(&p, "blk.0.wq", 2, IFLOW_DT_Q4_B64, 0) == IFLOW_EUNSUPPORTED, "requantizing is refused");
    CHECK(strcmp(iflow_errmsg(), "cannot quantize tensor 'blk.0.wq': it is already q4_b64 (use --requantize)") == 0,
          "message: %s", iflow_errmsg());
    CHECK(choose(&p, "blk.1.wq", 2, IFLOW_DT_Q4_B64, 0) == IFLOW_DT_Q4_B64, "a bare entry keeps a quantized tensor");
    CHECK(choose(&p, "blk.2.wq", 2, IFLOW_DT_Q4_B64, 0) == IFLOW_DT_F16, "dequantizing to a float type is allowed");
    CHECK(choose(&p, "blk.0.attn_norm", 1, IFLOW_DT_Q8_B32, 0) == IFLOW_DT_F32, "a quantized vector becomes f32");
    p.requantize = 1;
    CHECK(choose(&p, "blk.0.wq", 2, IFLOW_DT_Q4_B64, 0) == IFLOW_DT_Q3H_B64, "--requantize");
    /* types that hold no weights */
    CHECK(choose(&p, "blk.0.wq", 2, IFLOW_DT_I32, 0) == IFLOW_EUNSUPPORTED, "i32 matrix");
    CHECK(strcmp(iflow_errmsg(), "cannot quantize tensor 'blk.0.wq': type i32 is not a weight type (keep it with --keep 'blk.0.wq')") == 0,
          "message: %s", iflow_errmsg());
    CHECK(choose(&p, "ids", 1, IFLOW_DT_U8, 0) == IFLOW_EUNSUPPORTED, "u8 vector");
    CHECK(choose(&p, "blk.1.ids", 2, IFLOW_DT_I32, 0) == IFLOW_DT_I32, "a bare entry keeps i32");
    CHECK(choose(&p, "a\nb", 2, IFLOW_DT_I32, 0) == IFLOW_EUNSUPPORTED && strchr(iflow_errmsg(), '\n') == NULL,
          "a name from a file is quoted");
    iflow_quant_policy_free(&p);
}

static void test_check_rules(void)
{
    const char *names[] = {"tok_embd", "blk.0.wq", "blk.0.attn_norm", "output_norm"};
    iflow_quant_policy p;
    iflow_quant_policy_init(&p, IFLOW_DT_Q4_B64);
    CHECK(iflow_quant_check_rules(&p, names, 4, 1, "m.ifs") == 0, "defaults need not match (no 'output' tensor)");
    iflow_quant_policy_add_keep(&p, "embed,output=q8,blk.*.wq,*norm");
    CHECK(iflow_quant_check_rules(&p, names, 4, 1, "m.ifs") == 0, "all match (tied): %s", iflow_errmsg());
    CHECK(iflow_quant_check_rules(&p, names, 4, 0, "m.ifs") == IFLOW_EINVAL, "untied: output matches nothing");
    CHECK(strcmp(iflow_errmsg(), "--keep pattern 'output' matches no tensor in 'm.ifs'") == 0, "message: %s", iflow_errmsg());
    iflow_quant_policy_add_keep(&p, "blk.1.*");
    CHECK(iflow_quant_check_rules(&p, names, 4, 1, "m.ifs") == IFLOW_EINVAL &&
              strcmp(iflow_errmsg(), "--keep pattern 'blk.1.*' matches no tensor in 'm.ifs'") == 0,
          "message: %s", iflow_errmsg());
    iflow_quant_policy_free(&p);
}

/* ---- whole shards ------------------------------------------------------------------------- */

/* Largest |w - w'| of one row over its bound (<= 1 passes); see the opening comment. */
/* The worst ratio, over the blocks of one row, of the error to the bound: the largest |w - w'|
 * (rms = 0: --method minmax, whose every element is within the bound) or the root mean square
 * of w - w' (rms = 1: the search, whose block's squared error is at most the min/max rule's,
 * so its root mean square is within the same bound). */
static double row_error_ratio(const float *w, const float *back, int K, int B, int L, int rms)
{
    double worst = 0;
    for (int b0 = 0; b0 < K; b0 += B) {
        int n = K - b0 < B ? K - b0 : B;
        float lo = w[b0], hi = w[b0];
        for (int i = 1; i < n; i++)
            lo = fminf(lo, w[b0 + i]), hi = fmaxf(hi, w[b0 + i]);
        double r = (double)hi - lo, bound = r / (L - 1) / 2 + (fabs(lo) + r) / 1024 + 1e-7, sq = 0;
        for (int i = 0; i < n; i++) {
            double e = fabs((double)w[b0 + i] - back[b0 + i]);
            worst = rms ? worst : fmax(worst, e / bound);
            sq += e * e;
        }
        worst = rms ? fmax(worst, sqrt(sq / n) / bound) : worst;
    }
    return worst;
}

/* A tensor's rows as F32 (dequantized or converted); malloc'd. */
static float *as_f32(const iflow_shard_rec *t, size_t *rows, int *K)
{
    *K = (int)t->shape[t->n_dims - 1];
    *rows = 1;
    for (int d = 0; d < t->n_dims - 1; d++)
        *rows *= (size_t)t->shape[d];
    float *f = malloc(*rows * (size_t)*K * sizeof *f);
    int64_t k = *K;
    size_t rb = iflow_tensor_nbytes(t->dtype, 1, &k);
    for (size_t r = 0; r < *rows; r++) {
        const char *src = (const char *)t->data + r * rb;
        if (iflow_dtype_is_quant(t->dtype))
            ifk_dequantize_row(f + r * (size_t)*K, t->dtype, src, *K);
        else
            iflow_dtype_convert(f + r * (size_t)*K, IFLOW_DT_F32, src, t->dtype, (size_t)*K);
    }
    return f;
}

/* Compare quantized shard q with its source s: records, meta, and every tensor's values. */
static void compare_shards(const char *src_path, const char *q_path, const char *how)
{
    iflow_shard *s = NULL, *q = NULL;
    CHECK(iflow_shard_open(&s, src_path, 0) == 0 && iflow_shard_open(&q, q_path, 0) == 0, "%s: open: %s", how, iflow_errmsg());
    if (!s || !q)
        goto out;
    CHECK(iflow_shard_n_records(s) == iflow_shard_n_records(q), "%s: record count", how);
    json_error_t je;
    json_t *meta = json_loads(iflow_shard_meta(q), 0, &je), *quant = json_object_get(meta, "quantization");
    CHECK(json_is_object(quant) && json_is_array(json_object_get(quant, "overrides")), "%s: quantization object", how);
    CHECK(json_is_object(json_object_get(meta, "hparams")), "%s: the meta is otherwise kept", how);
    int target = iflow_dtype_from_name(json_string_value(json_object_get(quant, "type")));
    const char *method = json_string_value(json_object_get(quant, "method"));
    CHECK(method && (strcmp(method, "search") == 0 || strcmp(method, "minmax") == 0), "%s: method", how);
    int rms = !method || strcmp(method, "minmax") != 0;
    json_decref(meta);
    for (size_t i = 1; i < iflow_shard_n_records(s); i++) {
        const iflow_shard_rec *a = iflow_shard_rec_at(s, i), *b = iflow_shard_rec_at(q, i);
        CHECK(strcmp(a->name, b->name) == 0 && a->kind == b->kind && a->n_dims == b->n_dims &&
                  memcmp(a->shape, b->shape, sizeof a->shape) == 0,
              "%s: record %zu '%s' header", how, i, a->name);
        if (a->kind == IFLOW_REC_BLOB || a->n_dims == 1) {
            CHECK(a->dtype == b->dtype && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0,
                  "%s: '%s' copied unchanged", how, a->name);
            continue;
        }
        int want = strcmp(a->name, "tok_embd") == 0 && target >= IFLOW_DT_Q5_B64 ? IFLOW_DT_Q6_B64 : target;
        CHECK(b->dtype == want, "%s: '%s' is %s", how, a->name, iflow_dtype_name(b->dtype));
        if (!iflow_dtype_is_quant(b->dtype))
            continue;
        const ifk_qtype_info *qi = ifk_qtype(b->dtype);
        size_t rows, rows_b;
        int K, K_b;
        float *w = as_f32(a, &rows, &K), *back = as_f32(b, &rows_b, &K_b);
        double worst = 0;
        for (size_t r = 0; r < rows; r++)
            worst = fmax(worst, row_error_ratio(w + r * (size_t)K, back + r * (size_t)K, K, qi->block, qi->levels, rms));
        CHECK(worst <= 1.0 && worst > 0.05, "%s: '%s' error %.3f of its bound", how, a->name, worst);
        free(w);
        free(back);
    }
out:
    iflow_shard_close(s);
    iflow_shard_close(q);
}

static void test_every_type(void)
{
    const char *models[] = {s_f32, xs_f32}, *tags[] = {"stories260K", "xs-ckpt"};
    for (int m = 0; m < 2; m++)
        for (int dt = IFLOW_DT_QFIRST; dt < IFLOW_DT_QEND_; dt++)
        for (int method = IFLOW_QUANT_SEARCH; method <= IFLOW_QUANT_MINMAX; method++) {
            iflow_quant_policy p;
            iflow_quant_stats st;
            char how[64];
            snprintf(how, sizeof how, "%s %s %s", tags[m], iflow_dtype_name(dt), method ? "minmax" : "search");
            iflow_quant_policy_init(&p, dt);
            p.method = method;
            const char *out = path_of("q.ifs");
            CHECK(iflow_quantize_shard(models[m], out, &p, 0, &st) == 0, "%s: %s", how, iflow_errmsg());
            CHECK(st.n_tensors == 47 && st.n_by_type[IFLOW_DT_F32] == 11, "%s: %zu tensors", how, st.n_tensors);
            CHECK(st.n_by_type[dt] == (dt >= IFLOW_DT_Q5_B64 ? 35u : 36u), "%s: %zu matrices of the target", how, st.n_by_type[dt]);
            compare_shards(models[m], out, how);
            iflow_quant_policy_free(&p);
        }
}

/* The output does not depend on the number of threads; a zstd output holds the same shard. */
static void test_threads_and_zstd(void)
{
    iflow_quant_policy p;
    iflow_quant_policy_init(&p, IFLOW_DT_Q3H_B64);
    int n = omp_get_max_threads();
    omp_set_num_threads(1);
    int rc = iflow_quantize_shard(s_f32, path_of("t1.ifs"), &p, 0, NULL);
    omp_set_num_threads(n > 1 ? n : 4);
    rc |= iflow_quantize_shard(s_f32, path_of("tn.ifs"), &p, 0, NULL);
    rc |= iflow_quantize_shard(s_f32, path_of("tz.ifs.zst"), &p, IFLOW_QUANT_ZSTD, NULL);
    omp_set_num_threads(n);
    CHECK(rc == 0, "quantize: %s", iflow_errmsg());
    size_t n1, n2;
    char *a = test_read_file(path_of("t1.ifs"), &n1), *b = test_read_file(path_of("tn.ifs"), &n2);
    CHECK(a && b && n1 == n2 && memcmp(a, b, n1) == 0, "1 thread and many give the same bytes");
    free(a);
    free(b);
    iflow_shard *z = NULL, *t = NULL;
    CHECK(iflow_shard_open(&z, path_of("tz.ifs.zst"), 0) == 0 && iflow_shard_open(&t, path_of("t1.ifs"), 0) == 0, "open");
    for (size_t i = 0; z && t && i < iflow_shard_n_records(t); i++)
        CHECK(iflow_shard_rec_at(z, i)->xxh64 == iflow_shard_rec_at(t, i)->xxh64, "zstd record %zu", i);
    iflow_shard_close(z);
    iflow_shard_close(t);
    iflow_quant_policy_free(&p);
}

/* A quantized shard: refused as input to another type without requantize; with it, the values
 * are within the new type's bound of the dequantized input; the same type is a copy. */
static void test_requantize(void)
{
    iflow_quant_policy p4, p8;
    iflow_quant_policy_init(&p4, IFLOW_DT_Q4_B64);
    iflow_quant_policy_init(&p8, IFLOW_DT_Q8_B32);
    const char *q4 = path_of("q4.ifs"), *q8 = path_of("q8.ifs"), *again = path_of("again.ifs");
    CHECK(iflow_quantize_shard(s_f32, q4, &p4, 0, NULL) == 0, "q4_b64: %s", iflow_errmsg());
    CHECK(iflow_quantize_shard(q4, q8, &p8, 0, NULL) == IFLOW_EUNSUPPORTED, "refused without requantize");
    CHECK(strcmp(iflow_errmsg(), "cannot quantize tensor 'tok_embd': it is already q6 (use --requantize)") == 0,
          "message: %s", iflow_errmsg());
    CHECK(access(q8, F_OK) != 0, "no output left behind");
    p8.requantize = 1;
    CHECK(iflow_quantize_shard(q4, q8, &p8, 0, NULL) == 0, "requantize: %s", iflow_errmsg());
    iflow_shard *a = NULL, *b = NULL;
    CHECK(iflow_shard_open(&a, q4, 0) == 0 && iflow_shard_open(&b, q8, 0) == 0, "open");
    for (size_t i = 0; a && b && i < iflow_shard_n_records(a); i++) {
        const iflow_shard_rec *x = iflow_shard_rec_at(a, i), *y = iflow_shard_rec_at(b, i);
        if (x->kind != IFLOW_REC_TENSOR || x->n_dims == 1)
            continue;
        CHECK(y->dtype == IFLOW_DT_Q8_B32, "'%s' requantized to q8_b32", y->name);
        size_t rows;
        int K;
        float *w = as_f32(x, &rows, &K), *back = as_f32(y, &rows, &K);
        double worst = 0;
        for (size_t r = 0; r < rows; r++)
            worst = fmax(worst, row_error_ratio(w + r * (size_t)K, back + r * (size_t)K, K, 32, 256, 1));
        CHECK(worst <= 1.0, "'%s' requantized within the q8_b32 bound (%.3f)", y->name, worst);
        free(w);
        free(back);
    }
    json_error_t je;
    json_t *meta = b ? json_loads(iflow_shard_meta(b), 0, &je) : NULL, *q = json_object_get(meta, "quantization");
    CHECK(strcmp(json_string_value(json_object_get(q, "type")), "q8_b32") == 0 && json_is_true(json_object_get(q, "requantize")) &&
              strcmp(json_string_value(json_object_get(json_object_get(q, "source"), "type")), "q4_b64") == 0,
          "meta: type, requantize, source");
    json_decref(meta);
    iflow_shard_close(a);
    iflow_shard_close(b);
    /* the same type again: every tensor copied */
    CHECK(iflow_quantize_shard(q4, again, &p4, 0, NULL) == 0, "same type: %s", iflow_errmsg());
    CHECK(iflow_shard_open(&a, q4, 0) == 0 && iflow_shard_open(&b, again, 0) == 0, "open");
    for (size_t i = 1; a && b && i < iflow_shard_n_records(a); i++)
        CHECK(iflow_shard_rec_at(a, i)->xxh64 == iflow_shard_rec_at(b, i)->xxh64, "record %zu copied", i);
    iflow_shard_close(a);
    iflow_shard_close(b);
    iflow_quant_policy_free(&p4);
    iflow_quant_policy_free(&p8);
}

static void test_stream_errors(void)
{
    iflow_quant_policy p;
    iflow_quant_policy_init(&p, IFLOW_DT_Q8_B32);
    size_t n;
    char *data = test_read_file(s_f32, &n);
    const char *trunc = path_of("trunc.ifs"), *out = path_of("out.ifs");
    test_write_file(trunc, data, 300000);
    CHECK(iflow_quantize_shard(trunc, out, &p, 0, NULL) == IFLOW_ETRUNC, "truncated input");
    CHECK(strstr(iflow_errmsg(), "truncated shard: data of 'blk.") && strstr(iflow_errmsg(), "stream ends at byte 300000"),
          "message: %s", iflow_errmsg());
    CHECK(access(out, F_OK) != 0, "no output left behind");
    free(data);

    const char *i32 = "tests/fixtures/quant/i32.ifs";
    CHECK(iflow_quantize_shard(i32, out, &p, 0, NULL) == IFLOW_EUNSUPPORTED, "i32 tensor");
    CHECK(strcmp(iflow_errmsg(), "cannot quantize tensor 'tok_embd': type i32 is not a weight type (keep it with --keep 'tok_embd')") == 0,
          "message: %s", iflow_errmsg());
    CHECK(access(out, F_OK) != 0, "no output left behind");
    iflow_quant_policy_add_keep(&p, "tok_embd");
    CHECK(iflow_quantize_shard(i32, out, &p, 0, NULL) == 0, "i32 kept: %s", iflow_errmsg());

    /* a shard without a meta record first */
    iflow_shard_writer *w;
    iflow_shard_writer_open(&w, trunc, 0);
    iflow_shard_write_tensor(w, "x", IFLOW_DT_F32, 2, (int64_t[]){2, 2}, (float[]){1, 2, 3, 4}, 16);
    iflow_shard_writer_close(w);
    CHECK(iflow_quantize_shard(trunc, out, &p, 0, NULL) == IFLOW_EFORMAT, "no meta record");
    CHECK(strstr(iflow_errmsg(), "trunc.ifs' does not start with its 'meta' record"), "message: %s", iflow_errmsg());
    iflow_quant_policy_free(&p);

    iflow_quant_policy_init(&p, IFLOW_DT_Q8_B32);
    iflow_quant_policy_add_keep(&p, "embd=q8");
    CHECK(iflow_quantize_shard(s_f32, out, &p, 0, NULL) == IFLOW_EINVAL, "unmatched pattern");
    CHECK(strstr(iflow_errmsg(), "--keep pattern 'embd' matches no tensor in '"),
          "message: %s", iflow_errmsg());
    iflow_quant_policy_free(&p);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s_f32, sizeof s_f32, "%s/s.ifs", dir);
    snprintf(xs_f32, sizeof xs_f32, "%s/xs.ifs", dir);
    RUN(test_names);
    RUN(test_tensor_nbytes);
    RUN(test_describe);
    RUN(test_quality_table);
    RUN(test_defaults);
    RUN(test_keep_lists);
    RUN(test_matching);
    RUN(test_choose);
    RUN(test_check_rules);
    if (test_convert("models/stories260K/hf", s_f32, -1) || test_convert("models/xs-ckpt/hf", xs_f32, -1)) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_quant") | 1;
    }
    RUN(test_every_type);
    RUN(test_threads_and_zstd);
    RUN(test_requantize);
    RUN(test_stream_errors);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_quant");
}
