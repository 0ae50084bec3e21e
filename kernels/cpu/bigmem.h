/*
 * bigmem.h -- zeroed memory for the large arrays the kernels stream (packed weights, KV caches),
 * in transparent huge pages where the kernel allows them.
 *
 * Why. Decode reads every weight once per token, a forward stream of hundreds of MB per
 * thread. In 4 KiB pages that stream crosses a page every 4 KiB: a TLB miss and a page walk
 * each time, and the hardware prefetchers restart at the boundary. Backed by 2 MiB pages it
 * reads faster. Measured on the development machine (Zen 4, 2 cores; TinyLlama-1.1B shape,
 * every matrix packed, decode of 64 tokens, median of 4 alternating runs): see
 * docs/PERFORMANCE.md, "Huge pages for the packed weights".
 *
 * Contract
 *   ifk_bigmem_alloc(n) returns n zeroed bytes (64-byte aligned), or NULL when out of memory.
 *   From IFK_BIGMEM_MIN bytes on, the block is a mapping of its own, 2 MiB aligned, advised
 *   MADV_HUGEPAGE (the kernel backs it with huge pages as it is first touched: zero pages
 *   cost nothing until then, as with calloc); smaller blocks come from aligned_alloc, zeroed.
 *   ifk_bigmem_free(p) frees a block of ifk_bigmem_alloc (NULL: nothing). Thread-safe.
 *   IFLOW_HUGEPAGES=0 in the environment (read at the first call) keeps the mappings but
 *   leaves out the advice: the 4 KiB pages, to compare.
 *   ifk_bigmem_huge_bytes(): bytes of the live mappings advised into huge pages (for the
 *   tests; what the kernel actually backed is in /proc/self/smaps, AnonHugePages).
 */
#ifndef IFK_BIGMEM_H
#define IFK_BIGMEM_H

#include <stddef.h>

enum { IFK_BIGMEM_MIN = 1 << 21 };

void *ifk_bigmem_alloc(size_t n);
void ifk_bigmem_free(void *p);
size_t ifk_bigmem_huge_bytes(void);

#endif
