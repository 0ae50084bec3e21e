/* emu.cc -- the CUDA runtime of the CPU emulation: devices, memory, streams and their
 * recordings, events, launches, and the fibers that run a block's threads. The contract is
 * cuda_emu.h's. */
#include "cuda_emu.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include <map>
#include <string>
#include <mutex>
#include <vector>

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

/* ---- errors ---------------------------------------------------------------------------------- */

static thread_local cudaError_t last_error = cudaSuccess;

static cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

static const struct {
    cudaError_t e;
    const char *name, *text;
} error_names[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
};

static const char *error_text(cudaError_t e, bool name)
{
    for (const auto &n : error_names)
        if (n.e == e)
            return name ? n.name : n.text;
    return name ? "cudaErrorUnknown" : "unknown error";
}

const char *cudaGetErrorName(cudaError_t e) { return error_text(e, true); }

const char *cudaGetErrorString(cudaError_t e) { return error_text(e, false); }

/* ---- devices ----------------------------------------------------------------------------------- */

/* What an H200 has, which the launch checks and the properties both say. */
enum { SM_COUNT = 132, MAX_THREADS = 1024, SMEM_DEFAULT = 48 << 10, SMEM_OPTIN = 227 << 10 };

static int env_int(const char *name, long long lo, long long hi, long long dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return (int)dflt;
    char *end;
    long long v = strtoll(s, &end, 10);
    return *end || v < lo || v > hi ? (int)dflt : (int)v;
}

/* The environment is read at the first call. */
static int n_devices(void)
{
    static const int n = env_int("IFLOW_EMU_DEVICES", 0, 16, 1);
    return n;
}

static size_t read_mem_limit(void)
{
    const char *s = getenv("IFLOW_EMU_MEM");
    unsigned long long v = s && *s ? strtoull(s, NULL, 10) : 0;
    return v ? (size_t)v : (size_t)8 << 30;
}

static size_t mem_limit(void)
{
    static const size_t limit = read_mem_limit();
    return limit;
}

static thread_local int current = 0;

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = n_devices();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

static bool bad_device(int dev) { return dev < 0 || dev >= n_devices(); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    if (bad_device(dev))
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "iflow CUDA emulator");
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = SM_COUNT;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev)
{
    if (bad_device(dev))
        return fail(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMemoryClockRate: *v = 2619000; return cudaSuccess; /* kHz: an H200's HBM3e */
    case cudaDevAttrGlobalMemoryBusWidth: *v = 6144; return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
    *dev = current;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
    if (bad_device(dev))
        return fail(cudaErrorInvalidDevice);
    current = dev;
    return cudaSuccess;
}

/* ---- recordings ------------------------------------------------------------------------------- */

struct emu_graph {
    std::vector<std::function<void()>> ops;
    bool invalid; /* an operation the recording does not allow was called during it */
};

/* The stream this thread is capturing, or NULL: while it is, the calls a capture forbids (they
 * would wait for the device) fail and spoil the capture. */
static thread_local emu_stream *capturing;

static cudaError_t forbidden_in_capture(void)
{
    if (capturing)
        capturing->capture->invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
}

void emu::enqueue(cudaStream_t s, std::function<void()> op)
{
    if (s && s->capture)
        s->capture->ops.push_back(std::move(op));
    else
        op();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    *s = new emu_stream{emu::enqueue, current, NULL};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return fail(cudaErrorInvalidResourceHandle);
    if (s->capture) {
        delete s->capture;
        if (capturing == s)
            capturing = NULL;
    }
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    return capturing ? forbidden_in_capture() : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return capturing ? forbidden_in_capture() : cudaSuccess; }

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    if (!s || s->capture)
        return fail(!s ? cudaErrorStreamCaptureUnsupported : cudaErrorIllegalState);
    s->capture = new emu_graph{{}, false};
    capturing = s;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    if (!s || !s->capture)
        return fail(cudaErrorIllegalState);
    emu_graph *r = s->capture;
    s->capture = NULL;
    capturing = NULL;
    if (r->invalid) {
        delete r;
        *g = NULL;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = r;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    if (!g)
        return fail(cudaErrorInvalidValue);
    *e = new emu_graph{g->ops, false};
    return cudaSuccess;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info)
{
    if (!e || !g)
        return fail(cudaErrorInvalidValue);
    e->ops = g->ops;
    if (info)
        *info = {cudaGraphExecUpdateSuccess, NULL, NULL};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    if (!e)
        return fail(cudaErrorInvalidValue);
    if (s && s->capture)
        return forbidden_in_capture();
    for (auto &op : e->ops)
        op();
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------------------------ */

struct emu_event {
    double ms;
};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new emu_event{0};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    emu::enqueue(s, [e]() { e->ms = now_ms(); });
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) { return capturing ? forbidden_in_capture() : cudaSuccess; }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------------------------ */

struct allocation {
    size_t bytes;
    int dev;
};
static std::mutex mem_mu;
static std::map<uintptr_t, allocation> allocations; /* by first byte */
static size_t used[16];

/* The allocation holding [p, p + n), or NULL. */
static const allocation *device_range(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it == allocations.begin())
        return NULL;
    --it;
    if ((uintptr_t)p + n > it->first + it->second.bytes)
        return NULL;
    return &it->second;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = NULL;
    if (capturing)
        return forbidden_in_capture();
    std::lock_guard<std::mutex> g(mem_mu);
    if (n > mem_limit() - used[current])
        return fail(cudaErrorMemoryAllocation);
    void *q = NULL;
    if (posix_memalign(&q, 256, n ? n : 1))
        return fail(cudaErrorMemoryAllocation);
    memset(q, 0xff, n); /* device memory starts as garbage: a float read before written is NaN */
    allocations[(uintptr_t)q] = {n ? n : 1, current};
    used[current] += n;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    if (capturing)
        return forbidden_in_capture();
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end())
        return fail(cudaErrorInvalidValue);
    used[it->second.dev] -= it->second.bytes;
    allocations.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    std::lock_guard<std::mutex> g(mem_mu);
    *total_b = mem_limit();
    *free_b = mem_limit() - used[current];
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    const allocation *al = p ? device_range(p, 1) : NULL;
    memset(a, 0, sizeof *a);
    a->type = al ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    a->device = al ? al->dev : -1;
    a->devicePointer = al ? (void *)p : NULL;
    a->hostPointer = al ? NULL : (void *)p;
    return cudaSuccess;
}

/* A copy's ends must be what its kind says: the device side inside one allocation. */
static bool copy_ok(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    const bool dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const bool sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    return n == 0 || ((!dd || device_range(dst, n)) && (!sd || device_range(src, n)));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    if (capturing)
        return forbidden_in_capture();
    if (!copy_ok(dst, src, n, k))
        return fail(cudaErrorInvalidValue);
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s)
{
    if (!copy_ok(dst, src, n, k))
        return fail(cudaErrorInvalidValue);
    emu::enqueue(s, [=]() { memmove(dst, src, n); });
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
    if (n && !device_range(dst, n))
        return fail(cudaErrorInvalidValue);
    emu::enqueue(s, [=]() { memset(dst, v, n); });
    return cudaSuccess;
}

/* ---- launches ---------------------------------------------------------------------------------- */

static std::mutex attr_mu;
static std::map<const void *, int> dyn_smem_limit; /* cudaFuncSetAttribute's */

cudaError_t emu_func_set_attribute(const void *fn, cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > SMEM_OPTIN)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(attr_mu);
    dyn_smem_limit[fn] = v;
    return cudaSuccess;
}

int emu::launch_ok(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
        fail(cudaErrorInvalidConfiguration);
        return 0;
    }
    size_t limit = SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> g(attr_mu);
        auto it = dyn_smem_limit.find(fn);
        if (it != dyn_smem_limit.end())
            limit = (size_t)it->second;
    }
    if (smem > limit) {
        fail(cudaErrorInvalidValue);
        return 0;
    }
    return 1;
}

/* A block's threads as fibers. A fiber runs until it waits at a barrier or returns; when every
 * fiber waits or has returned, the barriers whose threads have all arrived let them go.
 *
 * The switch between the scheduler and a fiber is emu_switch (x86-64 assembly below: the
 * callee-saved registers onto the old stack, then the new stack's off it; the floating-point
 * control words are left alone, as no kernel changes them), since ucontext's swapcontext costs a
 * system call each time (the signal mask) and a block's threads switch at every barrier and
 * shuffle. Under AddressSanitizer each switch is announced to it
 * (__sanitizer_start/finish_switch_fiber). */
extern "C" void emu_switch(void **save_sp, void *load_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
static inline void __sanitizer_start_switch_fiber(void **, const void *, size_t) {}
static inline void __sanitizer_finish_switch_fiber(void *, const void **, size_t *) {}
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

namespace {
enum { F_RUN, F_WARP, F_BLOCK, F_DONE };
struct fiber {
    void *sp;       /* saved stack pointer while switched out */
    int state;
    bool began;     /* called cudaGridDependencySynchronize */
    unsigned shfl;  /* shuffles reached so far: the exchange buffer of the next one (odd,
                     * even), and whether the lane gave a value to a given one */
};
struct block_run {
    const char *name;
    bool overlap;         /* an overlapped launch: every thread must call cudaGridDependencySynchronize */
    std::function<void()> *body;
    int n;                /* threads */
    int cur;              /* the fiber running */
    fiber *f;
    void *sched_sp;       /* the scheduler's, while a fiber runs */
    const void *sched_bottom;
    size_t sched_size;
    void *dyn;
    uint64_t xch[2][MAX_THREADS]; /* the shuffles' values, by thread: odd and even shuffles apart, so that
                            * one barrier a shuffle is enough (a lane cannot write a buffer
                            * again before every lane has passed the next shuffle's barrier) */
};
thread_local block_run *B;

const size_t STACK = (size_t)256 << 10;
thread_local std::vector<char *> stacks;

/* From a fiber to the scheduler; back when the scheduler switches to it again. */
void to_scheduler(fiber &me, bool done)
{
    void *fake = NULL;
    __sanitizer_start_switch_fiber(done ? NULL : &fake, B->sched_bottom, B->sched_size);
    emu_switch(&me.sp, B->sched_sp);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
}

extern "C" void fiber_entry(void)
{
    __sanitizer_finish_switch_fiber(NULL, &B->sched_bottom, &B->sched_size);
    (*B->body)();
    fiber &me = B->f[B->cur];
    if (B->overlap && !me.began) {
        fprintf(stderr,
                "cuda emulator: %s, launched to overlap the kernel before it (programmatic stream serialization): "
                "thread %d of block (%u, %u, %u) returned without cudaGridDependencySynchronize()\n",
                B->name, B->cur, blockIdx.x, blockIdx.y, blockIdx.z);
        abort();
    }
    me.state = F_DONE;
    to_scheduler(me, true); /* never resumed */
    abort();
}

/* A fiber that starts at fiber_entry on stack st: what emu_switch pops, then the return address. */
void fiber_init(fiber &f, char *st, int t)
{
    /* a stack used by an earlier fiber keeps the redzones of the frames it left without returning
     * (fiber_entry's and its last switch's, at the top): clean for AddressSanitizer */
    ASAN_UNPOISON_MEMORY_REGION(st + STACK - (16 << 10), 16 << 10);
    /* the stacks' tops 64 bytes apart modulo a page, not all in one set of the L1 cache */
    uintptr_t top = ((uintptr_t)(st + STACK - 64 * (t % 64)) & ~(uintptr_t)15) - 8; /* at entry, rsp % 16 == 8 */
    void **sp = (void **)top;
    *--sp = (void *)fiber_entry;
    for (int i = 0; i < 6; i++)
        *--sp = NULL; /* rbp rbx r12 r13 r14 r15 */
    f.sp = sp;
    f.state = F_RUN;
    f.began = false;
    f.shfl = 0;
}

/* From the scheduler into fiber t until it waits or returns. */
void resume(block_run &b, int t)
{
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, stacks[t], STACK);
    emu_switch(&b.sched_sp, b.f[t].sp);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
}

void wait_at(int state)
{
    fiber &me = B->f[B->cur];
    me.state = state;
    to_scheduler(me, false);
}

bool reverse_order(void)
{
    static const bool r = getenv("IFLOW_EMU_ORDER") && !strcmp(getenv("IFLOW_EMU_ORDER"), "reverse");
    return r;
}

void set_thread(int t)
{
    threadIdx.x = t % blockDim.x;
    threadIdx.y = t / blockDim.x % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

[[noreturn]] void deadlock(const block_run &b)
{
    int warp = 0, blk = 0, done = 0;
    for (int t = 0; t < b.n; t++)
        warp += b.f[t].state == F_WARP, blk += b.f[t].state == F_BLOCK, done += b.f[t].state == F_DONE;
    fprintf(stderr,
            "cuda emulator: deadlock in %s, block (%u, %u, %u) of %d threads: %d wait at __syncthreads, %d at a "
            "warp barrier (__syncwarp or a shuffle), %d returned\n",
            b.name, blockIdx.x, blockIdx.y, blockIdx.z, b.n, blk, warp, done);
    abort();
}

/* Warp w's lanes until each has returned or waits at __syncthreads. The warp's own barriers
 * (__syncwarp, shuffles) let its lanes go as soon as all its live lanes have reached one; a warp
 * whose lanes wait at both kinds can never go on (a deadlock on the GPU too). */
void run_warp(block_run &b, int w, bool rev)
{
    const int t0 = w * 32, t1 = b.n < t0 + 32 ? b.n : t0 + 32;
    for (;;) {
        int at_warp = 0, live = 0;
        for (int i = 0; i < t1 - t0; i++) {
            const int t = rev ? t1 - 1 - i : t0 + i;
            fiber &f = b.f[t];
            if (f.state == F_RUN) {
                b.cur = t;
                set_thread(t);
                resume(b, t);
            }
            at_warp += f.state == F_WARP;
            live += f.state != F_DONE;
        }
        if (at_warp == 0)
            return;
        if (at_warp < live)
            deadlock(b);
        for (int t = t0; t < t1; t++)
            if (b.f[t].state == F_WARP)
                b.f[t].state = F_RUN;
    }
}

void run_block(block_run &b)
{
    for (int t = 0; t < b.n; t++)
        fiber_init(b.f[t], stacks[t], t);
    const bool rev = reverse_order();
    const int nw = (b.n + 31) / 32;
    for (;;) {
        for (int i = 0; i < nw; i++)
            run_warp(b, rev ? nw - 1 - i : i, rev);
        bool waiting = false; /* at __syncthreads: all of them now */
        for (int t = 0; t < b.n; t++)
            if (b.f[t].state == F_BLOCK)
                b.f[t].state = F_RUN, waiting = true;
        if (!waiting)
            return;
    }
}

std::mutex launch_mu; /* one grid at a time: __shared__ arrays are static */

void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, bool overlap, std::function<void()> &body)
{
    std::lock_guard<std::mutex> g(launch_mu);
    const int n = (int)(block.x * block.y * block.z);
    while ((int)stacks.size() < n) {
        void *s = mmap(NULL, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (s == MAP_FAILED) {
            fprintf(stderr, "cuda emulator: cannot map a fiber's stack\n");
            abort();
        }
        stacks.push_back((char *)s);
    }
    std::vector<fiber> fibers((size_t)n);
    block_run b;
    b.name = name, b.overlap = overlap, b.body = &body, b.n = n, b.cur = 0, b.f = fibers.data();
    B = &b;
    gridDim = grid, blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                b.dyn = NULL;
                if (smem && posix_memalign(&b.dyn, 128, smem)) {
                    fprintf(stderr, "cuda emulator: out of host memory for %s's shared memory\n", name);
                    abort();
                }
                if (b.dyn)
                    memset(b.dyn, 0xff, smem);
                run_block(b);
                free(b.dyn);
            }
    B = NULL;
}
} // namespace

void emu::launch_body(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool overlap,
                      std::function<void()> body)
{
    enqueue(s, [=]() mutable { run_grid(name, grid, block, smem, overlap, body); });
}

void cudaGridDependencySynchronize(void)
{
    if (B) /* in a kernel */
        B->f[B->cur].began = true;
}

const char *emu::kernel_name(const void *fn)
{
    static std::mutex mu;
    static std::map<const void *, std::string> names;
    std::lock_guard<std::mutex> g(mu);
    auto it = names.find(fn);
    if (it != names.end())
        return it->second.c_str();
    Dl_info di;
    std::string name;
    if (dladdr(fn, &di) && di.dli_sname) {
        int st = 0;
        char *dm = abi::__cxa_demangle(di.dli_sname, NULL, NULL, &st);
        name = st == 0 && dm ? dm : di.dli_sname;
        free(dm);
    } else {
        char buf[64];
        snprintf(buf, sizeof buf, "the kernel at %p", fn);
        name = buf;
    }
    return names.emplace(fn, name).first->second.c_str();
}

void *emu::dyn_smem(void) { return B ? B->dyn : NULL; }

void __syncthreads(void) { wait_at(F_BLOCK); }

void __syncwarp(unsigned mask) { wait_at(F_WARP); }

uint64_t emu_shfl(uint64_t v, int src)
{
    const int me = B->cur, w0 = me & ~31;
    const unsigned n = ++B->f[me].shfl; /* this is the lane's shuffle n */
    uint64_t *x = B->xch[n & 1];
    x[me] = v;
    wait_at(F_WARP);
    const int t = w0 + src;
    /* a lane past the block's end, or one that returned before this shuffle, gives nothing: the
     * caller's own value (one that returned after it has given its value) */
    return t < B->n && B->f[t].shfl >= n ? x[t] : v;
}

void emu_wmma_check(const void *p, unsigned ldm, size_t elem_bytes)
{
    if ((uintptr_t)p % 32 || ldm * elem_bytes % 16) {
        fprintf(stderr, "cuda emulator: wmma in %s: pointer %p (must be 32-byte aligned), ldm %u (must be a multiple "
                        "of 16 bytes)\n", B ? B->name : "?", p, ldm);
        abort();
    }
}
