/*
 * cuda_emu.h -- the part of CUDA that kernels/cuda uses, emulated on the CPU.
 *
 * `make CUDA=emu` builds kernels/cuda from its unchanged sources with g++ against this header
 * (tests/cuda-emu/include/ holds the CUDA header names, each including this one) after a
 * textual pass, cu2cc.pl: `extern __shared__ T x[]` becomes a pointer to the block's dynamic
 * shared memory, and a `k<<<grid, block, smem, stream>>>(args)` launch (test_emu.cu's;
 * kernels/cuda launches through cudaLaunchKernelEx, emulated below) `emu::launcher(grid, block, smem,
 * stream).run("k", k, args)`. Every program and test of that build then finds GPUs, "iflow CUDA
 * emulator", that run the kernels on the CPU: `make check-emu` runs the GPU tests (tests/gpu)
 * there, so a machine without a GPU (CI) checks the kernels' logic against their CPU
 * references: indices, bounds, barriers, shuffles, tiling, the recorded graphs, the overlapped
 * launches' rule. Not their speed, and not the GPU's floating point to the bit (nvcc contracts
 * a * b + c into FMAs; g++ here does not).
 *
 * Contract of the emulation
 *   Memory: device memory is host memory (cudaMalloc = posix_memalign, filled with 0xff so that
 *     a float read before it is written is NaN), counted per device against IFLOW_EMU_MEM bytes
 *     (default 8 GiB), so out-of-memory paths run; a copy's device side must lie in one
 *     allocation; under
 *     SANITIZE=1 AddressSanitizer sees every device allocation and each block's dynamic shared
 *     memory at its exact size, as compute-sanitizer's memcheck would.
 *   Streams: an operation runs when it is enqueued, in order. A capturing stream
 *     (cudaStreamBeginCapture) records launches, copies and memsets instead; cudaGraphLaunch
 *     runs the recording again with the arguments it was recorded with.
 *   Launches: by <<<>>> (cu2cc.pl) or cudaLaunchKernelEx (kernels/cuda's ifkc_launch). The
 *     configuration is checked as the GPU checks it (1..1024 threads a block, dynamic shared
 *     memory within 48 KiB or the kernel's cudaFuncSetAttribute limit) and an error is left
 *     for cudaGetLastError (and returned by cudaLaunchKernelEx). An overlapped launch
 *     (programmatic stream serialization) runs after the grid before it like any other; every
 *     one of its threads must have called cudaGridDependencySynchronize() when it returns, or
 *     the emulator prints the kernel (by its symbol), thread and block and aborts. Blocks run
 *     one after another (a race between blocks cannot show); a block's threads are fibers on the launching thread, switched at
 *     __syncthreads, __syncwarp and every warp shuffle. A warp whose live lanes wait at
 *     different kinds of barrier (__syncthreads and __syncwarp or a shuffle) never goes on, on a
 *     GPU either: the emulator prints the kernel and block and aborts. Threads that returned
 *     count as arrived at __syncthreads, and give their value to the shuffles they reached.
 *     IFLOW_EMU_ORDER=reverse runs the threads between two barriers last to first, so that a
 *     missing barrier shows as a different result.
 *   Devices: IFLOW_EMU_DEVICES of them (default 1), each with an H200's properties (132 SMs,
 *     compute capability 9.0) so that launch shapes are those of the real device.
 *   cuBLAS: libcublas.so.emu (tests/cuda-emu/cublas.cc), dlopen()ed as the real one would be:
 *     sgemm and gemm_ex in double sums. NCCL: none (the NCCL paths report it missing).
 *   Machines: x86-64 (the fibers' switch is a few lines of its assembly, emu.cc).
 *
 * Files: include/ (the CUDA header names), emu.cc (runtime, launches, fibers), cublas.cc,
 * cu2cc.pl. Build: the Makefile's CUDA=emu block. What the GPU tests skip here: IFLOW_EMU.
 */
#ifndef IFLOW_CUDA_EMU_H
#define IFLOW_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define CUDART_VERSION 12080

/* ---- built-in variables ---------------------------------------------------------------------- */

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;

/* ---- runtime types and errors --------------------------------------------------------------- */

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorIllegalState = 401,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
enum cudaMemoryType { cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes {
    cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaDeviceAttr { cudaDevAttrMemoryClockRate = 36, cudaDevAttrGlobalMemoryBusWidth = 37 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                             cudaStreamCaptureModeRelaxed };
enum cudaGraphExecUpdateResult { cudaGraphExecUpdateSuccess, cudaGraphExecUpdateError };
struct cudaGraphExecUpdateResultInfo {
    cudaGraphExecUpdateResult result;
    void *errorNode, *errorFromNode;
};
#define cudaStreamNonBlocking 0x01u

struct cudaDeviceProp { /* what kernels/cuda reads */
    char name[256];
    int major, minor, multiProcessorCount;
};

/* A stream. enqueue is emu::enqueue, reached through the stream so that libcublas.so.emu needs
 * no symbol of the program that loads it. */
typedef struct emu_stream *cudaStream_t;
struct emu_stream {
    void (*enqueue)(cudaStream_t s, std::function<void()> op);
    int dev;
    struct emu_graph *capture; /* being recorded into, or NULL */
};
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;

enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaMalloc(void **p, size_t n);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s = 0);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t emu_func_set_attribute(const void *fn, cudaFuncAttribute a, int v);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute a, int v)
{
    return emu_func_set_attribute((const void *)fn, a, v);
}

/* ---- half and bfloat16 ------------------------------------------------------------------------ */

struct __half {
    _Float16 h;
    __half() = default;
    __half(float f) : h((_Float16)f) {}
    operator float() const { return (float)h; }
};
struct __half2 { __half x, y; };
struct __nv_bfloat16 {
    uint16_t b;
    __nv_bfloat16() = default;
};
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

static inline __half __float2half_rn(float f) { __half h; h.h = (_Float16)f; return h; }
static inline float __half2float(__half h) { return (float)h.h; }
static inline __half __ushort_as_half(unsigned short u) { __half h; memcpy(&h, &u, 2); return h; }
static inline unsigned short __half_as_ushort(__half h) { unsigned short u; memcpy(&u, &h, 2); return u; }
static inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
static inline float2 __half22float2(__half2 h) { return {(float)h.x.h, (float)h.y.h}; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays a (quiet) NaN */
        b.b = (uint16_t)((u >> 16) | 0x40u);
    else
        b.b = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
    return b;
}
static inline float __bfloat162float(__nv_bfloat16 b)
{
    uint32_t u = (uint32_t)b.b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- arithmetic intrinsics -------------------------------------------------------------------- */

/* The _rn forms are the plain operations: the emulated kernels are built with -ffp-contract=off. */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline int __float2int_rn(float x) { return (int)lrintf(x); }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
static inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
/* A block's threads are fibers switched only at barriers and shuffles, and blocks run one after
 * another: a read-modify-write is atomic as it stands. */
static inline int atomicAdd(int *p, int v)
{
    const int old = *p;
    *p = old + v;
    return old;
}
template <typename T> static inline T __ldg(const T *p) { return *p; }
#define IFLOW_EMU_MINMAX(T)                                                                   \
    static inline T min(T a, T b) { return a < b ? a : b; }                                    \
    static inline T max(T a, T b) { return a > b ? a : b; }
IFLOW_EMU_MINMAX(int)
IFLOW_EMU_MINMAX(unsigned)
IFLOW_EMU_MINMAX(long)
IFLOW_EMU_MINMAX(unsigned long)
IFLOW_EMU_MINMAX(long long)
IFLOW_EMU_MINMAX(unsigned long long)
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ---- barriers and warp shuffles (emu.cc) ------------------------------------------------------ */

/* The calling thread's lane: its linear index in the block, modulo 32. */
static inline int emu_lane(void)
{
    return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32);
}

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* Exchange of 8 bytes a lane: every lane of the warp publishes v and reads lane src's. */
uint64_t emu_shfl(uint64_t v, int src_lane);
template <typename T> static inline T emu_shfl_t(T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = emu_shfl(u, src);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int m, int w = 32)
{
    const int l = emu_lane();
    return emu_shfl_t(v, (l & ~(w - 1)) | ((l ^ m) & (w - 1)));
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src, int w = 32)
{
    const int l = emu_lane();
    return emu_shfl_t(v, (l & ~(w - 1)) | (src & (w - 1)));
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int w = 32)
{
    const int l = emu_lane(), s = (l & (w - 1)) + (int)d;
    return emu_shfl_t(v, s < w ? (l & ~(w - 1)) + s : l);
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int w = 32)
{
    const int l = emu_lane(), s = (l & (w - 1)) - (int)d;
    return emu_shfl_t(v, s >= 0 ? (l & ~(w - 1)) + s : l);
}

/* ---- launches --------------------------------------------------------------------------------- */

/* cudaLaunchKernelEx's configuration; of the attributes, programmatic stream serialization
 * (an overlapped launch, see `Launches` above) is the one kernels/cuda uses. */
enum cudaLaunchAttributeID : int { cudaLaunchAttributeIgnore = 0, cudaLaunchAttributeProgrammaticStreamSerialization = 6 };
union cudaLaunchAttributeValue {
    char pad[64];
    int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
};
/* In a kernel: the thread has waited for the grids before it (an overlapped launch's rule). */
void cudaGridDependencySynchronize(void);
static inline void cudaTriggerProgrammaticLaunchCompletion(void) {}

namespace emu {
/* The block's dynamic shared memory (cu2cc.pl turns `extern __shared__ T name[];` into a
 * pointer to it). */
void *dyn_smem(void);
/* Check a configuration; 0 and the error left for cudaGetLastError when it is bad. */
int launch_ok(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem);
/* Run op on stream s now, or record it when s is being captured (cuBLAS's calls). */
void enqueue(cudaStream_t s, std::function<void()> op);
/* Run body on every thread of every block of grid, now or into the stream's recording;
 * overlap: an overlapped launch (its threads must call cudaGridDependencySynchronize). */
void launch_body(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool overlap,
                 std::function<void()> body);
/* The kernel at fn by its symbol (programs of the emulation are linked with -rdynamic). */
const char *kernel_name(const void *fn);

struct launcher {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    bool overlap = false; /* programmatic stream serialization */
    launcher(dim3 g, dim3 b, size_t sm = 0, cudaStream_t s = 0) : grid(g), block(b), smem(sm), stream(s) {}
    /* name: the kernel as the launch wrote it (cu2cc.pl), for messages. false: a bad
     * configuration, left for cudaGetLastError. */
    template <typename... P, typename... A> bool run(const char *name, void (*fn)(P...), A &&...a)
    {
        if (!launch_ok(name, (const void *)fn, grid, block, smem))
            return false;
        std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
        launch_body(name, grid, block, smem, stream, overlap, [fn, args]() { std::apply(fn, args); });
        return true;
    }
};
} // namespace emu

/* An overlapped launch runs as any other (one grid after another); what the emulation checks
 * is the rule that makes overlapping safe: every thread of such a grid calls
 * cudaGridDependencySynchronize() before it returns, or the emulator stops naming the kernel. */
template <typename... P, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*fn)(P...), A &&...a)
{
    emu::launcher l(c->gridDim, c->blockDim, c->dynamicSmemBytes, c->stream);
    for (unsigned i = 0; i < c->numAttrs; i++) {
        if (c->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization)
            l.overlap = c->attrs[i].val.programmaticStreamSerializationAllowed != 0;
        else if (c->attrs[i].id != cudaLaunchAttributeIgnore)
            return cudaErrorInvalidValue;
    }
    return l.run(emu::kernel_name((const void *)fn), fn, std::forward<A>(a)...) ? cudaSuccess : cudaPeekAtLastError();
}

#endif
