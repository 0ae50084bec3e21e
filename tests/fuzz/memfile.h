/* memfile.h -- fuzz targets whose parser takes a path: put the input in a memfd and hand the
 * parser "/proc/self/fd/N". */
#ifndef IFLOW_FUZZ_MEMFILE_H
#define IFLOW_FUZZ_MEMFILE_H

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Returns the fd (close it after use) and writes the path into buf, or -1. */
static int memfile(const uint8_t *data, size_t size, char *buf, size_t cap)
{
    int fd = memfd_create("fuzz", 0);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(buf, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
