/* fuzz_shard.c -- the shard reader, both ways (mmap and stream), on arbitrary bytes, and the
 * tokenizers a shard carries (both sides: iflow_tokenizer_from_shard), its payload checksums
 * not verified so that mutated tokenizer bytes reach the tokenizer readers. */
#include <stdint.h>
#include <stdlib.h>

#include "libcore/formats/shard.h"
#include "libcore/tokenizers/tokenizer.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = memfile(data, size, path, sizeof path);
    if (fd < 0)
        return 0;
    iflow_shard *sh;
    if (iflow_shard_open(&sh, path, 0) == 0) {
        for (size_t i = 0; i < iflow_shard_n_records(sh); i++) {
            const iflow_shard_rec *r = iflow_shard_rec_at(sh, i);
            volatile uint8_t sink = r->nbytes ? ((const uint8_t *)r->data)[r->nbytes - 1] : 0;
            (void)sink;
        }
        iflow_shard_close(sh);
    }
    if (iflow_shard_open(&sh, path, IFLOW_SHARD_NO_VERIFY) == 0) {
        for (int side = IFLOW_TOK_SOURCE; side <= IFLOW_TOK_TARGET; side++) {
            iflow_tokenizer *t;
            if (iflow_tokenizer_from_shard(&t, sh, side) == 0)
                iflow_tokenizer_close(t);
        }
        iflow_shard_close(sh);
    }
    iflow_shard_reader *rd;
    iflow_shard_rec rec;
    if (iflow_shard_reader_open(&rd, path) == 0) {
        while (iflow_shard_reader_next(rd, &rec) == 1)
            ;
        iflow_shard_reader_close(rd);
    }
    close(fd);
    return 0;
}
