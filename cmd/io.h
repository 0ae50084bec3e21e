/* io.h -- small I/O helpers the programs share: whole-stream reads, clocks, peak memory. */
#ifndef IFLOW_CMD_IO_H
#define IFLOW_CMD_IO_H

#include <stddef.h>
#include <stdio.h>

/* Read a whole file ("-" for stdin) into a NUL-terminated malloc'd buffer; 0 or <0 (error set). */
int slurp(const char *path, char **data, size_t *len);
/* Monotonic seconds. */
double now_s(void);
/* Peak resident set size of this process, in MiB. */
double peak_rss_mib(void);

#endif
