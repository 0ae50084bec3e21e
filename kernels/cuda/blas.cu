/* blas.cu -- loading cuBLAS on first use. See blas.cuh. */
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/common.cuh"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define IFKC_STR_(x) #x
#define IFKC_STR(x) IFKC_STR_(x)
static const char blas_soname[] = "libcublas.so." IFKC_STR(CUBLAS_VER_MAJOR);

static ifkc_blas_api api;
static int loaded;               /* 1: api is complete */
static char why[400];            /* why it is not      */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int resolve(void *lib, const char *name, void **slot)
{
    return ifkc_dl_sym(lib, "cuBLAS", blas_soname, name, slot, why, sizeof why);
}

static void load(void)
{
    /* The programs' rpath names the toolkit's lib64, and dlopen searches the caller's runpath;
     * the fixed path is for programs built without it. IFLOW_CUBLAS: a path, where cuBLAS lives
     * elsewhere (a pip wheel). */
    static const char *const paths[] = {blas_soname, "/usr/local/cuda/lib64/" "libcublas.so." IFKC_STR(CUBLAS_VER_MAJOR)};
    void *lib = ifkc_dl_open("cuBLAS", "IFLOW_CUBLAS", paths, 2, why, sizeof why);
    if (!lib)
        return;
    loaded = resolve(lib, "cublasCreate_v2", (void **)&api.create) &&
             resolve(lib, "cublasDestroy_v2", (void **)&api.destroy) &&
             resolve(lib, "cublasSetStream_v2", (void **)&api.set_stream) &&
             resolve(lib, "cublasSgemm_v2", (void **)&api.sgemm) &&
             resolve(lib, "cublasGemmEx", (void **)&api.gemm_ex) &&
             resolve(lib, "cublasGetStatusName", (void **)&api.status_name) &&
             resolve(lib, "cublasGetStatusString", (void **)&api.status_string);
}

const ifkc_blas_api *ifkc_blas(void)
{
    pthread_once(&once, load);
    if (!loaded) {
        ifkc_seterr(IFKC_ENODEV, "%s", why);
        return NULL;
    }
    return &api;
}
