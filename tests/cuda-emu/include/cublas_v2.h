/* cublas_v2.h of the CPU emulation: the types and codes kernels/cuda uses. The functions are in
 * libcublas.so.emu (tests/cuda-emu/cublas.cc), dlopen()ed by kernels/cuda/blas.cu as the real
 * library is. See tests/cuda-emu/cuda_emu.h. */
#ifndef IFLOW_EMU_CUBLAS_V2_H
#define IFLOW_EMU_CUBLAS_V2_H
#include "../cuda_emu.h"

#define CUBLAS_VER_MAJOR emu

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16F = 74 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };
typedef struct emu_cublas *cublasHandle_t;
#endif
