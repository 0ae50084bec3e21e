/*
 * gpulib.h -- what the GPU tests share (header-only, like tests/unit/check.h): cuda:0 opened
 * once, host and device buffers that end the test with a message when they cannot be had
 * (there is nothing to test then), and a download that is a check (a kernel fault shows there).
 *
 *   gpu_open(prog)          cuda:0 into `dev`, or 0 with a failed check saying why (no GPU)
 *   gpu_xmalloc(n)          host memory or exit(2)
 *   gpu_dup(host, n)        a device buffer with a copy of host[0..n) (host NULL: uninitialized)
 *   gpu_fetch(host, p, n)   download; a failure is a failed check
 */
#ifndef IFLOW_GPULIB_H
#define IFLOW_GPULIB_H

#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/check.h"

static ifkc_dev *dev;
static const char *gpu_prog = "test";

static inline int gpu_open(const char *prog)
{
    int n = 0, rc = ifkc_device_count(&n);
    gpu_prog = prog;
    if (rc || n < 1) {
        fprintf(stderr, "%s: no GPU to run on: %s\n", prog, rc ? ifkc_errmsg() : "0 devices");
        CHECK(0, "a CUDA device is needed (this test runs only under make check-gpu on a GPU machine)");
        return 0;
    }
    if ((rc = ifkc_open(&dev, 0)) != 0) {
        CHECK(0, "opening cuda:0: %s", ifkc_errmsg());
        return 0;
    }
    return 1;
}

static inline void *gpu_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "%s: out of host memory (%zu bytes)\n", gpu_prog, n);
        exit(2);
    }
    return p;
}

static inline void *gpu_dup(const void *host, size_t n)
{
    void *p;
    int rc = ifkc_malloc(dev, &p, n);
    if (rc == 0 && host)
        rc = ifkc_upload(dev, p, host, n);
    if (rc) {
        fprintf(stderr, "%s: device buffer of %zu bytes: %s\n", gpu_prog, n, ifkc_errmsg());
        exit(2);
    }
    return p;
}

static inline int gpu_fetch(void *host, const void *p, size_t n)
{
    int rc = ifkc_download(dev, host, p, n);
    CHECK(rc == 0, "download: %s", ifkc_errmsg());
    return rc;
}

#endif
