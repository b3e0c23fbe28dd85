// The C API (include/pyspec.h) over spec::Engine. Every entry point catches: an engine exception
// becomes a status and the thread's last-error message, so nothing but plain C crosses.
#include "pyspec.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "spec/calibrate.h"
#include "spec/decoder.h"
#include "spec/drafter_registry.h"
#include "spec/error.h"

struct pyspec_engine {
    std::unique_ptr<spec::Engine> engine;
    // One generation, reload or removal at a time (spec::Engine's rule). holder tells a call
    // from inside this engine's own stream callback (which would wait on itself) from another
    // thread's (which waits its turn).
    std::mutex busy;
    std::atomic<std::thread::id> holder{};
};

struct pyspec_generation {
    spec::GenerateResult result;
};

namespace {

thread_local std::string t_last_error;

pyspec_status fail(pyspec_status status, const std::string& message) {
    t_last_error = message;
    return status;
}

// Runs `body` (returning a status), turning every exception into a status and message.
template <typename Body>
pyspec_status guarded(Body&& body) noexcept {
    try {
        return body();
    } catch (const spec::ModelLoadError& e) { return fail(PYSPEC_ERR_MODEL_LOAD, e.what());
    } catch (const spec::VocabMismatchError& e) { return fail(PYSPEC_ERR_VOCAB_MISMATCH, e.what());
    } catch (const spec::InvalidArgumentError& e) { return fail(PYSPEC_ERR_INVALID_ARGUMENT, e.what());
    } catch (const spec::ContextOverflowError& e) { return fail(PYSPEC_ERR_CONTEXT_OVERFLOW, e.what());
    } catch (const spec::DecodeError& e) { return fail(PYSPEC_ERR_DECODE, e.what());
    } catch (const spec::PoolFileError& e) { return fail(PYSPEC_ERR_POOL_FILE, e.what());
    } catch (const spec::HeadFileError& e) { return fail(PYSPEC_ERR_HEAD_FILE, e.what());
    } catch (const spec::HeadMismatchError& e) { return fail(PYSPEC_ERR_HEAD_MISMATCH, e.what());
    } catch (const std::bad_alloc&) { return fail(PYSPEC_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& e) { return fail(PYSPEC_ERR_INTERNAL, e.what());
    } catch (...) { return fail(PYSPEC_ERR_INTERNAL, "unknown error");
    }
}

pyspec_status null_argument(const char* function, const char* name) {
    return fail(PYSPEC_ERR_INVALID_ARGUMENT, std::string(function) + ": " + name + " is NULL");
}

std::string slot_name(const char* name) { return name ? name : ""; }

// Holds the engine for one generation, reload or removal.
class EngineHold {
public:
    explicit EngineHold(pyspec_engine& e) : engine_(e) {}
    // False (and nothing held) when this thread holds the engine already.
    bool acquire() {
        if (engine_.holder.load() == std::this_thread::get_id()) return false;
        lock_ = std::unique_lock<std::mutex>(engine_.busy);
        engine_.holder.store(std::this_thread::get_id());
        return true;
    }
    ~EngineHold() {
        if (lock_.owns_lock()) engine_.holder.store(std::thread::id{});
    }

private:
    pyspec_engine& engine_;
    std::unique_lock<std::mutex> lock_;
};

pyspec_status busy(const char* function) {
    return fail(PYSPEC_ERR_BUSY, std::string(function) +
                                     ": called from this engine's own stream callback; it would wait for itself");
}

// The chain length each method drafts when the request leaves n_draft at 0: what measured best
// on the development machine (the Python package's defaults).
int32_t default_n_draft(const std::string& method) {
    if (method == "lookup") return 8;
    return 4;
}

spec::GenerateParams to_engine(const pyspec_generate_params& p) {
    spec::GenerateParams g;
    g.max_tokens = p.max_tokens;
    g.sampling.temperature = p.temperature;
    g.sampling.top_k = p.top_k;
    g.sampling.top_p = p.top_p;
    g.sampling.min_p = p.min_p;
    g.method = p.method ? p.method : "auto";
    spec::find_drafter_method(g.method);  // InvalidArgumentError listing the methods
    g.draft = slot_name(p.draft);
    g.n_draft = p.n_draft != 0 ? p.n_draft : default_n_draft(g.method);
    g.tree.n_nodes = p.tree_nodes;
    g.tree.depth = p.tree_depth;
    g.tree.branching = p.tree_branching;
    g.beam.n_beams = p.beam_count;
    g.beam.length = p.beam_length;
    g.scheduler.max_depth = p.auto_max_depth;
    g.scheduler.max_nodes = p.auto_max_nodes;
    g.scheduler.max_gamma = p.auto_max_gamma;
    g.scheduler.use_draft_model = p.auto_use_draft_model;
    g.scheduler.use_head = p.auto_use_head;
    g.pool.enabled = p.use_pool;
    if (p.use_seed) g.seed = p.seed;
    if (p.n_stop < 0) throw spec::InvalidArgumentError("n_stop must be >= 0, got " + std::to_string(p.n_stop));
    if (p.n_stop > 0 && !p.stop) throw spec::InvalidArgumentError("stop is NULL with n_stop > 0");
    for (int32_t i = 0; i < p.n_stop; ++i) {
        if (!p.stop[i]) throw spec::InvalidArgumentError("stop[" + std::to_string(i) + "] is NULL");
        g.stop.emplace_back(p.stop[i]);
    }
    g.trace_top_k = 0;  // the C API returns no trace
    return g;
}

pyspec_status run_generation(pyspec_engine* engine, const std::vector<int32_t>& prompt,
                             const pyspec_generate_params* params, pyspec_stream_callback callback,
                             void* user_data, pyspec_generation** out) {
    const pyspec_generate_params p = params ? *params : pyspec_generate_default_params();
    const spec::GenerateParams g = to_engine(p);
    spec::TextCallback on_text;
    if (callback) {
        on_text = [callback, user_data](const std::string& piece, const spec::GenerateResult&) {
            return callback(piece.c_str(), piece.size(), user_data);
        };
    }
    EngineHold hold(*engine);
    if (!hold.acquire()) return busy("pyspec_generate");
    auto generation = std::make_unique<pyspec_generation>();
    spec::GenerateResult partial;
    try {
        generation->result = engine->engine->generate(prompt, g, on_text, &partial);
    } catch (...) {
        // Started and failed: hand back what was produced; refused before starting: nothing.
        if (partial.finish_reason == "error") {
            generation->result = std::move(partial);
            *out = generation.release();
        }
        throw;
    }
    *out = generation.release();
    return PYSPEC_OK;
}

}  // namespace

extern "C" {

const char* pyspec_last_error(void) { return t_last_error.c_str(); }

const char* pyspec_status_name(pyspec_status status) {
    switch (status) {
        case PYSPEC_OK: return "ok";
        case PYSPEC_ERR_INVALID_ARGUMENT: return "invalid_argument";
        case PYSPEC_ERR_MODEL_LOAD: return "model_load";
        case PYSPEC_ERR_VOCAB_MISMATCH: return "vocab_mismatch";
        case PYSPEC_ERR_CONTEXT_OVERFLOW: return "context_overflow";
        case PYSPEC_ERR_DECODE: return "decode";
        case PYSPEC_ERR_POOL_FILE: return "pool_file";
        case PYSPEC_ERR_HEAD_FILE: return "head_file";
        case PYSPEC_ERR_HEAD_MISMATCH: return "head_mismatch";
        case PYSPEC_ERR_BUSY: return "busy";
        case PYSPEC_ERR_BUFFER_TOO_SMALL: return "buffer_too_small";
        case PYSPEC_ERR_OUT_OF_MEMORY: return "out_of_memory";
        case PYSPEC_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}

const char* pyspec_version(void) {
#define PYSPEC_STR2(x) #x
#define PYSPEC_STR(x) PYSPEC_STR2(x)
    return PYSPEC_STR(PYSPEC_VERSION_MAJOR) "." PYSPEC_STR(PYSPEC_VERSION_MINOR) "." PYSPEC_STR(PYSPEC_VERSION_PATCH);
#undef PYSPEC_STR
#undef PYSPEC_STR2
}

// ---- engine ------------------------------------------------------------------------------------

pyspec_engine_params pyspec_engine_default_params(void) {
    const spec::ModelParams model;
    pyspec_engine_params p{};
    p.n_ctx = model.n_ctx;
    p.n_batch = model.n_batch;
    p.n_threads = 0;
    p.n_gpu_layers = 0;
    p.seed = 0;
    p.pool_capacity = 0;
    p.prefix_cache = model.reuse_prefix;
    p.flash_attn = model.flash_attn;
    p.head_path = nullptr;
    return p;
}

namespace {

// "host:port,host:port" -> its endpoints (empty parts skipped; checked by the engine).
std::vector<std::string> split_servers(const char* servers) {
    std::vector<std::string> out;
    if (!servers) return out;
    std::string part;
    for (const char* c = servers;; ++c) {
        if (*c == ',' || *c == '\0') {
            const size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
            if (b != std::string::npos) out.push_back(part.substr(b, e - b + 1));
            part.clear();
            if (*c == '\0') break;
        } else {
            part += *c;
        }
    }
    return out;
}

pyspec_status load_engine(const char* function, const char* target_path, const char* draft_path,
                          const pyspec_engine_params* params, const char* rpc_servers, pyspec_engine** out) {
    if (out) *out = nullptr;
    return guarded([&] {
        if (!out) return null_argument(function, "out");
        if (!target_path) return null_argument(function, "target_path");
        const pyspec_engine_params p = params ? *params : pyspec_engine_default_params();
        if (p.n_threads < 0) {
            return fail(PYSPEC_ERR_INVALID_ARGUMENT, "n_threads must be >= 0, got " + std::to_string(p.n_threads));
        }
        if (p.pool_capacity < 0) {
            return fail(PYSPEC_ERR_INVALID_ARGUMENT,
                        "pool_capacity must be >= 0 (0: the default), got " + std::to_string(p.pool_capacity));
        }
        spec::EngineParams ep;
        ep.model.n_ctx = p.n_ctx;
        ep.model.n_batch = p.n_batch;
        ep.model.n_threads = p.n_threads;
        ep.model.n_gpu_layers = p.n_gpu_layers;
        ep.model.reuse_prefix = p.prefix_cache;
        ep.model.flash_attn = p.flash_attn;
        ep.model.rpc_servers = split_servers(rpc_servers);
        ep.seed = p.seed;
        if (p.pool_capacity > 0) ep.pool.capacity = size_t(p.pool_capacity);
        auto handle = std::make_unique<pyspec_engine>();
        handle->engine = std::make_unique<spec::Engine>(target_path, draft_path ? draft_path : "", ep);
        if (p.head_path) handle->engine->reload_head(p.head_path);
        *out = handle.release();
        return PYSPEC_OK;
    });
}

}  // namespace

pyspec_status pyspec_engine_load(const char* target_path, const char* draft_path, const pyspec_engine_params* params,
                                 pyspec_engine** out) {
    return load_engine("pyspec_engine_load", target_path, draft_path, params, nullptr, out);
}

pyspec_status pyspec_engine_load_rpc(const char* target_path, const char* draft_path,
                                     const pyspec_engine_params* params, const char* rpc_servers,
                                     pyspec_engine** out) {
    return load_engine("pyspec_engine_load_rpc", target_path, draft_path, params, rpc_servers, out);
}

void pyspec_engine_free(pyspec_engine* engine) {
    if (!engine) return;
    try {
        engine->engine->close();
    } catch (...) {
        // Freeing cannot fail the caller; the destructor frees what close() left.
    }
    delete engine;
}

int32_t pyspec_engine_n_vocab(const pyspec_engine* engine) {
    int32_t n = 0;
    if (engine) guarded([&] { n = engine->engine->shared_target()->n_vocab(); return PYSPEC_OK; });
    return n;
}

int32_t pyspec_engine_n_ctx(const pyspec_engine* engine) {
    int32_t n = 0;
    if (engine) guarded([&] { n = engine->engine->shared_target()->n_ctx(); return PYSPEC_OK; });
    return n;
}

bool pyspec_engine_has_draft(const pyspec_engine* engine, const char* name) {
    bool has = false;
    if (engine) guarded([&] { has = engine->engine->has_draft(slot_name(name)); return PYSPEC_OK; });
    return has;
}

int64_t pyspec_engine_draft_version(const pyspec_engine* engine, const char* name) {
    int64_t v = 0;
    if (engine) guarded([&] { v = engine->engine->draft_version(slot_name(name)); return PYSPEC_OK; });
    return v;
}

bool pyspec_engine_has_head(const pyspec_engine* engine) {
    bool has = false;
    if (engine) guarded([&] { has = engine->engine->has_head(); return PYSPEC_OK; });
    return has;
}

int64_t pyspec_engine_head_version(const pyspec_engine* engine) {
    int64_t v = 0;
    if (engine) guarded([&] { v = engine->engine->head_version(); return PYSPEC_OK; });
    return v;
}

// ---- methods -----------------------------------------------------------------------------------

int32_t pyspec_method_count(void) { return int32_t(spec::drafter_methods().size()); }

const char* pyspec_method_name(int32_t index) {
    const auto& methods = spec::drafter_methods();
    return index >= 0 && size_t(index) < methods.size() ? methods[size_t(index)].name : nullptr;
}

// ---- tokens and chat ---------------------------------------------------------------------------

pyspec_status pyspec_tokenize(const pyspec_engine* engine, const char* text, bool add_special, bool parse_special,
                              int32_t* tokens, int32_t n_max, int32_t* n_tokens) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_tokenize", "engine");
        if (!text) return null_argument("pyspec_tokenize", "text");
        if (!n_tokens) return null_argument("pyspec_tokenize", "n_tokens");
        if (n_max < 0) return fail(PYSPEC_ERR_INVALID_ARGUMENT, "pyspec_tokenize: n_max must be >= 0");
        if (n_max > 0 && !tokens) return null_argument("pyspec_tokenize", "tokens");
        const std::vector<int32_t> ids = engine->engine->shared_target()->tokenize(text, add_special, parse_special);
        *n_tokens = int32_t(ids.size());
        if (ids.size() > size_t(n_max)) {
            return fail(PYSPEC_ERR_BUFFER_TOO_SMALL, "pyspec_tokenize: " + std::to_string(ids.size()) +
                                                         " tokens do not fit n_max = " + std::to_string(n_max));
        }
        if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_chat_template(const pyspec_engine* engine, const pyspec_chat_message* messages, size_t n_messages,
                                   bool add_assistant, char** out) {
    if (out) *out = nullptr;
    return guarded([&] {
        if (!engine) return null_argument("pyspec_chat_template", "engine");
        if (!out) return null_argument("pyspec_chat_template", "out");
        if (n_messages > 0 && !messages) return null_argument("pyspec_chat_template", "messages");
        std::vector<std::pair<std::string, std::string>> pairs;
        for (size_t i = 0; i < n_messages; ++i) {
            if (!messages[i].role || !messages[i].content) {
                return fail(PYSPEC_ERR_INVALID_ARGUMENT,
                            "pyspec_chat_template: message " + std::to_string(i) + " has a NULL role or content");
            }
            pairs.emplace_back(messages[i].role, messages[i].content);
        }
        const std::string text = engine->engine->shared_target()->apply_chat_template(pairs, add_assistant);
        char* copy = new char[text.size() + 1];
        std::memcpy(copy, text.c_str(), text.size() + 1);
        *out = copy;
        return PYSPEC_OK;
    });
}

void pyspec_string_free(char* str) { delete[] str; }

// ---- generation --------------------------------------------------------------------------------

pyspec_generate_params pyspec_generate_default_params(void) {
    const spec::GenerateParams g;
    pyspec_generate_params p{};
    p.max_tokens = g.max_tokens;
    p.temperature = g.sampling.temperature;
    p.top_k = g.sampling.top_k;
    p.top_p = g.sampling.top_p;
    p.min_p = g.sampling.min_p;
    p.method = "auto";
    p.draft = nullptr;
    p.n_draft = 0;
    p.tree_nodes = g.tree.n_nodes;
    p.tree_depth = g.tree.depth;
    p.tree_branching = g.tree.branching;
    p.beam_count = g.beam.n_beams;
    p.beam_length = g.beam.length;
    p.auto_max_depth = g.scheduler.max_depth;
    p.auto_max_nodes = g.scheduler.max_nodes;
    p.auto_max_gamma = g.scheduler.max_gamma;
    p.auto_use_draft_model = g.scheduler.use_draft_model;
    p.auto_use_head = g.scheduler.use_head;
    p.use_pool = g.pool.enabled;
    p.use_seed = false;
    p.seed = 0;
    p.stop = nullptr;
    p.n_stop = 0;
    return p;
}

pyspec_status pyspec_generate(pyspec_engine* engine, const char* prompt, const pyspec_generate_params* params,
                              pyspec_stream_callback callback, void* user_data, pyspec_generation** out) {
    if (out) *out = nullptr;
    return guarded([&] {
        if (!engine) return null_argument("pyspec_generate", "engine");
        if (!prompt) return null_argument("pyspec_generate", "prompt");
        if (!out) return null_argument("pyspec_generate", "out");
        const std::vector<int32_t> tokens = engine->engine->shared_target()->tokenize(prompt, true, true);
        return run_generation(engine, tokens, params, callback, user_data, out);
    });
}

pyspec_status pyspec_generate_tokens(pyspec_engine* engine, const int32_t* tokens, int32_t n_tokens,
                                     const pyspec_generate_params* params, pyspec_stream_callback callback,
                                     void* user_data, pyspec_generation** out) {
    if (out) *out = nullptr;
    return guarded([&] {
        if (!engine) return null_argument("pyspec_generate_tokens", "engine");
        if (!out) return null_argument("pyspec_generate_tokens", "out");
        if (n_tokens < 0) return fail(PYSPEC_ERR_INVALID_ARGUMENT, "pyspec_generate_tokens: n_tokens must be >= 0");
        if (n_tokens > 0 && !tokens) return null_argument("pyspec_generate_tokens", "tokens");
        // The engine checks each id against the vocabulary and refuses an empty prompt.
        const std::vector<int32_t> prompt(tokens, tokens + n_tokens);
        return run_generation(engine, prompt, params, callback, user_data, out);
    });
}

const char* pyspec_generation_text(const pyspec_generation* generation, size_t* n_bytes) {
    if (n_bytes) *n_bytes = generation ? generation->result.text.size() : 0;
    return generation ? generation->result.text.c_str() : "";
}

const int32_t* pyspec_generation_tokens(const pyspec_generation* generation, int32_t* n_tokens) {
    if (n_tokens) *n_tokens = generation ? int32_t(generation->result.tokens.size()) : 0;
    return generation ? generation->result.tokens.data() : nullptr;
}

const char* pyspec_generation_finish_reason(const pyspec_generation* generation) {
    return generation ? generation->result.finish_reason.c_str() : "";
}

pyspec_stats pyspec_generation_stats(const pyspec_generation* generation) {
    pyspec_stats out{};
    if (!generation) return out;
    const spec::Stats& s = generation->result.stats;
    out.n_prompt_tokens = s.n_prompt_tokens;
    out.n_prompt_cached = s.n_prompt_cached;
    out.n_generated = s.n_generated;
    out.n_target_calls = s.n_target_calls;
    out.n_drafted = s.n_drafted;
    out.n_accepted = s.n_accepted;
    out.n_draft_decodes = s.n_draft_decodes;
    out.acceptance_rate = s.acceptance_rate();
    out.tokens_per_target_call = s.tokens_per_target_call();
    out.tokens_per_second = s.tokens_per_second();
    out.t_prefill_ms = s.t_prefill_ms;
    out.t_draft_ms = s.t_draft_ms;
    out.t_verify_ms = s.t_verify_ms;
    out.t_total_ms = s.t_total_ms;
    return out;
}

int64_t pyspec_generation_draft_version(const pyspec_generation* generation) {
    return generation ? generation->result.draft_version : 0;
}

int64_t pyspec_generation_head_version(const pyspec_generation* generation) {
    return generation ? generation->result.head_version : 0;
}

void pyspec_generation_free(pyspec_generation* generation) { delete generation; }

// ---- flash attention ---------------------------------------------------------------------------

pyspec_status pyspec_engine_decide_flash_attn(pyspec_engine* engine, bool* on, double* ratio) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_engine_decide_flash_attn", "engine");
        if (!on) return null_argument("pyspec_engine_decide_flash_attn", "on");
        // Held as a generation is: the timing shares the weights and would be skewed by one.
        EngineHold hold(*engine);
        if (!hold.acquire()) return busy("pyspec_engine_decide_flash_attn");
        const spec::FlashAttentionDecision d = spec::decide_flash_attention(engine->engine->target());
        *on = d.on;
        if (ratio) *ratio = d.ratio;
        return PYSPEC_OK;
    });
}

// ---- phrase pool -------------------------------------------------------------------------------

pyspec_status pyspec_pool_save(pyspec_engine* engine, const char* path) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_pool_save", "engine");
        if (!path) return null_argument("pyspec_pool_save", "path");
        engine->engine->pool()->save(path);
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_pool_load(pyspec_engine* engine, const char* path) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_pool_load", "engine");
        if (!path) return null_argument("pyspec_pool_load", "path");
        engine->engine->pool()->load(path);
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_pool_clear(pyspec_engine* engine) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_pool_clear", "engine");
        engine->engine->pool()->clear();
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_pool_stats_get(const pyspec_engine* engine, pyspec_pool_stats* out) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_pool_stats_get", "engine");
        if (!out) return null_argument("pyspec_pool_stats_get", "out");
        const std::shared_ptr<spec::PhrasePool> pool = engine->engine->pool();
        const spec::PhrasePoolStats s = pool->stats();
        *out = pyspec_pool_stats{};
        out->size = s.size;
        out->capacity = int64_t(pool->params().capacity);
        out->n_inserted = s.n_inserted;
        out->n_evicted = s.n_evicted;
        out->n_lookups = s.n_lookups;
        out->n_hits = s.n_hits;
        out->n_tokens_accepted = s.n_tokens_accepted;
        return PYSPEC_OK;
    });
}

// ---- hot reload --------------------------------------------------------------------------------

pyspec_status pyspec_draft_reload(pyspec_engine* engine, const char* name, const char* path) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_draft_reload", "engine");
        if (!path) return null_argument("pyspec_draft_reload", "path");
        // Read the file while generations run; swap between them.
        std::unique_ptr<spec::Model> draft = engine->engine->load_draft(path);
        EngineHold hold(*engine);
        if (!hold.acquire()) return busy("pyspec_draft_reload");
        engine->engine->swap_draft(std::move(draft), slot_name(name));
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_draft_remove(pyspec_engine* engine, const char* name) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_draft_remove", "engine");
        EngineHold hold(*engine);
        if (!hold.acquire()) return busy("pyspec_draft_remove");
        engine->engine->remove_draft(slot_name(name));
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_head_reload(pyspec_engine* engine, const char* path) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_head_reload", "engine");
        if (!path) return null_argument("pyspec_head_reload", "path");
        std::unique_ptr<spec::DraftHead> head = engine->engine->load_head(path);
        EngineHold hold(*engine);
        if (!hold.acquire()) return busy("pyspec_head_reload");
        engine->engine->swap_head(std::move(head));
        return PYSPEC_OK;
    });
}

pyspec_status pyspec_head_remove(pyspec_engine* engine) {
    return guarded([&] {
        if (!engine) return null_argument("pyspec_head_remove", "engine");
        EngineHold hold(*engine);
        if (!hold.acquire()) return busy("pyspec_head_remove");
        engine->engine->remove_head();
        return PYSPEC_OK;
    });
}

}  // extern "C"
