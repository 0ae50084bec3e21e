/*
 * opt.h -- the programs' option tables, and everything generated from them.
 *
 * Each program in cmd/ describes itself once, as an iflow_tool with a table of iflow_opt.
 * That table drives the option parser, --help, the OPTIONS section of the program's man page
 * and its bash, zsh and fish completions (`make docs` writes those from the hidden option
 * --iflow-doc=man|bash|zsh|fish; tests/cli/docs.sh fails when the committed files drift).
 *
 * Conventions: usage errors (unknown option, bad value) print "iflow-x: <what>" and one hint
 * line to stderr and exit 2; runtime failures print "iflow-x: <message>" and exit 1.
 */
#ifndef IFLOW_OPT_H
#define IFLOW_OPT_H

#include <stdint.h>

enum { OPT_HELP = 1000, OPT_VERSION, OPT_DOC };

typedef struct {
    int         id;         /* returned by opt_next(); >= 256 for long-only options       */
    const char *name;       /* long name without "--"                                     */
    char        short_name; /* 0 for none                                                 */
    const char *arg;        /* metavariable ("N", "FILE") or NULL for a flag               */
    const char *help;       /* one line for --help and the man page                       */
    const char *complete;   /* completion: "file", "dir", or a space-separated word list  */
} iflow_opt;

typedef struct {
    const char      *name;     /* "iflow-run"                                     */
    const char      *usage;    /* "-m MODEL [-p PROMPT] [options]"                */
    const char      *summary;  /* one line: what the program does                  */
    const iflow_opt *opts;     /* terminated by an entry with name == NULL         */
} iflow_tool;

/* Parse the next option. Returns its id, 0 when options end (opt_index(): first operand), or
 * exits: --help (0), --version (0), --iflow-doc (0), usage errors (2). *arg gets the value. */
int opt_next(const iflow_tool *t, int argc, char **argv, const char **arg);
int opt_index(void);

/* Print "iflow-x: message" to stderr (the message is libiflow's last error if fmt is NULL). */
void die_usage(const iflow_tool *t, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
void die(const iflow_tool *t, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

/* Value parsers: on a bad value they exit through die_usage naming the option. */
long   opt_long(const iflow_tool *t, const char *opt, const char *s, long min, long max);
double opt_double(const iflow_tool *t, const char *opt, const char *s, double min, double max);
uint64_t opt_u64(const iflow_tool *t, const char *opt, const char *s);

/* Where programs look for specs: $IFLOW_SPEC_PATH (colon-separated), then the specs/ directory
 * beside the executable's bin/ (a build tree), then $PREFIX/share/iflow/specs (an install). */
int spec_dirs(const char *dirs[], int cap);

#include "include/iflow.h"
#define IFLOW_VERSION IFLOW_VERSION_STRING

#endif
