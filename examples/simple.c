// Loads a target and a draft, generates with method "auto" and prints the text and statistics.
//
//   simple TARGET.gguf [DRAFT.gguf] [PROMPT] [MAX_TOKENS]
#include <stdio.h>
#include <stdlib.h>

#include <pyspec.h>

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TARGET.gguf [DRAFT.gguf] [PROMPT] [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    const char * target = argv[1];
    const char * draft = argc > 2 && argv[2][0] ? argv[2] : NULL;
    const char * prompt = argc > 3 ? argv[3] : "Write a Python function that checks whether a number is prime.";

    pyspec_engine * engine = NULL;
    pyspec_status status = pyspec_engine_load(target, draft, NULL, &engine);
    if (status != PYSPEC_OK) {
        fprintf(stderr, "load failed (%s): %s\n", pyspec_status_name(status), pyspec_last_error());
        return 1;
    }

    // A chat prompt where the model has a template, else the plain text.
    const pyspec_chat_message messages[] = {{"user", prompt}};
    char * chat = NULL;
    const char * input = prompt;
    if (pyspec_chat_template(engine, messages, 1, true, &chat) == PYSPEC_OK) input = chat;

    pyspec_generate_params params = pyspec_generate_default_params();  // method "auto", greedy
    params.max_tokens = argc > 4 ? atoi(argv[4]) : 128;
    pyspec_generation * generation = NULL;
    status = pyspec_generate(engine, input, &params, NULL, NULL, &generation);
    pyspec_string_free(chat);
    if (status != PYSPEC_OK) {
        fprintf(stderr, "generate failed (%s): %s\n", pyspec_status_name(status), pyspec_last_error());
        pyspec_generation_free(generation);
        pyspec_engine_free(engine);
        return 1;
    }

    printf("%s\n", pyspec_generation_text(generation, NULL));
    const pyspec_stats s = pyspec_generation_stats(generation);
    printf("-- pyspec %s, method %s, finish: %s\n", pyspec_version(), params.method,
           pyspec_generation_finish_reason(generation));
    printf("-- %d prompt tokens, %d generated in %d target calls: %.2f tokens per call\n", s.n_prompt_tokens,
           s.n_generated, s.n_target_calls, s.tokens_per_target_call);
    printf("-- drafted %d, accepted %d (acceptance %.1f%%), %.1f tokens/s\n", s.n_drafted, s.n_accepted,
           100.0 * s.acceptance_rate, s.tokens_per_second);

    pyspec_generation_free(generation);
    pyspec_engine_free(engine);
    return 0;
}
