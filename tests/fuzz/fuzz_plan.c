/* fuzz_plan.c -- partition plans (plan.h: iflow_plan_load, then iflow_plan_check against a
 * fixed shape and a save) and device description files (partition.h: iflow_devdb_load, then a
 * machine parsed from it). The first input byte picks the parser. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "libcore/engine/partition.h"
#include "libcore/engine/plan.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (size < 1)
        return 0;
    int which = data[0] & 1;
    int fd = memfile(data + 1, size - 1, path, sizeof path);
    if (fd < 0)
        return 0;
    if (which == 0) {
        iflow_plan p;
        if (iflow_plan_load(&p, path) == 0) {
            iflow_plan_check(&p, 5, 8, 4, 172);
            iflow_plan_check(&p, p.n_layers, p.n_heads, p.n_kv_heads, p.ffn_dim);
            char out[80];
            snprintf(out, sizeof out, "%s.out", path);
            if (iflow_plan_save(&p, out) == 0)
                unlink(out);
        }
    } else {
        iflow_devdb *db;
        if (iflow_devdb_load(&db, path) == 0) {
            iflow_machine m;
            iflow_machine_opts o = {.host_memory = 1ull << 34, .host_cores = 4};
            for (int i = 0; i < iflow_devdb_count(db) && i < 4; i++) {
                char spec[64];
                snprintf(spec, sizeof spec, "2x%s,cpu:2", iflow_devdb_at(db, i)->name);
                iflow_machine_parse(&m, spec, db, &o);
            }
            iflow_devdb_free(db);
        }
    }
    close(fd);
    return 0;
}
