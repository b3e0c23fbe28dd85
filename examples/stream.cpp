// Streams a generation piece by piece and cancels it after N pieces; the engine then serves a
// second request, as an application's "stop" button would leave it.
//
//   stream TARGET.gguf [DRAFT.gguf] [N_PIECES] [PROMPT]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <pyspec.h>

namespace {

struct EngineDeleter {
    void operator()(pyspec_engine * e) const { pyspec_engine_free(e); }
};
struct GenerationDeleter {
    void operator()(pyspec_generation * g) const { pyspec_generation_free(g); }
};
using EnginePtr = std::unique_ptr<pyspec_engine, EngineDeleter>;
using GenerationPtr = std::unique_ptr<pyspec_generation, GenerationDeleter>;

struct Reader {
    int n_pieces = 0;
    int cancel_after = 0;
};

// Prints each piece as it arrives; returning false cancels the generation.
bool on_piece(const char * piece, size_t n_bytes, void * user_data) {
    auto * reader = static_cast<Reader *>(user_data);
    std::fwrite(piece, 1, n_bytes, stdout);
    std::fflush(stdout);
    return ++reader->n_pieces < reader->cancel_after;
}

int fail(const char * what, pyspec_status status) {
    std::fprintf(stderr, "%s failed (%s): %s\n", what, pyspec_status_name(status), pyspec_last_error());
    return 1;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s TARGET.gguf [DRAFT.gguf] [N_PIECES] [PROMPT]\n", argv[0]);
        return 2;
    }
    const char * draft = argc > 2 && argv[2][0] ? argv[2] : nullptr;
    Reader reader;
    reader.cancel_after = argc > 3 ? std::atoi(argv[3]) : 8;
    const std::string prompt = argc > 4 ? argv[4] : "def fibonacci(n):";

    pyspec_engine * raw = nullptr;
    pyspec_status status = pyspec_engine_load(argv[1], draft, nullptr, &raw);
    if (status != PYSPEC_OK) return fail("load", status);
    EnginePtr engine(raw);

    pyspec_generate_params params = pyspec_generate_default_params();
    params.max_tokens = 256;
    pyspec_generation * out = nullptr;
    status = pyspec_generate(engine.get(), prompt.c_str(), &params, on_piece, &reader, &out);
    GenerationPtr streamed(out);
    if (status != PYSPEC_OK) return fail("stream", status);
    std::printf("\n-- %d pieces, finish: %s, %d tokens\n", reader.n_pieces,
                pyspec_generation_finish_reason(streamed.get()), pyspec_generation_stats(streamed.get()).n_generated);

    params.max_tokens = 16;
    status = pyspec_generate(engine.get(), prompt.c_str(), &params, nullptr, nullptr, &out);
    GenerationPtr next(out);
    if (status != PYSPEC_OK) return fail("generate after cancel", status);
    std::printf("-- next request: finish: %s, %d tokens\n", pyspec_generation_finish_reason(next.get()),
                pyspec_generation_stats(next.get()).n_generated);
    return 0;
}
