/*
 * spec.h -- model specs: a model family as a choice of atomic blocks (specs/NAME.ini).
 *
 * A spec file has four sections (iflow-spec(5) is the full description):
 *   [model]    name, architectures (config.json "architectures" values it serves), description
 *   [blocks]   block = choice, e.g. norm = rms, activation = silu, ffn = gated, position = rope
 *   [hparams]  iflow hyperparameter = config.json keys or literals, first present wins
 *   [tensors]  iflow tensor name = source tensor name, "{L}" standing for the layer index
 *   [ignore]   pattern = shell pattern of source tensors that carry nothing the engine needs
 *
 * Contract
 *   iflow_spec_load() parses one file (inih) and owns every string in the result until
 *   iflow_spec_close(). iflow_spec_find() scans directories for the *.ini serving an
 *   architecture. iflow_spec_resolve() evaluates [blocks] and [hparams] against a parsed
 *   config.json and returns a new JSON object {"spec", "blocks", "hparams"} that the caller
 *   owns (json_decref); this resolved form is what a shard file stores, so no tool needs the
 *   .ini after conversion. Errors name the file and line ("specs/x.ini:12: ...").
 */
#ifndef IFLOW_SPEC_H
#define IFLOW_SPEC_H

#include <jansson.h>
#include <stddef.h>

typedef struct { char *key, *value; } iflow_spec_kv;

typedef struct {
    char *path;
    char *name, *description;
    char **architectures;   size_t n_architectures;
    iflow_spec_kv *blocks;  size_t n_blocks;
    iflow_spec_kv *hparams; size_t n_hparams;
    iflow_spec_kv *tensors; size_t n_tensors;
    char **ignore;          size_t n_ignore;
} iflow_spec;

int  iflow_spec_load(iflow_spec **out, const char *path);
void iflow_spec_close(iflow_spec *spec);

/* Load the first spec (in directory order, then file name order) whose [model] architectures
 * list `architecture`; "devices.ini" (device descriptions, partition.h) is not a spec and is
 * skipped. IFLOW_ENOTFOUND names the architecture and the directories searched. */
int iflow_spec_find(iflow_spec **out, const char *const *dirs, size_t n_dirs, const char *architecture);

/* Resolve against config.json. */
int iflow_spec_resolve(const iflow_spec *spec, const json_t *config, json_t **resolved);

/* Source tensor name for an iflow tensor name (e.g. "blk.3.wq" -> "model.layers.3...."), written
 * to buf. Returns 0, or IFLOW_ENOTFOUND if the spec does not map that name. */
int iflow_spec_source_name(const iflow_spec *spec, const char *iflow_name, char *buf, size_t cap);

/* 1 if a source tensor name matches one of the [ignore] patterns. */
int iflow_spec_ignored(const iflow_spec *spec, const char *source_name);

#endif
