/* slice.c -- row and column slices of weight matrices. See slice.h. */
#include "slice.h"
#include "footprint.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "kernels/cpu/quant.h"

#include <stdlib.h>
#include <string.h>

const void *iflow_slice_rows(const void *data, int type, int64_t r0, int64_t cols)
{
    return (const char *)data + iflow_matrix_bytes(type, r0, cols);
}

int iflow_slice_columns_check(int type, int64_t c0, int64_t c1, int64_t K, const char *name)
{
    const ifk_qtype_info *q = ifk_qtype(type);
    if (!q || (c0 == 0 && c1 == K) || (c0 % q->block == 0 && (c1 % q->block == 0 || c1 == K)))
        return 0;
    return iflow_seterr(IFLOW_EUNSUPPORTED,
                        "cannot split the columns of '%s' (%s, blocks of %d) at %lld-%lld: a split of a quantized "
                        "matrix must fall on block boundaries",
                        name, iflow_dtype_name(type), q->block, (long long)c0, (long long)c1 - 1);
}

void *iflow_slice_columns(const void *data, int type, int64_t rows, int64_t K, int64_t c0, int64_t c1)
{
    size_t in_row = iflow_matrix_bytes(type, 1, K), out_row = iflow_matrix_bytes(type, 1, c1 - c0),
           skip = c0 ? iflow_matrix_bytes(type, 1, c0) : 0;
    /* quantized: c0 is on a block boundary, so the slice is whole blocks; a float type's
     * columns are elements */
    size_t n = out_row * (size_t)rows;
    char *out = malloc(n ? n : 1);
    if (!out)
        return NULL;
    for (int64_t r = 0; r < rows; r++)
        memcpy(out + (size_t)r * out_row, (const char *)data + (size_t)r * in_row + skip, out_row);
    return out;
}
