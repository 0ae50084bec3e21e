/*
 * blas.cuh -- cuBLAS, loaded when a GPU is first opened, not when a program starts.
 *
 * Linking libcublas (and the libcublasLt it pulls in, half a gigabyte together) adds about
 * 150 ms to the start of every program, GPU or not; iflow's programs are started many times in
 * pipelines and tests. So kernels/cuda names no cuBLAS symbol: ifkc_blas() dlopen()s
 * libcublas.so.<major of the cuBLAS headers built against> once (thread-safe), resolves the few
 * functions iflow calls, and returns their table, or NULL with the reason in ifkc_errmsg().
 * IFLOW_CUBLAS=PATH in the environment names the library file instead (cuBLAS from a pip wheel,
 * say). A machine without cuBLAS can still list its GPUs; opening one then fails with that reason.
 */
#ifndef IFKC_BLAS_CUH
#define IFKC_BLAS_CUH

#include <cublas_v2.h>

typedef struct {
    cublasStatus_t (*create)(cublasHandle_t *h);
    cublasStatus_t (*destroy)(cublasHandle_t h);
    cublasStatus_t (*set_stream)(cublasHandle_t h, cudaStream_t s);
    cublasStatus_t (*sgemm)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                            float *C, int ldc);
    cublasStatus_t (*gemm_ex)(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                              cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                              cublasComputeType_t compute, cublasGemmAlgo_t algo);
    const char *(*status_name)(cublasStatus_t s);
    const char *(*status_string)(cublasStatus_t s);
} ifkc_blas_api;

/* The table, or NULL (message set) when libcublas cannot be loaded. */
const ifkc_blas_api *ifkc_blas(void);

#endif
