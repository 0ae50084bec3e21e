/*
 * test_reasoning.c -- a reply's <think> block (libcore/serving/reasoning.h): hand-labelled replies
 * to prompts that open the block (DeepSeek-R1's template), close it (Qwen3's with thinking off)
 * or neither, with and without </think>, whitespace around the tags, a tag inside the answer;
 * and detection over the 16 real chat templates (only DeepSeek-R1's names <think>).
 */
#include "tests/unit/check.h"
#include "libcore/serving/reasoning.h"

typedef struct {
    const char *prompt, *text;
    int has;
    const char *reasoning, *content;
} rcase;

static const rcase CASES[] = {
    /* the prompt opened the block */
    {"<｜Assistant｜><think>\n", "Two and two.\n</think>\n\nFour.", 1, "Two and two.", "Four."},
    {"<｜Assistant｜><think>\n", "Still thinking about it", 1, "Still thinking about it", ""},
    {"<think>", "</think>Four.", 1, "", "Four."},
    {"<think>  \n", "a</think>b</think>c", 1, "a", "b</think>c"},
    /* the reply opens it */
    {"<|im_start|>assistant\n", "<think>\nHmm.\n</think>\n\nFour.", 1, "Hmm.", "Four."},
    {"<|im_start|>assistant\n", "  \n<think>Hmm.", 1, "Hmm.", ""},
    {"", "<think></think>", 1, "", ""},
    {NULL, "<think>x</think> y ", 1, "x", "y "},
    /* no block */
    {"<|im_start|>assistant\n<think>\n\n</think>\n\n", "Four.", 0, NULL, "Four."},
    {"<|im_start|>assistant\n", "Four. <think>no</think>", 0, NULL, "Four. <think>no</think>"},
    {"<|im_start|>assistant\n", "", 0, NULL, ""},
    {"<think>x", "y", 0, NULL, "y"},
};

static void test_split(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const rcase *c = &CASES[i];
        size_t r_off = 99, r_len = 99, c_off = 99, n = strlen(c->text);
        size_t plen = c->prompt ? strlen(c->prompt) : 0;
        int has = iflow_reasoning_split(c->prompt, plen, c->text, n, &r_off, &r_len, &c_off);
        CHECK(has == c->has, "case %zu: has %d, want %d", i, has, c->has);
        if (c->reasoning)
            CHECK(r_off + r_len <= n && r_len == strlen(c->reasoning) &&
                      memcmp(c->text + r_off, c->reasoning, r_len) == 0,
                  "case %zu: reasoning '%.*s', want '%s'", i, (int)r_len, c->text + r_off, c->reasoning);
        else
            CHECK(r_len == 0 && r_off == 0, "case %zu: no reasoning", i);
        CHECK(c_off <= n && strcmp(c->text + c_off, c->content) == 0, "case %zu: content '%s', want '%s'", i,
              c_off <= n ? c->text + c_off : "(out of range)", c->content);
    }
}

static void test_closed(void)
{
    CHECK(iflow_reasoning_closed("<|im_start|>assistant\n<think>\n\n</think>\n\n", 41), "Qwen3 without thinking");
    CHECK(!iflow_reasoning_closed("<|im_start|>assistant\n<think>\n", 30), "an open block");
    CHECK(!iflow_reasoning_closed("<|im_start|>assistant\n", 22), "no block");
    CHECK(!iflow_reasoning_closed(NULL, 0), "no prompt");
}

static void test_detect(void)
{
    static const char *const files[] = {"command-r", "deepseek-r1", "falcon", "gemma", "granite31", "llama2",
                                        "llama3", "llama31", "llama32", "mistral-v03", "mistral", "olmo2",
                                        "phi3", "qwen25", "smollm2", "zephyr"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "chat/templates/%s.jinja", files[i]);
        const char *path = test_fixture(rel);
        size_t n = 0;
        char *text = path ? test_read_file(path, &n) : NULL;
        CHECK(text != NULL, "read %s", rel);
        if (text)
            CHECK(iflow_reasoning_detect(text, n) == (strcmp(files[i], "deepseek-r1") == 0), "%s", files[i]);
        free(text);
    }
    CHECK(!iflow_reasoning_detect(NULL, 0), "no template");
}

int main(void)
{
    RUN(test_split);
    RUN(test_detect);
    RUN(test_closed);
    return check_summary("test_reasoning");
}
