/* fuzz_split.c -- what a split model's loader reads from a device file's meta record (split.h):
 * the input is the meta's JSON text, checked as device 1 of a fixed 4-device hybrid plan of
 * stories260K's shape (iflow_split_check_meta, against itself as device 0's meta too), its
 * hyperparameters read, and that device's tensor list built when the plan fits them. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "libcore/engine/split.h"

static void fixed_plan(iflow_plan *p)
{
    static const int parts[4][6] = {{0, 3, 0, 4, 0, 86}, {0, 3, 4, 8, 86, 172}, {3, 5, 0, 4, 0, 86}, {3, 5, 4, 8, 86, 172}};
    *p = (iflow_plan){.n_layers = 5, .n_heads = 8, .n_kv_heads = 4, .ffn_dim = 172, .n_devices = 4, .output_device = 2};
    for (int i = 0; i < 4; i++) {
        iflow_plan_device *d = &p->devices[i];
        snprintf(d->name, sizeof d->name, "cpu:%d", i);
        d->layer0 = parts[i][0], d->layer1 = parts[i][1], d->head0 = parts[i][2], d->head1 = parts[i][3];
        d->ffn0 = parts[i][4], d->ffn1 = parts[i][5];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *meta = json_loadb((const char *)data, size, 0, NULL);
    if (!meta)
        return 0;
    iflow_plan p;
    fixed_plan(&p);
    int index, count;
    iflow_split_is_part(meta, &index, &count);
    iflow_split_check_meta(meta, "device-1.ifs", &p, "plan.ini", 1, NULL, NULL);
    iflow_split_check_meta(meta, "device-1.ifs", &p, "plan.ini", 1, meta, "device-0.ifs");
    iflow_hparams hp;
    if (iflow_hparams_from_json(&hp, meta, "fuzz") == 0 &&
        iflow_plan_check(&p, hp.n_layers, hp.n_heads, hp.n_kv_heads, hp.ffn_dim) == 0) {
        iflow_split_tensor *t;
        size_t n;
        for (int i = 0; i < p.n_devices; i++)
            if (iflow_split_tensors(&hp, &p, i, &t, &n) == 0)
                free(t);
    }
    json_decref(meta);
    return 0;
}
