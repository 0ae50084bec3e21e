/*
 * spec.h -- model specs: a model family as a choice of atomic blocks (specs/NAME.ini).
 *
 * A spec file has four sections (iflow-spec(5) is the full description):
 *   [model]    name, architectures (config.json "architectures" values it serves), description,
 *              base (optional: another spec of the same folder whose keys this one overrides)
 *   [blocks]   block = choice, e.g. norm = rms, activation = silu, ffn = gated, position = rope
 *   [hparams]  iflow hyperparameter = config.json keys or literals, first present wins
 *   [tensors]  iflow tensor name = source tensor name, "{L}" standing for the layer index and
 *              "{E}" for the expert (a mixture of experts' FFN)
 *   [ignore]   pattern = shell pattern of source tensors that carry nothing the engine needs
 *   [blocks.KEY=VALUE]  blocks that replace [blocks]' keys when config.json's KEY is VALUE (T5's
 *              feed_forward_proj = gated-gelu: a gated GELU FFN); when sections name KEY and
 *              the config has it, its value must be one they name
 *   [hparams.KEY=VALUE]  hyperparameters (alternatives as in [hparams]) that replace [hparams]'
 *              when config.json's KEY is VALUE; other values keep [hparams]' (no refusal)
 *   [gguf]     architectures = general.architecture values this spec serves from GGUF files;
 *              [gguf.blocks], [gguf.hparams], [gguf.tensors] override the keys of the sections
 *              of the same name for such a source, [gguf.ignore] replaces [ignore], and
 *              [gguf.blocks.KEY=VALUE], [gguf.hparams.KEY=VALUE] add conditional sections
 *   A key of [hparams] may name "{K}": the config's string at key K, so one variant serves
 *   several GGUF architectures ({general.architecture}.block_count).
 *
 * Contract
 *   iflow_spec_load() parses one file (inih) and owns every string in the result until
 *   iflow_spec_close(). iflow_spec_find() scans directories for the *.ini serving an
 *   architecture. iflow_spec_resolve() evaluates [blocks] and [hparams] against a parsed
 *   config.json and returns a new JSON object {"spec", "blocks", "hparams"} that the caller
 *   owns (json_decref); this resolved form is what a shard file stores, so no tool needs the
 *   .ini after conversion. Errors name the file and line ("specs/x.ini:12: ...").
 *
 *   Source formats other than a Hugging Face directory (today: "gguf") are variants of a spec:
 *   iflow_spec_find_source() finds the spec whose [FORMAT] section lists the source's
 *   architecture and returns it with the variant applied (iflow_spec_use_source()), so the
 *   rest of the converter reads one spec whatever the source. Data, not code: a new
 *   architecture from GGUF is a [gguf] section.
 */
#ifndef IFLOW_SPEC_H
#define IFLOW_SPEC_H

#include <jansson.h>
#include <stddef.h>

typedef struct { char *key, *value; } iflow_spec_kv;

/* The [FORMAT] sections of a spec: a variant for another source format. */
typedef struct {
    char *format;                             /* "gguf"                                       */
    char **architectures;   size_t n_architectures;
    iflow_spec_kv *blocks;  size_t n_blocks;  /* each overrides the same key of the base      */
    iflow_spec_kv *hparams; size_t n_hparams;
    iflow_spec_kv *tensors; size_t n_tensors;
    char **ignore;          size_t n_ignore;  /* replaces the base's [ignore] when has_ignore */
    int has_ignore;
    struct iflow_spec_when *whens; size_t n_whens; /* [FORMAT.blocks.K=V], [FORMAT.hparams.K=V] */
} iflow_spec_variant;

/* [blocks.KEY=VALUE] or [hparams.KEY=VALUE]: blocks or hyperparameters chosen by a config value. */
typedef struct iflow_spec_when {
    char *key, *value;
    iflow_spec_kv *blocks;  size_t n_blocks;  /* the keys it sets: blocks, or hyperparameters */
    int hparams;                              /* 1: [hparams.KEY=VALUE] */
} iflow_spec_when;

typedef struct {
    char *path;
    char *name, *description;
    char *base;             /* [model] base: the spec (NAME.ini beside it) this one extends  */
    char **architectures;   size_t n_architectures;
    iflow_spec_kv *blocks;  size_t n_blocks;
    iflow_spec_kv *hparams; size_t n_hparams;
    iflow_spec_kv *tensors; size_t n_tensors;
    char **ignore;          size_t n_ignore;
    iflow_spec_variant *variants; size_t n_variants;
    iflow_spec_when *whens; size_t n_whens;      /* in file order (a base's first) */
    const char *source;     /* the variant applied (a format name), or NULL for Hugging Face  */
} iflow_spec;

int  iflow_spec_load(iflow_spec **out, const char *path);
void iflow_spec_close(iflow_spec *spec);

/* Load the first spec (in directory order, then file name order) whose [model] architectures
 * list `architecture`; "devices.ini" (device descriptions, partition.h) is not a spec and is
 * skipped. IFLOW_ENOTFOUND names the architecture and the directories searched. */
int iflow_spec_find(iflow_spec **out, const char *const *dirs, size_t n_dirs, const char *architecture);

/* As iflow_spec_find() for a source of another format ("gguf"): the first spec whose [format]
 * section lists `architecture`, with that variant applied. */
int iflow_spec_find_source(iflow_spec **out, const char *const *dirs, size_t n_dirs, const char *format,
                           const char *architecture);

/* Apply the variant for `format` to spec (once): its blocks, hparams and tensors override the
 * base's keys, its ignore patterns replace the base's. IFLOW_ESPEC when the spec has none. */
int iflow_spec_use_source(iflow_spec *spec, const char *format);

/* Resolve against config.json (or a source's metadata, nested at the dots of its keys). An
 * alternative "!key" is true when key is absent and false when present. [blocks.KEY=VALUE]
 * sections whose KEY has VALUE in the config replace blocks, in file order; a config value of
 * KEY that no section names is IFLOW_ESPEC naming the key, the value and the spec. */
int iflow_spec_resolve(const iflow_spec *spec, const json_t *config, json_t **resolved);

/* Source tensor name for an iflow tensor name (e.g. "blk.3.wq" -> "model.layers.3...."), written
 * to buf. Returns 0, or IFLOW_ENOTFOUND if the spec does not map that name. */
int iflow_spec_source_name(const iflow_spec *spec, const char *iflow_name, char *buf, size_t cap);

/* 1 if a source tensor name matches one of the [ignore] patterns. */
int iflow_spec_ignored(const iflow_spec *spec, const char *source_name);

/* A [blocks] key as the spec's sections set it (its variant's, when one is applied), before any
 * [blocks.KEY=VALUE] section and any config: "half" for rope_layout. NULL when none sets it. */
const char *iflow_spec_block(const iflow_spec *spec, const char *key);

#endif
