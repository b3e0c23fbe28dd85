// The C API (include/pyspec.h) through its boundary only: bad inputs (NULL pointers, bad paths,
// another vocabulary, out-of-range values) come back as status codes with a message and never
// crash; a generation, a stream and its cancellation, the pool and hot reload work on a real
// GGUF. argv[1]: a tiny target; argv[2]: a tiny model with another vocabulary; argv[3]: a
// scratch directory. Run under ASan/UBSan by scripts/sanitize.sh.
#include <cctype>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "pyspec.h"

namespace {

std::string g_target, g_other_vocab, g_dir;

bool error_mentions(const char* expected) {
    const std::string message = pyspec_last_error();
    if (message.find(expected) != std::string::npos) return true;
    std::fprintf(stderr, "  last error: %s\n  expected to contain: %s\n", message.c_str(), expected);
    return false;
}

pyspec_engine_params small_params() {
    pyspec_engine_params p = pyspec_engine_default_params();
    p.n_ctx = 512;
    p.n_threads = 1;
    return p;
}

void write_file(const std::string& path, const char* bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fputs(bytes, f);
    std::fclose(f);
}

void test_version() {
    char expected[32];
    std::snprintf(expected, sizeof expected, "%d.%d.%d", PYSPEC_VERSION_MAJOR, PYSPEC_VERSION_MINOR,
                  PYSPEC_VERSION_PATCH);
    CHECK(std::strcmp(pyspec_version(), expected) == 0);
    CHECK(std::strcmp(pyspec_status_name(PYSPEC_OK), "ok") == 0);
    CHECK(std::strcmp(pyspec_status_name(PYSPEC_ERR_VOCAB_MISMATCH), "vocab_mismatch") == 0);
    CHECK(std::strcmp(pyspec_status_name(pyspec_status(999)), "unknown") == 0);
    CHECK(pyspec_method_count() > 0);
    CHECK(std::strcmp(pyspec_method_name(0), "auto") == 0);
    CHECK(pyspec_method_name(-1) == nullptr);
    CHECK(pyspec_method_name(pyspec_method_count()) == nullptr);
}

void test_null_pointers() {
    pyspec_engine* engine = reinterpret_cast<pyspec_engine*>(1);
    CHECK(pyspec_engine_load(nullptr, nullptr, nullptr, &engine) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(engine == nullptr);
    CHECK(error_mentions("target_path is NULL"));
    CHECK(pyspec_engine_load(g_target.c_str(), nullptr, nullptr, nullptr) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions("out is NULL"));

    pyspec_generation* generation = reinterpret_cast<pyspec_generation*>(1);
    CHECK(pyspec_generate(nullptr, "x", nullptr, nullptr, nullptr, &generation) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(generation == nullptr);
    CHECK(pyspec_generate_tokens(nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr) ==
          PYSPEC_ERR_INVALID_ARGUMENT);
    int32_t n = -1;
    CHECK(pyspec_tokenize(nullptr, "x", true, true, nullptr, 0, &n) == PYSPEC_ERR_INVALID_ARGUMENT);
    char* text = nullptr;
    CHECK(pyspec_chat_template(nullptr, nullptr, 0, true, &text) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_pool_save(nullptr, "x") == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_pool_load(nullptr, "x") == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_pool_clear(nullptr) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_pool_stats_get(nullptr, nullptr) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_draft_reload(nullptr, nullptr, "x") == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_draft_remove(nullptr, nullptr) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_head_reload(nullptr, "x") == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_head_remove(nullptr) == PYSPEC_ERR_INVALID_ARGUMENT);

    // Queries and readers of NULL handles answer empty values.
    CHECK(pyspec_engine_n_vocab(nullptr) == 0);
    CHECK(!pyspec_engine_has_draft(nullptr, nullptr));
    CHECK(std::strcmp(pyspec_generation_text(nullptr, nullptr), "") == 0);
    CHECK(pyspec_generation_tokens(nullptr, &n) == nullptr && n == 0);
    CHECK(pyspec_generation_stats(nullptr).n_generated == 0);
    pyspec_generation_free(nullptr);
    pyspec_engine_free(nullptr);
    pyspec_string_free(nullptr);
}

void test_bad_paths_and_vocabularies() {
    pyspec_engine* engine = nullptr;
    const pyspec_engine_params p = small_params();
    CHECK(pyspec_engine_load((g_dir + "/missing.gguf").c_str(), nullptr, &p, &engine) == PYSPEC_ERR_MODEL_LOAD);
    CHECK(engine == nullptr);
    CHECK(error_mentions("missing.gguf"));

    const std::string not_gguf = g_dir + "/not_gguf.gguf";
    write_file(not_gguf, "this is not a GGUF file\n");
    CHECK(pyspec_engine_load(not_gguf.c_str(), nullptr, &p, &engine) == PYSPEC_ERR_MODEL_LOAD);
    CHECK(engine == nullptr);

    CHECK(pyspec_engine_load(g_target.c_str(), (g_dir + "/missing_draft.gguf").c_str(), &p, &engine) ==
          PYSPEC_ERR_MODEL_LOAD);
    CHECK(engine == nullptr);

    CHECK(pyspec_engine_load(g_target.c_str(), g_other_vocab.c_str(), &p, &engine) == PYSPEC_ERR_VOCAB_MISMATCH);
    CHECK(engine == nullptr);
    CHECK(error_mentions("vocabulary sizes differ"));

    pyspec_engine_params bad = p;
    bad.n_threads = -1;
    CHECK(pyspec_engine_load(g_target.c_str(), nullptr, &bad, &engine) == PYSPEC_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.head_path = "/nonexistent/head.gguf";
    CHECK(pyspec_engine_load(g_target.c_str(), nullptr, &bad, &engine) == PYSPEC_ERR_HEAD_FILE);
    CHECK(engine == nullptr);
}

// The last error belongs to the thread whose call failed.
void test_last_error_is_per_thread() {
    CHECK(pyspec_engine_load(nullptr, nullptr, nullptr, nullptr) == PYSPEC_ERR_INVALID_ARGUMENT);
    std::string other;
    std::thread([&] { other = pyspec_last_error(); }).join();
    CHECK(other.empty());
    CHECK(std::strlen(pyspec_last_error()) > 0);
}

std::vector<int32_t> tokens_of(const pyspec_generation* g) {
    int32_t n = 0;
    const int32_t* t = pyspec_generation_tokens(g, &n);
    return std::vector<int32_t>(t, t + n);
}

void test_generate(pyspec_engine* engine) {
    pyspec_generate_params params = pyspec_generate_default_params();
    CHECK(std::strcmp(params.method, "auto") == 0);
    params.max_tokens = 24;

    pyspec_generation* with_auto = nullptr;
    CHECK(pyspec_generate(engine, "def add(a, b):", &params, nullptr, nullptr, &with_auto) == PYSPEC_OK);
    params.method = "none";
    pyspec_generation* plain = nullptr;
    CHECK(pyspec_generate(engine, "def add(a, b):", &params, nullptr, nullptr, &plain) == PYSPEC_OK);
    if (with_auto && plain) {
        CHECK(tokens_of(with_auto).size() == 24);
        CHECK(tokens_of(with_auto) == tokens_of(plain));  // greedy: the target's output either way
        CHECK(std::strcmp(pyspec_generation_finish_reason(with_auto), "length") == 0);
        size_t n_bytes = 0;
        const char* text = pyspec_generation_text(with_auto, &n_bytes);
        CHECK(std::strlen(text) == n_bytes && n_bytes > 0);
        const pyspec_stats s = pyspec_generation_stats(with_auto);
        CHECK(s.n_generated == 24);
        CHECK(s.n_target_calls > 0 && s.n_target_calls <= 24);
        CHECK_NEAR(s.tokens_per_target_call, 24.0 / s.n_target_calls, 1e-9);
        CHECK(s.acceptance_rate >= 0.0 && s.acceptance_rate <= 1.0);
        CHECK(pyspec_generation_stats(plain).n_target_calls == 24);
    }
    pyspec_generation_free(with_auto);
    pyspec_generation_free(plain);

    // Bad requests: a status and no generation, and the engine stays usable.
    pyspec_generation* g = reinterpret_cast<pyspec_generation*>(1);
    params = pyspec_generate_default_params();
    params.method = "no-such-method";
    CHECK(pyspec_generate(engine, "x", &params, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(g == nullptr);
    CHECK(error_mentions("no-such-method"));
    params = pyspec_generate_default_params();
    params.temperature = -1.0f;
    CHECK(pyspec_generate(engine, "x", &params, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    params = pyspec_generate_default_params();
    params.n_stop = 1;
    CHECK(pyspec_generate(engine, "x", &params, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions("stop is NULL"));
    params.n_stop = -1;
    CHECK(pyspec_generate(engine, "x", &params, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    params = pyspec_generate_default_params();
    params.method = "chain";
    params.draft = "no-such-slot";
    CHECK(pyspec_generate(engine, "x", &params, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(g == nullptr);

    const int32_t n_vocab = pyspec_engine_n_vocab(engine);
    const int32_t outside[] = {1, n_vocab};
    CHECK(pyspec_generate_tokens(engine, outside, 2, nullptr, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_generate_tokens(engine, outside, 0, nullptr, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(pyspec_generate_tokens(engine, outside, -3, nullptr, nullptr, nullptr, &g) == PYSPEC_ERR_INVALID_ARGUMENT);
    const std::vector<int32_t> too_long(size_t(pyspec_engine_n_ctx(engine)) + 8, 1);
    CHECK(pyspec_generate_tokens(engine, too_long.data(), int32_t(too_long.size()), nullptr, nullptr, nullptr, &g) ==
          PYSPEC_ERR_CONTEXT_OVERFLOW);
    CHECK(g == nullptr);

    // A stop string ends the output before it: two ASCII letters of the unstopped output.
    params = pyspec_generate_default_params();
    params.max_tokens = 24;
    pyspec_generation* full = nullptr;
    CHECK(pyspec_generate(engine, "def add(a, b):", &params, nullptr, nullptr, &full) == PYSPEC_OK);
    const std::string full_text = pyspec_generation_text(full, nullptr);
    pyspec_generation_free(full);
    size_t at = 1;
    while (at + 1 < full_text.size() && !(std::isalpha((unsigned char)full_text[at]) &&
                                          std::isalpha((unsigned char)full_text[at + 1]))) {
        ++at;
    }
    CHECK(at + 1 < full_text.size());
    if (at + 1 < full_text.size()) {
        const std::string stop_text = full_text.substr(at, 2);
        const char* stops[] = {stop_text.c_str()};
        params.stop = stops;
        params.n_stop = 1;
        pyspec_generation* stopped = nullptr;
        CHECK(pyspec_generate(engine, "def add(a, b):", &params, nullptr, nullptr, &stopped) == PYSPEC_OK);
        CHECK(std::strcmp(pyspec_generation_finish_reason(stopped), "stop") == 0);
        CHECK(pyspec_generation_text(stopped, nullptr) == full_text.substr(0, full_text.find(stop_text)));
        pyspec_generation_free(stopped);
    }
}

struct StreamState {
    pyspec_engine* engine = nullptr;
    int32_t n_pieces = 0;
    int32_t cancel_after = 0;
    std::string text;
    pyspec_status reentrant = PYSPEC_OK;
    pyspec_status reentrant_flash_attn = PYSPEC_OK;
};

bool on_piece(const char* piece, size_t n_bytes, void* user_data) {
    auto* state = static_cast<StreamState*>(user_data);
    state->text.append(piece, n_bytes);
    if (++state->n_pieces == 1) {
        // Calls that wait for the engine would wait for this very generation.
        state->reentrant = pyspec_draft_remove(state->engine, nullptr);
        bool on = false;
        state->reentrant_flash_attn = pyspec_engine_decide_flash_attn(state->engine, &on, nullptr);
        int32_t n = 0;
        CHECK(pyspec_tokenize(state->engine, "def", false, false, nullptr, 0, &n) ==
              PYSPEC_ERR_BUFFER_TOO_SMALL);  // the tokenizer is free to use
    }
    return state->n_pieces < state->cancel_after;
}

void test_stream_and_cancel(pyspec_engine* engine) {
    StreamState state;
    state.engine = engine;
    state.cancel_after = 3;
    pyspec_generate_params params = pyspec_generate_default_params();
    params.max_tokens = 64;
    pyspec_generation* g = nullptr;
    CHECK(pyspec_generate(engine, "class Counter:", &params, on_piece, &state, &g) == PYSPEC_OK);
    CHECK(state.n_pieces == 3);
    CHECK(state.reentrant == PYSPEC_ERR_BUSY);
    CHECK(state.reentrant_flash_attn == PYSPEC_ERR_BUSY);
    CHECK(pyspec_engine_has_draft(engine, nullptr));  // the removal was refused
    CHECK(std::strcmp(pyspec_generation_finish_reason(g), "cancelled") == 0);
    CHECK(state.text == pyspec_generation_text(g, nullptr));
    pyspec_generation_free(g);

    // Usable after the cancellation.
    params.max_tokens = 8;
    CHECK(pyspec_generate(engine, "class Counter:", &params, nullptr, nullptr, &g) == PYSPEC_OK);
    CHECK(pyspec_generation_stats(g).n_generated == 8);
    pyspec_generation_free(g);
}

std::vector<int32_t> greedy_tokens(pyspec_engine* engine, const char* prompt, int32_t n) {
    pyspec_generate_params params = pyspec_generate_default_params();
    params.max_tokens = n;
    params.method = "none";
    pyspec_generation* g = nullptr;
    std::vector<int32_t> out;
    CHECK(pyspec_generate(engine, prompt, &params, nullptr, nullptr, &g) == PYSPEC_OK);
    if (!g) return out;
    int32_t count = 0;
    const int32_t* tokens = pyspec_generation_tokens(g, &count);
    out.assign(tokens, tokens + count);
    pyspec_generation_free(g);
    return out;
}

// The flash-attention choice: NULLs refused, the rule's ratio and choice agree, the engine is left
// as it was, and an engine loaded with the choice generates.
void test_decide_flash_attn(pyspec_engine* engine) {
    bool on = true;
    double ratio = -1.0;
    CHECK(pyspec_engine_decide_flash_attn(nullptr, &on, &ratio) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions("engine is NULL"));
    CHECK(pyspec_engine_decide_flash_attn(engine, nullptr, &ratio) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions("on is NULL"));
    CHECK(on && ratio == -1.0);  // nothing written on failure

    const std::vector<int32_t> before = greedy_tokens(engine, "def add(a, b):", 12);
    CHECK(pyspec_engine_decide_flash_attn(engine, &on, &ratio) == PYSPEC_OK);
    CHECK(ratio > 0.0 && ratio < 10.0);
    CHECK(on == (ratio < 0.98));
    CHECK(pyspec_engine_decide_flash_attn(engine, &on, nullptr) == PYSPEC_OK);  // ratio is optional
    CHECK(greedy_tokens(engine, "def add(a, b):", 12) == before);

    pyspec_engine_params p = small_params();
    p.flash_attn = on;
    pyspec_engine* chosen = nullptr;
    CHECK(pyspec_engine_load(g_target.c_str(), nullptr, &p, &chosen) == PYSPEC_OK);
    if (chosen) {
        CHECK(greedy_tokens(chosen, "def add(a, b):", 12).size() == 12);
        pyspec_engine_free(chosen);
    }
}

// Two threads generating on one engine take turns; both get the same greedy output.
void test_two_threads(pyspec_engine* engine) {
    std::vector<int32_t> out[2];
    pyspec_status status[2] = {PYSPEC_ERR_INTERNAL, PYSPEC_ERR_INTERNAL};
    auto run = [&](int i) {
        pyspec_generate_params params = pyspec_generate_default_params();
        params.max_tokens = 16;
        params.method = "chain";
        pyspec_generation* g = nullptr;
        status[i] = pyspec_generate(engine, "def fib(n):", &params, nullptr, nullptr, &g);
        out[i] = tokens_of(g);
        pyspec_generation_free(g);
    };
    std::thread a(run, 0), b(run, 1);
    a.join();
    b.join();
    CHECK(status[0] == PYSPEC_OK && status[1] == PYSPEC_OK);
    CHECK(out[0].size() == 16 && out[0] == out[1]);
}

void test_tokens_and_chat(pyspec_engine* engine) {
    int32_t n = 0;
    CHECK(pyspec_tokenize(engine, "def add(a, b):", true, true, nullptr, 0, &n) == PYSPEC_ERR_BUFFER_TOO_SMALL);
    CHECK(n > 0);
    std::vector<int32_t> tokens(size_t(n) + 0);
    int32_t n2 = 0;
    CHECK(pyspec_tokenize(engine, "def add(a, b):", true, true, tokens.data(), n, &n2) == PYSPEC_OK);
    CHECK(n2 == n);
    CHECK(pyspec_tokenize(engine, "x", true, true, nullptr, 5, &n2) == PYSPEC_ERR_INVALID_ARGUMENT);

    const pyspec_chat_message messages[] = {{"system", "Be brief."}, {"user", "Say hi."}};
    char* text = nullptr;
    const pyspec_status status = pyspec_chat_template(engine, messages, 2, true, &text);
    CHECK(status == PYSPEC_OK || status == PYSPEC_ERR_INVALID_ARGUMENT);  // a model may lack a template
    if (status == PYSPEC_OK) {
        CHECK(std::strstr(text, "Say hi.") != nullptr);
        pyspec_string_free(text);
    }
    const pyspec_chat_message bad[] = {{nullptr, "x"}};
    CHECK(pyspec_chat_template(engine, bad, 1, true, &text) == PYSPEC_ERR_INVALID_ARGUMENT);
    CHECK(text == nullptr);
}

void test_pool(pyspec_engine* engine) {
    pyspec_pool_stats stats{};
    CHECK(pyspec_pool_stats_get(engine, &stats) == PYSPEC_OK);
    CHECK(stats.size > 0);  // the generations above harvested phrases
    CHECK(stats.capacity > 0);
    const std::string path = g_dir + "/pool.bin";
    CHECK(pyspec_pool_save(engine, path.c_str()) == PYSPEC_OK);
    CHECK(pyspec_pool_clear(engine) == PYSPEC_OK);
    pyspec_pool_stats cleared{};
    pyspec_pool_stats_get(engine, &cleared);
    CHECK(cleared.size == 0);
    CHECK(pyspec_pool_load(engine, path.c_str()) == PYSPEC_OK);
    pyspec_pool_stats loaded{};
    pyspec_pool_stats_get(engine, &loaded);
    CHECK(loaded.size == stats.size);

    CHECK(pyspec_pool_load(engine, (g_dir + "/missing.pool").c_str()) == PYSPEC_ERR_POOL_FILE);
    const std::string garbage = g_dir + "/garbage.pool";
    write_file(garbage, "not a phrase pool");
    CHECK(pyspec_pool_load(engine, garbage.c_str()) == PYSPEC_ERR_POOL_FILE);
    pyspec_pool_stats after{};
    pyspec_pool_stats_get(engine, &after);
    CHECK(after.size == stats.size);  // a bad file changes nothing
    CHECK(pyspec_pool_save(engine, "/nonexistent-dir/pool.bin") == PYSPEC_ERR_POOL_FILE);
}

void test_reload(pyspec_engine* engine) {
    CHECK(pyspec_engine_draft_version(engine, nullptr) == 1);
    CHECK(pyspec_draft_reload(engine, nullptr, (g_dir + "/missing.gguf").c_str()) == PYSPEC_ERR_MODEL_LOAD);
    CHECK(pyspec_draft_reload(engine, nullptr, g_other_vocab.c_str()) == PYSPEC_ERR_VOCAB_MISMATCH);
    CHECK(pyspec_engine_draft_version(engine, nullptr) == 1);  // the old draft keeps serving
    CHECK(pyspec_draft_reload(engine, nullptr, g_target.c_str()) == PYSPEC_OK);
    CHECK(pyspec_engine_draft_version(engine, nullptr) == 2);

    CHECK(pyspec_draft_reload(engine, "second", g_target.c_str()) == PYSPEC_OK);
    CHECK(pyspec_engine_has_draft(engine, "second"));
    pyspec_generate_params params = pyspec_generate_default_params();
    params.max_tokens = 8;
    params.method = "chain";
    params.draft = "second";
    pyspec_generation* g = nullptr;
    CHECK(pyspec_generate(engine, "def", &params, nullptr, nullptr, &g) == PYSPEC_OK);
    CHECK(pyspec_generation_draft_version(g) == 1);
    pyspec_generation_free(g);
    CHECK(pyspec_draft_remove(engine, "second") == PYSPEC_OK);
    CHECK(!pyspec_engine_has_draft(engine, "second"));
    CHECK(pyspec_draft_remove(engine, "second") == PYSPEC_ERR_INVALID_ARGUMENT);

    CHECK(pyspec_head_reload(engine, (g_dir + "/missing_head.gguf").c_str()) == PYSPEC_ERR_HEAD_FILE);
    CHECK(pyspec_head_reload(engine, g_target.c_str()) == PYSPEC_ERR_HEAD_FILE);  // a model, not a head
    CHECK(!pyspec_engine_has_head(engine));
    CHECK(pyspec_head_remove(engine) == PYSPEC_ERR_INVALID_ARGUMENT);  // none to remove
    CHECK(error_mentions("no draft head"));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s TARGET.gguf OTHER_VOCAB.gguf SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    g_target = argv[1];
    g_other_vocab = argv[2];
    g_dir = argv[3];

    test_version();
    test_null_pointers();
    test_bad_paths_and_vocabularies();
    test_last_error_is_per_thread();

    pyspec_engine* engine = nullptr;
    const pyspec_engine_params p = small_params();
    CHECK(pyspec_engine_load(g_target.c_str(), g_target.c_str(), &p, &engine) == PYSPEC_OK);
    if (!engine) {
        std::fprintf(stderr, "cannot load %s: %s\n", g_target.c_str(), pyspec_last_error());
        return 1;
    }
    test_generate(engine);
    test_stream_and_cancel(engine);
    test_two_threads(engine);
    test_tokens_and_chat(engine);
    test_pool(engine);
    test_reload(engine);
    test_decide_flash_attn(engine);
    pyspec_engine_free(engine);

    std::printf("test_c_api: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
