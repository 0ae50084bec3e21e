/* fuzz_convert.c -- libFuzzer target: a spec (.ini) driving iflow_convert over a real fixture,
 * so that what only conversion parses runs on arbitrary input: the tensor sources' row ranges
 * (sums of products of symbols, periodic ranges, ^T, chained ranges over 3-D tensors) and
 * alternatives, checked against the source's shapes, and the payloads they gather. The first
 * byte picks the fixture (tests/fixtures/families/: gpt_oss's 3-D experts, deepseek_v2's
 * kv_b_proj, phi3's fused qkv_proj, gpt_oss-mxfp4's MXFP4 pairs); the rest is the spec, written
 * beside links to the .ini files of specs/ (a spec's base is looked up in its own folder). Run
 * from the repository root. */
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "libcore/formats/convert.h"

static char dir[64];

/* The folder and what is in it, at exit. */
static void remove_dir(void)
{
    DIR *d = opendir(dir);
    char path[400];
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* A folder of its own with links to every spec (once). */
static int make_dir(void)
{
    char here[PATH_MAX], from[PATH_MAX + 300], to[400];
    snprintf(dir, sizeof dir, "/tmp/fuzz_convert_%d", (int)getpid());
    DIR *d = opendir("specs");
    if (!d || !getcwd(here, sizeof here) || (mkdir(dir, 0700) != 0 && access(dir, F_OK) != 0)) {
        if (d)
            closedir(d);
        return -1;
    }
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".ini") != 0)
            continue;
        snprintf(from, sizeof from, "%s/specs/%s", here, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
        if (symlink(from, to) != 0 && access(to, F_OK) != 0)
            break;
    }
    closedir(d);
    atexit(remove_dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const fixtures[] = {"tests/fixtures/families/gpt_oss", "tests/fixtures/families/deepseek_v2",
                                           "tests/fixtures/families/phi3", "tests/fixtures/families/gpt_oss-mxfp4"};
    static int ready;
    if (!ready)
        ready = make_dir() == 0 ? 1 : -1;
    if (size < 1 || ready < 0)
        return 0;
    char spec[128], out[128];
    snprintf(spec, sizeof spec, "%s/fuzz-input.ini", dir);
    snprintf(out, sizeof out, "%s/out.ifs", dir);
    FILE *f = fopen(spec, "wb");
    if (!f)
        return 0;
    const int ok = fwrite(data + 1, 1, size - 1, f) == size - 1;
    if (fclose(f) != 0 || !ok)
        return 0;
    const char *dirs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_path = spec, .spec_dirs = dirs, .n_spec_dirs = 1};
    iflow_convert(fixtures[data[0] % 4], out, &o);
    unlink(out);
    return 0;
}
