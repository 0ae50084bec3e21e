/* io.h -- small I/O helpers the programs share: whole-stream reads, clocks, peak memory. */
#ifndef IFLOW_CMD_IO_H
#define IFLOW_CMD_IO_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "include/iflow.h"

/* Read a whole file ("-" for stdin) into a NUL-terminated malloc'd buffer; 0 or <0 (error set). */
int slurp(const char *path, char **data, size_t *len);
/* fn(user, line, len) for each line of f, without its "\n" or "\r\n" (a last line without
 * "\n" counts). */
void each_line(FILE *f, void (*fn)(void *user, const char *line, size_t len), void *user);
/* Monotonic seconds. */
double now_s(void);
/* Peak resident set size of this process, in MiB. */
double peak_rss_mib(void);

/* Every JSON output starts with "schema": its version (docs/JSON.md): a change that removes,
 * renames or changes the meaning of a field increments it; new fields do not. */
#define IFLOW_JSON_SCHEMA 1
/* A new object {"schema": IFLOW_JSON_SCHEMA, ...o's fields in order}; takes o's reference. */
json_t *json_schema(json_t *o);

/* n entries of log-probabilities (iflow_result.logprobs, .prompt_logprobs) as a JSON array of
 * {"id", "token" (its text; null, with "bytes", when that is not valid UTF-8), "logprob" (null
 * for a first prompt token)}, with_top: each with "top", the same for the most likely tokens at
 * its position (docs/JSON.md). */
json_t *logprobs_json(const iflow_tokenizer *tok, const iflow_token_logprob *e, int n, int with_top);

#endif
