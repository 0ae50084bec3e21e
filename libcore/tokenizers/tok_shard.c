/* tok_shard.c -- a shard's tokenizer (iflow_tokenizer_from_shard): the records its meta names,
 * built back by iflow_tokenizer_from_format(). The layout is shard.h's. */
#include "libcore/base/error.h"
#include "tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* Blob record `name` of sh, or IFLOW_ENOTFOUND naming it. */
static int blob(const iflow_shard *sh, const char *name, const iflow_shard_rec **r)
{
    *r = iflow_shard_find(sh, name);
    if (!*r || (*r)->kind != IFLOW_REC_BLOB)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing tokenizer record '%s' in '%s'", name, iflow_shard_path(sh));
    return 0;
}

/* The tokenizer that description d ({"format", "record", "vocab"?}) names. */
static int build(iflow_tokenizer **out, const iflow_shard *sh, const json_t *d)
{
    const char *format = json_string_value(json_object_get(d, "format")),
               *record = json_string_value(json_object_get(d, "record")),
               *vocab = json_string_value(json_object_get(d, "vocab")), *path = iflow_shard_path(sh);
    const iflow_shard_rec *r, *v = NULL;
    char name[512], vname[512];
    if (!format || !record)
        return iflow_seterr(IFLOW_EFORMAT, "bad tokenizer description in the meta record of '%s' (no format or record)",
                            path);
    int rc = blob(sh, record, &r);
    if (rc == 0 && vocab)
        rc = blob(sh, vocab, &v);
    if (rc < 0)
        return rc;
    snprintf(name, sizeof name, "%s:%s", path, record);
    snprintf(vname, sizeof vname, "%s:%s", path, vocab ? vocab : "");
    rc = iflow_tokenizer_from_format(out, format, r->data, r->nbytes, name, v ? v->data : NULL, v ? v->nbytes : 0,
                                     vname);
    if (rc < 0)
        return iflow_preperr(rc, "bad tokenizer record '%s'%s%s (payload at byte %llu) in '%s'", record,
                             v ? " with " : "", v ? vocab : "", (unsigned long long)r->offset, path);
    return 0;
}

int iflow_tokenizer_from_shard(iflow_tokenizer **out, const iflow_shard *sh, int side)
{
    *out = NULL;
    json_error_t je;
    json_t *meta = json_loads(iflow_shard_meta(sh), 0, &je);
    if (!meta)
        return iflow_seterr(IFLOW_EFORMAT, "bad meta record in '%s': %s at line %d", iflow_shard_path(sh), je.text,
                            je.line);
    const json_t *d = json_object_get(meta, "tokenizer");
    if (d && side == IFLOW_TOK_TARGET)
        d = json_object_get(d, "target");
    int rc = d ? build(out, sh, d) : 0; /* none: a model still runs on token ids */
    json_decref(meta);
    return rc;
}
