// The llama.cpp boundary on a real GGUF (argv[1], e.g. the tiny model tests/test_cpp.py builds):
// settings llama.cpp would abort the process on come back as typed errors, a failed decode leaves
// no stale output rows, an error in mid-generation hands back the output so far, and the phrase
// pool outlives close() for a caller still using it.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "spec/decoder.h"
#include "spec/error.h"
#include "spec/model.h"

namespace {

std::string g_model;

spec::ModelParams small_params(int32_t n_ctx, int32_t n_batch) {
    spec::ModelParams p;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_threads = 1;
    return p;
}

// llama.cpp reserves an output row per sequence and asserts that they fit the batch: the model
// refuses such settings with an error instead.
void test_more_sequences_than_batch_rows_is_an_error() {
    spec::ModelParams p = small_params(256, 8);
    p.n_seq_max = 9;
    CHECK(throws_invalid([&] { spec::Model model(g_model, p); }, "n_seq_max=9"));
    p.n_seq_max = 8;
    spec::Model model(g_model, p);
    CHECK(model.params().n_seq_max == 8);
}

// A context smaller than n_batch caps llama.cpp's batch: the model reports the batch it really
// has, and a larger decode is an argument error, not llama.cpp's assertion.
void test_batch_is_capped_by_the_context() {
    spec::Model model(g_model, small_params(32, 512));
    CHECK(model.params().n_batch == 32);
    std::vector<int32_t> tokens(100, 65);
    CHECK(throws_invalid([&] { model.decode_seq(tokens.data(), 100, 0, false); }, "exceeds n_batch=32"));
    const std::vector<int32_t> prompt(100, 66);
    model.prefill_prompt(prompt);  // in chunks of the real batch
    CHECK(model.kv_pos_max(0) == 98);
}

// After a failed decode no output row is readable: the rows of the batch that failed were never
// computed (llama.cpp returns no logits for them).
void test_failed_decode_leaves_no_outputs() {
    spec::Model model(g_model, small_params(256, 256));
    const int32_t n_cells = model.n_ctx();
    std::vector<int32_t> tokens(size_t(n_cells), 65);
    for (int32_t i = 0; i < n_cells; i += 256) model.decode_seq(tokens.data() + i, 256, i, false);
    CHECK(model.n_outputs() == 1);
    CHECK(model.logits(0) != nullptr);
    bool overflowed = false;
    try {
        model.decode_seq(tokens.data(), 1, n_cells, true);
    } catch (const spec::ContextOverflowError&) {
        overflowed = true;
    }
    CHECK(overflowed);
    CHECK(model.n_outputs() == 0);
    CHECK(throws_invalid([&] { model.logits(0); }, "out of range"));
}

spec::EngineParams engine_params(int32_t n_batch) {
    spec::EngineParams p;
    p.model = small_params(256, n_batch);
    return p;
}

// Engines whose batch is smaller than the tree sequences used to abort in llama.cpp.
void test_engine_with_a_small_batch() {
    for (int32_t n_batch : {1, 2, 16, 63}) {
        spec::Engine engine(g_model, g_model, engine_params(n_batch));
        spec::GenerateParams params;
        params.method = "none";
        params.max_tokens = 8;
        const std::vector<int32_t> prompt = engine.target().tokenize("hello there", true, false);
        const spec::GenerateResult plain = engine.generate(prompt, params);
        CHECK(plain.tokens.size() == 8);
        if (n_batch > 1) {
            params.method = "chain";
            params.n_draft = std::min(4, n_batch - 1);
            CHECK(engine.generate(prompt, params).tokens == plain.tokens);
        }
    }
}

// An exception in mid-generation (here: the text callback) propagates, and the output produced
// until then is handed back with finish_reason "error"; the engine stays usable.
void test_error_in_mid_generation_keeps_the_output() {
    spec::Engine engine(g_model, g_model, engine_params(64));
    spec::GenerateParams params;
    params.method = "chain";
    params.max_tokens = 40;
    const std::vector<int32_t> prompt = engine.target().tokenize("The quick brown", true, false);
    const spec::GenerateResult reference = engine.generate(prompt, params);
    int n_pieces = 0;
    std::string text;
    const spec::TextCallback fail_on_fifth = [&](const std::string& piece, const spec::GenerateResult&) {
        if (++n_pieces == 5) throw std::runtime_error("callback failed");
        text += piece;
        return true;
    };
    spec::GenerateResult partial;
    bool thrown = false;
    try {
        engine.generate(prompt, params, fail_on_fifth, &partial);
    } catch (const std::runtime_error& e) {
        thrown = std::string(e.what()) == "callback failed";
    }
    CHECK(thrown);
    CHECK(partial.finish_reason == "error");
    CHECK(partial.tokens.size() >= 4 && partial.tokens.size() < reference.tokens.size());
    CHECK(std::equal(partial.tokens.begin(), partial.tokens.end(), reference.tokens.begin()));
    CHECK(partial.prompt_tokens == prompt);
    CHECK(partial.stats.n_generated == int32_t(partial.tokens.size()));
    CHECK(partial.text.compare(0, text.size(), text) == 0);
    CHECK(engine.generate(prompt, params).tokens == reference.tokens);
}

// A caller that holds the pool (a save on another thread) keeps it alive through close().
void test_pool_outlives_close() {
    spec::Engine engine(g_model, "", engine_params(64));
    spec::GenerateParams params;
    params.method = "lookup";
    params.max_tokens = 16;
    engine.generate(engine.target().tokenize("one two three one two three", true, false), params);
    const std::shared_ptr<spec::PhrasePool> pool = engine.pool();
    const size_t size = pool->size();
    CHECK(size > 0);
    engine.close();
    CHECK(engine.closed());
    CHECK(pool->size() == size);
    bool closed_error = false;
    try {
        engine.pool();
    } catch (const spec::ClosedError&) {
        closed_error = true;
    }
    CHECK(closed_error);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: test_model MODEL.gguf\n");
        return 2;
    }
    g_model = argv[1];
    test_more_sequences_than_batch_rows_is_an_error();
    test_batch_is_capped_by_the_context();
    test_failed_decode_leaves_no_outputs();
    test_engine_with_a_small_batch();
    test_error_in_mid_generation_keeps_the_output();
    test_pool_outlives_close();
    std::printf("test_model: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
