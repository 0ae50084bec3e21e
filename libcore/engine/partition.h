/*
 * partition.h -- choosing a partition plan (plan.h) for a model on a set of devices, by a cost
 * model: memory per device, decode latency per token, throughput (the Inferflow paper,
 * section 4: by layer, by tensor, hybrid). docs/PARTITION.md states the formulas.
 *
 * Contract
 *   Devices are described by figures, not opened: an iflow_devdesc is a device kind's memory,
 *   memory bandwidth, F16 dense FLOP/s, and the bandwidth and latency of its link to the other
 *   devices. iflow_devdb_load() reads them from an ini file (specs/devices.ini, format there):
 *       [device H100-80G]
 *       kind = gpu      memory = 81559 MiB    bandwidth = 3350 GB/s    flops = 989 TFLOP/s
 *       link = 450 GB/s       latency = 2 us          match = H100 80GB HBM3
 *       overhead = 36 us      efficiency = f16 0.82, q4_b64 0.39, * 0.39
 *       host_bandwidth = 35 GB/s                      (kind cpu only)
 *   every number with its unit; errors name the file and line. overhead, efficiency and
 *   host_bandwidth are optional: what iflow's decode measured on that kind of device (a fixed
 *   time per layer part and step; the fraction of the bandwidth each weight type is read at,
 *   `*` for the types not named; what all CPU devices of one host read together). The description named "cpu" is
 *   the template of virtual CPU devices (its flops are per core, its memory "host"), the one
 *   named "cuda" that of live GPUs.
 *
 *   A machine (iflow_machine) is the devices a plan may use, in plan order, parsed from a list
 *   of comma-separated items by iflow_machine_parse():
 *       4xH100-80G     four devices of that description (cuda:0..cuda:3)
 *       cpu:4          four virtual CPU devices (cpu:0..cpu:3) sharing this machine's cores and
 *                      memory; each has opts->cpu_bw bytes/s (default: the "cpu" description's)
 *       cpu            one CPU device (all cores)
 *       cuda:1         a live GPU (iflow_device_list): its memory and peak bandwidth; FLOP/s
 *                      from the description whose `match` is in its model name, else from the
 *                      "cuda" description (the template of live GPUs), whose link (PCIe) it
 *                      takes unless opts->link_bw
 *   GPUs take the names cuda:0.. in order of appearance (live ones keep theirs), CPU devices
 *   cpu:0... opts->link_bw overrides every device's link bandwidth.
 *
 *   A model's shape (iflow_model_shape) is its hyperparameters and the type of every matrix,
 *   from a shard read record by record (iflow_shard_reader: a file or "-", payloads not kept) or
 *   from a Hugging Face config.json resolved through its spec (iflow_convert_resolve) with
 *   matrices of a given type. Byte sizes follow iflow_tensor_nbytes() (quantized rows padded).
 *
 *   iflow_partition_make() builds the plan of one strategy and its cost; every plan it returns
 *   passes iflow_plan_check(). It returns 0 when the plan fits every device; IFLOW_ENOMEM when
 *   it does not (the plan and cost are still filled; the message names the first device that
 *   lacks memory and how many bytes); IFLOW_EUNSUPPORTED or IFLOW_EINVAL when the strategy
 *   cannot apply to this model and machine (the message says why; nothing is filled).
 *   IFLOW_STRAT_AUTO tries every strategy and returns the best that fits for the objective.
 *   iflow_partition_cost_of() prices any plan (one loaded from a file) on a machine.
 *   Nothing here prints, opens a device (but the live ones listed by iflow_device_list) or
 *   allocates beyond the shape's arrays (iflow_model_shape_free) and the device database
 *   (iflow_devdb_free).
 */
#ifndef IFLOW_PARTITION_H
#define IFLOW_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "libcore/base/dtype.h"        /* IFLOW_DT_QEND_: efficiency per weight type */
#include "libcore/engine/footprint.h"   /* IFLOW_PM_*: the matrices of a layer */
#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"

/* ---- devices ---- */

typedef struct {
    char     name[32];   /* "H100-80G", "cpu"; a live device: its model string, shortened   */
    int      is_cpu;     /* kind = cpu                                                        */
    uint64_t memory;     /* bytes (0 for "host": this machine's memory)                        */
    double   mem_bw;     /* bytes/s                                                           */
    double   flops;      /* F16 dense FLOP/s (the CPU template: per core; 0: unknown)         */
    double   link_bw;    /* bytes/s per direction to the other devices                        */
    double   link_lat;   /* seconds per message                                               */
    char     match[64];  /* a substring of a CUDA device's model name ("" none)               */
    /* How fast iflow's decode runs there, measured (optional keys; a description without them
     * takes its kind's template's, "cpu" or "cuda"; without those: 0, 0 and 1): */
    double   overhead;   /* seconds each layer part adds to a decode step beyond its reads     */
    double   host_bw;    /* kind cpu: bytes/s all CPU devices of the host read together (0: no limit) */
    double   eff[IFLOW_DT_QEND_]; /* per weight type: the fraction of mem_bw decode reads it at  */
} iflow_devdesc;

typedef struct iflow_devdb iflow_devdb;

int  iflow_devdb_load(iflow_devdb **out, const char *path);
void iflow_devdb_free(iflow_devdb *db);
int  iflow_devdb_count(const iflow_devdb *db);
const iflow_devdesc *iflow_devdb_at(const iflow_devdb *db, int i);
/* By name, case-insensitive; NULL if absent. */
const iflow_devdesc *iflow_devdb_find(const iflow_devdb *db, const char *name);

typedef struct {
    char          name[32];  /* the plan's name: "cuda:0", "cpu:1"                    */
    iflow_devdesc d;         /* this one device's figures (a CPU's flops: all its cores) */
} iflow_pdevice;

typedef struct {
    int           n;
    iflow_pdevice dev[IFLOW_PLAN_MAX_DEVICES];
    char          label[96];  /* "4 x H100-80G", "cpu:4", "cuda:0, cuda:1"                  */
} iflow_machine;

typedef struct {
    double   cpu_bw;       /* bytes/s of each CPU device; 0: the "cpu" description's       */
    double   host_bw;      /* bytes/s of all CPU devices together; 0: the "cpu" description's */
    double   link_bw;      /* bytes/s of every device's link; 0: as described              */
    uint64_t host_memory;  /* 0: this machine's (iflow_device_list)                        */
    int      host_cores;   /* 0: this machine's                                            */
} iflow_machine_opts;

/* IFLOW_ENOTFOUND names an unknown description or a live device this machine lacks;
 * IFLOW_EINVAL a malformed item, a device named twice, more than 16 devices. */
int iflow_machine_parse(iflow_machine *m, const char *spec, const iflow_devdb *db, const iflow_machine_opts *o);

/* ---- the model ---- */

typedef struct {
    iflow_hparams hp;
    int     *types;        /* [n_layers * IFLOW_PM_COUNT]: the type of each layer matrix      */
    int      output_type;  /* the output matrix (tok_embd's when tied)                        */
    int      embed_type;
    uint64_t total_bytes;  /* every tensor                                                    */
    char     source[256];  /* the path or directory, for messages                             */
} iflow_model_shape;

/* From a shard ("-": standard input), read one record at a time; every tensor the blocks need
 * must be there with its shape (iflow_model_tensors), as the loader would require. */
int  iflow_model_shape_from_shard(iflow_model_shape *s, const char *path);
/* From DIR/config.json resolved as iflow_convert() would (spec_path / spec_dirs of opts);
 * matrices of type dtype (a float or quantized IFLOW_DT_*), vectors F32. */
int  iflow_model_shape_from_config(iflow_model_shape *s, const char *dir, int dtype, const char *spec_path,
                                   const char *const *spec_dirs, size_t n_spec_dirs);
void iflow_model_shape_free(iflow_model_shape *s);

/* ---- strategies and the cost model ---- */

enum {
    IFLOW_STRAT_LAYER,    /* contiguous layer ranges sized to memory; output on the last device */
    IFLOW_STRAT_TENSOR,   /* every layer on every device: heads and FFN columns split           */
    IFLOW_STRAT_HYBRID,   /* layer groups x head groups (G x T = devices, G, T > 1)            */
    IFLOW_STRAT_GPU_CPU,  /* the first layers on a GPU, as many as fit; the rest on the CPU     */
    IFLOW_STRAT_COUNT,
    IFLOW_STRAT_AUTO = IFLOW_STRAT_COUNT
};
enum { IFLOW_OBJ_LATENCY, IFLOW_OBJ_THROUGHPUT };

/* "layer", "tensor", "hybrid", "gpu-cpu", "auto"; NULL for others. */
const char *iflow_strategy_name(int strategy);
/* -1 if unknown. */
int iflow_strategy_from_name(const char *name);

typedef struct {
    int n_ctx;       /* KV-cache positions per sequence (<= 0: 4096)                          */
    int batch;       /* sequences decoded together (<= 0: 1)                                  */
    int objective;   /* IFLOW_OBJ_*: what auto and hybrid's factorization minimize/maximize   */
} iflow_partition_opts;

typedef struct {
    uint64_t weights, kv, scratch, total, capacity;   /* bytes on one device */
} iflow_partition_mem;

typedef struct {
    int    n_devices;                                  /* the plan's                            */
    char   device[IFLOW_PLAN_MAX_DEVICES][32];         /* each plan device's description name   */
    iflow_partition_mem mem[IFLOW_PLAN_MAX_DEVICES];  /* per plan device                       */
    uint64_t mem_max;                                 /* the largest total                     */
    int    fits;                                      /* every total <= capacity               */
    int    short_device;                              /* the first that does not fit, or -1    */
    uint64_t short_bytes;                             /* what it lacks                         */
    int    groups, heads_split;                       /* layout: layer groups x head groups    */
    int    n_stages;                                  /* pipeline stages (distinct device sets) */
    int    sequences;                                 /* whose KV cache is counted              */
    /* decode step (one token of each of `batch` sequences), seconds: */
    double t_read;       /* per layer, the slowest part's max(bytes / (bandwidth x efficiency), flop /
                          * FLOP/s) (CPU parts together: at most the host's bandwidth), summed        */
    double t_fixed;      /* per layer, the largest overhead of the devices holding it, summed           */
    double t_allreduce;  /* 2 ring all-reduces per split layer                                     */
    double t_transfer;   /* hidden state across layer-range boundaries                             */
    double t_output;     /* final norm and output matrix                                           */
    double latency;      /* the sum: seconds per decode step                                      */
    double stage_max;    /* the slowest pipeline stage                                             */
    double tokens_per_s; /* batch / stage_max: throughput with every stage busy                    */
} iflow_partition_cost;

int iflow_partition_make(iflow_plan *plan, iflow_partition_cost *cost, const iflow_model_shape *m,
                         const iflow_machine *mc, int strategy, const iflow_partition_opts *o);

/* Memory and time of a plan whose devices are named in mc. IFLOW_EINVAL when it does not fit
 * the model (iflow_plan_check) or names a device mc lacks. cost->fits says whether it fits. */
int iflow_partition_cost_of(iflow_partition_cost *cost, const iflow_plan *plan, const iflow_model_shape *m,
                            const iflow_machine *mc, const iflow_partition_opts *o);

#endif
