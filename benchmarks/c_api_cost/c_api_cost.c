// The C API: pyspec_generate through libpyspec.
//   c_api_cost MODEL.gguf METHOD MAX_TOKENS
#include <stdio.h>
#include <stdlib.h>

#include <pyspec.h>

int main(int argc, char ** argv) {
    if (argc < 4) return 2;
    pyspec_engine_params params = pyspec_engine_default_params();
    params.n_ctx = 1024;
    params.n_threads = 1;
    pyspec_engine * engine = NULL;
    if (pyspec_engine_load(argv[1], argv[1], &params, &engine) != PYSPEC_OK) {
        fprintf(stderr, "%s\n", pyspec_last_error());
        return 1;
    }
    pyspec_generate_params g = pyspec_generate_default_params();
    g.method = argv[2];
    g.max_tokens = atoi(argv[3]);
    pyspec_generation * out = NULL;
    if (pyspec_generate(engine, "class Counter:", &g, NULL, NULL, &out) != PYSPEC_OK) {
        fprintf(stderr, "%s\n", pyspec_last_error());
        return 1;
    }
    const pyspec_stats s = pyspec_generation_stats(out);
    printf("%d tokens, %d target calls\n", s.n_generated, s.n_target_calls);
    pyspec_generation_free(out);
    pyspec_engine_free(engine);
    return 0;
}
