/*
 * test_bigmem.c -- large zeroed blocks in huge pages (kernels/cpu/bigmem.h).
 *
 *   - blocks below IFK_BIGMEM_MIN: 64-byte aligned, zeroed, writable, freed;
 *   - blocks from IFK_BIGMEM_MIN on: 2 MiB aligned, zeroed, writable to the last byte, counted
 *     in ifk_bigmem_huge_bytes() while alive, and their mapping carries the kernel's huge-page
 *     advice (VmFlags "hg" in /proc/self/smaps) where the kernel has transparent huge pages;
 *   - many blocks of both kinds freed in a shuffled order (the list of mappings), a NULL free;
 *   - IFLOW_HUGEPAGES=0 (this program run again with it): the same blocks without the advice.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "kernels/cpu/bigmem.h"

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* 1 when the kernel offers transparent huge pages on advice ("always" or "madvise" chosen). */
static int thp_available(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return 0;
    char line[256] = "";
    int ok = fgets(line, sizeof line, f) && (strstr(line, "[always]") || strstr(line, "[madvise]"));
    fclose(f);
    return ok;
}

/* The VmFlags line of the mapping that starts at p, from /proc/self/smaps (into out), or 0. */
static int vm_flags(const void *p, char *out, size_t cap)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[512];
    int in = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = lo == (unsigned long)(uintptr_t)p;
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, cap, "%s", line + 8);
            found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

static int advised(const void *p)
{
    char flags[512];
    return vm_flags(p, flags, sizeof flags) && strstr(flags, " hg") != NULL;
}

static void test_small(void)
{
    size_t sizes[] = { 0, 1, 63, 64, 100, 4096, 65537, IFK_BIGMEM_MIN - 1 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = ifk_bigmem_alloc(sizes[i]);
        CHECK(p != NULL, "alloc %zu", sizes[i]);
        if (!p)
            continue;
        CHECK((uintptr_t)p % 64 == 0, "%zu bytes at %p: not 64-byte aligned", sizes[i], (void *)p);
        CHECK(all_zero(p, sizes[i]), "%zu bytes: not zeroed", sizes[i]);
        memset(p, 0xa5, sizes[i]);
        ifk_bigmem_free(p);
    }
    ifk_bigmem_free(NULL);
}

static void test_large(void)
{
    size_t sizes[] = { IFK_BIGMEM_MIN, IFK_BIGMEM_MIN + 1, (size_t)3 << 20, ((size_t)8 << 20) + 4097 };
    const int thp = thp_available();
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t before = ifk_bigmem_huge_bytes();
        unsigned char *p = ifk_bigmem_alloc(sizes[i]);
        CHECK(p != NULL, "alloc %zu", sizes[i]);
        if (!p)
            continue;
        CHECK((uintptr_t)p % ((size_t)2 << 20) == 0, "%zu bytes at %p: not 2 MiB aligned", sizes[i], (void *)p);
        CHECK(all_zero(p, sizes[i]), "%zu bytes: not zeroed", sizes[i]);
        memset(p, 0x5a, sizes[i]); /* every byte writable */
        CHECK(p[sizes[i] - 1] == 0x5a, "last byte");
        if (thp) {
            CHECK(ifk_bigmem_huge_bytes() >= before + sizes[i], "huge bytes %zu -> %zu for a block of %zu",
                  before, ifk_bigmem_huge_bytes(), sizes[i]);
            CHECK(advised(p), "%zu bytes at %p: no huge-page advice in /proc/self/smaps", sizes[i], (void *)p);
        }
        ifk_bigmem_free(p);
        CHECK(ifk_bigmem_huge_bytes() == before, "huge bytes %zu after free, %zu before", ifk_bigmem_huge_bytes(),
              before);
    }
}

static void test_many(void)
{
    enum { N = 200 };
    unsigned char *p[N];
    size_t n[N];
    for (int i = 0; i < N; i++) {
        n[i] = i % 3 ? (size_t)(rnd_u32() % 5000) : IFK_BIGMEM_MIN + (size_t)(rnd_u32() % 100000);
        p[i] = ifk_bigmem_alloc(n[i]);
        CHECK(p[i] != NULL, "block %d of %zu bytes", i, n[i]);
        if (p[i] && n[i])
            p[i][0] = p[i][n[i] - 1] = (unsigned char)i;
    }
    for (int i = N - 1; i > 0; i--) { /* shuffle, then free in that order */
        int j = (int)(rnd_u32() % (unsigned)(i + 1));
        unsigned char *tp = p[i];
        size_t tn = n[i];
        p[i] = p[j], n[i] = n[j], p[j] = tp, n[j] = tn;
    }
    for (int i = 0; i < N; i++) {
        if (p[i] && n[i])
            CHECK(p[i][0] == p[i][n[i] - 1], "block of %zu bytes: its first and last bytes differ", n[i]);
        ifk_bigmem_free(p[i]);
    }
    CHECK(ifk_bigmem_huge_bytes() == 0, "huge bytes %zu with no block alive", ifk_bigmem_huge_bytes());
}

/* This program again with IFLOW_HUGEPAGES=0 and the argument "no-advice": its exit status. */
static void test_env_off(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("IFLOW_HUGEPAGES", "0", 1);
        execl("/proc/self/exe", "test_bigmem", "no-advice", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid, "fork");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "IFLOW_HUGEPAGES=0: the child exited with status %d", st);
}

static int no_advice(void)
{
    unsigned char *p = ifk_bigmem_alloc((size_t)4 << 20);
    CHECK(p != NULL, "alloc");
    if (p) {
        CHECK((uintptr_t)p % ((size_t)2 << 20) == 0, "not 2 MiB aligned");
        CHECK(all_zero(p, (size_t)4 << 20), "not zeroed");
        CHECK(ifk_bigmem_huge_bytes() == 0, "IFLOW_HUGEPAGES=0 but %zu bytes advised", ifk_bigmem_huge_bytes());
        CHECK(!advised(p), "IFLOW_HUGEPAGES=0 but the mapping is advised");
        ifk_bigmem_free(p);
    }
    return check_summary("test_bigmem (IFLOW_HUGEPAGES=0)");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "no-advice") == 0)
        return no_advice();
    RUN(test_small);
    RUN(test_large);
    RUN(test_many);
    RUN(test_env_off);
    return check_summary("test_bigmem");
}
