/*
 * test_chat.c -- a model's chat template (libcore/serving/chat.h) where it lives:
 *   - SmolLM2-135M-Instruct's GGUF converted: the shard's "chat_template" record is the GGUF's
 *     tokenizer.chat_template byte for byte, and a conversation renders to jinja2's text
 *     (tests/fixtures/chat/expected.jsonl, transformers' environment), its BOS/EOS texts the
 *     tokenizer's;
 *   - the same shard rewritten without that record (a shard converted before templates were
 *     stored): the template is read from its GGUF vocabulary record instead, the same text;
 *   - extra variables that would replace the conversation's own are refused.
 */
#include "tests/unit/testlib.h"
#include "tests/unit/chatref.h"
#include "libcore/formats/gguf.h"
#include "libcore/formats/shard.h"
#include "libcore/serving/chat.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define SMOL "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"

static char dir[] = "/tmp/iflow-test-chat-XXXXXX";
static char with_path[300], without_path[300];

/* A copy of shard `from` without its "chat_template" record. */
static int copy_without_template(const char *from, const char *to)
{
    iflow_shard_reader *r;
    iflow_shard_writer *w;
    iflow_shard_rec rec;
    int rc = iflow_shard_reader_open(&r, from);
    if (rc < 0)
        return rc;
    if ((rc = iflow_shard_writer_open(&w, to, 0)) < 0) {
        iflow_shard_reader_close(r);
        return rc;
    }
    while ((rc = iflow_shard_reader_next(r, &rec)) > 0) {
        if (rec.kind == IFLOW_REC_BLOB && strcmp(rec.name, "chat_template") == 0)
            continue;
        rc = rec.kind == IFLOW_REC_BLOB ? iflow_shard_write_blob(w, rec.name, rec.data, rec.nbytes)
                                        : iflow_shard_write_tensor(w, rec.name, rec.dtype, rec.n_dims, rec.shape,
                                                                   rec.data, rec.nbytes);
        if (rc < 0)
            break;
    }
    iflow_shard_reader_close(r);
    if (rc < 0) {
        iflow_shard_writer_abort(w);
        return rc;
    }
    return iflow_shard_writer_close(w);
}

/* The GGUF's own template, read here with gguf.h. */
static char *gguf_template(void)
{
    iflow_gguf *g;
    const char *text;
    size_t len;
    char *copy = NULL;
    if (iflow_gguf_open(&g, test_data(SMOL)) < 0)
        return NULL;
    if (iflow_gguf_get_str(g, "tokenizer.chat_template", &text, &len) == 0 && (copy = malloc(len + 1)))
        memcpy(copy, text, len + 1);
    iflow_gguf_close(g);
    return copy;
}

/* Render conversation `conv` with the template of the shard at path; compare with jinja2's. */
static void render_case(const char *what, const char *path)
{
    iflow_model *m;
    iflow_chat *c;
    json_t *messages;
    char *want = chatref_expected("smollm2", "system_multi_ends_assistant", 1, &messages), *text;
    size_t len;
    CHECK(want && messages, "fixtures for smollm2");
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "%s: open: %s", what, iflow_errmsg());
        goto out;
    }
    int rc = iflow_chat_open(&c, m, NULL);
    CHECK(rc == 0, "%s: the template: %s", what, iflow_errmsg());
    if (rc == 0) {
        rc = iflow_chat_render(c, messages, NULL, 1, &text, &len);
        CHECK(rc == 0 && want && len == strlen(want) && memcmp(text, want, len) == 0, "%s: jinja2's text: [%s]", what,
              rc == 0 ? text : iflow_errmsg());
        if (rc == 0)
            free(text);
        json_t *bad = json_pack("{s:s}", "eos_token", "x");
        rc = iflow_chat_render(c, messages, bad, 1, &text, &len);
        CHECK_ERR(rc, IFLOW_EINVAL, "'eos_token'", "the conversation sets it");
        json_decref(bad);
        iflow_chat_close(c);
    }
    iflow_model_close(m);
out:
    json_decref(messages);
    free(want);
}

static void test_record(void)
{
    iflow_shard *sh;
    char *want = gguf_template();
    CHECK(want != NULL, "the GGUF has a chat template");
    if (iflow_shard_open(&sh, with_path, 0) == 0) {
        const iflow_shard_rec *r = iflow_shard_find(sh, "chat_template");
        CHECK(r && want && r->nbytes == strlen(want) && memcmp(r->data, want, r->nbytes) == 0,
              "the record is the GGUF's template, byte for byte");
        iflow_shard_close(sh);
    } else
        CHECK(0, "open %s: %s", with_path, iflow_errmsg());
    free(want);
    render_case("the chat_template record", with_path);
}

static void test_old_shard(void)
{
    int rc = copy_without_template(with_path, without_path);
    CHECK(rc == 0, "copy without the record: %s", iflow_errmsg());
    iflow_shard *sh;
    if (rc == 0 && iflow_shard_open(&sh, without_path, 0) == 0) {
        CHECK(!iflow_shard_find(sh, "chat_template"), "the copy has no chat_template record");
        iflow_shard_close(sh);
    }
    if (rc == 0)
        render_case("the GGUF vocabulary's key", without_path);
}

int main(void)
{
    if (!test_data(SMOL)) {
        fprintf(stderr, "SKIP test_chat: %s not found\n", SMOL);
        return check_summary("test_chat");
    }
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(with_path, sizeof with_path, "%s/smol.ifs", dir);
    snprintf(without_path, sizeof without_path, "%s/old.ifs", dir);
    if (test_convert(SMOL, with_path, -1) == 0) {
        RUN(test_record);
        RUN(test_old_shard);
    }
    unlink(with_path);
    unlink(without_path);
    rmdir(dir);
    return check_summary("test_chat");
}
