/* model.h -- opening the model a program is given: a shard file, or any source iflow-convert
 * reads (a Hugging Face directory, a GGUF file, a llama2.c checkpoint), converted on the fly. */
#ifndef IFLOW_CMD_MODEL_H
#define IFLOW_CMD_MODEL_H

#include "cmd/opt.h"
#include "libcore/engine/model.h"

#include <stddef.h>

/* 1 if path names a source to convert: a directory with a config.json, a GGUF file, a llama2.c
 * checkpoint. A shard ("-": on stdin) and iflow-partition's directories are models already. */
int cmd_is_source(const char *path);

/* iflow_model_open(), after converting a source (cmd_is_source) with the installed specs into a
 * file under $TMPDIR (default /tmp), unlinked once open: the model's mapping holds the converted
 * copy until it closes. Convert once with iflow-convert to load a model repeatedly without
 * paying the conversion each time. */
int cmd_model_open(iflow_model **out, const char *path, int flags);
/* The same for the process computing plan device dev (iflow_model_open_device; dev < 0: all). */
int cmd_model_open_device(iflow_model **out, const char *path, int flags, int dev);

/* LoRA adapters from the command line (--lora FILE, --lora-scaled FILE:SCALE): merged into the
 * weights of a source as it is converted (convert.h), or applied at run time to a converted model
 * (cmd_model_open_lora). */
#define CMD_MAX_LORAS 16
typedef struct {
    const char *paths[CMD_MAX_LORAS]; /* the arguments, or --lora-scaled's FILE in names[] */
    double scales[CMD_MAX_LORAS];
    size_t n;
    char names[CMD_MAX_LORAS][4096];
    /* --lora-module NAME=FILE: adapters a batch's requests choose by name ("lora": NAME), applied
     * at run time to the sequences that ask (iflow_model_add_adapter), numbered from 1 in order */
    const char *modules[CMD_MAX_LORAS];      /* NAME (in module_args) */
    const char *module_paths[CMD_MAX_LORAS]; /* FILE (in module_args) */
    size_t n_modules;
    char module_args[CMD_MAX_LORAS][4096];
} cmd_loras;

/* Add --lora's (scaled = 0) or --lora-scaled's (scaled = 1) argument; a usage error if bad. */
void cmd_lora_add(const iflow_tool *t, cmd_loras *l, const char *arg, int scaled);
/* Add --lora-module's NAME=FILE (NAME of letters, digits, '.', '_' and '-', each once). */
void cmd_lora_module_add(const iflow_tool *t, cmd_loras *l, const char *arg);
/* The options' fields of iflow_convert_opts for l (NULL or empty: none). */
void cmd_lora_opts(const cmd_loras *l, const char *const **paths, const double **scales, size_t *n);

/* cmd_model_open_device() with adapters l: merged into a source as it is converted, applied at
 * run time to a model already converted (iflow_model_add_lora, with the installed specs), and
 * l's modules added for the sequences that ask for them (iflow_model_add_adapter). l may be
 * NULL. */
int cmd_model_open_lora(iflow_model **out, const char *path, int flags, int dev, const cmd_loras *l);

#endif
