/*
 * devices.h -- the programs' shared handling of --device, --gpu-layers, --list-devices and
 * --activations.
 *
 * devices_place() turns the options into a placement (libcore/engine/model.h) and puts the
 * model on it: --device cpu runs everything on the CPU as before; cuda or cuda:N puts the first
 * --gpu-layers layers (default: all, and then the output too) on that GPU and the rest on the
 * CPU; auto (the default) does that when a GPU can be opened and otherwise runs on the CPU,
 * saying why under -v. With a plan (--plan FILE) the model is placed as the plan says: its
 * cpu:N devices are CPU devices of one process with the plan's thread counts (default: the
 * cores shared out), cuda:N are GPUs. A split model (a directory of iflow-partition --split) is
 * placed by its own plan unless --plan gives another of the same partition. Failures die()
 * with the library's message.
 */
#ifndef IFLOW_CMD_DEVICES_H
#define IFLOW_CMD_DEVICES_H

#include "cmd/opt.h"
#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"

typedef struct {
    const char *plan;     /* a partition plan file (man iflow-plan.5), or NULL */
    const char *device;   /* "auto" (NULL too), "cpu", "cuda", "cuda:N"  */
    int gpu_layers;       /* layers on the GPU; < 0: all                 */
    int threads, n_ctx, verbose;
    int gpu_graphs;       /* IFLOW_GRAPHS_*: --gpu-graphs, --no-gpu-graphs (iflow_batch_set_graphs) */
} device_opts;

typedef struct {
    iflow_device *gpu;    /* NULL when everything runs on the CPU */
    int *layer_device;
    int n_plan_devices;   /* with a plan: its devices */
    iflow_device *plan_devices[IFLOW_PLAN_MAX_DEVICES];
} placed;

/* Place m as o says; the returned state is released with devices_release() after the model
 * is closed. */
void devices_place(const iflow_tool *t, iflow_model *m, const device_opts *o, placed *p);
void devices_release(placed *p);

/* --activations MODE: int (the default), int8, int16 or f32, how the CPU's products meet the
 * activations (iflow_kernel_set_activations: rounded per token, to int8 / int16 for quantized
 * weights and to BF16 for F16 / BF16 ones where the CPU has AVX512_BF16, or not); another MODE
 * is a usage error. DEVICES_ACTIVATIONS_OPT(id) is its entry in an option table (cmd/opt.h). */
void devices_set_activations(const iflow_tool *t, const char *mode);
#define DEVICES_ACTIVATIONS_OPT(id)                                                                \
    {id, "activations", 0, "MODE",                                                                 \
     "how the CPU's matrix products meet the activations: int (default: rounded per token, to int8 " \
     "for quantized weights (Q8 and Q4 with each token's outliers multiplied in F32, on CPUs with " \
     "AVX512_VNNI), int16 for Q6 and Q5, and to BF16 for F16 and BF16 weights on CPUs with "        \
     "AVX512_BF16; the fast path), int8 (as int, and int8 for Q6 and Q5 too: faster prefill of "   \
     "Q6 and Q5, a little less accurate), int16 (as int, but int16 for Q8 too: more accurate Q8, " \
     "slower prefill) or f32 (not rounded: the reference, slower)",                                 \
     "int int8 int16 f32"}

/* --comm KIND (auto, mpi or nccl; another is a usage error): how a plan's processes exchange
 * states. devices_comm_nccl() is the NCCL comm it asks for, or NULL to keep mpi (MPI, or no
 * comm without mpirun): auto takes NCCL when every process's device is a GPU (an all-reduce
 * over mpi, so that all agree; said under verbose), nccl insists (without mpirun: rank 0 of
 * 1). Failures exit through die(). DEVICES_COMM_OPT(id) is its option-table entry. */
void devices_check_comm(const iflow_tool *t, const char *kind);
struct iflow_comm *devices_comm_nccl(const iflow_tool *t, const char *kind, struct iflow_comm *mpi,
                                     const iflow_model *m, const placed *p, int verbose);
#define DEVICES_COMM_OPT(id)                                                                       \
    {id, "comm", 0, "KIND",                                                                        \
     "how the processes of a plan (one per device, under mpirun) exchange states: auto (NCCL when " \
     "every process's device is a GPU, else MPI), mpi or nccl; nccl without mpirun runs a "        \
     "one-device plan through NCCL (default auto)",                                                 \
     "auto mpi nccl"}

/* Print every device (--list-devices): a table, or JSON Lines with as_json. */
void devices_list(const iflow_tool *t, int as_json);

#endif
