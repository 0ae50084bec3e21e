/*
 * comm.h -- one model over several processes: the communication a forward pass needs.
 *
 * Contract
 *   With a partition plan of N devices run as N processes (mpirun -np N iflow-run --plan ...),
 *   process r computes the layer parts of plan device r and nothing else; every process has
 *   the same placement, runs the same engine loop on the same requests, and sees the same
 *   logits, so their samplers draw the same tokens. What crosses between processes:
 *     - the hidden state of a step's rows, sent from the process that computed the last layer
 *       to the one that computes the next (layer partition: pipeline boundaries);
 *     - for a layer split over several devices, the state broadcast to all, and each sub-block's
 *       partial outputs summed over all processes (all-reduce; a process without a part of
 *       that layer adds zeros);
 *     - the logits (or the argmax ids) of the step, broadcast from the output device's process.
 *   The state and the partial outputs cross from and into a GPU's memory when the comm takes
 *   device memory (device_buffers), else through the host.
 *   Each process may open only what its device computes (iflow_model_open_device: of a split
 *   model, its own file); iflow_ctx_set_comm checks that all run the same model.
 *   An iflow_comm is a vtable over a transport: MPI between processes (cmd/comm_mpi.c), or
 *   memory shared by threads (iflow_comm_local_open below: the processes of a plan as threads of
 *   one process), or NCCL between GPUs (iflow_comm_nccl_open, bootstrapped over MPI). A plan run
 *   in one process without a comm shares host memory instead (forward.c's split_block).
 *   Each op returns 0 or a negative IFLOW_E* code with the message set; every process must
 *   call the same ops in the same order (the forward pass guarantees it).
 */
#ifndef IFLOW_COMM_H
#define IFLOW_COMM_H

#include <stddef.h>

typedef struct iflow_comm iflow_comm;

typedef struct {
    int (*bcast)(iflow_comm *c, void *buf, size_t bytes, int root);
    int (*allreduce_sum)(iflow_comm *c, float *buf, size_t n);   /* buf [n] += every process's */
    int (*send)(iflow_comm *c, const void *buf, size_t bytes, int to);
    int (*recv)(iflow_comm *c, void *buf, size_t bytes, int from);
} iflow_comm_ops;

struct iflow_comm {
    const iflow_comm_ops *ops;
    int rank, size;
    int device_buffers;   /* 1: the ops also take this process's device memory (NCCL; threads
                           * sharing memory), so a GPU's state is exchanged where it is; 0: host
                           * memory only (MPI) */
    void *impl;
};

/* A communicator over NCCL for this process's GPU (a CUDA device: libcore/device/cuda.c, over
 * kernels/cuda/nccl.cu), as rank boot->rank of boot->size: boot (MPI) carries NCCL's unique id
 * from rank 0 and the agreement that every rank could start NCCL, so that none is left waiting.
 * boot NULL: rank 0 of 1 (a one-device plan through the same path). Its ops take the GPU's
 * memory in place (device_buffers: the forward pass keeps the state there) and host memory
 * staged through the GPU. IFLOW_EUNSUPPORTED for a device that is not a GPU or a build without
 * CUDA; IFLOW_ENOTFOUND when libnccl.so.2 does not load. */
struct iflow_device;
int  iflow_comm_nccl_open(iflow_comm **out, struct iflow_device *gpu, iflow_comm *boot);
void iflow_comm_nccl_close(iflow_comm *c);

/* n communicators between threads of this process: comms[r] is rank r's, for the thread that
 * plays process r. Collectives wait for all n ranks, a send for its receiver; allreduce_sum adds
 * the ranks' buffers in rank order, so every rank gets the same bits (those of the in-process
 * plan when its parts are in rank order). Close once, after every thread is done. */
int  iflow_comm_local_open(iflow_comm **comms, int n);
void iflow_comm_local_close(iflow_comm **comms, int n);

#endif
