#include "spec/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "spec/drafter_registry.h"
#include "spec/error.h"
#include "spec/grammar.h"
#include "spec/penalties.h"
#include "spec/log.h"
#include "spec/text_stream.h"
#include "spec/tree.h"
#include "spec/verify.h"

namespace spec {
namespace {

// Frees `old` (a draft model being replaced or removed) and gives the C heap's free pages back
// to the system. A model's context buffers are large blocks that glibc takes from its arenas
// (not from mmap) once its dynamic mmap threshold has risen, which it does at the first free of
// such a block; freed at a reload, their pages stayed resident as free arena memory, and the
// serving process grew with the draft updates (the server soak: +12.6 MB over its first 500
// requests and 13 reloads while the heap in use stayed flat; 60 reloads of the tiny draft in one
// engine: +16 MB). malloc_trim hands those pages back (docs/hardening.md has the figures).
void free_model(std::unique_ptr<Model> old) {
    if (!old) return;
    old.reset();
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}


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
    std::vector<int32_t> parents;     // [n] the draft's tree (a chain spelled out)
    TreeBatchLayout layout;
    std::vector<std::vector<float>> row_probs;  // [n + 1][n_vocab] sampled: target rows, on first use
    std::vector<uint8_t> row_ready;             // [n + 1] row_probs[r] holds this step's row r
    std::vector<int32_t> target_argmax;         // [n + 1] greedy: the target's token after each row
    // Greedy without any use for a logits row: the target takes each row's argmax on its backend
    // (Model::set_backend_argmax) and no row reaches the host.
    bool backend_argmax = false;
    std::vector<float> row, residual;
    std::vector<int32_t> scratch;
    // Methods with a draft head: the target's hidden state of the row that chose the last
    // committed token (empty before the first target decode).
    std::vector<float> hidden;
    std::vector<int32_t> top_ids;     // [k] log-probabilities of one token's row
    std::vector<float> top_values;    // [k]
    // A request with a grammar: the state after the committed tokens, and this step's rows.
    std::unique_ptr<Grammar> grammar;
    StepGrammar step_grammar;
    std::unique_ptr<ForcedText> forced;  // drafts of the text the grammar forces (grammar_drafts)
    bool grammar_draft = false;          // this step's draft came from `forced`, not the drafter
    std::vector<float> masked;        // [n_vocab] a row's logits after the grammar's mask
    // A request with penalties or biases: the counts of its output so far, and one row's
    // penalised logits (the tokens on that row's path, root first).
    std::unique_ptr<PenaltyState> penalties;
    std::vector<float> penalised;     // [n_vocab]
    std::vector<int32_t> row_path;

    Request(const GenerateParams& p, Model& t, Drafter* d, Rng& r)
        : params(p), target(t), drafter(d), rng(r), text(p.stop) {}
};

void prefill(Request& req, const std::vector<int32_t>& prompt) {
    req.target.prefill_prompt(prompt);
    req.result.stats.n_prompt_cached = req.target.prefill_reused();
    req.n_past = int32_t(prompt.size()) - 1;  // the last token starts step one
    req.committed = prompt;
    if (req.drafter) req.drafter->begin(prompt);
}

// One batch entry, refilled in place: its sequence-id vector keeps its capacity from step to step.
// seq_ids: [n_seq_ids]
void set_batch_token(BatchToken& entry, int32_t token, int32_t pos, const int32_t* seq_ids, int32_t n_seq_ids) {
    entry.token = token;
    entry.pos = pos;
    entry.seq_ids.assign(seq_ids, seq_ids + n_seq_ids);
    entry.output = true;
}

// Decodes the root (the pending committed token) and the draft in one target call. Tree nodes go
// into leaf sequences that first receive the committed tokens (spec/tree.h). The parents, the
// layout and the batch are the request's, refilled every step without allocating once they have
// held a draft of this size.
void decode_draft(Request& req, std::vector<BatchToken>& batch) {
    const Draft& draft = req.draft;
    check_draft(draft, req.target.n_vocab());  // verification reads [n, n_vocab] rows of it
    const int32_t n = int32_t(draft.tokens.size());
    if (draft.parents.empty()) {
        req.parents.resize(size_t(n));
        for (int32_t i = 0; i < n; ++i) req.parents[size_t(i)] = i - 1;  // a chain
    } else {
        req.parents.assign(draft.parents.begin(), draft.parents.end());
    }
    layout_tree(req.parents, req.layout);
    for (int32_t s = 1; s <= req.layout.n_leaves; ++s) req.target.kv_copy(0, s);
    if (batch.size() < size_t(n) + 1) batch.resize(size_t(n) + 1);  // never shrunk: entries keep their vectors
    const TreeBatchLayout& layout = req.layout;
    set_batch_token(batch[0], req.committed.back(), req.n_past, layout.root_seq_ids.data(),
                    int32_t(layout.root_seq_ids.size()));
    for (int32_t i = 0; i < n; ++i) {
        set_batch_token(batch[size_t(i) + 1], draft.tokens[size_t(i)], req.n_past + 1 + layout.depth[size_t(i)],
                        layout.node_seq_ids(i), layout.n_node_seq_ids(i));
    }
    req.target.decode(batch.data(), n + 1);
}

// Row r's logits as the request's sampling sees them: the target's, or with penalties and biases
// a copy penalised for the output so far plus the draft tokens on the row's path. Valid until
// the next call.
const float* request_logits(Request& req, int32_t r) {
    const float* logits = req.target.logits(r);
    if (!req.penalties) return logits;
    const int32_t n_vocab = req.target.n_vocab();
    req.penalised.assign(logits, logits + n_vocab);
    req.row_path.clear();
    for (int32_t node = r - 1; node >= 0; node = req.parents[size_t(node)]) {
        req.row_path.push_back(req.draft.tokens[size_t(node)]);
    }
    std::reverse(req.row_path.begin(), req.row_path.end());
    req.penalties->apply(req.penalised.data(), n_vocab, req.row_path);
    return req.penalised.data();
}

// Verifies the draft against target rows 0..n (row 0: the root, row i + 1: node i).
TreeVerdict verify_step(Request& req) {
    const int32_t n = int32_t(req.draft.tokens.size());
    const int32_t n_vocab = req.target.n_vocab();
    const GenerateParams& params = req.params;
    if (params.sampling.greedy()) {
        // The argmax of the rows the walk reads (a rejected long draft: one or two), of every row
        // only for a drafter that learns from them all.
        req.target_argmax.assign(size_t(n + 1), -1);
        const auto target_token = [&req, n_vocab](int32_t r) {
            int32_t& token = req.target_argmax[size_t(r)];
            if (token >= 0) return token;
            if (req.backend_argmax) {
                token = req.target.argmax_token(r);
            } else if (!req.grammar) {
                token = argmax(request_logits(req, r), n_vocab);
            } else {
                token = req.step_grammar.row(r).argmax(request_logits(req, r), n_vocab);
                if (token < 0) throw InvalidArgumentError("the grammar allows no token after the output so far");
            }
            return token;
        };
        const TreeVerdict verdict = verify_tree_greedy(req.draft.tokens, req.parents, target_token);
        if (req.drafter && req.drafter->observes_target()) {
            for (int32_t r = 0; r <= n; ++r) target_token(r);
        }
        return verdict;
    }
    // Probabilities only for the rows verification walks through (the root and each accepted
    // node), computed on first use: a rejected long draft costs one or two rows, not n + 1.
    if (req.row_probs.size() < size_t(n + 1)) req.row_probs.resize(size_t(n + 1));
    req.row_ready.assign(size_t(n + 1), 0);
    const TargetRowFn target_row = [&req, n_vocab, &params](int32_t r) -> const float* {
        std::vector<float>& row = req.row_probs[size_t(r)];
        if (!req.row_ready[size_t(r)]) {
            const float* logits = request_logits(req, r);
            if (req.grammar) {
                req.masked.assign(logits, logits + n_vocab);
                req.step_grammar.row(r).mask(req.masked.data(), n_vocab);
                if (!std::isfinite(req.masked[size_t(argmax(req.masked.data(), n_vocab))])) {
                    throw InvalidArgumentError("the grammar allows no token after the output so far");
                }
                logits = req.masked.data();
            }
            compute_probs(logits, n_vocab, params.sampling, row, req.scratch);
            req.row_ready[size_t(r)] = 1;
        }
        return row.data();
    };
    if (params.acceptance == "typical") {
        return verify_tree_typical(req.draft.tokens, req.parents, target_row, n_vocab, params.typical_epsilon,
                                   params.typical_delta, req.rng);
    }
    const float* q = req.draft.probs.empty() ? nullptr : req.draft.probs.data();  // nullptr: one-hot
    return verify_tree_rejection(req.draft.tokens, req.parents, target_row, q, n_vocab, req.rng, req.residual);
}

// Keeps the root and the accepted path in sequence 0 of the target's KV cache; drops the rest.
void keep_accepted(Request& req, const TreeVerdict& verdict) {
    const int32_t n_accepted = int32_t(verdict.path.size());
    if (req.layout.n_leaves > 0) {
        if (n_accepted > 0) {
            const int32_t seq = req.layout.leaf_seq[size_t(verdict.path.back())];
            req.target.kv_copy(seq, 0, req.n_past + 1, req.n_past + 1 + n_accepted);
        }
        req.target.kv_keep(0);
    }
    const bool rejected = n_accepted < int32_t(req.draft.tokens.size());
    req.n_past += 1 + n_accepted;
    // Sequence 0 holds nothing past the accepted path unless a chain's node was rejected (a tree's
    // other nodes went with their leaf sequences above).
    if (rejected && req.layout.n_leaves == 0) req.target.kv_remove(0, req.n_past, -1);
}

// Appends one token to the output; returns false when generation must end.
// row: the target's output row the token was chosen from.
bool commit_token(Request& req, int32_t token, int32_t row, const TextCallback& on_text) {
    GenerateResult& res = req.result;
    if (req.target.is_eog(token)) {
        res.finish_reason = "stop";
        return false;
    }
    if (req.params.return_logits || req.params.logprobs >= 0) {
        const float* logits_row = req.target.logits(row);  // [n_vocab]
        if (req.params.return_logits) res.logits.insert(res.logits.end(), logits_row, logits_row + req.target.n_vocab());
        if (req.params.logprobs >= 0) {
            res.token_logprobs.push_back(token_logprobs(logits_row, req.target.n_vocab(), token, req.params.logprobs,
                                                        req.top_ids, req.top_values));
            res.top_logprob_ids.insert(res.top_logprob_ids.end(), req.top_ids.begin(), req.top_ids.end());
            res.top_logprobs.insert(res.top_logprobs.end(), req.top_values.begin(), req.top_values.end());
        }
    }
    req.committed.push_back(token);
    res.tokens.push_back(token);
    if (req.penalties) req.penalties->push(token);
    const std::string piece = req.text.push(req.target.token_to_piece(token));
    if (!piece.empty() && on_text && !on_text(piece, res)) {
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

// The step's record (what was drafted, how much was accepted) always; the target's top-k at a
// rejected position only when trace_top_k asks for it (a softmax over the row, on the host).
void record_trace(Request& req, const TreeVerdict& verdict, int32_t position) {
    const Draft& draft = req.draft;
    StepTrace step;
    step.position = position;
    step.n_accepted = int32_t(verdict.path.size());
    step.target_token = verdict.next_token;
    step.rejected = !verdict.is_bonus;
    if (draft.parents.empty()) {
        step.draft_tokens = draft.tokens;
    } else {
        for (int32_t node : verdict.path) step.draft_tokens.push_back(draft.tokens[size_t(node)]);
        const int32_t at = verdict.path.empty() ? -1 : verdict.path.back();
        for (size_t c = 0; c < draft.parents.size() && step.rejected; ++c) {
            if (draft.parents[c] == at) {
                step.draft_tokens.push_back(draft.tokens[c]);
                break;
            }
        }
    }
    if (step.rejected && req.params.trace_top_k > 0) {
        const int32_t row = verdict.path.empty() ? 0 : verdict.path.back() + 1;
        softmax(req.target.logits(row), req.target.n_vocab(), req.row);
        top_k_entries(req.row.data(), req.target.n_vocab(), req.params.trace_top_k, step.top_ids, step.top_probs);
        if (step.draft_tokens.size() > size_t(step.n_accepted)) {
            step.rejected_prob = req.row[size_t(step.draft_tokens[size_t(step.n_accepted)])];
        }
    }
    req.result.trace.push_back(std::move(step));
}

// Sequences the contexts get for tree drafts: kMaxTreeSeqs, or fewer when the batch is smaller,
// since llama.cpp keeps an output row per sequence within n_batch (itself capped by n_ctx).
int32_t tree_sequences(const ModelParams& model) {
    int32_t n = std::min(kMaxTreeSeqs, model.n_batch);
    if (model.n_ctx > 0) n = std::min(n, model.n_ctx);
    return std::max(n, 1);
}

// The default calibration sizes that one decode of this model can take.
std::vector<int32_t> calibration_sizes(const Model& model) {
    std::vector<int32_t> sizes;
    for (int32_t k : default_calibration_sizes()) {
        if (k <= model.params().n_batch && k + 2 <= model.n_ctx()) sizes.push_back(k);
    }
    return sizes;
}

}  // namespace

Engine::Engine(const std::string& target_path, const std::string& draft_path, const EngineParams& params)
    : params_(params), draft_params_(params.model), rng_(params.seed) {
    draft_params_.n_seq_max = std::max(draft_params_.n_seq_max, tree_sequences(params.model));
    target_ = std::make_shared<Model>(target_path, draft_params_);
    control_tokens_ = target_->control_tokens();
    target_->layout_tokens(&blank_line_tokens_, &unit_start_tokens_, &fence_tokens_);
    if (!draft_path.empty()) swap_draft(load_draft(draft_path), "");
    PhrasePoolParams pool_params = params.pool;
    pool_params.n_vocab = target_->n_vocab();
    pool_ = std::make_shared<PhrasePool>(pool_params);
}

std::shared_ptr<PhrasePool> Engine::pool() {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    if (!pool_) throw ClosedError("engine is closed");
    return pool_;
}

std::shared_ptr<const Model> Engine::shared_target() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    if (!target_) throw ClosedError("engine is closed");
    return target_;
}

bool Engine::closed() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    return target_ == nullptr;
}

Engine::~Engine() = default;

void Engine::check_open() const {
    if (!target_) throw ClosedError("engine is closed");
}

Model& Engine::target() {
    check_open();
    return *target_;
}

Model* Engine::find_draft(const std::string& name) const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    const auto it = drafts_.find(name);
    return it == drafts_.end() ? nullptr : it->second.model.get();
}

bool Engine::has_draft(const std::string& name) const {
    return find_draft(name) != nullptr;
}

Model& Engine::draft(const std::string& name) {
    check_open();
    Model* model = find_draft(name);
    if (!model) {
        throw InvalidArgumentError(name.empty() ? std::string("engine has no draft model")
                                                : "engine has no draft model named '" + name + "'");
    }
    return *model;
}

std::vector<std::string> Engine::draft_names() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    std::vector<std::string> names;
    for (const auto& [name, slot] : drafts_) {
        if (slot.model) names.push_back(name);
    }
    return names;
}

int64_t Engine::draft_version(const std::string& name) const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    const auto it = drafts_.find(name);
    return it == drafts_.end() ? 0 : it->second.version;
}

std::unique_ptr<Model> Engine::load_draft(const std::string& path) const {
    return std::make_unique<Model>(path, draft_params_);
}

void Engine::swap_draft(std::unique_ptr<Model> draft, const std::string& name) {
    check_open();
    if (!draft) throw InvalidArgumentError("swap_draft needs a model");
    if (!draft->drops_positions()) {
        throw InvalidArgumentError("draft " + draft->path() + " keeps a recurrent state that cannot drop rejected "
                                   "tokens: a draft model must be a transformer");
    }
    check_vocab_compatible(*target_, *draft);
    std::unique_ptr<Model> old;  // freed after the lock is released
    {
        std::lock_guard<std::mutex> lock(drafts_mutex_);
        DraftSlot& slot = drafts_[name];
        slot.cost = {};  // another file, maybe another quantization: never its predecessor's cost
        old = std::move(slot.model);
        slot.model = std::move(draft);
        ++slot.version;
    }
    free_model(std::move(old));
}

void Engine::reload_draft(const std::string& path, const std::string& name) {
    swap_draft(load_draft(path), name);
}

void Engine::remove_draft(const std::string& name) {
    check_open();
    std::unique_ptr<Model> old;
    {
        std::lock_guard<std::mutex> lock(drafts_mutex_);
        const auto it = drafts_.find(name);
        if (it == drafts_.end() || !it->second.model) {
            throw InvalidArgumentError("engine has no draft model named '" + name + "' to remove");
        }
        old = std::move(it->second.model);
    }
    free_model(std::move(old));
}

std::unique_ptr<DraftHead> Engine::load_head(const std::string& path) const {
    // Runs outside the engine's lock, maybe while close() runs: the target stays alive until
    // the head is checked against it.
    const std::shared_ptr<const Model> target = shared_target();
    HeadParams params;
    params.n_threads = params_.model.n_threads;
    params.use_gpu = params_.model.n_gpu_layers != 0;  // -1: all layers
    return std::make_unique<DraftHead>(path, *target, params);
}

void Engine::swap_head(std::unique_ptr<DraftHead> head) {
    check_open();
    if (!head) throw InvalidArgumentError("swap_head needs a head");
    if (head->n_embd() != target_->n_hidden()) {
        throw HeadMismatchError("head " + head->path() + " has width " + std::to_string(head->n_embd()) +
                                ", the target's hidden state " + std::to_string(target_->n_hidden()));
    }
    std::unique_ptr<DraftHead> old;  // freed after the lock is released
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    old = std::move(head_);
    head_ = std::move(head);
    ++head_version_;
    forget_head_record();
}

void Engine::reload_head(const std::string& path) { swap_head(load_head(path)); }

void Engine::remove_head() {
    check_open();
    std::unique_ptr<DraftHead> old;
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    if (!head_) throw InvalidArgumentError("engine has no draft head to remove");
    old = std::move(head_);
    forget_head_record();
}

void Engine::forget_head_record() {
    head_costs_ = CostModel();
    head_acceptance_.clear();
}

bool Engine::has_head() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    return head_ != nullptr;
}

int64_t Engine::head_version() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    return head_version_;
}

std::string Engine::head_path() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    return head_ ? head_->path() : std::string();
}

std::unique_ptr<NgramTable> Engine::load_ngram(const std::string& path) const {
    const std::shared_ptr<const Model> target = shared_target();  // as in load_head
    return std::make_unique<NgramTable>(NgramTable::load(path, target->n_vocab(), vocab_fingerprint(*target)));
}

void Engine::swap_ngram(std::unique_ptr<NgramTable> table) {
    check_open();
    if (!table) throw InvalidArgumentError("swap_ngram needs a table");
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    ngram_.swap(table);  // the old table is freed when `table` goes, after the lock
}

void Engine::remove_ngram() {
    check_open();
    std::unique_ptr<NgramTable> old;
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    old.swap(ngram_);
}

std::string Engine::ngram_path() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    return ngram_ ? ngram_->path() : std::string();
}

int64_t Engine::ngram_size() const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    return ngram_ ? ngram_->size() : 0;
}

CostCurve Engine::measure_target_cost(const std::vector<int32_t>& sizes, int32_t repeats,
                                      const CalibrationProgress& progress, int32_t context) {
    Model& model = target();
    if (!model.drops_positions()) {  // calibration drops the timed tokens after each decode
        throw InvalidArgumentError("cost curves time drafts the target may reject, and " + model.path() +
                                   " keeps a recurrent state that cannot drop them: use method='none'");
    }
    const CostCurve curve =
        measure_cost_curve(model, sizes.empty() ? calibration_sizes(model) : sizes, repeats, true, progress, context);
    std::lock_guard<std::mutex> lock(costs_mutex_);
    target_costs_.set_prior(curve);
    return curve;
}

CostCurve Engine::measure_draft_cost(const std::string& name, const std::vector<int32_t>& sizes, int32_t repeats,
                                     const CalibrationProgress& progress, int32_t context) {
    Model& model = draft(name);
    const CostCurve curve =
        measure_cost_curve(model, sizes.empty() ? calibration_sizes(model) : sizes, repeats, false, progress, context);
    set_draft_cost(curve, name);
    return curve;
}

void Engine::set_target_cost(const CostCurve& curve) {
    check_open();
    std::lock_guard<std::mutex> lock(costs_mutex_);
    target_costs_.set_prior(curve);
}

void Engine::set_draft_cost(const CostCurve& curve, const std::string& name) {
    check_open();
    spec::validate(curve);
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    const auto it = drafts_.find(name);
    if (it == drafts_.end() || !it->second.model) {
        throw InvalidArgumentError("engine has no draft model named '" + name + "' to set a cost curve for");
    }
    it->second.cost = curve;
}

CostCurve Engine::target_cost() const {
    std::lock_guard<std::mutex> lock(costs_mutex_);
    return target_costs_.prior();
}

CostModel Engine::target_cost_model() const {
    std::lock_guard<std::mutex> lock(costs_mutex_);
    return target_costs_;
}

Engine::Learnt Engine::learnt() const {
    check_open();
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    std::lock_guard<std::mutex> costs_lock(costs_mutex_);
    return Learnt{acceptance_, target_costs_, head_costs_, head_acceptance_, head_version_};
}

void Engine::restore_learnt(const Learnt& state) {
    check_open();
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    acceptance_ = state.acceptance;
    {
        std::lock_guard<std::mutex> costs_lock(costs_mutex_);
        target_costs_ = state.target_costs;
    }
    if (state.head_version == head_version_) {
        head_costs_ = state.head_costs;
        head_acceptance_ = state.head_acceptance;
    }
}

std::map<std::string, std::vector<double>> Engine::acceptance_counts() const {
    check_open();
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    std::map<std::string, std::vector<double>> out;
    for (const auto& [key, stats] : acceptance_) out[key] = stats.counts();
    return out;
}

void Engine::set_acceptance_counts(const std::map<std::string, std::vector<double>>& counts,
                                   const std::vector<std::string>& without_model) {
    check_open();
    std::map<std::string, AcceptanceStats> fresh;
    for (const auto& [key, values] : counts) {
        try {
            fresh[key].set_counts(values);
        } catch (const InvalidArgumentError& e) {
            throw InvalidArgumentError("statistics key '" + key + "': " + e.what());
        }
    }
    for (const std::string& key : without_model) {
        if (const auto it = fresh.find(key); it != fresh.end()) it->second.clear_model();
    }
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    acceptance_ = std::move(fresh);
}

CostCurve Engine::draft_cost(const std::string& name) const {
    std::lock_guard<std::mutex> lock(drafts_mutex_);
    const auto it = drafts_.find(name);
    return it == drafts_.end() ? CostCurve{} : it->second.cost;
}

void Engine::close() {
    // Taken out under the lock, freed after it: a caller still holding the pool or the target
    // (a save on another thread) frees it when done.
    std::shared_ptr<PhrasePool> pool;
    std::shared_ptr<Model> target;
    std::vector<std::unique_ptr<Model>> drafts;
    std::unique_ptr<DraftHead> head;
    {
        std::lock_guard<std::mutex> lock(drafts_mutex_);
        pool = std::move(pool_);
        target = std::move(target_);
        for (auto& [name, slot] : drafts_) drafts.push_back(std::move(slot.model));  // versions stay readable
        head = std::move(head_);
    }
}

std::unique_ptr<Drafter> Engine::make_drafter(const GenerateParams& params) {
    // Drafters are cheap (the models and their caches belong to the engine): one per request.
    const DrafterMethod& method = find_drafter_method(params.method);
    if (!method.make) return nullptr;
    DrafterResources resources;
    resources.target = target_.get();
    resources.pool = pool_.get();
    if (method_uses_draft_model(method, params, has_draft(params.draft))) {
        resources.draft = find_draft(params.draft);
        if (!resources.draft) {
            const std::string which = params.draft.empty() ? "a draft model" : "the draft model '" + params.draft + "'";
            throw InvalidArgumentError("method '" + params.method + "' needs " + which +
                                       "; load one or use method='none' or 'lookup'");
        }
    }
    if (method.needs_cost_curves) {
        if (target_costs_.empty()) measure_target_cost();
        if (resources.draft && draft_cost(params.draft).empty()) measure_draft_cost(params.draft);
        resources.target_cost = &target_costs_;
        if (resources.draft) {
            // The slot's curve lives in drafts_, which only changes between generations.
            std::lock_guard<std::mutex> lock(drafts_mutex_);
            resources.draft_cost = &drafts_.at(params.draft).cost;
        }
        // Without unit ends (LookupParams::unit_ends) a unit end is an ordinary copy node, and
        // without substitutions a repeated replacement is a failing one, without resyncs a copy
        // resumed after a break is a short match, without loose substitutions a renamed word met
        // elsewhere is a failing copy, without fences the start of a copied code block is a short
        // match: the kinds mean other things, so requests that assign them each way learn apart.
        std::string acceptance_key = params.draft;
        if (!params.lookup.unit_ends) acceptance_key += "\n(no unit ends)";
        if (!params.lookup.substitutions) acceptance_key += "\n(no substitutions)";
        if (params.lookup.substitutions && !params.lookup.resync) acceptance_key += "\n(no resync)";
        if (params.lookup.substitutions && !params.lookup.loose_substitutions) {
            acceptance_key += "\n(no loose substitutions)";
        }
        if (!params.lookup.fences) acceptance_key += "\n(no fences)";
        resources.acceptance = &acceptance_[acceptance_key];
    }
    if (method_uses_head(method, params, head_ != nullptr)) {
        if (!head_) {
            throw InvalidArgumentError("method '" + params.method +
                                       "' needs a draft head; load one with reload_head (pyspec train-head makes one)");
        }
        resources.head = head_.get();
        resources.head_cost = &head_costs_;
        resources.head_acceptance = &head_acceptance_;
    }
    if (method.needs_cost_curves && params.scheduler.use_corpus) resources.corpus = ngram_.get();
    // Copies stop at the target's control tokens (LookupParams::stop_tokens) and know where the
    // source's top-level units end (blank_line_tokens, unit_start_tokens) and its code blocks
    // open (fence_tokens).
    GenerateParams with_stops = params;
    with_stops.lookup.stop_tokens = control_tokens_;
    if (params.lookup.unit_ends) with_stops.lookup.blank_line_tokens = blank_line_tokens_;
    if (params.lookup.unit_ends || params.lookup.fences) with_stops.lookup.unit_start_tokens = unit_start_tokens_;
    if (params.lookup.fences) with_stops.lookup.fence_tokens = fence_tokens_;
    return method.make(with_stops, resources);
}

void Engine::validate(const std::vector<int32_t>& prompt, const GenerateParams& params) const {
    spec::validate(params.sampling);
    spec::validate(params.penalties, target_->n_vocab());
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
    if (params.backend_argmax < -1 || params.backend_argmax > 1) {
        throw InvalidArgumentError("backend_argmax must be -1 (where the output layer runs on a GPU), 0 or 1, got " +
                                   std::to_string(params.backend_argmax));
    }
    if (params.logprobs < -1) {
        throw InvalidArgumentError("logprobs must be -1 (off) or the number of top alternatives >= 0, got " +
                                   std::to_string(params.logprobs));
    }
    for (const auto& s : params.stop) {
        if (s.empty()) throw InvalidArgumentError("stop strings must not be empty");
    }
    if (params.method != "none" && !target_->drops_positions()) {
        throw InvalidArgumentError("method '" + params.method + "' drafts tokens the target may reject, and " +
                                   target_->path() + " keeps a recurrent state that cannot drop them: use "
                                   "method='none'");
    }
    MethodLimits limits;
    limits.n_ctx = n_ctx;
    limits.n_batch = target_->params().n_batch;
    limits.n_seq_max = draft_params_.n_seq_max;
    limits.n_draft_max = std::min({kMaxDraftTokens, limits.n_batch - 1, n_ctx - 1});
    find_drafter_method(params.method).validate(params, limits);
    if (params.acceptance != "exact" && params.acceptance != "typical") {
        throw InvalidArgumentError("acceptance must be 'exact' or 'typical', got '" + params.acceptance + "'");
    }
    if (params.acceptance == "typical" && !(params.typical_epsilon > 0.0f && params.typical_delta > 0.0f)) {
        throw InvalidArgumentError("typical_epsilon and typical_delta must be > 0");
    }
}

namespace {

// Hands the output so far to *partial when an exception leaves generate() (finish_reason "error").
class PartialOnError {
public:
    PartialOnError(Request& req, GenerateResult* partial, Clock::time_point t_start)
        : req_(req), partial_(partial), t_start_(t_start), n_exceptions_(std::uncaught_exceptions()) {}
    PartialOnError(const PartialOnError&) = delete;
    PartialOnError& operator=(const PartialOnError&) = delete;

    ~PartialOnError() {
        if (!partial_ || std::uncaught_exceptions() == n_exceptions_) return;
        try {
            GenerateResult& res = req_.result;
            res.finish_reason = "error";
            res.text = utf8_sanitize(req_.text.text());
            res.stats.n_generated = int32_t(res.tokens.size());
            res.stats.t_total_ms = ms_since(t_start_);
            *partial_ = std::move(res);
        } catch (...) {  // out of memory while unwinding: the original exception matters more
        }
    }

private:
    Request& req_;
    GenerateResult* partial_;
    Clock::time_point t_start_;
    int n_exceptions_;
};

}  // namespace

GenerateResult Engine::generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                                const TextCallback& on_text, GenerateResult* partial) {
    check_open();
    validate(prompt, params);
    const std::unique_ptr<Drafter> drafter_owner = make_drafter(params);
    Drafter* drafter = drafter_owner.get();
    // A seeded request draws from a stream of its own: it neither reads nor moves the engine's
    // shared stream, so one caller's seed never sets the randomness of another's requests.
    Rng seeded_rng(params.seed.value_or(0));
    Rng& rng = params.seed ? seeded_rng : rng_;

    const auto t_start = Clock::now();
    Request req(params, *target_, drafter, rng);
    const PartialOnError keep_partial(req, partial, t_start);
    const DrafterMethod& method = find_drafter_method(params.method);
    if (method_uses_draft_model(method, params, has_draft(params.draft))) {
        req.result.draft_version = draft_version(params.draft);
    }
    const bool uses_head = method_uses_head(method, params, head_ != nullptr);
    if (uses_head) req.result.head_version = head_version();
    Stats& stats = req.result.stats;
    stats.n_prompt_tokens = int32_t(prompt.size());
    const DraftShape shape = method.shape(params);
    stats.accept_histogram.assign(size_t(shape.depth + 1), 0);
    req.result.prompt_tokens = prompt;
    req.result.n_top_logprobs = std::min(std::max(params.logprobs, 0), target_->n_vocab());
    if (!params.grammar.empty()) {
        req.grammar = std::make_unique<Grammar>(target_->vocab(), params.grammar, params.grammar_root);
        if (drafter && params.grammar_drafts) {
            {
                std::lock_guard<std::mutex> lock(drafts_mutex_);
                if (!forced_chars_) forced_chars_ = std::make_unique<ForcedChars>(*target_);
            }
            req.forced = std::make_unique<ForcedText>(*target_, *forced_chars_);
        }
    }
    if (params.penalties.active()) req.penalties = std::make_unique<PenaltyState>(params.penalties, prompt);
    // Backend argmax is switched only when a request wants the other mode (a switch costs a graph
    // reservation); where the backend cannot run it, rows come to the host as before.
    const bool argmax_only = params.sampling.greedy() && !req.grammar && !req.penalties && !params.return_logits &&
                             params.logprobs < 0 && params.trace_top_k == 0;
    const bool wanted = params.backend_argmax > 0 || (params.backend_argmax < 0 && target_->output_on_gpu());
    target_->set_backend_argmax(argmax_only && wanted);
    req.backend_argmax = target_->backend_argmax();
    stats.backend_argmax = req.backend_argmax;
    prefill(req, prompt);
    stats.t_prefill_ms = ms_since(t_start);
    // Hidden states after the prompt (llama.cpp would otherwise output every prompt row), and
    // off again however generation ends.
    struct HiddenOutput {
        Model& model;
        explicit HiddenOutput(Model& m, bool on) : model(m) { model.set_hidden_output(on); }
        ~HiddenOutput() { model.set_hidden_output(false); }
    } hidden_output(*target_, uses_head);

    const int32_t n_ctx = target_->n_ctx();
    const int32_t n_batch = target_->params().n_batch;
    std::vector<BatchToken> batch;
    bool running = params.max_tokens > 0;
    if (!running) req.result.finish_reason = "length";
    while (running) {
        // Room: the pending token plus the draft must fit the window; a path adds at most its
        // depth + 1 tokens, so never draft deeper than max_tokens allows.
        if (req.n_past + 1 > n_ctx) {
            req.result.finish_reason = "length";
            break;
        }
        const int32_t n_remaining = params.max_tokens - int32_t(req.result.tokens.size());
        const int32_t room = n_ctx - req.n_past - 1;
        DraftRequest dreq{&req.committed, std::min({shape.depth, n_remaining - 1, room}), &params.sampling, &rng,
                          std::min({shape.n_nodes, room, n_batch - 1}),
                          req.hidden.empty() ? nullptr : req.hidden.data()};

        auto t0 = Clock::now();
        req.draft.clear();
        if (drafter && dreq.n_draft_max > 0 && dreq.n_nodes_max > 0) drafter->draft(dreq, req.draft);
        req.grammar_draft = false;
        if (req.grammar) {
            req.step_grammar.prune(*req.grammar, req.draft);
            if (req.forced && req.draft.tokens.empty() && dreq.n_draft_max > 0) {
                const std::string& text = req.text.text();
                req.forced->draft(*req.grammar, text.empty() ? '\0' : text.back(), dreq.n_draft_max, req.draft);
                req.grammar_draft = !req.draft.tokens.empty();
                if (req.grammar_draft) req.step_grammar.prune(*req.grammar, req.draft);
            }
        }
        stats.t_draft_ms += ms_since(t0);

        t0 = Clock::now();
        decode_draft(req, batch);
        stats.t_target_ms += ms_since(t0);
        ++stats.n_target_calls;
        const TreeVerdict verdict = verify_step(req);
        // What a step of this size costs now, for the planner's next steps (spec/cost_model.h).
        const double step_ms = ms_since(t0);
        const int32_t step_size = 1 + int32_t(req.draft.tokens.size());
        {
            std::lock_guard<std::mutex> lock(costs_mutex_);  // cost_model() may copy it meanwhile
            target_costs_.observe(step_size, step_ms);
        }
        req.result.step_ms.push_back(float(step_ms));
        req.result.step_sizes.push_back(step_size);
        if (drafter && params.sampling.greedy() && !req.draft.tokens.empty() && !req.grammar_draft) {
            drafter->observe_target(req.draft.tokens, req.parents, req.target_argmax);
        }
        stats.t_verify_ms += ms_since(t0);

        t0 = Clock::now();
        const int32_t n_draft = int32_t(req.draft.tokens.size());
        const int32_t n_accepted = int32_t(verdict.path.size());
        stats.n_drafted += n_draft;
        if (n_draft == 0) ++stats.n_empty_drafts;
        stats.n_candidate_tokens += req.draft.n_candidate_tokens > 0 ? req.draft.n_candidate_tokens : n_draft;
        record_trace(req, verdict, int32_t(req.result.tokens.size()));
        keep_accepted(req, verdict);
        int32_t row = 0;  // the target row that chose the next token: the root, then path nodes
        int32_t n_used = 0;  // accepted tokens the output used: none after an end of generation or a stop string
        for (int32_t i = 0; i < n_accepted && running; ++i) {
            const int32_t node = verdict.path[size_t(i)];
            running = commit_token(req, req.draft.tokens[size_t(node)], row, on_text);
            row = node + 1;
            ++n_used;
        }
        stats.n_accepted += n_used;
        ++stats.accept_histogram[size_t(std::min(n_used, shape.depth))];
        if (running) running = commit_token(req, verdict.next_token, row, on_text);
        if (running && req.grammar) {
            auto next = std::make_unique<Grammar>(req.step_grammar.row(row));
            next->accept(verdict.next_token);
            req.grammar = std::move(next);
        }
        if (running && uses_head) {
            const float* h = req.target.hidden(row);
            req.hidden.assign(h, h + req.target.n_hidden());
        }
        // A grammar draft replaced an empty one: the drafter's own draft had nothing to accept.
        if (drafter && running) drafter->accept(req.committed, req.grammar_draft ? 0 : n_accepted);
        stats.t_other_ms += ms_since(t0);
    }

    if (drafter) drafter->end(req.committed);
    // Only sequence 0 stays (the prefix cache of the next request): a generation that ended
    // right after a draft leaves its tree branches behind.
    target_->kv_drop_side_sequences();
    if (Model* draft = find_draft(params.draft)) draft->kv_drop_side_sequences();
    const std::string tail = req.text.finish();
    if (!tail.empty() && on_text && req.result.finish_reason != "cancelled") on_text(tail, req.result);
    req.result.text = utf8_sanitize(req.text.text());
    stats.n_generated = int32_t(req.result.tokens.size());
    if (drafter) {
        const DrafterStats drafted = drafter->stats();
        stats.n_draft_decodes = int32_t(drafted.n_model_decodes);
        stats.n_head_drafts = int32_t(drafted.n_head_drafts);
        stats.n_head_accepted = int32_t(drafted.n_head_accepted);
    }
    stats.t_total_ms = ms_since(t_start);
    return std::move(req.result);
}

}  // namespace spec
