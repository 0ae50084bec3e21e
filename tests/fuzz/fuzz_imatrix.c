/* fuzz_imatrix.c -- the importance-matrix parser (iflow-imatrix(5)) and the check of a parsed
 * one against a fixed small model, then a round trip through the writer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libcore/formats/imatrix.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"tok_embd", "blk.0.wq", "blk.0.wo", "blk.0.ffn_down", "output"};
    static const int64_t cols[] = {64, 64, 64, 172, 64};
    static const int mult[] = {0, 1, 1, 1, 1};
    iflow_imatrix *im;
    if (iflow_imatrix_parse(&im, data, size, "fuzz") == 0) {
        iflow_imatrix_check_model(im, names, cols, mult, 5, "fuzz", "model");
        for (size_t i = 0; i < im->n; i++)
            if (iflow_imatrix_find(im, im->e[i].name) != &im->e[i])
                abort(); /* names are unique */
        char path[64];
        snprintf(path, sizeof path, "/tmp/fuzz-imatrix-%ld", (long)getpid());
        iflow_imatrix *back;
        if (iflow_imatrix_save(im, path) == 0 && iflow_imatrix_load(&back, path) == 0) {
            if (back->n != im->n || back->n_tokens != im->n_tokens)
                abort(); /* the writer writes what the parser read */
            iflow_imatrix_free(back);
        }
        unlink(path);
        iflow_imatrix_free(im);
    }
    return 0;
}
