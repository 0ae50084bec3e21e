/*
 * progress.h -- one status line on standard error for long work, rewritten in place.
 *
 * Contract
 *   progress_open() decides once whether the line is shown: with mode PROGRESS_AUTO only when
 *   standard error is a terminal (never in pipes, files or CI logs), PROGRESS_ON always (a
 *   --progress run), PROGRESS_OFF never. progress_show() formats the line and draws it as
 *   "\r" + text + "erase to the end of the line", cut to the terminal's width (TIOCGWINSZ; 80
 *   columns when standard error is not a terminal) so it never wraps; it redraws at most ten
 *   times a second unless forced. progress_end() erases the line, so what follows (a -v log
 *   line, an error) starts on a clean line; call it before printing anything else to stderr.
 *   progress_rate() and progress_left() format a rate and the time left for the line.
 *   The library never draws: libcore reports through callbacks (libcore/base/progress.h) and
 *   the programs draw.
 */
#ifndef IFLOW_CMD_PROGRESS_H
#define IFLOW_CMD_PROGRESS_H

#include <stdint.h>

#include "cmd/opt.h"
#include "libcore/base/progress.h"

enum { PROGRESS_AUTO = -1, PROGRESS_OFF = 0, PROGRESS_ON = 1 };

typedef struct {
    int on;             /* the line is shown                           */
    const char *name;   /* the program's name, the line's prefix       */
    double t0, last;    /* when the work began; the last redraw        */
    uint64_t total_bytes; /* progress_tensors: the bytes in all when the library does not know */
} progress;

void progress_open(progress *p, const char *name, int mode);
/* Draw the line (at most ten times a second; force: now). */
void progress_show(progress *p, int force, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void progress_end(progress *p);
/* Erase the status line if one is drawn (die() calls it before its message). */
void progress_erase(void);
/* Write line s and a newline to standard output and flush it, for output written while a
 * status line may be drawn (iflow-run --batch's results): when standard output is the terminal
 * the line is drawn on, the line is erased first and drawn again below, so s never lands after
 * the status text. Any thread may call it; drawing waits for it. 0, or EOF on a failed write. */
int progress_write_line(const char *s);
/* Seconds since progress_open. */
double progress_elapsed(const progress *p);
/* "12.3 MB" for a byte count (decimal units). */
const char *progress_bytes(char *buf, int cap, double bytes);
/* The time left for `done` of `total` after `elapsed` seconds: "3 s left", "2 min left",
 * "1 h 5 min left", or "" while it cannot be estimated yet. */
const char *progress_left(char *buf, int cap, double done, double total, double elapsed);

/* An iflow_progress_fn (libcore/base/progress.h) for converting and quantizing, user a
 * progress: "12/57 tensors, 1.2 GB of 2.2 GB, 350 MB/s, 3 s left, blk.3.wq". */
void progress_tensors(void *user, const iflow_progress *p);

/* --progress and --no-progress for the option tables (ids above every program's own). */
enum { OPT_PROGRESS = 900, OPT_NO_PROGRESS };
#define PROGRESS_OPTS                                                                                                  \
    {OPT_PROGRESS, "progress", 0, NULL, "show a status line on standard error even when it is not a terminal", NULL},  \
    {OPT_NO_PROGRESS, "no-progress", 0, NULL,                                                                          \
     "never show the status line (by default it is shown only when standard error is a terminal)", NULL}

#endif
