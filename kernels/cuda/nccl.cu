/* nccl.cu -- collectives between GPUs through NCCL, loaded on first use. See cuda_kernels.h.
 *
 * libnccl.so.2 is dlopen()ed as cuBLAS is (blas.cu): linking it would make every program need it
 * to start. nccl.h gives the types and signatures only; every call goes through the table below.
 * A communicator takes device memory in place (the call is enqueued on its device's stream, in
 * order with the kernels there) and stages host memory through one device buffer: upload, the
 * NCCL call, download (which waits), so such a call returns with its result on the host. */
#include "kernels/cuda/common.cuh"

#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IFKC_TRY(expr)                                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

static_assert(IFKC_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the id size of cuda_kernels.h is NCCL's");

static struct {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*error_string)(ncclResult_t);
} api;
static int loaded;
static char why[400];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int resolve(void *lib, const char *name, void **slot)
{
    return ifkc_dl_sym(lib, "NCCL", "libnccl.so.2", name, slot, why, sizeof why);
}

static void load(void)
{
    /* IFLOW_NCCL: a path, where NCCL lives elsewhere (a pip wheel) */
    static const char *const paths[] = {"libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                                        "/usr/local/cuda/lib64/libnccl.so.2"};
    void *lib = ifkc_dl_open("NCCL", "IFLOW_NCCL", paths, 3, why, sizeof why);
    if (!lib)
        return;
    loaded = resolve(lib, "ncclGetUniqueId", (void **)&api.get_unique_id) &&
             resolve(lib, "ncclCommInitRank", (void **)&api.init_rank) &&
             resolve(lib, "ncclCommDestroy", (void **)&api.destroy) &&
             resolve(lib, "ncclBroadcast", (void **)&api.broadcast) &&
             resolve(lib, "ncclAllReduce", (void **)&api.all_reduce) &&
             resolve(lib, "ncclSend", (void **)&api.send) && resolve(lib, "ncclRecv", (void **)&api.recv) &&
             resolve(lib, "ncclGetErrorString", (void **)&api.error_string);
}

int ifkc_nccl_available(void)
{
    pthread_once(&once, load);
    return loaded ? 0 : ifkc_seterr(IFKC_ENODEV, "%s", why);
}

static int nccl_err(ncclResult_t r, const char *what)
{
    return ifkc_seterr(r == ncclInvalidArgument || r == ncclInvalidUsage ? IFKC_EINVAL : IFKC_ECUDA, "%s: %s", what,
                       api.error_string(r));
}

#define NCCL_CK(expr, what)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (expr);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return nccl_err(r_, what);                                                             \
    } while (0)

struct ifkc_nccl {
    ifkc_dev *dev;
    ncclComm_t comm;
    int rank, size;
    void *stage;        /* device memory of `cap` bytes */
    size_t cap;
};

int ifkc_nccl_id(void *id)
{
    IFKC_TRY(ifkc_nccl_available());
    ncclUniqueId u;
    NCCL_CK(api.get_unique_id(&u), "ncclGetUniqueId");
    memcpy(id, u.internal, sizeof u.internal);
    return 0;
}

int ifkc_nccl_open(ifkc_nccl **out, ifkc_dev *d, int rank, int size, const void *id)
{
    *out = NULL;
    IFKC_TRY(ifkc_nccl_available());
    if (size < 1 || rank < 0 || rank >= size)
        return ifkc_seterr(IFKC_EINVAL, "rank %d of %d", rank, size);
    ifkc_nccl *c = (ifkc_nccl *)calloc(1, sizeof *c);
    if (!c)
        return ifkc_seterr(IFKC_ENOMEM, "out of host memory");
    c->dev = d, c->rank = rank, c->size = size;
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    int rc = ifkc_make_current(d);
    ncclResult_t r = rc ? ncclSuccess : api.init_rank(&c->comm, size, u, rank);
    if (rc == 0 && r != ncclSuccess)
        rc = nccl_err(r, "ncclCommInitRank");
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void ifkc_nccl_close(ifkc_nccl *c)
{
    if (!c)
        return;
    if (ifkc_make_current(c->dev) == 0) {
        api.destroy(c->comm);
        cudaFree(c->stage);
    }
    free(c);
}

/* A device buffer of n bytes, on c's device made current. */
static int stage(ifkc_nccl *c, size_t n)
{
    IFKC_TRY(ifkc_make_current(c->dev));
    c->dev->seq++; /* NCCL writes buffers */
    if (n <= c->cap)
        return 0;
    cudaFree(c->stage);
    c->stage = NULL, c->cap = 0;
    IFKC_CK(cudaMalloc(&c->stage, n), "cudaMalloc of the NCCL staging buffer");
    c->cap = n;
    return 0;
}

/* 1 if p is device memory (NCCL takes it in place), 0 for host memory (staged). */
static int on_device(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* plain host memory on older runtimes */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int ifkc_nccl_bcast(ifkc_nccl *c, void *buf, size_t bytes, int root)
{
    IFKC_TRY(ifkc_make_current(c->dev));
    c->dev->seq++; /* NCCL writes buffers */
    if (on_device(buf)) {
        NCCL_CK(api.broadcast(buf, buf, bytes, ncclUint8, root, c->comm, c->dev->stream), "ncclBroadcast");
        return 0;
    }
    IFKC_TRY(stage(c, bytes));
    if (c->rank == root)
        IFKC_TRY(ifkc_upload(c->dev, c->stage, buf, bytes));
    NCCL_CK(api.broadcast(c->stage, c->stage, bytes, ncclUint8, root, c->comm, c->dev->stream), "ncclBroadcast");
    return ifkc_download(c->dev, buf, c->stage, bytes);
}

int ifkc_nccl_allreduce_sum(ifkc_nccl *c, float *buf, size_t n)
{
    IFKC_TRY(ifkc_make_current(c->dev));
    c->dev->seq++; /* NCCL writes buffers */
    if (on_device(buf)) {
        NCCL_CK(api.all_reduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, c->dev->stream), "ncclAllReduce");
        return 0;
    }
    IFKC_TRY(stage(c, n * sizeof *buf));
    IFKC_TRY(ifkc_upload(c->dev, c->stage, buf, n * sizeof *buf));
    NCCL_CK(api.all_reduce(c->stage, c->stage, n, ncclFloat32, ncclSum, c->comm, c->dev->stream), "ncclAllReduce");
    return ifkc_download(c->dev, buf, c->stage, n * sizeof *buf);
}

int ifkc_nccl_send(ifkc_nccl *c, const void *buf, size_t bytes, int peer)
{
    IFKC_TRY(ifkc_make_current(c->dev));
    c->dev->seq++; /* NCCL writes buffers */
    if (on_device(buf)) {
        NCCL_CK(api.send(buf, bytes, ncclUint8, peer, c->comm, c->dev->stream), "ncclSend");
        return 0;
    }
    IFKC_TRY(stage(c, bytes));
    IFKC_TRY(ifkc_upload(c->dev, c->stage, buf, bytes));
    NCCL_CK(api.send(c->stage, bytes, ncclUint8, peer, c->comm, c->dev->stream), "ncclSend");
    return ifkc_sync(c->dev);
}

int ifkc_nccl_recv(ifkc_nccl *c, void *buf, size_t bytes, int peer)
{
    IFKC_TRY(ifkc_make_current(c->dev));
    c->dev->seq++; /* NCCL writes buffers */
    if (on_device(buf)) {
        NCCL_CK(api.recv(buf, bytes, ncclUint8, peer, c->comm, c->dev->stream), "ncclRecv");
        return 0;
    }
    IFKC_TRY(stage(c, bytes));
    NCCL_CK(api.recv(c->stage, bytes, ncclUint8, peer, c->comm, c->dev->stream), "ncclRecv");
    return ifkc_download(c->dev, buf, c->stage, bytes);
}
