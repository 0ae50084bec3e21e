/* model.c -- see model.h. */
#include "cmd/model.h"
#include "cmd/opt.h"
#include "libcore/base/error.h"
#include "libcore/formats/convert.h"
#include "libcore/formats/ggufsrc.h"
#include "libcore/formats/llama2c.h"
#include "libcore/formats/lora.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cmd_is_source(const char *path)
{
    struct stat sb;
    if (strcmp(path, "-") == 0 || stat(path, &sb) < 0)
        return 0;
    if (S_ISDIR(sb.st_mode)) { /* a Hugging Face directory; iflow-partition's split is a model */
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        return access(cfg, F_OK) == 0;
    }
    return iflow_is_gguf_file(path) || iflow_is_llama2c_file(path);
}

int cmd_model_open(iflow_model **out, const char *path, int flags)
{
    return cmd_model_open_lora(out, path, flags, -1, NULL);
}

int cmd_model_open_device(iflow_model **out, const char *path, int flags, int dev)
{
    return cmd_model_open_lora(out, path, flags, dev, NULL);
}

void cmd_lora_add(const iflow_tool *t, cmd_loras *l, const char *arg, int scaled)
{
    if (l->n == CMD_MAX_LORAS)
        die_usage(t, "at most %d LoRA adapters", CMD_MAX_LORAS);
    double scale = 1;
    const char *colon = scaled ? strrchr(arg, ':') : NULL;
    l->paths[l->n] = arg;
    if (scaled) {
        if (!colon || colon == arg || (size_t)(colon - arg) >= sizeof l->names[0])
            die_usage(t, "--lora-scaled takes FILE:SCALE, not '%s'", arg);
        scale = opt_double(t, "lora-scaled", colon + 1, -1e6, 1e6);
        memcpy(l->names[l->n], arg, (size_t)(colon - arg));
        l->names[l->n][colon - arg] = 0;
        l->paths[l->n] = l->names[l->n];
    }
    l->scales[l->n++] = scale;
}

void cmd_lora_module_add(const iflow_tool *t, cmd_loras *l, const char *arg)
{
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : 0;
    static const char NAME_CHARS[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
    if (!eq || n == 0 || !eq[1] || strspn(arg, NAME_CHARS) != n || strlen(arg) >= sizeof l->module_args[0])
        die_usage(t, "--lora-module takes NAME=FILE, NAME of letters, digits, '.', '_' and '-', not '%s'", arg);
    if (l->n_modules == CMD_MAX_LORAS)
        die_usage(t, "at most %d LoRA modules", CMD_MAX_LORAS);
    char *buf = l->module_args[l->n_modules];
    memcpy(buf, arg, strlen(arg) + 1);
    buf[n] = 0;
    for (size_t i = 0; i < l->n_modules; i++)
        if (strcmp(l->modules[i], buf) == 0)
            die_usage(t, "--lora-module '%s' given twice", buf);
    l->modules[l->n_modules] = buf;
    l->module_paths[l->n_modules++] = buf + n + 1;
}

void cmd_lora_opts(const cmd_loras *l, const char *const **paths, const double **scales, size_t *n)
{
    *paths = l && l->n ? l->paths : NULL;
    *scales = l && l->n ? l->scales : NULL;
    *n = l ? l->n : 0;
}

/* Adapter file path (scale s) applied to m at run time: to every sequence (module NULL), or
 * added as module `module` for the sequences that ask for it. */
static int add_one(iflow_model *m, const char *path, double s, const char *module)
{
    const char *dirs[8];
    size_t n_dirs = (size_t)spec_dirs(dirs, 8);
    iflow_lora *a = NULL;
    int rc = iflow_lora_open(&a, path, s);
    if (rc == 0)
        rc = module ? iflow_model_add_adapter(m, a, dirs, n_dirs) : iflow_model_add_lora(m, a, dirs, n_dirs);
    iflow_lora_close(a);
    if (rc < 0 && module)
        iflow_preperr(rc, "--lora-module '%s'", module);
    return rc < 0 ? rc : 0;
}

/* The model converted (or not) at path opened, with l's adapters applied at run time (only its
 * modules when `merged`: the others went into the conversion). */
static int open_shard_lora(iflow_model **out, const char *path, int flags, int dev, const cmd_loras *l, int merged)
{
    IFLOW_TRY(iflow_model_open_device(out, path, flags, dev));
    int rc = 0;
    for (size_t i = 0; l && !merged && i < l->n && rc == 0; i++)
        rc = add_one(*out, l->paths[i], l->scales[i], NULL);
    for (size_t i = 0; l && i < l->n_modules && rc == 0; i++)
        rc = add_one(*out, l->module_paths[i], 1, l->modules[i]);
    if (rc < 0) {
        iflow_model_close(*out);
        *out = NULL;
    }
    return rc;
}

int cmd_model_open_lora(iflow_model **out, const char *path, int flags, int dev, const cmd_loras *l)
{
    if (!cmd_is_source(path))
        return open_shard_lora(out, path, flags, dev, l, 0);
    /* converted into a temporary directory, opened, and unlinked: the mapping keeps the data */
    const char *tmp = getenv("TMPDIR");
    char dir[4096], shard[4200];
    snprintf(dir, sizeof dir, "%s/iflow-model-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return iflow_seterr(IFLOW_EIO, "cannot make a temporary directory to convert '%s' into: %s", path,
                            strerror(errno));
    snprintf(shard, sizeof shard, "%s/model.ifs", dir);
    const char *dirs[8];
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = dirs};
    o.n_spec_dirs = (size_t)spec_dirs(dirs, 8);
    cmd_lora_opts(l, &o.lora_paths, &o.lora_scales, &o.n_loras);
    int rc = iflow_convert(path, shard, &o);
    if (rc == 0)
        rc = open_shard_lora(out, shard, flags, dev, l, 1);
    else
        iflow_preperr(rc, "converting '%s'", path);
    unlink(shard);
    rmdir(dir);
    return rc;
}
