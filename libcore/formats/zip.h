/*
 * zip.h -- a checked reader of the members of a zip archive held in memory (as torch.save
 * writes them: every member "stored", i.e. uncompressed).
 *
 * Contract
 *   iflow_zip_parse() reads the central directory of the n bytes at buf (which the caller owns
 *   and keeps alive and unchanged while the archive is used; nothing is copied) and checks,
 *   for every member, that its local header is where the directory says, carries the same
 *   name, and that its data lies inside the buffer. Zip64 end records and zip64 size/offset
 *   fields are understood. Compressed or encrypted members are listed (method != 0) but their
 *   data cannot be had: iflow_zip_find_stored() refuses them with IFLOW_EUNSUPPORTED. CRCs are
 *   not checked (a checkpoint is read in place, never decompressed).
 *
 *   On failure the archive is left empty and a message names `name` and the byte offset. The
 *   archive owns its member table; iflow_zip_free() releases it (not the buffer). Member names
 *   point into buf and are NOT NUL-terminated: use name_len.
 */
#ifndef IFLOW_ZIP_H
#define IFLOW_ZIP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;       /* into the buffer, name_len bytes, not NUL-terminated */
    size_t name_len;
    int method;             /* 0 = stored; anything else is compressed */
    int encrypted;
    uint64_t size;          /* compressed size = bytes of data in the archive */
    uint64_t usize;         /* uncompressed size */
    uint64_t data_offset;   /* where the member's bytes start in the buffer */
} iflow_zip_member;

typedef struct {
    const char *name;            /* for messages (borrowed) */
    const unsigned char *base;
    size_t size;
    iflow_zip_member *m;         /* in name order */
    size_t n;
} iflow_zip;

int  iflow_zip_parse(iflow_zip *z, const void *buf, size_t n, const char *name);
void iflow_zip_free(iflow_zip *z);

/* The member called `name` (a NUL-terminated string), or NULL. */
const iflow_zip_member *iflow_zip_find(const iflow_zip *z, const char *name);

/* The data of stored member `name`: 0 with *data and *size set, IFLOW_ENOTFOUND if absent,
 * IFLOW_EUNSUPPORTED if it is compressed or encrypted. */
int iflow_zip_find_stored(const iflow_zip *z, const char *name, const void **data,
                          size_t *size);

#endif
