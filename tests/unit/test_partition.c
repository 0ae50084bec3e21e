/* test_partition.c -- libcore/engine/partition.h: device descriptions, machines, model shapes
 * (from a shard and from config.json), every strategy on 1, 2, 3, 4 and 8 devices for
 * stories260K, TinyLlama-1.1B and a Llama-2-70B shape (each plan passes iflow_plan_check and
 * survives a save/load), layer ranges following memory, GQA replication, what fits, and the
 * cost model against the formulas of docs/PARTITION.md computed by hand. */
#include "libcore/base/dtype.h"
#include "libcore/engine/footprint.h"
#include "libcore/engine/partition.h"
#include "libcore/engine/plan.h"
#include "testlib.h"

#include <math.h>
#include <sys/stat.h>

#define TINY "models/synthetic/tinyllama-1.1b"
#define L70B "tests/fixtures/synthetic/llama-2-70b"

static iflow_devdb *db;
static const iflow_machine_opts host = {.host_memory = 64ull << 30, .host_cores = 16};
static const char *specs[] = {"specs"};

static int machine(iflow_machine *m, const char *spec)
{
    int rc = iflow_machine_parse(m, spec, db, &host);
    CHECK(rc == 0, "machine '%s': %s", spec, iflow_errmsg());
    return rc;
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b) + 1e-15; }

static void test_devices(void)
{
    const iflow_devdesc *h = iflow_devdb_find(db, "h100-80g");
    CHECK(h && h->memory == 81559ull << 20 && h->mem_bw == 3350e9 && h->flops == 989e12 && h->link_bw == 450e9 &&
              close_to(h->link_lat, 2e-6) && !h->is_cpu,
          "H100-80G's figures");
    const char *need[] = {"H100-80G", "H100-PCIe-80G", "H200-141G", "A100-80G", "A100-40G", "L40S", "RTX4090-24G",
                          "V100-32G", "cpu"};
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        CHECK(iflow_devdb_find(db, need[i]) != NULL, "devices.ini describes %s", need[i]);
    CHECK(iflow_devdb_find(db, "cpu")->is_cpu, "cpu is a CPU");
    /* what decode measured: GPU descriptions take the cuda template's, CPU ones the cpu's */
    CHECK(close_to(h->overhead, 37e-6) && h->eff[IFLOW_DT_F16] == 0.87 && h->eff[IFLOW_DT_Q8_B64] == 0.53 &&
              h->eff[IFLOW_DT_Q4_B64] == 0.44 && h->eff[IFLOW_DT_Q6_B64] == 0.44 /* `*` */ && h->host_bw == 0,
          "H100-80G takes the cuda template's overhead %g and efficiencies", h->overhead);
    const iflow_devdesc *cpu = iflow_devdb_find(db, "cpu");
    CHECK(cpu->overhead == 0 && cpu->eff[IFLOW_DT_F16] == 1 && cpu->eff[IFLOW_DT_Q2_B32] == 1 && cpu->host_bw == 40e9,
          "cpu: no overhead, efficiency 1, the host's 40 GB/s");

    iflow_machine m;
    if (machine(&m, "4xH100-80G") == 0)
        CHECK(m.n == 4 && strcmp(m.dev[0].name, "cuda:0") == 0 && strcmp(m.dev[3].name, "cuda:3") == 0 &&
                  strcmp(m.dev[2].d.name, "H100-80G") == 0,
              "4xH100-80G: cuda:0..cuda:3");
    if (machine(&m, "cpu:4") == 0)
        CHECK(m.n == 4 && strcmp(m.dev[3].name, "cpu:3") == 0 && m.dev[0].d.memory == 16ull << 30 &&
                  m.dev[0].d.mem_bw == 20e9 && close_to(m.dev[0].d.flops, 4 * 117e9),
              "cpu:4 shares 64 GiB and 16 cores: %llu bytes, %g FLOP/s", (unsigned long long)m.dev[0].d.memory,
              m.dev[0].d.flops);
    iflow_machine_opts o = host;
    o.cpu_bw = 12.5e9;
    o.link_bw = 1e9;
    CHECK(iflow_machine_parse(&m, "2xA100-40G, cpu", db, &o) == 0 && m.n == 3 && strcmp(m.dev[2].name, "cpu:0") == 0 &&
              m.dev[2].d.mem_bw == 12.5e9 && m.dev[2].d.memory == 64ull << 30 && m.dev[0].d.link_bw == 1e9,
          "--cpu-bw, --link-bw: %s", iflow_errmsg());
    int rc = iflow_machine_parse(&m, "4xB200", db, &host);
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "'B200'", "unknown device description");
    rc = iflow_machine_parse(&m, "17xH100-80G", db, &host);
    CHECK_ERR(rc, IFLOW_EINVAL, "17xH100-80G", "1 to 16");
    rc = iflow_machine_parse(&m, "cuda:x", db, &host);
    CHECK_ERR(rc, IFLOW_EINVAL, "cuda:x", "bad device");
    rc = iflow_machine_parse(&m, "cuda:15", db, &host); /* no machine here has 16 GPUs */
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "cuda:15", "has no");
}

static void test_devices_file_errors(void)
{
    const char *bad[][2] = {
        {"[device X]\nkind = gpu\nmemory = 80 GiB\nbandwidth = 3 TB\n", "bad bandwidth = '3 TB'"},
        {"[device X]\nkind = gpu\nmemory = 80 GiB\n", "lacks 'bandwidth'"},
        {"[gpu X]\nkind = gpu\n", "unknown section"},
        {"[device X]\nkind = tpu\n", "bad kind"},
        {"[device X]\ncolour = red\n", "unknown key 'colour'"},
        {"[device X]\nefficiency = f16\n", "bad efficiency item 'f16'"},
        {"[device X]\nefficiency = f16 0.8, q4 0.4\n", "names 'q4', not a weight type"},
        {"[device X]\nefficiency = i32 0.8\n", "names 'i32', not a weight type"},
        {"[device X]\nefficiency = f16 0.8, f16 0.7\n", "gives 'f16' twice"},
        {"[device X]\nefficiency = * 0.8, * 0.7\n", "gives '*' twice"},
        {"[device X]\nefficiency = f16 0\n", "bad efficiency item"},
        {"[device X]\noverhead = 5 parsecs\n", "bad overhead"},
        {"[device X]\nkind = gpu\nmemory = 1 GiB\nbandwidth = 1 GB/s\nflops = 1 TFLOP/s\nlink = 1 GB/s\n"
         "latency = 1 us\nhost_bandwidth = 9 GB/s\n",
         "host_bandwidth of 'X', which is not a cpu"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/iflow-devices-%d.ini", (int)getpid());
        test_write_file(path, bad[i][0], strlen(bad[i][0]));
        iflow_devdb *d = NULL;
        int rc = iflow_devdb_load(&d, path);
        CHECK_ERR(rc, IFLOW_EFORMAT, path, bad[i][1]);
        CHECK(d == NULL, "nothing returned");
        unlink(path);
    }
}

/* A description's own overhead and efficiency (its `*` included) win over its template's; the
 * rest come from the template; without a template, 1 and 0. */
static void test_devices_measured(void)
{
    const char *text = "[device cuda]\nkind = gpu\nmemory = live\nbandwidth = 1 TB/s\nflops = 0 FLOP/s\n"
                       "link = 1 GB/s\nlatency = 1 us\noverhead = 20 us\nefficiency = f16 0.9, * 0.5\n"
                       "[device A]\nkind = gpu\nmemory = 1 GiB\nbandwidth = 1 TB/s\nflops = 1 TFLOP/s\n"
                       "link = 1 GB/s\nlatency = 1 us\nefficiency = q8_b64 0.6\n"
                       "[device B]\nkind = gpu\nmemory = 1 GiB\nbandwidth = 1 TB/s\nflops = 1 TFLOP/s\n"
                       "link = 1 GB/s\nlatency = 1 us\noverhead = 0 us\nefficiency = * 0.7\n"
                       "[device C]\nkind = cpu\nmemory = host\nbandwidth = 1 GB/s\nflops = 1 GFLOP/s\n"
                       "link = 1 GB/s\nlatency = 1 us\n";
    char path[64];
    snprintf(path, sizeof path, "/tmp/iflow-devices-m-%d.ini", (int)getpid());
    test_write_file(path, text, strlen(text));
    iflow_devdb *d = NULL;
    int rc = iflow_devdb_load(&d, path);
    unlink(path);
    CHECK(rc == 0, "load: %s", iflow_errmsg());
    if (rc)
        return;
    const iflow_devdesc *a = iflow_devdb_find(d, "A"), *b = iflow_devdb_find(d, "B"), *c = iflow_devdb_find(d, "C");
    CHECK(close_to(a->overhead, 20e-6) && a->eff[IFLOW_DT_Q8_B64] == 0.6 && a->eff[IFLOW_DT_F16] == 0.9 &&
              a->eff[IFLOW_DT_Q4_B64] == 0.5,
          "A: its q8_b64, the template's f16, overhead and `*`: %g %g %g %g", a->overhead, a->eff[IFLOW_DT_Q8_B64],
          a->eff[IFLOW_DT_F16], a->eff[IFLOW_DT_Q4_B64]);
    CHECK(b->overhead == 0 && b->eff[IFLOW_DT_F16] == 0.7 && b->eff[IFLOW_DT_Q2_B32] == 0.7, "B: its own `*` and 0 us");
    CHECK(c->overhead == 0 && c->eff[IFLOW_DT_F32] == 1 && c->host_bw == 0, "C: no cpu template, 1 and 0");
    iflow_devdb_free(d);
}

/* Every strategy on 1, 2, 3, 4, 8 devices of `desc`: plans pass iflow_plan_check and a save/load. */
static void all_plans(const iflow_model_shape *s, const char *desc)
{
    static const int counts[] = {1, 2, 3, 4, 8};
    const iflow_hparams *hp = &s->hp;
    for (size_t k = 0; k < 5; k++) {
        char spec[64];
        snprintf(spec, sizeof spec, strcmp(desc, "cpu") == 0 ? "cpu:%d" : "%dx%s", counts[k], desc);
        iflow_machine m;
        if (machine(&m, spec))
            continue;
        for (int st = 0; st <= IFLOW_STRAT_AUTO; st++) {
            iflow_plan p;
            iflow_partition_cost c;
            int rc = iflow_partition_make(&p, &c, s, &m, st, NULL);
            int na = rc == IFLOW_EUNSUPPORTED;
            CHECK(rc == 0 || rc == IFLOW_ENOMEM || na, "%s on %s, %s: %s", s->source, spec, iflow_strategy_name(st),
                  iflow_errmsg());
            if (na) {
                CHECK(st == IFLOW_STRAT_HYBRID || st == IFLOW_STRAT_GPU_CPU || counts[k] > hp->n_heads,
                      "%s refused on %s: %s", iflow_strategy_name(st), spec, iflow_errmsg());
                continue;
            }
            int crc = iflow_plan_check(&p, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim);
            CHECK(crc == 0, "%s on %s, %s: plan check: %s", s->source, spec, iflow_strategy_name(st), iflow_errmsg());
            CHECK(c.fits == (rc == 0), "fits agrees with the return");
            char path[64];
            snprintf(path, sizeof path, "/tmp/iflow-plan-%d.ini", (int)getpid());
            iflow_plan q;
            CHECK(iflow_plan_save(&p, path) == 0 && iflow_plan_load(&q, path) == 0, "save/load: %s", iflow_errmsg());
            CHECK(q.n_devices == p.n_devices && q.output_device == p.output_device &&
                      memcmp(q.devices, p.devices, sizeof q.devices[0] * (size_t)q.n_devices) == 0 &&
                      strcmp(q.strategy, p.strategy) == 0,
                  "%s on %s, %s: the plan read back is the plan written", s->source, spec, iflow_strategy_name(st));
            unlink(path);
            if (st == IFLOW_STRAT_TENSOR)
                CHECK(p.n_devices == counts[k] && c.n_stages == 1, "tensor: one stage over every device");
            if (st == IFLOW_STRAT_LAYER)
                CHECK(c.heads_split == 1 && c.n_stages == p.n_devices, "layer: whole layers");
        }
    }
}

static int stories(iflow_model_shape *s)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/iflow-part-%d.ifs", (int)getpid());
    if (test_convert("models/stories260K/hf", path, -1))
        return -1;
    int rc = iflow_model_shape_from_shard(s, path);
    CHECK(rc == 0, "shape from shard: %s", iflow_errmsg());
    unlink(path);
    return rc;
}

static int config(iflow_model_shape *s, const char *dir, int dtype)
{
    int rc = iflow_model_shape_from_config(s, dir, dtype, NULL, specs, 1);
    CHECK(rc == 0, "shape from %s: %s", dir, iflow_errmsg());
    return rc;
}

static void test_shapes(void)
{
    iflow_model_shape s;
    if (!test_data("models/stories260K/hf"))
        SKIP("no stories260K");
    if (stories(&s))
        return;
    CHECK(s.hp.n_layers == 5 && s.hp.n_heads == 8 && s.hp.n_kv_heads == 4 && s.hp.ffn_dim == 172 && s.hp.dim == 64,
          "stories260K's shape");
    CHECK(s.types[4 * IFLOW_PM_COUNT + IFLOW_PM_DOWN] == IFLOW_DT_F32, "types from the shard");
    all_plans(&s, "H100-80G");
    all_plans(&s, "cpu");
    iflow_model_shape_free(&s);

    if (!test_data(TINY))
        SKIP("no " TINY);
    if (config(&s, test_data(TINY), IFLOW_DT_F16))
        return;
    CHECK(s.hp.n_layers == 22 && s.hp.n_heads == 32 && s.hp.n_kv_heads == 4 && s.hp.ffn_dim == 5632, "TinyLlama's shape");
    CHECK(s.types[IFLOW_PM_WQ] == IFLOW_DT_F16 && s.output_type == IFLOW_DT_F16, "--dtype f16");
    all_plans(&s, "H100-80G");
    all_plans(&s, "RTX4090-24G");
    iflow_model_shape_free(&s);

    if (config(&s, L70B, IFLOW_DT_F16))
        return;
    CHECK(s.hp.n_layers == 80 && s.hp.n_heads == 64 && s.hp.n_kv_heads == 8 && s.hp.ffn_dim == 28672, "70B's shape");
    all_plans(&s, "H100-80G");
    iflow_model_shape_free(&s);

    int rc = iflow_model_shape_from_config(&s, "/nonexistent", IFLOW_DT_F16, NULL, specs, 1);
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "/nonexistent", "cannot open model directory");
    rc = iflow_model_shape_from_shard(&s, "specs/llama.ini");
    CHECK(rc < 0, "a file that is not a shard");
}

/* Layer ranges are sized to memory: an 80 GB device gets about twice a 40 GB one's layers. */
static void test_layers_follow_memory(void)
{
    iflow_model_shape s;
    iflow_machine m;
    if (!test_data(TINY))
        SKIP("no " TINY);
    if (config(&s, test_data(TINY), IFLOW_DT_F16) || machine(&m, "A100-40G,A100-80G,A100-40G"))
        return;
    iflow_plan p;
    iflow_partition_cost c;
    int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_LAYER, NULL);
    CHECK(rc == 0, "layer: %s", iflow_errmsg());
    int n0 = p.devices[0].layer1 - p.devices[0].layer0, n1 = p.devices[1].layer1 - p.devices[1].layer0,
        n2 = p.devices[2].layer1 - p.devices[2].layer0;
    CHECK(n0 + n1 + n2 == 22 && n1 >= 2 * n0 - 1 && n1 <= 2 * n0 + 1 && n2 <= n0, "layers %d, %d, %d", n0, n1, n2);
    CHECK(p.output_device == 2, "output on the last device");
    /* equal devices: equal shares, the last one (with the output matrix) no larger */
    if (machine(&m, "4xH100-80G") || iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_LAYER, NULL))
        return;
    int ok = p.devices[3].layer1 == 22 && p.devices[3].layer1 - p.devices[3].layer0 <= 5;
    for (int i = 0; i < 4; i++)
        ok &= p.devices[i].layer1 - p.devices[i].layer0 >= 5 && p.devices[i].layer1 - p.devices[i].layer0 <= 6;
    CHECK(ok, "22 layers on 4 equal devices: 5 or 6 each, the last 5: ends %d %d %d %d", p.devices[0].layer1,
          p.devices[1].layer1, p.devices[2].layer1, p.devices[3].layer1);
    /* gpu-cpu: as many layers as fit on a 24 GB GPU; the 70B model's rest on the CPU */
    iflow_model_shape big;
    if (config(&big, L70B, IFLOW_DT_F16) || machine(&m, "RTX4090-24G,cpu"))
        return;
    rc = iflow_partition_make(&p, &c, &big, &m, IFLOW_STRAT_GPU_CPU, NULL);
    CHECK(rc == IFLOW_ENOMEM && p.n_devices == 2 && strcmp(p.devices[1].name, "cpu:0") == 0 && p.output_device == 1,
          "gpu-cpu on a 64 GiB host: %d, %s", rc, iflow_errmsg());
    CHECK(c.mem[0].total <= c.mem[0].capacity, "the GPU's share fits");
    uint64_t layer = c.mem[0].weights / (uint64_t)p.devices[0].layer1;
    CHECK(c.mem[0].capacity - c.mem[0].total < layer + c.mem[0].kv / (uint64_t)p.devices[0].layer1,
          "no room for one more layer");
    iflow_model_shape_free(&big);
    iflow_model_shape_free(&s);
}

/* stories260K: 8 heads over 4 KV heads. 8 devices: one head each, each KV head on two devices;
 * 3 devices: whole groups 2+1+1. */
static void test_gqa(void)
{
    iflow_model_shape s;
    iflow_machine m;
    if (!test_data("models/stories260K/hf"))
        SKIP("no stories260K");
    if (stories(&s) || machine(&m, "8xH100-80G"))
        return;
    iflow_plan p;
    iflow_partition_cost c;
    int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL);
    CHECK(rc == 0, "tensor on 8: %s", iflow_errmsg());
    for (int i = 0; i < 8; i++)
        CHECK(p.devices[i].head0 == i && p.devices[i].head1 == i + 1, "device %d: head %d", i, i);
    /* each device reads its group's KV head: the whole cache is held twice */
    uint64_t kv_one = 5ull * 2 * 4096 * 1 * 8 * 4; /* layers x K,V x positions x 1 kv head x head_dim x f32 */
    for (int i = 0; i < 8; i++)
        CHECK(c.mem[i].kv == kv_one, "device %d holds one KV head per layer: %llu", i, (unsigned long long)c.mem[i].kv);
    int f = 0;
    for (int i = 0; i < 8; i++) {
        CHECK(p.devices[i].ffn0 == f && p.devices[i].ffn1 - p.devices[i].ffn0 >= 21 && p.devices[i].ffn1 - p.devices[i].ffn0 <= 22,
              "FFN columns split evenly");
        f = p.devices[i].ffn1;
    }
    if (machine(&m, "3xH100-80G") || iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL))
        return;
    CHECK(p.devices[0].head0 == 0 && p.devices[0].head1 == 4 && p.devices[1].head1 == 6 && p.devices[2].head1 == 8,
          "3 devices: whole KV groups 2+1+1 (heads %d-%d, %d-%d, %d-%d)", p.devices[0].head0, p.devices[0].head1,
          p.devices[1].head0, p.devices[1].head1, p.devices[2].head0, p.devices[2].head1);
    /* more devices than heads: refused with the reason */
    if (machine(&m, "H100-80G,8xA100-80G"))
        return;
    rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "8 query heads", "more devices than heads");
    iflow_model_shape_free(&s);
}

/* Nine heads (MHA) over 2 devices: unequal ranges 5 + 4. */
static void test_uneven(void)
{
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/iflow-nine-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (mkdir(dir, 0700))
        return;
    const char *cfg = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 576, \"intermediate_size\": 1536, "
                      "\"num_hidden_layers\": 3, \"num_attention_heads\": 9, \"num_key_value_heads\": 3, "
                      "\"vocab_size\": 1000, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5}";
    test_write_file(path, cfg, strlen(cfg));
    iflow_model_shape s;
    iflow_machine m;
    if (config(&s, dir, IFLOW_DT_F16) == 0 && machine(&m, "2xL40S") == 0) {
        iflow_plan p;
        iflow_partition_cost c;
        int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL);
        CHECK(rc == 0 && p.devices[0].head1 == 6 && p.devices[1].head0 == 6 && p.devices[1].head1 == 9,
              "9 heads in 3 groups over 2: 6 + 3 (%s)", iflow_errmsg());
        if (machine(&m, "4xL40S") == 0) {
            rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL);
            CHECK(rc == 0 && p.devices[0].head1 == 2 && p.devices[1].head1 == 3 && p.devices[2].head1 == 6 &&
                      p.devices[3].head1 == 9,
                  "over 4: group 0 split 2+1, groups 1, 2 whole (%s)", iflow_errmsg());
        }
        iflow_model_shape_free(&s);
    }
    /* a quantized type: FFN splits fall on whole blocks */
    if (config(&s, dir, IFLOW_DT_Q4_B64) == 0 && machine(&m, "3xL40S") == 0) {
        iflow_plan p;
        iflow_partition_cost c;
        int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL);
        CHECK(rc == 0 && p.devices[0].ffn1 % 64 == 0 && p.devices[1].ffn1 % 64 == 0, "q4_b64 columns on blocks: %d, %d",
              p.devices[0].ffn1, p.devices[1].ffn1);
        iflow_model_shape_free(&s);
    }
    unlink(path);
    rmdir(dir);
}

/* A 70B model in f16 fits on 8 H100s by tensor, not on one. */
static void test_fit(void)
{
    iflow_model_shape s;
    iflow_machine m;
    if (config(&s, L70B, IFLOW_DT_F16) || machine(&m, "8xH100-80G"))
        return;
    iflow_plan p;
    iflow_partition_cost c;
    int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, NULL);
    CHECK(rc == 0 && c.fits && c.mem_max < 20ull << 30, "70B tensor on 8xH100-80G: %s", iflow_errmsg());
    rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_AUTO, NULL);
    CHECK(rc == 0 && strcmp(p.strategy, "tensor") == 0, "auto for latency: tensor, got %s", p.strategy);
    iflow_partition_opts o = {.objective = IFLOW_OBJ_THROUGHPUT};
    rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_HYBRID, &o);
    CHECK(rc == 0 && c.n_stages * c.heads_split == 8, "hybrid factorization of 8: %dx%d", c.n_stages, c.heads_split);
    if (machine(&m, "1xH100-80G"))
        return;
    for (int st = IFLOW_STRAT_LAYER; st <= IFLOW_STRAT_TENSOR; st++) {
        rc = iflow_partition_make(&p, &c, &s, &m, st, NULL);
        CHECK_ERR(rc, IFLOW_ENOMEM, "cuda:0 (H100-80G) lacks", "bytes) for the");
        CHECK(!c.fits && c.short_device == 0 && c.short_bytes == c.mem[0].total - c.mem[0].capacity, "the missing bytes");
    }
    rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_AUTO, NULL);
    CHECK_ERR(rc, IFLOW_ENOMEM, "no strategy fits", "cuda:0");
    iflow_model_shape_free(&s);
}

/* CPU devices read one host's memory: a tensor split over cpu:2 costs each layer at least its
 * parts' bytes together over --host-bw; a layer split runs one device at a time. */
static void test_host_bandwidth(void)
{
    iflow_model_shape s;
    if (!test_data(TINY))
        SKIP("no " TINY);
    if (config(&s, test_data(TINY), IFLOW_DT_F16))
        return;
    iflow_machine m;
    iflow_machine_opts o = host;
    o.cpu_bw = 20e9;
    iflow_partition_opts po = {.n_ctx = 64};
    iflow_plan p;
    iflow_partition_cost c[3];
    const double host_bw[3] = {30e9, 60e9, 1e15};
    for (int i = 0; i < 3; i++) {
        o.host_bw = host_bw[i];
        CHECK(iflow_machine_parse(&m, "cpu:2", db, &o) == 0 && m.dev[1].d.host_bw == host_bw[i], "--host-bw");
        int rc = iflow_partition_make(&p, &c[i], &s, &m, IFLOW_STRAT_TENSOR, &po);
        CHECK(rc == 0, "tensor on cpu:2: %s", iflow_errmsg());
    }
    /* both halves together over 30 GB/s; each half alone over 20 GB/s once the host allows 40 */
    CHECK(close_to(c[0].t_read * 30e9, c[2].t_read * 20e9 * 2), "30 GB/s for both: %g s against %g s", c[0].t_read,
          c[2].t_read);
    CHECK(close_to(c[1].t_read, c[2].t_read), "60 GB/s: each device's own 20 GB/s bounds it");
    o.host_bw = 30e9;
    CHECK(iflow_machine_parse(&m, "cpu:2", db, &o) == 0, "cpu:2");
    iflow_partition_cost l30, l1;
    iflow_partition_make(&p, &l30, &s, &m, IFLOW_STRAT_LAYER, &po);
    o.host_bw = 1e15;
    iflow_machine_parse(&m, "cpu:2", db, &o);
    iflow_partition_make(&p, &l1, &s, &m, IFLOW_STRAT_LAYER, &po);
    CHECK(close_to(l30.t_read, l1.t_read), "layer split: one device at a time, the host's limit not reached");
    iflow_model_shape_free(&s);
}

/* TinyLlama f16 on 2xH100-80G by tensor, ctx 4096, batch 1: docs/PARTITION.md's formulas by hand. */
static void test_cost_by_hand(void)
{
    iflow_model_shape s;
    iflow_machine m;
    if (!test_data(TINY))
        SKIP("no " TINY);
    if (config(&s, test_data(TINY), IFLOW_DT_F16) || machine(&m, "2xH100-80G"))
        return;
    iflow_plan p;
    iflow_partition_cost c;
    iflow_partition_opts o = {.n_ctx = 4096, .batch = 1};
    int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_TENSOR, &o);
    CHECK(rc == 0, "tensor: %s", iflow_errmsg());
    CHECK(p.devices[0].head1 == 16 && p.devices[0].ffn1 == 2816 && p.output_device == 0, "halves");
    /* one part: 16 heads x 64, 2 kv heads x 64, 2816 FFN columns, dim 2048, f16 */
    double D = 2048, attn = (1024 * D + 2 * 128 * D + D * 1024) * 2 + D * 4, ffn = 3 * 2816 * D * 2 + D * 4;
    double kv_read = 4096.0 * 2 * 64 * 4;                   /* 2 x (4096/2) positions x 2 kv heads x 64 x f32 */
    double bw = 3350e9, link = 450e9, lat = 2e-6, act = D * 4;
    /* what decode measured (the cuda template's, which H100-80G takes): f16 and f32 read at
     * 0.87 of the bandwidth, 37 us a layer; the norms (D x 4 bytes) are f32 */
    double e = 0.87, fixed = 37e-6;
    double t_layer = (attn + kv_read) / (bw * e) + ffn / (bw * e); /* bandwidth-bound at batch 1 */
    double t_ar = 2 * (2.0 * 1 / 2 * act / link + 2 * 1 * lat);
    double out = 32000 * D * 2 + D * 4, t_out = out / (bw * e);
    double want = 22 * (t_layer + fixed + t_ar) + t_out;
    CHECK(close_to(c.t_read, 22 * t_layer), "read time %.9g, by hand %.9g", c.t_read, 22 * t_layer);
    CHECK(close_to(c.t_fixed, 22 * fixed), "fixed time %.9g, by hand %.9g", c.t_fixed, 22 * fixed);
    CHECK(close_to(c.t_allreduce, 22 * t_ar), "all-reduce %.9g, by hand %.9g", c.t_allreduce, 22 * t_ar);
    CHECK(c.t_transfer == 0 && close_to(c.t_output, t_out), "no transfer; output %.9g", c.t_output);
    CHECK(close_to(c.latency, want), "latency %.9g s, by hand %.9g", c.latency, want);
    CHECK(close_to(c.tokens_per_s, 1 / want), "one stage: throughput = 1 / latency");
    /* memory of device 0: its slices, the output matrix, KV for 4096 positions, scratch (a GPU's
     * pass of 512 rows of x, xb, q, att, gate, up and the new k, v of 4 kv heads) and a row of logits */
    uint64_t w = (uint64_t)(22 * (attn + ffn) + out), kv = 22ull * 2 * 4096 * 2 * 64 * 4;
    uint64_t scratch = 512ull * (2 * 2048 + 2 * 2048 + 2 * 5632 + 2 * 256) * 4 + 32000 * 4;
    CHECK(c.mem[0].weights == w && c.mem[0].kv == kv && c.mem[0].scratch == scratch,
          "device 0: weights %llu (%llu), kv %llu (%llu), scratch %llu (%llu)", (unsigned long long)c.mem[0].weights,
          (unsigned long long)w, (unsigned long long)c.mem[0].kv, (unsigned long long)kv,
          (unsigned long long)c.mem[0].scratch, (unsigned long long)scratch);

    /* layer split over 2: one boundary transfer; throughput = 1 / slowest stage */
    rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_LAYER, &o);
    CHECK(rc == 0 && c.n_stages == 2 && close_to(c.t_transfer, act / link + lat), "one transfer: %.9g", c.t_transfer);
    CHECK(close_to(c.tokens_per_s, 1 / c.stage_max) && c.stage_max < 0.6 * c.latency && c.stage_max > 0.5 * c.latency,
          "two stages: throughput 1 / the slower stage (%.9g of %.9g s)", c.stage_max, c.latency);
    iflow_model_shape_free(&s);
}

/* Blocks other than Llama's: GPT-2's plain FFN (two matrices, not three) and BERT's encoder
 * (no output matrix, no logits) in the cost model, by hand. */
static void test_cost_other_blocks(void)
{
    iflow_model_shape s;
    iflow_machine m;
    if (config(&s, "tests/fixtures/families/gpt2", IFLOW_DT_F16) || machine(&m, "H100-80G"))
        return;
    iflow_plan p;
    iflow_partition_cost c;
    /* batch 1024: the FFN is compute-bound (2 x 32 x 128 x 2 flop a token), attention reads KV */
    iflow_partition_opts o = {.n_ctx = 64, .batch = 1024};
    int rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_LAYER, &o);
    CHECK(rc == 0, "gpt2: %s", iflow_errmsg());
    const iflow_hparams *hp = &s.hp;
    double t_read = 0, B = 1024, bw = 3350e9 * 0.87 /* f16 and f32 read at 0.87 */, flops = 989e12;
    for (int l = 0; l < hp->n_layers; l++) {
        iflow_part_bytes b = iflow_part_weight_bytes(hp, s.types + l * IFLOW_PM_COUNT, 0, hp->n_heads, 0, hp->ffn_dim);
        double kv = B * 64 * hp->n_kv_heads * hp->head_dim * 4, ffn_flop = B * 2.0 * hp->dim * 2 * hp->ffn_dim;
        double t_ffn = fmax((double)b.ffn / bw, ffn_flop / flops);
        CHECK(ffn_flop / flops > (double)b.ffn / bw, "gpt2: the FFN is compute-bound at batch 1024");
        t_read += fmax(((double)b.attn + kv) / bw, (B * 2.0 * hp->dim * 4 * 32 + B * 2.0 * 32 * 64) / flops) + t_ffn;
    }
    CHECK(close_to(c.t_read, t_read), "gpt2 plain FFN: read time %.9g, by hand %.9g", c.t_read, t_read);
    iflow_model_shape_free(&s);

    if (config(&s, "tests/fixtures/families/bert", IFLOW_DT_F16))
        return;
    o.batch = 1;
    rc = iflow_partition_make(&p, &c, &s, &m, IFLOW_STRAT_LAYER, &o);
    CHECK(rc == 0, "bert: %s", iflow_errmsg());
    uint64_t w = 0;
    for (int l = 0; l < s.hp.n_layers; l++) {
        iflow_part_bytes b = iflow_part_weight_bytes(&s.hp, s.types + l * IFLOW_PM_COUNT, 0, s.hp.n_heads, 0, s.hp.ffn_dim);
        w += b.attn + b.ffn;
    }
    CHECK(c.mem[0].weights == w && c.mem[0].scratch == iflow_scratch_bytes(&s.hp, IFLOW_GPU_PASS) && c.t_output == 0,
          "bert: weights %llu (layers alone %llu), scratch %llu (no logits %llu), output time %g",
          (unsigned long long)c.mem[0].weights, (unsigned long long)w, (unsigned long long)c.mem[0].scratch,
          (unsigned long long)iflow_scratch_bytes(&s.hp, IFLOW_GPU_PASS), c.t_output);
    iflow_model_shape_free(&s);
}

int main(void)
{
    if (iflow_devdb_load(&db, "specs/devices.ini")) {
        fprintf(stderr, "specs/devices.ini: %s\n", iflow_errmsg());
        return 1;
    }
    RUN(test_devices);
    RUN(test_devices_file_errors);
    RUN(test_devices_measured);
    RUN(test_host_bandwidth);
    RUN(test_shapes);
    RUN(test_layers_follow_memory);
    RUN(test_gqa);
    RUN(test_uneven);
    RUN(test_fit);
    RUN(test_cost_by_hand);
    RUN(test_cost_other_blocks);
    iflow_devdb_free(db);
    return check_summary("test_partition");
}
