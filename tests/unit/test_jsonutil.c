/*
 * test_jsonutil.c -- iflow_json_text (libcore/base/jsonutil.h): text that may not be valid UTF-8
 * (a generation cut inside a character) as a JSON string. The expected bytes are Python 3.11's
 * bytes.decode("utf-8", "replace") of each input, re-encoded (each maximal invalid subpart one
 * U+FFFD): truncated sequences, stray continuation bytes, overlong forms, surrogates, code
 * points past U+10FFFF, bytes that never occur, a NUL.
 */
#include "tests/unit/check.h"
#include "libcore/base/jsonutil.h"

static void test_text(void)
{
    static const struct {
        const char *in;
        size_t n_in;
        const char *want;
        size_t n_want;
    } cases[] = {
        {"\x70\x6c\x61\x69\x6e", 5, "\x70\x6c\x61\x69\x6e", 5},
        {"\x63\x61\x66\xc3\xa9", 5, "\x63\x61\x66\xc3\xa9", 5},
        {"\xe4\xb8", 2, "\xef\xbf\xbd", 3},
        {"\xe4\xb8\xad\xe6", 4, "\xe4\xb8\xad\xef\xbf\xbd", 6},
        {"\x61\x80\x62", 3, "\x61\xef\xbf\xbd\x62", 5},
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6},
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9},
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12},
        {"\xf0\x9f\x98", 3, "\xef\xbf\xbd", 3},
        {"\xf0\x9f\x98\x80\x21", 5, "\xf0\x9f\x98\x80\x21", 5},
        {"\xff\xfe", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6},
        {"\xe0\x80\xaf", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9},
        {"\xc3", 1, "\xef\xbf\xbd", 3},
        {"\xe2\x82\xac\xe2\x82", 5, "\xe2\x82\xac\xef\xbf\xbd", 6},
        {"\x78\x00\x79", 3, "\x78\x00\x79", 3},
        {"", 0, "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *j = iflow_json_text(cases[i].in, cases[i].n_in);
        CHECK(j && json_is_string(j) && json_string_length(j) == cases[i].n_want &&
                  !memcmp(json_string_value(j), cases[i].want, cases[i].n_want),
              "case %zu: %zu bytes, want %zu", i, j ? json_string_length(j) : 0, cases[i].n_want);
        json_decref(j);
    }
}

int main(void)
{
    RUN(test_text);
    return check_summary("test_jsonutil");
}
