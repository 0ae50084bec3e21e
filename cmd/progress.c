/* progress.c -- see progress.h. */
#include "cmd/progress.h"
#include "cmd/io.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* The status line of this process (any progress): whether it is on the terminal now and its
 * text, for drawing it again after a line of output; draw_mu orders drawing against
 * progress_write_line() from another thread. */
static pthread_mutex_t draw_mu = PTHREAD_MUTEX_INITIALIZER;
static int line_drawn;
static char drawn[512];

static void erase_locked(void)
{
    if (line_drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    line_drawn = 0;
}

void progress_erase(void)
{
    pthread_mutex_lock(&draw_mu);
    erase_locked();
    pthread_mutex_unlock(&draw_mu);
}

void progress_open(progress *p, const char *name, int mode)
{
    *p = (progress){.on = mode == PROGRESS_AUTO ? isatty(STDERR_FILENO) : mode == PROGRESS_ON, .name = name,
                    .t0 = now_s(), .last = -1};
}

/* Columns of the terminal on standard error; 80 when it is none or does not say. */
static int width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

void progress_show(progress *p, int force, const char *fmt, ...)
{
    if (!p->on)
        return;
    double t = now_s();
    if (!force && p->last >= 0 && t - p->last < 0.1)
        return;
    p->last = t;
    char line[512];
    int n = snprintf(line, sizeof line, "%s: ", p->name);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* one column short of the width: a line that fills the last column wraps on some terminals */
    int w = width() - 1;
    if (w < (int)sizeof line && (int)strlen(line) > w)
        line[w > 0 ? w : 0] = 0;
    pthread_mutex_lock(&draw_mu);
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    memcpy(drawn, line, sizeof drawn);
    line_drawn = 1;
    pthread_mutex_unlock(&draw_mu);
}

/* Standard output and standard error are the same terminal: what goes to the one lands on the
 * line the other is drawing. Decided once. */
static int same_terminal(void)
{
    static int same = -1;
    struct stat o, e;
    if (same < 0)
        same = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO) && fstat(STDOUT_FILENO, &o) == 0 &&
               fstat(STDERR_FILENO, &e) == 0 && o.st_rdev == e.st_rdev;
    return same;
}

int progress_write_line(const char *s)
{
    pthread_mutex_lock(&draw_mu);
    int shown = line_drawn && same_terminal();
    if (shown)
        erase_locked();
    int rc = fputs(s, stdout) == EOF || putchar('\n') == EOF || fflush(stdout) == EOF ? EOF : 0;
    if (shown) { /* drawn again under the line just written */
        fprintf(stderr, "\r%s\033[K", drawn);
        fflush(stderr);
        line_drawn = 1;
    }
    pthread_mutex_unlock(&draw_mu);
    return rc;
}

void progress_end(progress *p)
{
    (void)p;
    progress_erase();
}

double progress_elapsed(const progress *p)
{
    return now_s() - p->t0;
}

const char *progress_bytes(char *buf, int cap, double b)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4)
        b /= 1000, u++;
    snprintf(buf, (size_t)cap, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

const char *progress_left(char *buf, int cap, double done, double total, double elapsed)
{
    buf[0] = 0;
    if (done <= 0 || total <= done || elapsed < 0.5)
        return buf;
    double s = elapsed * (total - done) / done;
    if (s < 90)
        snprintf(buf, (size_t)cap, "%.0f s left", s);
    else if (s < 5400)
        snprintf(buf, (size_t)cap, "%.0f min left", s / 60);
    else
        snprintf(buf, (size_t)cap, "%ld h %ld min left", (long)s / 3600, (long)s % 3600 / 60);
    return buf;
}

void progress_tensors(void *user, const iflow_progress *p)
{
    progress *pr = user;
    double t = progress_elapsed(pr), total = (double)(p->total_bytes ? p->total_bytes : pr->total_bytes);
    char done[32], all[64] = "", rate[64] = "", left[40];
    progress_bytes(done, sizeof done, (double)p->bytes);
    if (total > 0)
        snprintf(all, sizeof all, " of %s", progress_bytes(left, sizeof left, total));
    if (t > 0.2)
        snprintf(rate, sizeof rate, ", %s/s", progress_bytes(left, sizeof left, (double)p->bytes / t));
    /* time left by bytes when their total is known, else by tensors */
    if (total > 0)
        progress_left(left, sizeof left, (double)p->bytes, total, t);
    else
        progress_left(left, sizeof left, (double)p->done, (double)p->total, t);
    progress_show(pr, p->total && p->done == p->total, "%llu/%llu tensors, %s%s%s%s%s, %s",
                  (unsigned long long)p->done, (unsigned long long)p->total, done, all, rate, left[0] ? ", " : "",
                  left, p->item ? p->item : "");
}
