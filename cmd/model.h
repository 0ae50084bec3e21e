/* model.h -- opening the model a program is given: a shard file, or any source iflow-convert
 * reads (a Hugging Face directory, a GGUF file, a llama2.c checkpoint), converted on the fly. */
#ifndef IFLOW_CMD_MODEL_H
#define IFLOW_CMD_MODEL_H

#include "libcore/engine/model.h"

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

#endif
