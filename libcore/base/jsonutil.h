/*
 * jsonutil.h -- loading JSON files (config.json & co.) and reading typed values out of them.
 *
 * Contract
 *   Built on jansson; values are plain json_t*. The loaders return a new reference in *out
 *   that the caller releases with json_decref(); on failure *out is NULL and the message is
 *   "<file>:<line>:<column>: <what is wrong>" (the line and column are jansson's, 1-based).
 *   Duplicate keys are accepted, the last one winning, as Python's json module does.
 *
 *   Getters take a key, or a dotted path into nested objects ("rope_scaling.factor"); a key
 *   that itself contains a dot is found when the object holds it literally. They never keep
 *   a reference and never allocate; strings they return point into the json_t and live as
 *   long as it does.
 *     - iflow_json_int() & co. are lenient: a missing key, a JSON null or a value of the
 *       wrong type gives the caller's default. Use them for optional knobs.
 *     - iflow_json_get_int() & co. are strict: 0 and *out set on success; IFLOW_ENOTFOUND when
 *       the key is missing or null (*out untouched, so callers can fall back to a default);
 *       IFLOW_EFORMAT when the value has the wrong type. Both set a message naming the key
 *       and `where` (usually the file the object came from).
 *   Integers: a JSON integer, or a real with an integral value inside int64's range
 *   (configs written by Python sometimes say 10000.0). Numbers: integers or reals.
 *   Booleans: only true and false.
 */
#ifndef IFLOW_JSONUTIL_H
#define IFLOW_JSONUTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* A JSON string of text [n] that may not be valid UTF-8 (a generation cut inside a character,
 * a model's stray bytes): each maximal invalid subpart becomes U+FFFD, as Python's
 * bytes.decode("utf-8", "replace") does. NULL only when memory runs out. */
json_t *iflow_json_text(const char *text, size_t n);

/* Read and parse the file at `path` (any JSON value). IFLOW_ENOTFOUND if it does not exist,
 * IFLOW_EIO if it cannot be read, IFLOW_EFORMAT if it is not valid JSON. */
int iflow_json_load_file(json_t **out, const char *path);

/* Parse n bytes; `name` stands in for the file name in messages. */
int iflow_json_load_buf(json_t **out, const void *buf, size_t n, const char *name);

/* Like iflow_json_load_file(), and the value must be an object (IFLOW_EFORMAT otherwise). */
int iflow_json_load_object(json_t **out, const char *path);

/* The value at `path` in `obj`, or NULL (also when obj is not an object). Borrowed. */
const json_t *iflow_json_lookup(const json_t *obj, const char *path);

/* Lenient getters: the value, or `def` when missing, null or of another type. */
int64_t     iflow_json_int(const json_t *obj, const char *path, int64_t def);
double      iflow_json_number(const json_t *obj, const char *path, double def);
int         iflow_json_bool(const json_t *obj, const char *path, int def);
const char *iflow_json_string(const json_t *obj, const char *path, const char *def);

/* Strict getters (see the contract). `where` names the source in messages; may be NULL. */
int iflow_json_get_int(const json_t *obj, const char *path, int64_t *out, const char *where);
int iflow_json_get_number(const json_t *obj, const char *path, double *out, const char *where);
int iflow_json_get_bool(const json_t *obj, const char *path, int *out, const char *where);
int iflow_json_get_string(const json_t *obj, const char *path, const char **out,
                          const char *where);

/* "object", "array", "string", "integer", "real", "true", "false", "null". */
const char *iflow_json_type_name(const json_t *v);

#endif
