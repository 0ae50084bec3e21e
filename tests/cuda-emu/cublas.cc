/* cublas.cc -- libcublas.so.emu, the cuBLAS of the CPU emulation (cuda_emu.h): the functions
 * kernels/cuda/blas.cu resolves, with cuBLAS's column-major contract
 *     C (m x n, ldc) = alpha op(A) (m x k) op(B) (k x n) + beta C
 * for F32, F16 and BF16 matrices, sums in double. A call is enqueued on the handle's stream like
 * a kernel (run now, or recorded when the stream is being captured). */
#include "cuda_emu.h"
#include "include/cublas_v2.h"

#include <stdlib.h>

#include <vector>

struct emu_cublas {
    cudaStream_t stream;
};

static float load(const void *p, cudaDataType t, size_t i)
{
    switch (t) {
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store(void *p, cudaDataType t, size_t i, float v)
{
    switch (t) {
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v;
    }
}

static bool known(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                 cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float beta, void *C,
                 cudaDataType ct, int ldc)
{
    /* op(A) as rows of k, op(B) as columns of k: then each C(i, j) is one contiguous dot product */
    std::vector<double> a((size_t)m * k), b((size_t)n * k);
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++)
            a[(size_t)i * k + p] = load(A, at, ta == CUBLAS_OP_N ? i + (size_t)p * lda : p + (size_t)i * lda);
    for (int j = 0; j < n; j++)
        for (int p = 0; p < k; p++)
            b[(size_t)j * k + p] = load(B, bt, tb == CUBLAS_OP_N ? p + (size_t)j * ldb : j + (size_t)p * ldb);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const double *x = &a[(size_t)i * k], *y = &b[(size_t)j * k];
            double s = 0;
            for (int p = 0; p < k; p++)
                s += x[p] * y[p];
            const size_t c = i + (size_t)j * ldc;
            store(C, ct, c, (float)(alpha * s + (beta != 0.0f ? beta * load(C, ct, c) : 0.0)));
        }
}

/* On the handle's stream (the default stream runs it now: it is never captured). */
static void run(cublasHandle_t h, std::function<void()> op)
{
    if (h->stream)
        h->stream->enqueue(h->stream, std::move(op));
    else
        op();
}

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = new emu_cublas{NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc)
{
    if (m < 0 || n < 0 || k < 0 || lda < 1 || ldb < 1 || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *alpha, be = *beta;
    run(h, [=]() { gemm(ta, tb, m, n, k, al, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, be, C, CUDA_R_32F, ldc); });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    if (m < 0 || n < 0 || k < 0 || lda < 1 || ldb < 1 || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!known(at) || !known(bt) || !known(ct) || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    run(h, [=]() { gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc); });
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "cuBLAS error";
    }
}
}
