/*
 * test_emu.cu -- the CPU emulation of CUDA (cuda_emu.h) against what the GPU does, so that the
 * tier that checks kernels/cuda in CI can itself fail. CUDA source, built like kernels/cuda
 * (cu2cc.pl, then g++) and only there: make check-emu runs it (its deadlock cases would hang
 * a real GPU).
 *
 *   - a block sum through shared memory and __syncthreads is exact; without its barrier the
 *     first thread reads the others' slots before they are written (the emulation runs a
 *     block's threads in turn between barriers): the wrong sum shows;
 *   - warp shuffles (xor, down, up, indexed) give each lane its partner's value, also when the
 *     partner returns right after the shuffle; a lane past the block's end gives the caller's;
 *   - a warp whose lanes wait at __syncthreads and at __syncwarp, or at a shuffle, ends the
 *     program with "deadlock" (in a child process). (Threads that return before a
 *     __syncthreads count as arrived, as on GPUs since Volta.)
 *   - launch checks: 1025 threads, a zero grid, dynamic shared memory past 48 KiB without
 *     cudaFuncSetAttribute (and within it with), errors left for cudaGetLastError;
 *   - a captured stream records launches and copies, replayed by cudaGraphLaunch with the
 *     device's values of the time; a synchronous call while capturing invalidates it;
 *   - device memory: IFLOW_EMU_MEM bounds cudaMalloc; copies check their device side;
 *   - cudaLaunchKernelEx: runs the kernel, returns a bad configuration's error; in an
 *     overlapped launch (programmatic stream serialization) a thread that returns without
 *     cudaGridDependencySynchronize() ends the program naming the kernel (in a child), and one
 *     that calls it is fine; without the attribute nothing is required.
 */
#include <cuda_runtime.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/check.h"

/* ---- kernels -------------------------------------------------------------------------------- */

__global__ void block_sum(const int *x, int *out, int barrier)
{
    __shared__ int s[256];
    s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    if (barrier)
        __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (unsigned i = 0; i < blockDim.x; i++)
            t += s[i];
        out[blockIdx.x] = t;
    }
}

/* out[4][n]: xor 1, down 3, up 5, lane 7's value; each lane returns right after */
__global__ void shuffles(int *out, int n)
{
    const int v = 100 + (int)threadIdx.x;
    const int a = __shfl_xor_sync(0xffffffffu, v, 1), b = __shfl_down_sync(0xffffffffu, v, 3),
              c = __shfl_up_sync(0xffffffffu, v, 5), d = __shfl_sync(0xffffffffu, v, 7);
    out[threadIdx.x] = a, out[n + threadIdx.x] = b, out[2 * n + threadIdx.x] = c, out[3 * n + threadIdx.x] = d;
}

__global__ void odd_even_barriers(int *out)
{
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 1;
}

__global__ void mixed_barriers(int *out)
{
    int v = (int)threadIdx.x;
    if (threadIdx.x == 0)
        __syncthreads();
    else
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

__global__ void big_smem(int *out)
{
    extern __shared__ int dyn[];
    dyn[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}

__global__ void add_one(int *x) { x[threadIdx.x] += 1; }

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_block_sum(void)
{
    enum { NB = 3, NT = 256 };
    int h[NB * NT], want[NB] = {0}, got[NB];
    for (int i = 0; i < NB * NT; i++)
        h[i] = i, want[i / NT] += h[i]; /* stale slots of another block give another sum */
    int *x, *out;
    cudaMalloc(&x, sizeof h);
    cudaMalloc(&out, sizeof got);
    cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
    for (int barrier = 1; barrier >= 0; barrier--) {
        block_sum<<<NB, NT>>>(x, out, barrier);
        CHECK(cudaGetLastError() == cudaSuccess, "block_sum launched");
        cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
        int same = 0;
        for (int b = 0; b < NB; b++)
            same += got[b] == want[b];
        if (barrier)
            CHECK(same == NB, "with its barrier: %d of %d block sums right", same, NB);
        else
            CHECK(same < NB, "without its barrier the sums are wrong (%d of %d right)", same, NB);
    }
    cudaFree(x);
    cudaFree(out);
}

static void test_shuffles(void)
{
    enum { N = 40 }; /* a warp and 8 lanes of a second */
    int got[4 * N], *out;
    cudaMalloc(&out, sizeof got);
    shuffles<<<1, N>>>(out, N);
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int t = 0; t < N; t++) {
        const int w0 = t & ~31, l = t & 31, me = 100 + t;
        const int xo = w0 + (l ^ 1), dn = l + 3 < 32 ? t + 3 : t, up = l >= 5 ? t - 5 : t, ix = w0 + 7;
        const int want[4] = {xo < N ? 100 + xo : me, dn < N ? 100 + dn : me, 100 + up, ix < N ? 100 + ix : me};
        for (int k = 0; k < 4; k++)
            if (got[k * N + t] != want[k]) {
                if (bad++ < 4)
                    fprintf(stderr, "lane %d shuffle %d: %d, want %d\n", t, k, got[k * N + t], want[k]);
            }
    }
    CHECK(bad == 0, "shuffles: %d of %d values wrong", bad, 4 * N);
    cudaFree(out);
}

/* run fn in a child; 1 if it died of SIGABRT with `what` in its stderr */
static int dies_saying(void (*fn)(void), const char *what)
{
    int fd[2];
    if (pipe(fd))
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        const struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* the abort is expected: no core file */
        dup2(fd[1], 2);
        close(fd[0]);
        fn();
        _exit(0);
    }
    close(fd[1]);
    char buf[2048] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(buf, what) != NULL;
}

static int dies_of_deadlock(void (*fn)(void)) { return dies_saying(fn, "cuda emulator: deadlock in "); }

static void run_odd_even_barriers(void)
{
    int *out;
    cudaMalloc(&out, 64 * sizeof(int));
    odd_even_barriers<<<1, 64>>>(out);
}

static void run_mixed_barriers(void)
{
    int *out;
    cudaMalloc(&out, 32 * sizeof(int));
    mixed_barriers<<<1, 32>>>(out);
}

static void test_deadlocks(void)
{
    fflush(NULL);
    CHECK(dies_of_deadlock(run_odd_even_barriers), "odd lanes at __syncthreads, even ones at __syncwarp: a deadlock");
    CHECK(dies_of_deadlock(run_mixed_barriers), "a warp at a shuffle and at __syncthreads: a deadlock");
}

static void test_launch_checks(void)
{
    int *out;
    cudaMalloc(&out, 1024 * sizeof(int));
    cudaGetLastError();
    add_one<<<1, 1025>>>(out);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads a block: invalid configuration");
    CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
    add_one<<<0, 32>>>(out);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "a zero grid: invalid configuration");
    const size_t big = 64 << 10;
    big_smem<<<1, 256, big>>>(out);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the attribute");
    CHECK(cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big) == cudaSuccess,
          "cudaFuncSetAttribute to 64 KiB");
    big_smem<<<1, 256, big>>>(out);
    CHECK(cudaGetLastError() == cudaSuccess, "64 KiB of dynamic shared memory with the attribute");
    int got[256];
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(got[0] == 1 && got[255] == 0, "the block's dynamic shared memory: %d %d", got[0], got[255]);
    cudaFree(out);
}

/* out[i] += 1 for the block's threads; the even ones (all: every_thread) wait first */
__global__ void overlapped_add(int *out, int every_thread)
{
    if (every_thread || threadIdx.x % 2 == 0)
        cudaGridDependencySynchronize();
    out[threadIdx.x] += 1;
}

static cudaError_t launch_ex(int overlap, dim3 block, int every_thread, int *out)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(2), c.blockDim = block, c.attrs = at, c.numAttrs = overlap ? 1u : 0u;
    return cudaLaunchKernelEx(&c, overlapped_add, out, every_thread);
}

static void run_overlap_without_wait(void)
{
    int *out;
    cudaMalloc(&out, 64 * sizeof(int));
    cudaMemsetAsync(out, 0, 64 * sizeof(int));
    launch_ex(1, dim3(64), 0, out);
}

static void test_launch_ex(void)
{
    int *out, got[64];
    cudaMalloc(&out, 64 * sizeof(int));
    cudaMemsetAsync(out, 0, 64 * sizeof(int));
    CHECK(launch_ex(1, dim3(64), 1, out) == cudaSuccess, "an overlapped launch whose threads all wait");
    CHECK(launch_ex(0, dim3(64), 0, out) == cudaSuccess, "a plain launch whose odd threads do not wait");
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(got[0] == 4 && got[63] == 4, "cudaLaunchKernelEx ran both grids of 2 blocks: %d %d", got[0], got[63]);
    CHECK(launch_ex(1, dim3(2048), 1, out) == cudaErrorInvalidConfiguration, "2048 threads: returned");
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "and left for cudaGetLastError");
    cudaLaunchAttribute odd = {};
    odd.id = (cudaLaunchAttributeID)99;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(1), c.blockDim = dim3(32), c.attrs = &odd, c.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&c, overlapped_add, out, 1) == cudaErrorInvalidValue, "an unknown attribute: invalid value");
    fflush(NULL);
    CHECK(dies_saying(run_overlap_without_wait, "overlapped_add(int*, int), launched to overlap the kernel before it"),
          "an overlapped launch with a thread that returns without cudaGridDependencySynchronize: stopped");
    cudaFree(out);
}

static void test_graphs(void)
{
    int h[32] = {0}, got[32], *x;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc(&x, sizeof h);
    cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
    cudaGraph_t g;
    cudaGraphExec_t e;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture begins");
    add_one<<<1, 32, 0, s>>>(x);
    add_one<<<1, 32, 0, s>>>(x);
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&e, g, 0) == cudaSuccess,
          "capture ends, graph instantiated");
    cudaMemcpy(got, x, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(got[0] == 0, "recorded launches do not run: %d", got[0]);
    for (int i = 0; i < 3; i++)
        cudaGraphLaunch(e, s);
    cudaStreamSynchronize(s);
    cudaMemcpy(got, x, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(got[0] == 6 && got[31] == 6, "three replays of two launches: %d %d", got[0], got[31]);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    /* a synchronous call while capturing fails, and so does the capture */
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    void *p;
    CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported, "cudaMalloc while capturing is refused");
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated, "the capture is invalidated");
    cudaGetLastError();
    cudaFree(x);
    cudaStreamDestroy(s);
}

static void test_memory(void)
{
    size_t fr, tot;
    cudaMemGetInfo(&fr, &tot);
    CHECK(tot == (size_t)1 << 20, "IFLOW_EMU_MEM sets the total: %zu", tot);
    void *a, *b;
    CHECK(cudaMalloc(&a, 768 << 10) == cudaSuccess, "768 KiB of 1 MiB");
    CHECK(cudaMalloc(&b, 512 << 10) == cudaErrorMemoryAllocation, "512 KiB more: out of memory");
    cudaGetLastError();
    char h[64];
    CHECK(cudaMemcpy(h, (char *)a + (768 << 10) - 32, 64, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "a copy past the end of a device buffer is refused");
    CHECK(cudaMemcpy(h, h, 64, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "a host pointer as a copy's device side is refused");
    cudaGetLastError();
    cudaFree(a);
    cudaMemGetInfo(&fr, &tot);
    CHECK(fr == tot, "all free again: %zu of %zu", fr, tot);
}

int main(void)
{
    setenv("IFLOW_EMU_MEM", "1048576", 1);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        CHECK(0, "no emulated device");
        return check_summary("test_emu");
    }
    RUN(test_block_sum);
    RUN(test_shuffles);
    RUN(test_deadlocks);
    RUN(test_launch_checks);
    RUN(test_launch_ex);
    RUN(test_graphs);
    RUN(test_memory);
    return check_summary("test_emu");
}
