/* bigmem.c -- large zeroed blocks in huge pages (bigmem.h). */
#include "kernels/cpu/bigmem.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* The live mappings: a block's address and its mapped length. Blocks this large are few (a
 * model's matrices, its caches), so a list scanned on free is enough. */
typedef struct {
    void *p;
    size_t len;
    int huge; /* advised MADV_HUGEPAGE */
} mapping;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;
static size_t n_maps, cap_maps, huge_bytes;
static int advise = -1; /* IFLOW_HUGEPAGES != 0, read once */

static int remember(void *p, size_t len) /* 0, or -1 when the list cannot grow; under mu */
{
    if (n_maps == cap_maps) {
        size_t cap = cap_maps ? 2 * cap_maps : 64;
        mapping *m = realloc(maps, cap * sizeof *m);
        if (!m)
            return -1;
        maps = m, cap_maps = cap;
    }
    maps[n_maps++] = (mapping){ p, len, 0 };
    return 0;
}

/* A fresh anonymous mapping of len bytes (a multiple of the page) whose start is 2 MiB aligned:
 * map len + 2 MiB, give back the head and the tail around the aligned part. */
static void *map_aligned(size_t len)
{
    size_t over = len + HUGE_PAGE;
    char *m = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > m)
        munmap(m, (size_t)(p - m));
    if (m + over > p + len)
        munmap(p + len, (size_t)(m + over - (p + len)));
    return p;
}

void *ifk_bigmem_alloc(size_t n)
{
    if (n < IFK_BIGMEM_MIN) {
        size_t r = (n + 63) & ~(size_t)63;
        void *p = aligned_alloc(64, r ? r : 64);
        if (p)
            memset(p, 0, r ? r : 64);
        return p;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (n > SIZE_MAX - 2 * HUGE_PAGE)
        return NULL;
    size_t len = (n + page - 1) / page * page;
    void *p = map_aligned(len);
    if (!p)
        return NULL;
    pthread_mutex_lock(&mu);
    if (advise < 0) {
        const char *e = getenv("IFLOW_HUGEPAGES");
        advise = !(e && strcmp(e, "0") == 0);
    }
    if (remember(p, len) < 0) {
        pthread_mutex_unlock(&mu);
        munmap(p, len);
        return NULL;
    }
    /* Advice, not a demand: a kernel without THP (or with it off) answers EINVAL and the
     * block is in ordinary pages, which is correct, only slower to stream. */
    if (advise && madvise(p, len, MADV_HUGEPAGE) == 0) {
        maps[n_maps - 1].huge = 1;
        huge_bytes += len;
    }
    pthread_mutex_unlock(&mu);
    return p;
}

void ifk_bigmem_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_maps; i++)
        if (maps[i].p == p) {
            size_t len = maps[i].len;
            if (maps[i].huge)
                huge_bytes -= len;
            maps[i] = maps[--n_maps];
            pthread_mutex_unlock(&mu);
            munmap(p, len);
            return;
        }
    pthread_mutex_unlock(&mu);
    free(p);
}

size_t ifk_bigmem_huge_bytes(void)
{
    pthread_mutex_lock(&mu);
    size_t n = huge_bytes;
    pthread_mutex_unlock(&mu);
    return n;
}
