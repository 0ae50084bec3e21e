/* device.c -- opening devices by name, listing them, moving weights and activations. See device.h. */
#include "device_impl.h"
#include "libcore/base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *iflow_bytes_str(char *buf, size_t n, uint64_t bytes)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, n, "%.1f GiB", bytes / 1073741824.0);
    else if (bytes >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else
        snprintf(buf, n, "%llu bytes", (unsigned long long)bytes);
    return buf;
}

/* "cuda" -> 0, "cuda:3" -> 3; -1 if name is not a CUDA device name. */
static int cuda_index(const char *name)
{
    if (strcmp(name, "cuda") == 0)
        return 0;
    if (strncmp(name, "cuda:", 5) != 0 || !name[5])
        return -1;
    char *end;
    long i = strtol(name + 5, &end, 10);
    return *end || i < 0 || i > 1024 ? -1 : (int)i;
}

int iflow_device_open(iflow_device **out, const char *name, int n_threads)
{
    *out = NULL;
    if (strcmp(name, "cpu") == 0)
        return iflow_cpu_open(out, n_threads);
    int idx = cuda_index(name);
    if (idx >= 0)
        return iflow_cuda_open(out, idx);
    return iflow_seterr(IFLOW_EINVAL, "unknown device '%s' (expected cpu, cuda or cuda:N)", name);
}

void iflow_device_close(iflow_device *d)
{
    if (d)
        d->ops->close(d);
}

int iflow_device_open_auto(iflow_device **out, int n_threads, const char **fallback)
{
    static __thread char why[512];
    if (fallback)
        *fallback = "";
    if (iflow_cuda_open(out, 0) == 0)
        return 0;
    snprintf(why, sizeof why, "%s", iflow_errmsg());
    if (fallback)
        *fallback = why;
    return iflow_cpu_open(out, n_threads);
}

void iflow_device_graph_stats(const iflow_device *d, iflow_graph_stats *st)
{
    memset(st, 0, sizeof *st);
    if (d && d->info.kind == IFLOW_DEVICE_CUDA)
        iflow_cuda_graph_stats(d, st);
}

const char *iflow_device_cuda_status(void)
{
    static __thread char status[512];
    const char *why = NULL;
    int n = iflow_cuda_count(&why);
    if (n <= 0)
        snprintf(status, sizeof status, "%s", why ? why : "no CUDA device");
    else {
        iflow_device_info info;
        if (iflow_cuda_info(0, &info) == 0)
            snprintf(status, sizeof status, "%s, %d device%s", info.detail, n, n == 1 ? "" : "s");
        else
            snprintf(status, sizeof status, "%d device%s (%s)", n, n == 1 ? "" : "s", iflow_errmsg());
    }
    return status;
}

int iflow_device_list(iflow_device_info *out, int cap, int *n)
{
    const char *why;
    int n_cuda = iflow_cuda_count(&why);
    *n = 0;
    if (cap > 0)
        iflow_cpu_info(&out[0]);
    *n = 1;
    for (int i = 0; i < n_cuda; i++) {
        if (*n < cap) {
            int rc = iflow_cuda_info(i, &out[*n]);
            if (rc < 0)
                return rc;
        }
        (*n)++;
    }
    return 0;
}

int iflow_device_query(const iflow_device *d, iflow_device_info *info)
{
    if (!d) {
        iflow_cpu_info(info);
        return 0;
    }
    return d->ops->query(d, info);
}

int iflow_device_put(iflow_device *d, const void **out, const void *host, size_t n)
{
    *out = NULL;
    if (!d || d->host_memory) {
        *out = host;
        return 0;
    }
    void *p;
    int rc = d->ops->alloc(d, &p, n);
    if (rc)
        return rc;
    if ((rc = d->ops->upload(d, p, host, n)) < 0) {
        d->ops->free(d, p);
        return rc;
    }
    *out = p;
    return 0;
}

void iflow_device_unput(iflow_device *d, const void *p)
{
    if (p && d && !d->host_memory)
        d->ops->free(d, (void *)p);
}

int iflow_device_pack(iflow_device *d, void **out, int *out_type, const void *W, int wtype, int N, int K)
{
    *out = NULL;
    if (!d)
        return iflow_cpu_pack(NULL, out, out_type, W, wtype, N, K);
    return d->ops->pack ? d->ops->pack(d, out, out_type, W, wtype, N, K) : 0;
}

void iflow_device_unpack(iflow_device *d, void *p)
{
    if (!p)
        return;
    if (!d)
        iflow_cpu_free(NULL, p);
    else
        d->ops->free(d, p);
}

int iflow_device_transfer(iflow_device *b, void *dst, iflow_device *a, const void *src, size_t n, void *stage)
{
    if (a == b && !a->host_memory)
        return iflow_seterr(IFLOW_EINVAL, "transfer within one device (%s)", a->info.name);
    if (a->host_memory)
        return b->ops->upload(b, dst, src, n);
    if (b->host_memory)
        return a->ops->download(a, dst, src, n);
    int rc = a->ops->download(a, stage, src, n);
    return rc ? rc : b->ops->upload(b, dst, stage, n);
}
