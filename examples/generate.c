/* generate.c -- libiflow's smallest complete program: a prompt in, its continuation out.
 *
 *     cc generate.c -o generate $(pkg-config --cflags --libs iflow)
 *     ./generate model.ifs "Once upon a time" [N_TOKENS [TEMPERATURE [SEED]]]
 *
 * The text is printed as it is generated; a line on standard error says how it ended. */
#include <iflow.h>

#include <stdio.h>
#include <stdlib.h>

static void print_piece(void *user, const char *text, size_t n)
{
    (void)user;
    fwrite(text, 1, n, stdout);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: %s MODEL PROMPT [N_TOKENS [TEMPERATURE [SEED]]]\n", argv[0]);
        return 2;
    }
    if (iflow_version_number() / 10000 != IFLOW_VERSION_MAJOR) {
        fprintf(stderr, "libiflow %s does not match iflow.h %s\n", iflow_version_string(), IFLOW_VERSION_STRING);
        return 1;
    }
    iflow_model *m;
    int rc = iflow_model_open(&m, argv[1], 0);
    if (rc < 0) {
        fprintf(stderr, "%s: %s: %s\n", argv[0], iflow_strerror(rc), iflow_errmsg());
        return 1;
    }
    iflow_generate_params gp;
    iflow_generate_params_default(&gp);
    gp.max_tokens = argc > 3 ? atoi(argv[3]) : 64;
    gp.sampling.temp = argc > 4 ? (float)atof(argv[4]) : 0.0f; /* 0: greedy */
    gp.sampling.seed = argc > 5 ? strtoull(argv[5], NULL, 10) : 0;
    gp.on_text = print_piece;

    iflow_result *r;
    rc = iflow_generate(m, argv[2], &gp, &r);
    if (rc < 0) {
        fprintf(stderr, "%s: %s: %s\n", argv[0], iflow_strerror(rc), iflow_errmsg());
        iflow_model_close(m);
        return 1;
    }
    printf("\n");
    fprintf(stderr, "%d prompt tokens, %d generated, finished by %s\n", r->n_prompt, r->n_tokens,
            iflow_finish_name(r->finish));
    iflow_result_free(r);
    iflow_model_close(m);
    return 0;
}
