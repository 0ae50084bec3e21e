/*
 * plan.h -- a partition plan: which device computes which layers, attention heads and FFN
 * columns of a model (the Inferflow paper, section 4: by layer, by tensor, hybrid).
 *
 * Contract
 *   A plan names its devices ("cpu:0".."cpu:N-1" are virtual CPU devices of one process, each
 *   with its own threads; "cuda:N" are GPUs) and, for each device, the layers it runs and the
 *   part of each of those layers it holds: a range of query heads (the KV heads they read come
 *   with them) and a range of FFN columns (gate/up rows, down columns). A layer held by one
 *   device whole is pipeline partition; a layer split over several is tensor partition, whose
 *   partial results are summed (all-reduced) after the attention output and after the FFN.
 *   Grouped-query attention: a part's query heads either cover whole KV-head groups, or lie in
 *   one group (that KV head is then replicated on every part that reads it).
 *
 *   The file form (man/iflow-plan.5) is an ini file:
 *       [plan]
 *       layers = 22          heads = 32          kv_heads = 4          ffn = 5632
 *       strategy = hybrid    output = cpu:0
 *       [device cpu:0]
 *       threads = 1          layers = 0-10       heads = 0-15          ffn = 0-2815
 *   (ranges are inclusive; "all" is the whole range). iflow_plan_load() parses it with inih,
 *   checks every number, and says which line is wrong; iflow_plan_check() checks a plan against
 *   a model's shape: every layer's heads and FFN columns covered exactly once, the GQA rule.
 *   iflow_plan_save() writes the same form.
 *
 *   Plans own their memory: iflow_plan_free().
 */
#ifndef IFLOW_PLAN_H
#define IFLOW_PLAN_H

#include <stddef.h>

#define IFLOW_PLAN_MAX_DEVICES 16

typedef struct {
    char name[32];            /* "cpu:0", "cuda:1"                                  */
    int  threads;             /* CPU threads of this device (0: cores / CPU devices) */
    int  layer0, layer1;      /* layers layer0..layer1-1 (none when layer1 <= layer0) */
    int  head0, head1;        /* query heads head0..head1-1 of each of those layers   */
    int  ffn0, ffn1;          /* FFN columns ffn0..ffn1-1                              */
} iflow_plan_device;

typedef struct iflow_plan_s {
    char strategy[16];        /* "layer", "tensor", "hybrid", "gpu-cpu", or "" (free text) */
    int  n_layers, n_heads, n_kv_heads, ffn_dim;   /* the model shape the plan is for        */
    int  n_devices;
    iflow_plan_device devices[IFLOW_PLAN_MAX_DEVICES];
    int  output_device;       /* index of the device computing the final norm and logits    */
} iflow_plan;

/* Read a plan file (path). Errors name the file and line. */
int  iflow_plan_load(iflow_plan *p, const char *path);
/* Write p to path (temporary file + rename) or to standard output for "-". */
int  iflow_plan_save(const iflow_plan *p, const char *path);
/* p fits a model of this shape: IFLOW_ESHAPE naming the mismatch (layer count, heads), or
 * IFLOW_EINVAL naming the layer and head or column left uncovered or covered twice. */
int  iflow_plan_check(const iflow_plan *p, int n_layers, int n_heads, int n_kv_heads, int ffn_dim);

/* a and b split a model the same way: the same devices in the same order holding the same
 * layers, heads and FFN columns, the same output device (names and threads may differ); else
 * IFLOW_EINVAL naming the first difference (b_name names b in it). */
int  iflow_plan_same_partition(const iflow_plan *a, const iflow_plan *b, const char *b_name);

/* Open the plan's devices into devs[0 .. n_devices): "cpu" and "cpu:N" are CPU devices sharing
 * this machine's cores (a device's own thread count, else the cores divided among the plan's
 * CPU devices); any other name is opened as iflow_device_open() knows it ("cuda:1"). only >= 0:
 * that device alone, the others NULL (one process per device: comm.h). On failure the devices
 * already opened are closed and devs[] is all NULL. */
struct iflow_device;
int  iflow_plan_open_devices(const iflow_plan *p, int only, struct iflow_device **devs);
void iflow_plan_close_devices(const iflow_plan *p, struct iflow_device **devs);

/* The devices holding layer l, in plan order, into idx[]; returns how many. */
int  iflow_plan_layer_devices(const iflow_plan *p, int l, int *idx);

#endif
