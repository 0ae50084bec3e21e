/* iflow-partition -- plan how a model is split over devices (by layer, by tensor, hybrid), with a
 * cost model; iflow-run --plan executes the plan. */
#include "cmd/io.h"
#include "cmd/opt.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/engine/partition.h"
#include "libcore/engine/plan.h"
#include "libcore/engine/split.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    O_MODEL = 'm', O_OUTPUT = 'o', O_VERBOSE = 'v',
    O_CONFIG = 256, O_DEVICES, O_STRATEGY, O_COMPARE, O_JSON, O_CTX, O_BATCH, O_DTYPE, O_OBJECTIVE, O_CPU_BW,
    O_HOST_BW, O_LINK_BW, O_PLAN, O_SPLIT,
};

static const iflow_opt opts[] = {
    {O_MODEL, "model", 'm', "FILE", "the model: a shard file, or - for standard input (read record by record)", "file"},
    {O_CONFIG, "config", 0, "DIR", "the model's shape from DIR/config.json instead (no weights needed)", "dir"},
    {O_DEVICES, "devices", 0, "LIST", "devices: 4xH100-80G, cpu:4, cuda:0,cuda:1, H100-80G,cpu (see specs/devices.ini)",
     NULL},
    {O_STRATEGY, "strategy", 0, "NAME", "layer, tensor, hybrid, gpu-cpu or auto (default: auto, the best that fits)",
     "layer tensor hybrid gpu-cpu auto"},
    {O_OUTPUT, "output", 'o', "FILE", "write the plan to FILE (default: standard output)", "file"},
    {O_COMPARE, "compare", 0, NULL, "print every strategy's memory, decode time and throughput instead of a plan", NULL},
    {O_JSON, "json", 0, NULL, "print JSON: with --compare, one line per strategy; else the plan's cost (with -o)", NULL},
    {O_CTX, "ctx", 0, "N", "KV-cache positions per sequence (default 4096)", NULL},
    {O_BATCH, "batch", 0, "N", "sequences decoded together (default 1)", NULL},
    {O_DTYPE, "dtype", 0, "TYPE", "with --config: the type of the weight matrices (default f16)",
     "f32 f16 bf16 q8_b32 q8_b64 q6 q5 q4_b32 q4_b64 q3h q3_b32 q2"},
    {O_OBJECTIVE, "objective", 0, "NAME", "what auto and hybrid optimize: latency (default) or throughput",
     "latency throughput"},
    {O_CPU_BW, "cpu-bw", 0, "GBPS", "memory bandwidth of each CPU device, GB/s (default: specs/devices.ini's, 20)", NULL},
    {O_HOST_BW, "host-bw", 0, "GBPS", "memory bandwidth of all CPU devices together, GB/s (default: specs/devices.ini's)",
     NULL},
    {O_LINK_BW, "link-bw", 0, "GBPS", "link bandwidth of every device, GB/s (default: each description's)", NULL},
    {O_SPLIT, "split", 0, "DIR", "write DIR/plan.ini and one shard file per device of the plan, holding only its slices", "dir"},
    {O_PLAN, "plan", 0, "FILE", "with --split: split by this plan (iflow-plan(5)) instead of planning one", "file"},
    {O_VERBOSE, "verbose", 'v', NULL, "print the chosen plan's memory and time breakdown on standard error", NULL},
    {0},
};

static const iflow_tool tool = {
    "iflow-partition", "(-m FILE | --config DIR) (--devices LIST | --plan FILE) [--strategy NAME] [-o FILE] [--compare] [--split DIR] [options]",
    "Plan how a model is split over devices: by layer, by tensor, hybrid, GPU+CPU.", opts,
};

/* specs/devices.ini from the directories programs find specs in. */
static iflow_devdb *load_devices(void)
{
    const char *dirs[8];
    int n = spec_dirs(dirs, 8);
    char searched[2048] = "";
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/devices.ini", dirs[i]);
        if (access(path, R_OK) == 0) {
            iflow_devdb *db;
            if (iflow_devdb_load(&db, path) < 0)
                die(&tool, NULL);
            return db;
        }
        size_t len = strlen(searched);
        snprintf(searched + len, sizeof searched - len, "%s%s", len ? ", " : "", dirs[i]);
    }
    die(&tool, "no devices.ini among the spec directories (searched %s; set IFLOW_SPEC_PATH)", n ? searched : "none");
}

static double ms(double s) { return s * 1e3; }

static const char *mib(char *buf, size_t cap, uint64_t b)
{
    return iflow_bytes_str(buf, cap, b);
}

static void print_cost_verbose(const iflow_plan *p, const iflow_partition_cost *c, const iflow_machine *mc,
                               const iflow_partition_opts *o)
{
    char a[32], b[32], d[32], e[32], f[32];
    fprintf(stderr, "%s: %s plan on %s: layout %dx%d, %d stage%s, ctx %d, batch %d (KV cache of %d sequence%s)\n",
            tool.name, p->strategy, mc->label, c->groups, c->heads_split, c->n_stages, c->n_stages == 1 ? "" : "s",
            o->n_ctx, o->batch, c->sequences, c->sequences == 1 ? "" : "s");
    for (int i = 0; i < c->n_devices; i++) {
        const iflow_partition_mem *x = &c->mem[i];
        fprintf(stderr, "  %-8s %-14s weights %s, KV cache %s, scratch %s: %s of %s%s\n", p->devices[i].name,
                c->device[i], mib(a, sizeof a, x->weights), mib(b, sizeof b, x->kv), mib(d, sizeof d, x->scratch),
                mib(e, sizeof e, x->total), mib(f, sizeof f, x->capacity), x->total > x->capacity ? " (does not fit)" : "");
    }
    fprintf(stderr,
            "  decode step: read %.3f ms + fixed %.3f ms + all-reduce %.3f ms + transfers %.3f ms + output %.3f ms"
            " = %.3f ms\n",
            ms(c->t_read), ms(c->t_fixed), ms(c->t_allreduce), ms(c->t_transfer), ms(c->t_output), ms(c->latency));
    fprintf(stderr, "  throughput: slowest stage %.3f ms, %.1f tokens/s at batch %d with every stage busy\n",
            ms(c->stage_max), c->tokens_per_s, o->batch);
}

static json_t *cost_json(const char *strategy, const iflow_plan *p, const iflow_partition_cost *c, int rc)
{
    json_t *j = json_pack("{s:s, s:b}", "strategy", strategy, "fits", rc == 0);
    if (rc && rc != IFLOW_ENOMEM) {
        json_object_set_new(j, "error", json_string(iflow_errmsg()));
        return j;
    }
    char layout[32];
    snprintf(layout, sizeof layout, "%dx%d", c->groups, c->heads_split);
    json_object_set_new(j, "layout", json_string(layout));
    json_object_set_new(j, "stages", json_integer(c->n_stages));
    json_object_set_new(j, "sequences", json_integer(c->sequences));
    json_object_set_new(j, "memory_max", json_integer((json_int_t)c->mem_max));
    json_t *devs = json_array();
    for (int i = 0; i < c->n_devices; i++) {
        const iflow_partition_mem *x = &c->mem[i];
        json_array_append_new(devs, json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "device", p->devices[i].name,
                                              "description", c->device[i], "weights", (json_int_t)x->weights, "kv",
                                              (json_int_t)x->kv, "scratch", (json_int_t)x->scratch, "total",
                                              (json_int_t)x->total, "capacity", (json_int_t)x->capacity));
    }
    json_object_set_new(j, "memory", devs);
    json_object_set_new(j, "ms_per_token", json_real(ms(c->latency)));
    json_object_set_new(j, "decode_tokens_per_s", json_real(1.0 / c->latency));
    json_object_set_new(j, "tokens_per_s", json_real(c->tokens_per_s));
    json_object_set_new(j, "read_ms", json_real(ms(c->t_read)));
    json_object_set_new(j, "fixed_ms", json_real(ms(c->t_fixed)));
    json_object_set_new(j, "allreduce_ms", json_real(ms(c->t_allreduce)));
    json_object_set_new(j, "transfer_ms", json_real(ms(c->t_transfer)));
    json_object_set_new(j, "output_ms", json_real(ms(c->t_output)));
    if (rc)
        json_object_set_new(j, "error", json_string(iflow_errmsg()));
    return j;
}

static void print_json(json_t *j)
{
    j = json_schema(j);
    json_dumpf(j, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    putchar('\n');
    json_decref(j);
}

/* Every strategy, then the best for the objective. */
static void compare(const iflow_model_shape *m, const iflow_machine *mc, const iflow_partition_opts *o, int as_json)
{
    iflow_plan plans[IFLOW_STRAT_COUNT + 1];
    iflow_partition_cost costs[IFLOW_STRAT_COUNT + 1];
    int rcs[IFLOW_STRAT_COUNT + 1];
    char msgs[IFLOW_STRAT_COUNT + 1][512];
    for (int s = 0; s <= IFLOW_STRAT_AUTO; s++) {
        rcs[s] = iflow_partition_make(&plans[s], &costs[s], m, mc, s, o);
        snprintf(msgs[s], sizeof msgs[s], "%s", rcs[s] ? iflow_errmsg() : "");
    }
    const char *best = rcs[IFLOW_STRAT_AUTO] == 0 ? plans[IFLOW_STRAT_AUTO].strategy : NULL;
    const iflow_hparams *hp = &m->hp;
    if (as_json) {
        for (int s = 0; s < IFLOW_STRAT_COUNT; s++) {
            iflow_seterr(rcs[s], "%s", msgs[s]);
            json_t *j = cost_json(iflow_strategy_name(s), &plans[s], &costs[s], rcs[s]);
            json_object_set_new(j, "best", json_boolean(best && strcmp(best, iflow_strategy_name(s)) == 0));
            print_json(j);
        }
        return;
    }
    char a[32];
    printf("model: %s: %d layers, %d heads, %d kv heads, dim %d, ffn %d, %s\n", m->source, hp->n_layers, hp->n_heads,
           hp->n_kv_heads, hp->dim, hp->ffn_dim, mib(a, sizeof a, m->total_bytes));
    printf("devices: %s (%d); ctx %d, batch %d, objective %s\n", mc->label, mc->n, o->n_ctx, o->batch,
           o->objective == IFLOW_OBJ_THROUGHPUT ? "throughput" : "latency");
    printf("%-8s %-6s %12s %10s %12s %12s  %s\n", "strategy", "layout", "mem/device", "ms/token", "decode tok/s",
           "tokens/s", "fits");
    for (int s = 0; s < IFLOW_STRAT_COUNT; s++) {
        const iflow_partition_cost *c = &costs[s];
        if (rcs[s] && rcs[s] != IFLOW_ENOMEM) {
            printf("%-8s %-6s %12s %10s %12s %12s  n/a: %s\n", iflow_strategy_name(s), "-", "-", "-", "-", "-", msgs[s]);
            continue;
        }
        char layout[32], fit[96];
        snprintf(layout, sizeof layout, "%dx%d", c->groups, c->heads_split);
        if (rcs[s] == 0)
            snprintf(fit, sizeof fit, "yes");
        else
            snprintf(fit, sizeof fit, "no: %s lacks %s", plans[s].devices[c->short_device].name,
                     mib(a, sizeof a, c->short_bytes));
        printf("%-8s %-6s %12s %10.3f %12.1f %12.1f  %s\n", iflow_strategy_name(s), layout,
               mib(a, sizeof a, c->mem_max), ms(c->latency), 1.0 / c->latency, c->tokens_per_s, fit);
    }
    if (best)
        printf("best for %s: %s\n", o->objective == IFLOW_OBJ_THROUGHPUT ? "throughput" : "latency", best);
    else
        printf("best: none fits\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *config = NULL, *devices = NULL, *out = NULL, *plan_path = NULL, *split = NULL, *arg;
    int strategy = IFLOW_STRAT_AUTO, do_compare = 0, as_json = 0, verbose = 0, dtype = IFLOW_DT_F16, c;
    iflow_partition_opts po = {.n_ctx = 4096, .batch = 1, .objective = IFLOW_OBJ_LATENCY};
    iflow_machine_opts mo = {0};
    while ((c = opt_next(&tool, argc, argv, &arg)) != 0) {
        switch (c) {
        case O_MODEL: model = arg; break;
        case O_CONFIG: config = arg; break;
        case O_DEVICES: devices = arg; break;
        case O_STRATEGY:
            if ((strategy = iflow_strategy_from_name(arg)) < 0)
                die_usage(&tool, "unknown strategy '%s' for --strategy (layer, tensor, hybrid, gpu-cpu, auto)", arg);
            break;
        case O_OUTPUT: out = arg; break;
        case O_COMPARE: do_compare = 1; break;
        case O_JSON: as_json = 1; break;
        case O_CTX: po.n_ctx = (int)opt_long(&tool, "ctx", arg, 1, 1 << 24); break;
        case O_BATCH: po.batch = (int)opt_long(&tool, "batch", arg, 1, 1 << 16); break;
        case O_DTYPE:
            dtype = iflow_dtype_from_name(arg);
            if (!iflow_dtype_is_float(dtype) && !iflow_dtype_is_quant(dtype))
                die_usage(&tool, "unknown type '%s' for --dtype (f32, f16, bf16 or a type of iflow-quant --list-types)", arg);
            break;
        case O_OBJECTIVE:
            if (strcmp(arg, "latency") && strcmp(arg, "throughput"))
                die_usage(&tool, "unknown objective '%s' for --objective (latency or throughput)", arg);
            po.objective = strcmp(arg, "throughput") == 0 ? IFLOW_OBJ_THROUGHPUT : IFLOW_OBJ_LATENCY;
            break;
        case O_CPU_BW: mo.cpu_bw = opt_double(&tool, "cpu-bw", arg, 0.001, 1e6) * 1e9; break;
        case O_HOST_BW: mo.host_bw = opt_double(&tool, "host-bw", arg, 0.001, 1e6) * 1e9; break;
        case O_LINK_BW: mo.link_bw = opt_double(&tool, "link-bw", arg, 0.001, 1e6) * 1e9; break;
        case O_VERBOSE: verbose = 1; break;
        case O_PLAN: plan_path = arg; break;
        case O_SPLIT: split = arg; break;
        }
    }
    if (opt_index() < argc)
        die_usage(&tool, "unexpected operand '%s' (give the model with -m FILE or --config DIR)", argv[opt_index()]);
    if (!model == !config)
        die_usage(&tool, model ? "give -m FILE or --config DIR, not both" : "no model: give -m FILE or --config DIR");
    if (plan_path && !split)
        die_usage(&tool, "--plan FILE is the plan for --split DIR: give --split");
    if (split && !model)
        die_usage(&tool, "--split needs the model's weights: give -m FILE (or - for standard input)");
    if (split && do_compare)
        die_usage(&tool, "--split writes a split model; --compare prints estimates: give one of them");
    if (plan_path && devices)
        die_usage(&tool, "--plan names the devices; --devices cannot be given with it");
    if (split && !plan_path && strcmp(model, "-") == 0)
        die_usage(&tool, "a model from standard input is read once: give the plan with --plan FILE");
    if (model && strcmp(model, "-") == 0 && isatty(0))
        die_usage(&tool, "no input: pipe a shard to standard input or give -m FILE");
    if (plan_path) {
        iflow_plan plan;
        if (iflow_plan_load(&plan, plan_path) < 0 || iflow_split_write(model, &plan, split) < 0)
            die(&tool, NULL);
        return 0;
    }
    if (!devices)
        die_usage(&tool, "no devices: give --devices LIST (such as 4xH100-80G or cpu:4)");
    if (as_json && !do_compare && (!out || strcmp(out, "-") == 0))
        die_usage(&tool, "--json without --compare prints the plan's cost: write the plan with -o FILE");

    iflow_devdb *db = load_devices();
    iflow_machine mc;
    if (iflow_machine_parse(&mc, devices, db, &mo) < 0)
        die(&tool, NULL);
    iflow_devdb_free(db);
    iflow_model_shape m;
    int rc;
    if (model)
        rc = iflow_model_shape_from_shard(&m, model);
    else {
        const char *dirs[8];
        int n = spec_dirs(dirs, 8);
        rc = iflow_model_shape_from_config(&m, config, dtype, NULL, dirs, (size_t)n);
    }
    if (rc < 0)
        die(&tool, NULL);

    if (do_compare)
        compare(&m, &mc, &po, as_json);
    if (do_compare && !out) {
        iflow_model_shape_free(&m);
        return 0;
    }
    iflow_plan plan;
    iflow_partition_cost cost;
    rc = iflow_partition_make(&plan, &cost, &m, &mc, strategy, &po);
    iflow_model_shape_free(&m);
    if (rc < 0) {
        if (verbose && rc == IFLOW_ENOMEM) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", iflow_errmsg());
            print_cost_verbose(&plan, &cost, &mc, &po);
            iflow_seterr(rc, "%s", msg);
        }
        die(&tool, NULL);
    }
    if (verbose)
        print_cost_verbose(&plan, &cost, &mc, &po);
    if (split && iflow_split_write(model, &plan, split) < 0)
        die(&tool, NULL);
    if ((out || !split) && iflow_plan_save(&plan, out ? out : "-") < 0)
        die(&tool, NULL);
    if (as_json && !do_compare)
        print_json(cost_json(plan.strategy, &plan, &cost, 0));
    return 0;
}
