/* device.cu -- devices, memory, copies, error messages. See cuda_kernels.h and common.cuh. */
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/common.cuh"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __thread char errmsg[512];

const char *ifkc_errmsg(void) { return errmsg; }

int ifkc_seterr(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

void *ifkc_dl_open(const char *what, const char *env_var, const char *const *paths, int n, char *why, size_t cap)
{
    const char *env = getenv(env_var);
    void *lib = NULL;
    if (env && *env)
        lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    for (int i = 0; !lib && !(env && *env) && i < n; i++)
        lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, cap, "cannot load %s (%s): %s", what, paths[0], e ? e : "not found");
    }
    return lib;
}

int ifkc_dl_sym(void *lib, const char *what, const char *soname, const char *name, void **slot, char *why, size_t cap)
{
    dlerror();
    *slot = dlsym(lib, name);
    if (!*slot)
        snprintf(why, cap, "cannot load %s: %s has no %s", what, soname, name);
    return *slot != NULL;
}

int ifkc_cuda_err(cudaError_t e, const char *what)
{
    int code = IFKC_ECUDA;
    if (e == cudaErrorMemoryAllocation)
        code = IFKC_ENOMEM;
    else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
        code = IFKC_ENODEV;
    cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */
    return ifkc_seterr(code, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int ifkc_blas_err(cublasStatus_t s, const char *what)
{
    int code = s == CUBLAS_STATUS_ALLOC_FAILED ? IFKC_ENOMEM : IFKC_ECUDA;
    const ifkc_blas_api *b = ifkc_blas(); /* loaded: a status comes from a call through it */
    return ifkc_seterr(code, "%s: %s: %s", what, b ? b->status_name(s) : "cublas error",
                       b ? b->status_string(s) : "");
}

int ifkc_device_count(int *n)
{
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e == cudaErrorInsufficientDriver) {
        *n = 0;
        cudaGetLastError();
        return ifkc_seterr(IFKC_ENODEV, "no CUDA driver (libcuda.so is missing or older than the CUDA %d.%d runtime)",
                           CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && *n == 0)) {
        *n = 0;
        cudaGetLastError();
        return ifkc_seterr(IFKC_ENODEV, "no CUDA-capable device");
    }
    if (e != cudaSuccess) {
        *n = 0;
        return ifkc_cuda_err(e, "cudaGetDeviceCount");
    }
    return 0;
}

int ifkc_device_info_get(int index, ifkc_device_info *out)
{
    int n;
    int rc = ifkc_device_count(&n);
    memset(out, 0, sizeof *out);
    if (rc)
        return rc;
    if (index < 0 || index >= n)
        return ifkc_seterr(IFKC_ENODEV, "no device cuda:%d (%d device%s)", index, n, n == 1 ? "" : "s");
    cudaDeviceProp p;
    IFKC_CK(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
    snprintf(out->name, sizeof out->name, "%.95s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess)
        out->mem_bw_peak = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0); /* double data rate */
    cudaGetLastError();
    IFKC_CK(cudaRuntimeGetVersion(&out->runtime_version), "cudaRuntimeGetVersion");
    IFKC_CK(cudaDriverGetVersion(&out->driver_version), "cudaDriverGetVersion");
    int cur;
    IFKC_CK(cudaGetDevice(&cur), "cudaGetDevice");
    IFKC_CK(cudaSetDevice(index), "cudaSetDevice");
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    cudaSetDevice(cur);
    if (e != cudaSuccess)
        return ifkc_cuda_err(e, "cudaMemGetInfo");
    out->mem_free = fr;
    out->mem_total = tot;
    return 0;
}

int ifkc_open(ifkc_dev **out, int index)
{
    *out = NULL;
    ifkc_device_info info;
    int rc = ifkc_device_info_get(index, &info);
    if (rc)
        return rc;
    const ifkc_blas_api *blas = ifkc_blas();
    if (!blas)
        return IFKC_ENODEV;
    ifkc_dev *d = (ifkc_dev *)calloc(1, sizeof *d);
    if (!d)
        return ifkc_seterr(IFKC_ENOMEM, "out of host memory");
    d->index = index;
    d->sm_count = info.sm_count;
    d->cc = info.cc_major * 10 + info.cc_minor;
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(d);
        return ifkc_cuda_err(e, "opening cuda device");
    }
    e = cudaMalloc((void **)&d->pos_dev, sizeof(int));
    if (e != cudaSuccess) {
        cudaStreamDestroy(d->stream);
        free(d);
        return ifkc_cuda_err(e, "cudaMalloc of the step position");
    }
    cublasStatus_t s = blas->create(&d->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = blas->set_stream(d->blas, d->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        rc = ifkc_blas_err(s, "cublasCreate");
        if (d->blas)
            blas->destroy(d->blas);
        cudaFree(d->pos_dev);
        cudaStreamDestroy(d->stream);
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

int ifkc_set_overlap(ifkc_dev *d, int on)
{
    on = on && d->cc >= 90;
    if (on != d->overlap)
        d->scratch_gen++; /* recorded steps were launched the other way */
    d->overlap = on;
    return on;
}

void ifkc_close(ifkc_dev *d)
{
    if (!d)
        return;
    cudaSetDevice(d->index);
    ifkc_graph_abort(d);
    cudaStreamSynchronize(d->stream);
    if (d->graph)
        cudaGraphExecDestroy(d->graph);
    for (int i = 0; i < IFKC_GRAPH_SLOTS; i++)
        if (d->at[i].exec)
            cudaGraphExecDestroy(d->at[i].exec);
    for (int i = 0; i < IFKC_SCRATCH_N_; i++)
        cudaFree(d->scratch[i]);
    cudaFree(d->pos_dev);
    for (int i = 0; i < IFKC_MARKS; i++)
        if (d->mark[i])
            cudaEventDestroy(d->mark[i]);
    ifkc_blas()->destroy(d->blas); /* loaded: the handle was opened through it */
    cudaStreamDestroy(d->stream);
    free(d);
}

static void human(char *buf, size_t n, size_t bytes)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, n, "%.1f GiB", bytes / 1073741824.0);
    else if (bytes >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else
        snprintf(buf, n, "%zu bytes", bytes);
}

int ifkc_malloc(ifkc_dev *d, void **p, size_t nbytes)
{
    *p = NULL;
    IFKC_CK(cudaSetDevice(d->index), "cudaSetDevice");
    cudaError_t e = cudaMalloc(p, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        char h[32], what[96];
        human(h, sizeof h, nbytes);
        snprintf(what, sizeof what, "cudaMalloc of %s on cuda:%d", h, d->index);
        *p = NULL;
        return ifkc_cuda_err(e, what);
    }
    return 0;
}

void ifkc_free(ifkc_dev *d, void *p)
{
    if (p) {
        cudaSetDevice(d->index);
        cudaFree(p);
    }
}

/* The operations that wait for the device refuse while a graph is recorded (see ifkc_graph_begin). */
static int refuse_recording(const ifkc_dev *d, const char *what)
{
    return ifkc_seterr(IFKC_EUNSUPPORTED, "%s on cuda:%d while a graph is recorded", what, d->index);
}

int ifkc_scratch(ifkc_dev *d, int slot, size_t nbytes, void **p)
{
    if (d->scratch_bytes[slot] < nbytes) {
        if (d->recording) { /* grown when the recording is dropped (ifkc_graph_abort) */
            if (d->scratch_want[slot] < nbytes)
                d->scratch_want[slot] = nbytes;
            return refuse_recording(d, "a scratch buffer that grows");
        }
        d->scratch_gen++; /* a positional graph that used the old buffer no longer holds */
        /* Kernels still queued may read the old buffer: wait before freeing it. */
        IFKC_CK(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize");
        cudaFree(d->scratch[slot]);
        d->scratch[slot] = NULL;
        d->scratch_bytes[slot] = 0;
        int rc = ifkc_malloc(d, &d->scratch[slot], nbytes);
        if (rc)
            return rc;
        d->scratch_bytes[slot] = nbytes;
    }
    *p = d->scratch[slot];
    return 0;
}

int ifkc_memset0(ifkc_dev *d, void *p, size_t nbytes)
{
    d->seq++;
    IFKC_CK(cudaMemsetAsync(p, 0, nbytes, d->stream), "cudaMemsetAsync");
    return 0;
}

int ifkc_upload(ifkc_dev *d, void *dst, const void *src, size_t nbytes)
{
    if (d->recording)
        return refuse_recording(d, "an upload");
    /* From pageable memory the copy is staged by the driver and the call returns when src may
     * be reused; the stream orders it with the kernels around it. */
    d->seq++;
    IFKC_CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, d->stream), "cudaMemcpy host to device");
    IFKC_CK(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize after upload");
    return 0;
}

int ifkc_download(ifkc_dev *d, void *dst, const void *src, size_t nbytes)
{
    if (d->recording)
        return refuse_recording(d, "a download");
    IFKC_CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, d->stream), "cudaMemcpy device to host");
    IFKC_CK(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize after download");
    return 0;
}

int ifkc_copy(ifkc_dev *d, void *dst, const void *src, size_t nbytes)
{
    d->seq++;
    IFKC_CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, d->stream), "cudaMemcpy device to device");
    return 0;
}

int ifkc_make_current(ifkc_dev *d)
{
    IFKC_CK(cudaSetDevice(d->index), "cudaSetDevice");
    return 0;
}

int ifkc_sync(ifkc_dev *d)
{
    if (d->recording)
        return refuse_recording(d, "a wait");
    IFKC_CK(cudaStreamSynchronize(d->stream), "cudaStreamSynchronize");
    return 0;
}

int ifkc_mark(ifkc_dev *d, int slot)
{
    if (slot < 0 || slot >= IFKC_MARKS)
        return ifkc_seterr(IFKC_EINVAL, "mark %d of cuda:%d is not one of 0..%d", slot, d->index, IFKC_MARKS - 1);
    if (!d->mark[slot])
        IFKC_CK(cudaEventCreate(&d->mark[slot]), "cudaEventCreate");
    IFKC_CK(cudaEventRecord(d->mark[slot], d->stream), "cudaEventRecord");
    return 0;
}

int ifkc_marks_ms(ifkc_dev *d, int a, int b, float *ms)
{
    if (a < 0 || a >= IFKC_MARKS || b < 0 || b >= IFKC_MARKS || !d->mark[a] || !d->mark[b])
        return ifkc_seterr(IFKC_EINVAL, "marks %d and %d of cuda:%d were not both made", a, b, d->index);
    if (d->recording)
        return refuse_recording(d, "a wait");
    IFKC_CK(cudaEventSynchronize(d->mark[b]), "cudaEventSynchronize");
    IFKC_CK(cudaEventElapsedTime(ms, d->mark[a], d->mark[b]), "cudaEventElapsedTime");
    return 0;
}

/* ---- recording (CUDA graphs) --------------------------------------------------------------------
 * Stream capture in thread-local mode: this thread's calls that are unsafe during a capture fail
 * instead of being run. Each recording is ended into a graph; the handle keeps one instantiated
 * graph (d->graph) and updates it from the new recording when the two have the same nodes
 * (cudaGraphExecUpdate: kernel arguments and grid sizes may change), else instantiates anew. */
int ifkc_graph_begin(ifkc_dev *d)
{
    if (d->recording)
        return ifkc_seterr(IFKC_EINVAL, "cuda:%d is already recording a graph", d->index);
    IFKC_CK(cudaSetDevice(d->index), "cudaSetDevice");
    IFKC_CK(cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    d->recording = 1;
    return 0;
}

/* The step position for what follows on the stream (outside any recording). */
__global__ void set_pos_kernel(int *slot, int pos) { ifkc_grid_begin(); *slot = pos; }

static int set_pos(ifkc_dev *d, int pos0)
{
    IFKC_CKL(ifkc_launch(d, set_pos_kernel, 1, 1, 0, d->pos_dev, pos0), "set_pos_kernel");
    return 0;
}

int ifkc_graph_begin_at(ifkc_dev *d, int pos0, int max_pos, unsigned long long key)
{
    if (pos0 < 0 || max_pos <= pos0)
        return ifkc_seterr(IFKC_EINVAL, "cuda:%d: position %d is not below the recording's %d", d->index, pos0, max_pos);
    if (d->recording)
        return ifkc_seterr(IFKC_EINVAL, "cuda:%d is already recording a graph", d->index);
    IFKC_CK(cudaSetDevice(d->index), "cudaSetDevice");
    int rc = set_pos(d, pos0);
    if (rc)
        return rc;
    rc = ifkc_graph_begin(d);
    if (rc)
        return rc;
    d->pos_on = 1;
    d->pos_max = max_pos;
    d->pos_key = key;
    return 0;
}

/* 1 when slot i holds no graph that can run: empty, or recorded over a scratch buffer since
 * replaced. */
static int at_void(const ifkc_dev *d, int i) { return !d->at[i].exec || d->at[i].gen != d->scratch_gen; }

/* The slot holding key's positional graph, or -1. */
static int at_find(const ifkc_dev *d, unsigned long long key)
{
    for (int i = 0; i < IFKC_GRAPH_SLOTS; i++)
        if (d->at[i].exec && d->at[i].key == key)
            return i;
    return -1;
}

int ifkc_graph_replay(ifkc_dev *d, int pos0, unsigned long long key)
{
    const int i = d->recording ? -1 : at_find(d, key);
    if (i < 0 || d->at[i].gen != d->scratch_gen || pos0 < 0 || pos0 >= d->at[i].max_pos)
        return 1;
    IFKC_CK(cudaSetDevice(d->index), "cudaSetDevice");
    int rc = set_pos(d, pos0);
    if (rc)
        return rc;
    IFKC_CK(cudaGraphLaunch(d->at[i].exec, d->stream), "cudaGraphLaunch");
    d->at[i].used = ++d->at_clock;
    d->gstats.launches++;
    d->gstats.replays++;
    return 0;
}

void ifkc_graph_abort(ifkc_dev *d)
{
    if (!d->recording)
        return;
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(d->stream, &g) == cudaSuccess && g)
        cudaGraphDestroy(g);
    cudaGetLastError(); /* the capture's failure is not the next launch's */
    d->recording = 0;
    d->pos_on = 0;
    d->gstats.aborts++;
    /* the scratch a dropped recording needed, so that the next one finds it */
    for (int i = 0; i < IFKC_SCRATCH_N_; i++) {
        void *p;
        if (d->scratch_want[i] > d->scratch_bytes[i] && ifkc_scratch(d, i, d->scratch_want[i], &p) != 0)
            break;
        d->scratch_want[i] = 0;
    }
}

int ifkc_graph_end(ifkc_dev *d)
{
    if (!d->recording)
        return ifkc_seterr(IFKC_EINVAL, "cuda:%d is not recording a graph", d->index);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(d->stream, &g);
    const int at = d->pos_on;
    d->recording = 0;
    d->pos_on = 0;
    if (e != cudaSuccess || !g) {
        cudaGetLastError();
        d->gstats.aborts++;
        return ifkc_cuda_err(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture");
    }
    /* where it goes: the plain graph, or the key's slot (else an empty one, else one recorded
     * over a scratch buffer since replaced, else the least recently used) */
    int slot = -1;
    if (at && (slot = at_find(d, d->pos_key)) < 0) {
        slot = 0;
        for (int i = 1; i < IFKC_GRAPH_SLOTS && !at_void(d, slot); i++)
            if (at_void(d, i) || d->at[i].used < d->at[slot].used)
                slot = i;
    }
    cudaGraphExec_t *exec = at ? &d->at[slot].exec : &d->graph;
    if (*exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*exec, g, &info) != cudaSuccess) {
            cudaGetLastError(); /* not the same nodes: instantiate this one */
            cudaGraphExecDestroy(*exec);
            *exec = NULL;
        }
    }
    if (!*exec) {
        e = cudaGraphInstantiate(exec, g, 0);
        if (e != cudaSuccess) {
            *exec = NULL;
            cudaGraphDestroy(g);
            return ifkc_cuda_err(e, "cudaGraphInstantiate");
        }
        d->gstats.instantiations++;
    }
    cudaGraphDestroy(g);
    if (at) {
        d->at[slot].key = d->pos_key;
        d->at[slot].gen = d->scratch_gen;
        d->at[slot].max_pos = d->pos_max;
        d->at[slot].used = ++d->at_clock;
    }
    IFKC_CK(cudaGraphLaunch(*exec, d->stream), "cudaGraphLaunch");
    d->gstats.launches++;
    return 0;
}

void ifkc_graph_stats_get(const ifkc_dev *d, ifkc_graph_stats *out) { *out = d->gstats; }
