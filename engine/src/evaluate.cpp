// Engine::evaluate*: the target's (or a draft's) rows of a token sequence evaluated from scratch,
// for tests, tools and training data; never used by generate().
#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "spec/decoder.h"
#include "spec/error.h"
#include "spec/sampling.h"

namespace spec {
namespace {

// Decodes `tokens` from an empty cache in chunks of n_batch, rows from first_output on (with
// their hidden states when `hidden`), and calls on_chunk after each decode with the index of the
// chunk's first output row among all of them; the model's outputs are then that chunk's rows.
// The cache is left empty and hidden output off, however it ends.
void evaluate_chunks(Model& model, const std::vector<int32_t>& tokens, int32_t first_output, bool hidden,
                     const std::function<void(int32_t first_row)>& on_chunk) {
    if (tokens.empty()) throw InvalidArgumentError("evaluate needs at least one token");
    if (int32_t(tokens.size()) > model.n_ctx()) {
        throw ContextOverflowError(std::to_string(tokens.size()) + " tokens do not fit the context window of " +
                                   std::to_string(model.n_ctx()));
    }
    const int32_t n_batch = model.params().n_batch;
    const int32_t n = int32_t(tokens.size());
    model.kv_clear();
    model.set_hidden_output(hidden);
    model.set_backend_argmax(false);
    try {
        std::vector<BatchToken> batch;
        int32_t n_rows = 0;
        for (int32_t i = 0; i < n; i += n_batch) {
            const int32_t n_chunk = std::min(n_batch, n - i);
            batch.clear();
            for (int32_t j = i; j < i + n_chunk; ++j) batch.push_back({tokens[size_t(j)], j, {}, j >= first_output});
            model.decode(batch);
            on_chunk(n_rows);
            n_rows += model.n_outputs();
        }
    } catch (...) {
        model.set_hidden_output(false);
        model.kv_clear();
        throw;
    }
    model.set_hidden_output(false);
    model.kv_clear();
}

void check_first_row(const std::vector<int32_t>& tokens, int32_t first_row) {
    if (!tokens.empty() && (first_row < 0 || first_row >= int32_t(tokens.size()))) {
        throw InvalidArgumentError("evaluate: first_row " + std::to_string(first_row) + " is outside [0, " +
                                   std::to_string(tokens.size()) + ")");
    }
}

}  // namespace

std::vector<float> Engine::evaluate(const std::vector<int32_t>& tokens, bool use_draft, bool all_rows,
                                    const std::string& draft_name, int32_t first_row) {
    check_first_row(tokens, first_row);
    const int32_t first_output = all_rows ? first_row : int32_t(tokens.size()) - 1;
    return evaluate_rows(use_draft ? draft(draft_name) : target(), tokens, first_output, nullptr);
}

std::vector<float> Engine::evaluate_hidden(const std::vector<int32_t>& tokens, std::vector<float>& hidden) {
    hidden.clear();
    return evaluate_rows(target(), tokens, 0, &hidden);
}

std::vector<float> Engine::evaluate_rows(Model& model, const std::vector<int32_t>& tokens, int32_t first_output,
                                         std::vector<float>* hidden) {
    const int32_t n_vocab = model.n_vocab();
    const int32_t n_hidden = model.n_hidden();
    const size_t n_rows = tokens.size() - size_t(std::min<size_t>(size_t(first_output), tokens.size()));
    std::vector<float> out;
    out.reserve(n_rows * size_t(n_vocab));
    if (hidden) hidden->reserve(n_rows * size_t(n_hidden));
    evaluate_chunks(model, tokens, first_output, hidden != nullptr, [&](int32_t) {
        for (int32_t r = 0; r < model.n_outputs(); ++r) {
            const float* row = model.logits(r);
            out.insert(out.end(), row, row + n_vocab);
            if (hidden) hidden->insert(hidden->end(), model.hidden(r), model.hidden(r) + n_hidden);
        }
    });
    return out;
}

void Engine::evaluate_top_k(const std::vector<int32_t>& tokens, int32_t first_row, int32_t k,
                            std::vector<int32_t>& top_ids, std::vector<float>& top_probs, std::vector<float>& hidden) {
    check_first_row(tokens, first_row);
    Model& model = target();
    const int32_t n_vocab = model.n_vocab();
    if (k < 1 || k > n_vocab) {
        throw InvalidArgumentError("evaluate_top_k: k must be in [1, " + std::to_string(n_vocab) + "], got " +
                                   std::to_string(k));
    }
    const int32_t n_hidden = model.n_hidden();
    const size_t n_rows = tokens.size() - size_t(first_row);
    top_ids.assign(n_rows * size_t(k), -1);
    top_probs.assign(n_rows * size_t(k), 0.0f);
    hidden.assign(n_rows * size_t(n_hidden), 0.0f);
    // The rows of a chunk are independent: split them over the model's threads (llama.cpp's
    // threads are idle between decodes). Each worker keeps its own scratch vectors.
    const int32_t n_workers = std::max(1, model.params().n_threads > 0 ? model.params().n_threads
                                                                        : int32_t(std::thread::hardware_concurrency()));
    evaluate_chunks(model, tokens, first_row, true, [&](int32_t first) {
        const int32_t n_out = model.n_outputs();
        for (int32_t r = 0; r < n_out; ++r) {
            const float* h = model.hidden(r);
            std::copy(h, h + n_hidden, hidden.begin() + long(size_t(first + r) * size_t(n_hidden)));
        }
        const auto work = [&](int32_t w) {
            std::vector<int32_t> ids;
            std::vector<float> logprobs;
            for (int32_t r = w; r < n_out; r += n_workers) {
                token_logprobs(model.logits(r), n_vocab, 0, k, ids, logprobs);
                const size_t at = size_t(first + r) * size_t(k);
                for (size_t j = 0; j < ids.size(); ++j) {
                    top_ids[at + j] = ids[j];
                    top_probs[at + j] = std::exp(logprobs[j]);
                }
            }
        };
        std::vector<std::thread> workers;
        for (int32_t w = 1; w < std::min(n_workers, n_out); ++w) workers.emplace_back(work, w);
        work(0);
        for (std::thread& t : workers) t.join();
    });
}

}  // namespace spec
