/* devices.c -- see devices.h. */
#include "cmd/devices.h"
#include "cmd/io.h"
#include "libcore/base/error.h"
#include "libcore/engine/comm.h"
#include "libcore/engine/plan.h"


#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Open the GPU the options ask for, or NULL for the CPU. */
static iflow_device *open_gpu(const iflow_tool *t, const device_opts *o)
{
    const char *name = o->device ? o->device : "auto";
    iflow_device *d = NULL;
    if (strcmp(name, "cpu") == 0) {
        if (o->gpu_layers > 0)
            die_usage(t, "--gpu-layers %d needs a GPU, but --device is cpu", o->gpu_layers);
        return NULL;
    }
    if (strcmp(name, "auto") == 0) {
        const char *why;
        if (iflow_device_open_auto(&d, o->threads, &why) < 0)
            die(t, NULL);
        if (d->info.kind == IFLOW_DEVICE_CPU) {
            if (o->verbose)
                fprintf(stderr, "%s: device auto: running on the cpu (%s)\n", t->name, why);
            iflow_device_close(d);
            return NULL;
        }
        return d;
    }
    if (strncmp(name, "cuda", 4) != 0)
        die_usage(t, "unknown device '%s' (expected auto, cpu, cuda or cuda:N)", name);
    if (iflow_device_open(&d, name, o->threads) < 0)
        die(t, NULL);
    return d;
}

/* Place m as plan file o->plan says; or, for a split model without --plan, as its own plan. */
static void place_plan(const iflow_tool *t, iflow_model *m, const device_opts *o, placed *p)
{
    iflow_plan plan;
    const iflow_plan *own = iflow_model_split_plan(m);
    const char *what = o->plan ? "--plan" : "a split model's plan";
    if (o->device && strcmp(o->device, "auto") != 0)
        die_usage(t, "%s names the devices; --device %s cannot be given with it", what, o->device);
    if (o->gpu_layers >= 0)
        die_usage(t, "%s places the layers; --gpu-layers cannot be given with it", what);
    if (o->plan && iflow_plan_load(&plan, o->plan) < 0)
        die(t, NULL);
    if (!o->plan)
        plan = *own;
    if (iflow_plan_open_devices(&plan, iflow_model_own_device(m), p->plan_devices) < 0) /* mpirun: its own only */
        die(t, NULL);
    p->n_plan_devices = plan.n_devices;
    if (iflow_model_place_plan(m, &plan, p->plan_devices, o->n_ctx) < 0)
        die(t, NULL);
    if (o->verbose)
        fprintf(stderr, "%s: plan %s (%s): %d devices, output on %s\n", t->name, o->plan ? o->plan : "of the split model",
                plan.strategy[0] ? plan.strategy : "no strategy named", plan.n_devices,
                plan.devices[plan.output_device].name);
}

void devices_place(const iflow_tool *t, iflow_model *m, const device_opts *o, placed *p)
{
    memset(p, 0, sizeof *p);
    if (o->plan || iflow_model_split_plan(m)) {
        place_plan(t, m, o, p);
        return;
    }
    if (iflow_model_has_lora(m) && (!o->device || strcmp(o->device, "auto") == 0)) {
        if (o->verbose) /* a run-time adapter computes on the CPU (iflow_model_add_lora) */
            fprintf(stderr, "%s: device auto: running on the cpu (a LoRA adapter applied at run time)\n", t->name);
        return;
    }
    if (!(p->gpu = open_gpu(t, o)))
        return;
    const iflow_hparams *hp = iflow_model_hparams(m);
    int n_gpu = o->gpu_layers < 0 || o->gpu_layers > hp->n_layers ? hp->n_layers : o->gpu_layers;
    if (!(p->layer_device = malloc(sizeof(int) * (size_t)hp->n_layers)))
        die(t, "out of memory");
    iflow_placement pl;
    iflow_placement_first_n(&pl, p->layer_device, hp->n_layers, p->gpu, n_gpu, NULL);
    if (iflow_model_place(m, &pl, o->n_ctx) < 0)
        die(t, NULL);
    if (o->verbose)
        fprintf(stderr, "%s: device %s (%s): %d of %d layers%s, the rest on the cpu\n", t->name, p->gpu->info.name,
                p->gpu->info.model, n_gpu, hp->n_layers, pl.output_device == 0 ? " and the output" : "");
}

void devices_release(placed *p)
{
    for (int i = 0; i < p->n_plan_devices; i++)
        iflow_device_close(p->plan_devices[i]);
    iflow_device_close(p->gpu);
    free(p->layer_device);
    memset(p, 0, sizeof *p);
}

void devices_set_activations(const iflow_tool *t, const char *mode)
{
    if (iflow_kernel_set_activations(mode) < 0)
        die_usage(t, "unknown activations '%s' (int, int8, int16, f32)", mode);
}

void devices_list(const iflow_tool *t, int as_json)
{
    iflow_device_info info[IFLOW_MAX_DEVICES];
    int n;
    if (iflow_device_list(info, IFLOW_MAX_DEVICES, &n) < 0)
        die(t, NULL);
    if (n > IFLOW_MAX_DEVICES)
        n = IFLOW_MAX_DEVICES;
    for (int i = 0; i < n; i++) {
        const iflow_device_info *d = &info[i];
        char tot[32], fr[32];
        if (as_json) {
            json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:i, s:s}", "name", d->name, "model", d->model, "mem_total",
                                  (json_int_t)d->mem_total, "mem_free", (json_int_t)d->mem_free, "units", d->units,
                                  "detail", d->detail);
            if (d->kind == IFLOW_DEVICE_CUDA) {
                char cc[16];
                snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
                json_object_set_new(j, "compute_capability", json_string(cc));
                json_object_set_new(j, "mem_bw_peak", json_real(d->mem_bw_peak));
            }
            j = json_schema(j);
            json_dumpf(j, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
            putchar('\n');
            json_decref(j);
        } else if (d->kind == IFLOW_DEVICE_CUDA) {
            printf("%-8s %s, %s memory (%s free), compute capability %d.%d, %d SMs, %s\n", d->name, d->model,
                   iflow_bytes_str(tot, sizeof tot, d->mem_total), iflow_bytes_str(fr, sizeof fr, d->mem_free),
                   d->cc_major, d->cc_minor, d->units, d->detail);
        } else {
            printf("%-8s %s, %s memory (%s available), %d cores, %s\n", d->name, d->model[0] ? d->model : "unknown cpu",
                   iflow_bytes_str(tot, sizeof tot, d->mem_total), iflow_bytes_str(fr, sizeof fr, d->mem_free), d->units,
                   d->detail);
        }
    }
    if (n == 1 && !as_json)
        printf("(no GPU: %s)\n", iflow_device_cuda_status());
    fflush(stdout);
}

void devices_check_comm(const iflow_tool *t, const char *kind)
{
    if (strcmp(kind, "auto") && strcmp(kind, "mpi") && strcmp(kind, "nccl"))
        die_usage(t, "--comm must be auto, mpi or nccl, not '%s'", kind);
}

iflow_comm *devices_comm_nccl(const iflow_tool *t, const char *kind, iflow_comm *mpi, const iflow_model *m,
                              const placed *p, int verbose)
{
    kind = kind ? kind : "auto";
    if (strcmp(kind, "mpi") == 0 || (!mpi && strcmp(kind, "nccl") != 0))
        return NULL;
    iflow_device *mine = p->plan_devices[iflow_model_own_device(m)];
    if (strcmp(kind, "auto") == 0) {
        float on_cpu = !mine || mine->info.kind != IFLOW_DEVICE_CUDA;
        if (mpi->ops->allreduce_sum(mpi, &on_cpu, 1) < 0)
            die(t, NULL);
        if (verbose)
            fprintf(stderr, "%s: the processes exchange states over %s\n", t->name, on_cpu > 0 ? "MPI" : "NCCL");
        if (on_cpu > 0)
            return NULL;
    }
    iflow_comm *c;
    if (iflow_comm_nccl_open(&c, mine, mpi) < 0)
        die(t, NULL);
    return c;
}
