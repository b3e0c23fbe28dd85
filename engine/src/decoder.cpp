#include "spec/decoder.h"

#include <algorithm>
#include <chrono>

#include "spec/error.h"
#include "spec/log.h"
#include "spec/text_stream.h"
#include "spec/verify.h"

namespace spec {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

constexpr int32_t kMaxDraft = 256;

// Everything one generate() call owns; keeps the step functions below short.
struct Request {
    const GenerateParams& params;
    Model& target;
    Drafter* drafter;
    Rng& rng;
    GenerateResult result;
    std::vector<int32_t> committed;  // prompt + generated; the last one is not yet in target KV
    int32_t n_past = 0;              // target KV holds committed[0 .. n_past)
    TextStream text;
    bool done = false;

    // Verification buffers, reused every step.
    Draft draft;
    std::vector<float> target_probs;  // [n_draft + 1, n_vocab]
    std::vector<float> draft_probs;   // [n_draft, n_vocab] (one-hot rows for deterministic drafts)
    std::vector<int32_t> target_argmax;
    std::vector<float> row, residual;
    std::vector<int32_t> scratch;

    Request(const GenerateParams& p, Model& t, Drafter* d, Rng& r)
        : params(p), target(t), drafter(d), rng(r), text(p.stop) {}
};

void prefill(Request& req, const std::vector<int32_t>& prompt) {
    req.target.kv_clear();
    const int32_t n_prefill = int32_t(prompt.size()) - 1;  // the last token starts step one
    const int32_t n_batch = req.target.params().n_batch;
    for (int32_t i = 0; i < n_prefill; i += n_batch) {
        req.target.decode_seq(prompt.data() + i, std::min(n_batch, n_prefill - i), i, false);
    }
    req.n_past = std::max(n_prefill, 0);
    req.committed = prompt;
    if (req.drafter) req.drafter->begin(prompt);
}

// Verifies the draft against target rows 0..n_draft; returns the verdict.
ChainVerdict verify_step(Request& req) {
    const int32_t n_draft = int32_t(req.draft.tokens.size());
    const int32_t n_vocab = req.target.n_vocab();
    const SamplingParams& sampling = req.params.sampling;
    if (sampling.greedy()) {
        req.target_argmax.resize(size_t(n_draft + 1));
        for (int32_t i = 0; i <= n_draft; ++i) req.target_argmax[size_t(i)] = argmax(req.target.logits(i), n_vocab);
        return verify_chain_greedy(req.draft.tokens, req.target_argmax);
    }
    req.target_probs.resize(size_t(n_draft + 1) * size_t(n_vocab));
    for (int32_t i = 0; i <= n_draft; ++i) {
        compute_probs(req.target.logits(i), n_vocab, sampling, req.row, req.scratch);
        std::copy(req.row.begin(), req.row.end(), req.target_probs.begin() + size_t(i) * size_t(n_vocab));
    }
    const float* q = req.draft.probs.data();
    if (req.draft.probs.empty() && n_draft > 0) {
        // Deterministic proposal: q is one-hot at the proposed token.
        req.draft_probs.assign(size_t(n_draft) * size_t(n_vocab), 0.0f);
        for (int32_t i = 0; i < n_draft; ++i) {
            req.draft_probs[size_t(i) * size_t(n_vocab) + size_t(req.draft.tokens[size_t(i)])] = 1.0f;
        }
        q = req.draft_probs.data();
    }
    return verify_chain_rejection(req.draft.tokens, req.target_probs.data(), q, n_vocab, req.rng, req.residual);
}

// Appends one token to the output; returns false when generation must end.
bool commit_token(Request& req, int32_t token, const TextCallback& on_text) {
    GenerateResult& res = req.result;
    if (req.target.is_eog(token)) {
        res.finish_reason = "stop";
        return false;
    }
    req.committed.push_back(token);
    res.tokens.push_back(token);
    const std::string piece = req.text.push(req.target.token_to_piece(token));
    if (!piece.empty() && on_text && !on_text(piece)) {
        res.finish_reason = "cancelled";
        return false;
    }
    if (req.text.stopped()) {
        res.finish_reason = "stop";
        return false;
    }
    if (int32_t(res.tokens.size()) >= req.params.max_tokens) {
        res.finish_reason = "length";
        return false;
    }
    return true;
}

void record_trace(Request& req, const ChainVerdict& verdict, int32_t position) {
    if (req.params.trace_top_k <= 0) return;
    StepTrace step;
    step.position = position;
    step.draft_tokens = req.draft.tokens;
    step.n_accepted = verdict.n_accepted;
    step.target_token = verdict.next_token;
    step.rejected = verdict.n_accepted < int32_t(req.draft.tokens.size());
    if (step.rejected) {
        softmax(req.target.logits(verdict.n_accepted), req.target.n_vocab(), req.row);
        top_k_entries(req.row.data(), req.target.n_vocab(), req.params.trace_top_k, step.top_ids, step.top_probs);
    }
    req.result.trace.push_back(std::move(step));
}

}  // namespace

Engine::Engine(const std::string& target_path, const std::string& draft_path, const EngineParams& params)
    : params_(params), rng_(params.seed) {
    target_ = std::make_unique<Model>(target_path, params.model);
    if (!draft_path.empty()) {
        draft_ = std::make_unique<Model>(draft_path, params.model);
        check_vocab_compatible(*target_, *draft_);
        chain_drafter_ = make_model_chain_drafter(*draft_);
    }
    lookup_drafter_ = make_prompt_lookup_drafter(lookup_params_);
}

Engine::~Engine() = default;

void Engine::check_open() const {
    if (!target_) throw ClosedError("engine is closed");
}

Model& Engine::target() {
    check_open();
    return *target_;
}

Model& Engine::draft() {
    check_open();
    if (!draft_) throw InvalidArgumentError("engine has no draft model");
    return *draft_;
}

std::vector<float> Engine::evaluate(const std::vector<int32_t>& tokens, bool use_draft, bool all_rows) {
    Model& model = use_draft ? draft() : target();
    if (tokens.empty()) throw InvalidArgumentError("evaluate needs at least one token");
    if (int32_t(tokens.size()) > model.n_ctx()) {
        throw ContextOverflowError(std::to_string(tokens.size()) + " tokens do not fit the context window of " +
                                   std::to_string(model.n_ctx()));
    }
    const int32_t n_vocab = model.n_vocab();
    const int32_t n_batch = model.params().n_batch;
    const int32_t n = int32_t(tokens.size());
    std::vector<float> out;
    out.reserve(size_t(all_rows ? n : 1) * size_t(n_vocab));
    model.kv_clear();
    for (int32_t i = 0; i < n; i += n_batch) {
        const int32_t n_chunk = std::min(n_batch, n - i);
        model.decode_seq(tokens.data() + i, n_chunk, i, all_rows);
        for (int32_t r = 0; r < model.n_outputs(); ++r) {
            if (!all_rows && i + n_chunk < n) continue;
            const float* row = model.logits(r);
            out.insert(out.end(), row, row + n_vocab);
        }
    }
    model.kv_clear();
    return out;
}

void Engine::close() {
    chain_drafter_.reset();
    lookup_drafter_.reset();
    draft_.reset();
    target_.reset();
}

Drafter* Engine::drafter_for(const GenerateParams& params) {
    const std::string& method = params.method;
    if (method == "none") return nullptr;
    if (method == "chain") {
        if (!chain_drafter_) {
            throw InvalidArgumentError("method 'chain' needs a draft model; load one or use method='none' or 'lookup'");
        }
        return chain_drafter_.get();
    }
    if (method == "lookup") {
        // Only its counters outlive a request (begin() rebuilds the index) and generate() reads
        // counter differences, so other n-gram sizes just mean a new drafter.
        const LookupParams& wanted = params.lookup;
        if (wanted.ngram_max != lookup_params_.ngram_max || wanted.ngram_min != lookup_params_.ngram_min) {
            lookup_drafter_ = make_prompt_lookup_drafter(wanted);
            lookup_params_ = wanted;
        }
        return lookup_drafter_.get();
    }
    throw InvalidArgumentError("unknown method '" + method + "' (available: none, chain, lookup)");
}

void Engine::validate(const std::vector<int32_t>& prompt, const GenerateParams& params) const {
    spec::validate(params.sampling);
    if (prompt.empty()) throw InvalidArgumentError("prompt is empty");
    const int32_t n_ctx = target_->n_ctx();
    if (int32_t(prompt.size()) >= n_ctx) {
        throw ContextOverflowError("prompt has " + std::to_string(prompt.size()) +
                                   " tokens but the context window is " + std::to_string(n_ctx) +
                                   " tokens (raise n_ctx or shorten the prompt)");
    }
    for (int32_t t : prompt) {
        if (t < 0 || t >= target_->n_vocab()) {
            throw InvalidArgumentError("prompt token " + std::to_string(t) + " outside the vocabulary [0, " +
                                       std::to_string(target_->n_vocab()) + ")");
        }
    }
    if (params.max_tokens < 0) throw InvalidArgumentError("max_tokens must be >= 0, got " + std::to_string(params.max_tokens));
    if (params.trace_top_k < 0) throw InvalidArgumentError("trace_top_k must be >= 0");
    const int32_t n_draft_limit = std::min({kMaxDraft, target_->params().n_batch - 1, n_ctx - 1});
    if (params.method != "none" && (params.n_draft < 1 || params.n_draft > n_draft_limit)) {
        throw InvalidArgumentError("n_draft must be in [1, " + std::to_string(n_draft_limit) + "] for this context (n_ctx=" +
                                   std::to_string(n_ctx) + ", n_batch=" + std::to_string(target_->params().n_batch) +
                                   "), got " + std::to_string(params.n_draft));
    }
    for (const auto& s : params.stop) {
        if (s.empty()) throw InvalidArgumentError("stop strings must not be empty");
    }
    if (params.method == "lookup") spec::validate(params.lookup);
}

GenerateResult Engine::generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                                const TextCallback& on_text) {
    check_open();
    validate(prompt, params);
    Drafter* drafter = drafter_for(params);
    if (params.seed) rng_.reseed(*params.seed);

    const auto t_start = Clock::now();
    Request req(params, *target_, drafter, rng_);
    Stats& stats = req.result.stats;
    stats.n_prompt_tokens = int32_t(prompt.size());
    stats.accept_histogram.assign(size_t(params.method == "none" ? 1 : params.n_draft + 1), 0);
    req.result.prompt_tokens = prompt;
    const DrafterStats drafter_before = drafter ? drafter->stats() : DrafterStats{};
    prefill(req, prompt);
    stats.t_prefill_ms = ms_since(t_start);

    const int32_t n_ctx = target_->n_ctx();
    std::vector<BatchToken> batch;
    bool running = params.max_tokens > 0;
    if (!running) req.result.finish_reason = "length";
    while (running) {
        // Room: the pending token plus the draft must fit the window; the step adds at most
        // n_draft + 1 tokens, so never draft past max_tokens.
        if (req.n_past + 1 > n_ctx) {
            req.result.finish_reason = "length";
            break;
        }
        const int32_t n_remaining = params.max_tokens - int32_t(req.result.tokens.size());
        const int32_t n_draft_max = std::min({params.n_draft, n_remaining - 1, n_ctx - req.n_past - 1});

        auto t0 = Clock::now();
        req.draft.tokens.clear();
        req.draft.probs.clear();
        if (drafter && n_draft_max > 0) {
            DraftRequest dreq{&req.committed, n_draft_max, &params.sampling, &rng_};
            drafter->draft(dreq, req.draft);
        }
        stats.t_draft_ms += ms_since(t0);

        t0 = Clock::now();
        const int32_t n_draft = int32_t(req.draft.tokens.size());
        batch.clear();
        batch.push_back({req.committed.back(), req.n_past, {}, true});
        for (int32_t i = 0; i < n_draft; ++i) batch.push_back({req.draft.tokens[size_t(i)], req.n_past + 1 + i, {}, true});
        target_->decode(batch);
        ++stats.n_target_calls;
        const ChainVerdict verdict = verify_step(req);
        stats.t_verify_ms += ms_since(t0);

        t0 = Clock::now();
        stats.n_drafted += n_draft;
        stats.n_accepted += verdict.n_accepted;
        ++stats.accept_histogram[size_t(verdict.n_accepted)];
        record_trace(req, verdict, int32_t(req.result.tokens.size()));
        // Target KV keeps the pending token and the accepted draft tokens.
        req.n_past += 1 + verdict.n_accepted;
        target_->kv_remove(0, req.n_past, -1);
        for (int32_t i = 0; i < verdict.n_accepted && running; ++i) {
            running = commit_token(req, req.draft.tokens[size_t(i)], on_text);
        }
        if (running) running = commit_token(req, verdict.next_token, on_text);
        if (drafter) drafter->accept(req.committed, verdict.n_accepted);
        stats.t_other_ms += ms_since(t0);
    }

    const std::string tail = req.text.finish();
    if (!tail.empty() && on_text && req.result.finish_reason != "cancelled") on_text(tail);
    req.result.text = utf8_sanitize(req.text.text());
    stats.n_generated = int32_t(req.result.tokens.size());
    if (drafter) stats.n_draft_decodes = int32_t(drafter->stats().n_model_decodes - drafter_before.n_model_decodes);
    stats.t_total_ms = ms_since(t_start);
    return std::move(req.result);
}

}  // namespace spec
