// The engine alone: spec::Engine::generate from C++, no C API, no Python.
//   engine_cost MODEL.gguf METHOD MAX_TOKENS
#include <cstdio>
#include <cstdlib>

#include "spec/decoder.h"

int main(int argc, char** argv) {
    if (argc < 4) return 2;
    spec::EngineParams params;
    params.model.n_ctx = 1024;
    params.model.n_threads = 1;
    spec::Engine engine(argv[1], argv[1], params);
    spec::GenerateParams g;
    g.method = argv[2];
    g.max_tokens = std::atoi(argv[3]);
    g.trace_top_k = 0;  // as the C API asks
    const auto prompt = engine.target().tokenize("class Counter:", true, true);
    const spec::GenerateResult r = engine.generate(prompt, g);
    std::printf("%zu tokens, %d target calls\n", r.tokens.size(), r.stats.n_target_calls);
    return 0;
}
