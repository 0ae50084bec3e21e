/* test_stop: stop strings found across piece boundaries, against a brute-force search of the
 * text after each piece; nothing of a stop string is ever emitted, and nothing else is held
 * back at the end. Pieces fed disarmed (min_tokens) complete no stop string; the first armed
 * piece completes one that began in them. */
#include "check.h"
#include "libcore/base/error.h"
#include "libcore/engine/stop.h"

/* Feed text in pieces cut at cuts[] (rising, < len); return what was emitted (malloc'd), the
 * matched index in *which. Checks on the way that the emitted text stays a prefix of want. */
static char *run_armed(iflow_stop *s, const char *text, const int *cuts, int n_cuts, int armed_from, const char *want,
                       int *which)
{
    size_t len = strlen(text), out_len = 0;
    char *out = calloc(len + 1, 1);
    int at = 0, stopped = 0, prefix_ok = 1;
    for (int c = 0; c <= n_cuts && !stopped; c++) {
        int end = c < n_cuts ? cuts[c] : (int)len;
        const char *e;
        size_t ne;
        iflow_stop_arm(s, c >= armed_from);
        int rc = iflow_stop_feed(s, text + at, (size_t)(end - at), &e, &ne);
        CHECK(rc >= 0, "feed: %s", iflow_errmsg());
        memcpy(out + out_len, e, ne);
        out_len += ne;
        prefix_ok &= strncmp(out, want, out_len) == 0 && out_len <= strlen(want);
        stopped = rc == 1;
        at = end;
    }
    if (!stopped) {
        const char *e;
        size_t ne;
        iflow_stop_flush(s, &e, &ne);
        memcpy(out + out_len, e, ne);
        out_len += ne;
    }
    CHECK(prefix_ok, "'%s': emitted text went past the expected output '%s'", text, want);
    *which = iflow_stop_which(s);
    return out;
}

static char *run(iflow_stop *s, const char *text, const int *cuts, int n_cuts, const char *want, int *which)
{
    return run_armed(s, text, cuts, n_cuts, 0, want, which);
}

/* Brute force: the earliest match over all strings in text[0..len) that ends after `after` (ties:
 * the first string). */
static int first_match(const char *text, size_t len, size_t after, const char *const *stops, int n, size_t *pos)
{
    int w = -1;
    *pos = len;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        for (size_t p = 0; p + l <= len && p < *pos; p++)
            if (p + l > after && memcmp(text + p, stops[i], l) == 0) {
                *pos = p, w = i;
                break;
            }
    }
    return w;
}

/* What a stream must do: stop at the first piece from armed_from on that completes a stop string
 * (generation cannot wait for a longer one that began earlier; one that a disarmed piece
 * completed does not count), cutting at the earliest such match in the text so far. */
static int stream_match(const char *text, const int *cuts, int n_cuts, int armed_from, const char *const *stops, int n,
                        size_t *pos)
{
    size_t len = strlen(text);
    for (int c = armed_from; c <= n_cuts; c++) {
        size_t start = c > 0 ? (size_t)cuts[c - 1] : 0;
        int w = first_match(text, c < n_cuts ? (size_t)cuts[c] : len, start, stops, n, pos);
        if (w >= 0)
            return w;
    }
    *pos = len;
    return -1;
}

static void test_examples(void)
{
    const char *stops[] = {"\n\n", "The end", "ab"};
    iflow_stop *s;
    CHECK(iflow_stop_open(&s, stops, 3) == 0, "open");
    int cuts[] = {3, 4, 12, 13, 14, 20}, which;
    char *out = run(s, "Once upon a\n time. The end. More", cuts, 6, "Once upon a\n time. ", &which);
    CHECK(strcmp(out, "Once upon a\n time. ") == 0 && which == 1, "'The end' across pieces: '%s' (%d)", out, which);
    free(out);
    iflow_stop_reset(s);
    int one[] = {5};
    out = run(s, "Happy\n\nnext", one, 1, "Happy", &which);
    CHECK(strcmp(out, "Happy") == 0 && which == 0, "a blank line at a piece boundary: '%s'", out);
    free(out);
    iflow_stop_reset(s);
    out = run(s, "no stop here: The en", NULL, 0, "no stop here: The en", &which);
    CHECK(strcmp(out, "no stop here: The en") == 0 && which == -1, "a partial stop string at the end is flushed");
    free(out);
    iflow_stop_close(s);

    /* disarmed for the first piece: the 'b' it completed does not count, though the tail "ab"
     * (a prefix of "abc") is still held; the armed piece completes "abc" across the boundary */
    const char *nested[] = {"abc", "b"};
    CHECK(iflow_stop_open(&s, nested, 2) == 0, "open");
    int at3[] = {3};
    out = run_armed(s, "xabz", at3, 1, 1, "xabz", &which);
    CHECK(strcmp(out, "xabz") == 0 && which == -1, "a stop string passed while disarmed: '%s' (%d)", out, which);
    free(out);
    iflow_stop_reset(s);
    out = run_armed(s, "xabcd", at3, 1, 1, "x", &which);
    CHECK(strcmp(out, "x") == 0 && which == 0, "one completed by the first armed piece: '%s' (%d)", out, which);
    free(out);
    iflow_stop_close(s);

    /* no stop strings: everything at once */
    CHECK(iflow_stop_open(&s, NULL, 0) == 0, "open with none");
    const char *e;
    size_t ne;
    CHECK(iflow_stop_feed(s, "abc", 3, &e, &ne) == 0 && ne == 3 && memcmp(e, "abc", 3) == 0, "pass-through");
    iflow_stop_close(s);
    const char *empty[] = {"x", ""};
    CHECK(iflow_stop_open(&s, empty, 2) == IFLOW_EINVAL && !s, "an empty stop string is refused");
    CHECK(strcmp(iflow_errmsg(), "stop string 2 is empty") == 0, "message: %s", iflow_errmsg());
}

/* Random texts over {a, b, c}, random stop strings, random piece boundaries. */
static void test_random(void)
{
    for (int trial = 0; trial < 3000; trial++) {
        char text[64], st[3][8];
        const char *stops[3];
        int len = 1 + (int)(rnd_u32() % 40), n = 1 + (int)(rnd_u32() % 3);
        for (int i = 0; i < len; i++)
            text[i] = "abc"[rnd_u32() % 3];
        text[len] = 0;
        for (int k = 0; k < n; k++) {
            int l = 1 + (int)(rnd_u32() % 5);
            for (int i = 0; i < l; i++)
                st[k][i] = "abc"[rnd_u32() % 3];
            st[k][l] = 0;
            stops[k] = st[k];
        }
        int cuts[64], n_cuts = 0;
        for (int i = 1; i < len; i++)
            if (rnd_u32() % 3 == 0)
                cuts[n_cuts++] = i;
        size_t pos;
        int armed_from = trial % 2 ? 0 : (int)(rnd_u32() % (unsigned)(n_cuts + 2)); /* half of them armed throughout */
        int want_which = stream_match(text, cuts, n_cuts, armed_from, stops, n, &pos);
        char want[64];
        memcpy(want, text, pos);
        want[pos] = 0;
        iflow_stop *s;
        if (iflow_stop_open(&s, stops, n) < 0) {
            CHECK(0, "open");
            return;
        }
        int which;
        char *out = run_armed(s, text, cuts, n_cuts, armed_from, want, &which);
        CHECK(strcmp(out, want) == 0 && which == want_which,
              "text '%s' stops '%s' '%s' '%s' armed from piece %d: got '%s' (%d), want '%s' (%d)", text, stops[0],
              n > 1 ? stops[1] : "", n > 2 ? stops[2] : "", armed_from, out, which, want, want_which);
        free(out);
        iflow_stop_close(s);
    }
}

int main(void)
{
    RUN(test_examples);
    RUN(test_random);
    return check_summary("test_stop");
}
