/* blas.cu -- loading cuBLAS on first use. See blas.cuh. */
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/common.cuh"

#include <dlfcn.h>
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

/* Resolve one symbol into *slot; 0 if missing (why is set). */
static int resolve(void *lib, const char *name, void **slot)
{
    dlerror();
    *slot = dlsym(lib, name);
    if (!*slot)
        snprintf(why, sizeof why, "cannot load cuBLAS: %s has no %s", blas_soname, name);
    return *slot != NULL;
}

static void load(void)
{
    /* The programs' rpath names the toolkit's lib64, and dlopen searches the caller's runpath;
     * the fixed path is for programs built without it. */
    const char *env = getenv("IFLOW_CUBLAS"); /* a path, where cuBLAS lives elsewhere (a pip wheel) */
    void *lib = dlopen(env && *env ? env : blas_soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(env && *env))
        lib = dlopen("/usr/local/cuda/lib64/" "libcublas.so." IFKC_STR(CUBLAS_VER_MAJOR), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "cannot load cuBLAS (%s): %s", blas_soname, e ? e : "not found");
        return;
    }
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
