// The auto scheduler (method "auto"): per step, the proposal and size that maximise expected
// tokens per second under the measured cost curves (spec/schedule.h), or plain decoding: the free
// proposal (prompt lookup and pool phrases), a draft-model chain, or a draft-head chain or tree.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "spec/cost_model.h"
#include "spec/draft_head.h"
#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/model.h"
#include "spec/ngram_table.h"
#include "spec/schedule.h"
#include "spec/tree.h"

namespace spec {
namespace {

// A draft-model or head chain is drafted only when its predicted rate beats the free proposal's
// by this factor: the prediction rests on averages, the free proposal's on the nodes at hand.
constexpr double kModelMargin = 1.02;

// Auto's head trees (AutoParams::head_tree_nodes): children per expanded node, and nodes
// expanded per head call.
constexpr int32_t kHeadTreeBranching = 4;
constexpr int32_t kHeadTreeExpand = 4;

// The draft model's cache misses the tokens committed since it last drafted (the whole prompt
// and output the first time it drafts in a request), and its first draft decodes them all. A
// model that starts drafting usually drafts for several steps, so that catch-up is charged to
// the chain's plan (plan_chain's fixed cost) spread over this many steps: where reading a prompt
// costs a few one-token decodes the model can still win; on this CPU, where the draft reads it
// at several ms per token, a chain chosen on a burst of noise in the target's one-token time can
// no longer pay a second of prompt reading for one step of a few tokens.
constexpr double kCatchUpSteps = 4.0;

// Probes of the cost model (plan_probe in spec/schedule.h): after this many plain steps in a row,
// the nodes accepted with P >= kProbeMinProb are drafted when their step size has been timed
// fewer than kProbeMinObserved times.
constexpr int32_t kProbeAfterPlainSteps = 8;
constexpr double kProbeMinProb = 0.5;
constexpr int64_t kProbeMinObserved = 3;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

class AutoDrafter final : public Drafter {
public:
    AutoDrafter(Model* model, const CostCurve* draft_cost, const CostModel& target_cost, AcceptanceStats& stats,
                PhrasePool* pool, const LookupParams& lookup, const PoolParams& pool_params, const AutoParams& params,
                const AutoHead& head, const NgramTable* corpus)
        : lookup_(make_pool_lookup_drafter(lookup, pool, pool_params)),
          corpus_(params.use_corpus ? corpus : nullptr),
          model_(model && draft_cost ? model : nullptr),
          draft_cost_(draft_cost),
          target_cost_(target_cost),
          acceptance_(stats),
          params_(params),
          head_(head) {
        if (draft_cost_) draft_costs_.set_prior(*draft_cost_);
        // A greedy head chain: beam search with one beam; and the head tree that may replace it.
        if (head_.head) {
            head_chain_ = make_head_beam_drafter(*head_.head, {1, std::min(params.max_gamma, kMaxTreeNodes)});
            if (params.head_tree_nodes > 0) {
                head_tree_ = make_head_tree_drafter(
                    *head_.head, {params.head_tree_nodes, std::min(params.max_gamma, kMaxTreeNodes), kHeadTreeBranching,
                                  kHeadTreeExpand});
            }
        }
    }

    std::string name() const override { return "auto"; }

    void begin(const std::vector<int32_t>& prompt) override {
        lookup_->begin(prompt);
        chain_.reset();  // the draft model's cache is filled the first time it drafts
        model_synced_ = 0;
        scorer_.clear();
        if (params_.check_history) acceptance_.begin_request();
    }

    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        used_ = nullptr;

        DraftRequest free_request = request;
        free_request.n_draft_max = std::min(request.n_draft_max, params_.max_depth);
        free_request.n_nodes_max = std::min(request.n_nodes_max, params_.max_nodes);
        lookup_->draft(free_request, free_);
        if (corpus_) add_corpus_branch(*request.tokens, free_request.n_draft_max, free_request.n_nodes_max);
        const std::vector<int32_t> free_parents = parents_of(free_);
        // The whole free proposal is scored against what gets committed, verified or not.
        scorer_.add(int32_t(request.tokens->size()), free_.tokens, free_.parents, free_.kinds);
        // The step costs as the engine has seen them lately (its calibration, corrected online).
        // The head drafts from the target's hidden state, which the first step lacks.
        const bool head_ready = head_chain_ && request.target_hidden;
        const int32_t gamma_max = model_ || head_ready ? std::min(params_.max_gamma, request.n_draft_max) : 0;
        target_cost_.table(std::max(int32_t(free_.tokens.size()), gamma_max) + 1, params_.adapt_costs, step_ms_);
        const DraftPlan free_plan = plan_draft(free_parents, free_.kinds, acceptance_, step_ms_, 0.0);

        // The best of the free proposal, a draft-model chain and a head chain.
        double best_rate = kModelMargin * free_plan.tokens_per_ms();
        ChainPlan model_plan, head_plan;
        if (model_) {
            model_plan = plan_chain(acceptance_.model_acceptance(), step_ms_, draft_decode_ms(), gamma_max,
                                    catch_up_ms(request) / kCatchUpSteps);
            if (model_plan.gamma > 0 && model_plan.tokens_per_ms() > best_rate) best_rate = model_plan.tokens_per_ms();
        }
        if (head_ready) {
            const int32_t head_max = std::min({gamma_max, request.n_nodes_max, kMaxTreeNodes});
            head_plan = plan_chain(head_acceptance(head_max), step_ms_, head_step_ms(request), head_max);
            if (head_plan.gamma > 0 && head_plan.tokens_per_ms() > best_rate) {
                if (head_tree_) {
                    draft_head_tree(request, head_max, out);
                } else {
                    draft_with_head(request, head_plan.gamma, out);
                }
                return;
            }
        }
        if (model_plan.gamma > 0 && model_plan.tokens_per_ms() >= best_rate) {
            draft_with_model(request, model_plan.gamma, out);
            return;
        }
        std::vector<int32_t> keep = free_plan.keep;
        if (keep.empty() && params_.adapt_costs && !free_.tokens.empty() &&
            ++plain_steps_ >= kProbeAfterPlainSteps) {
            keep = plan_probe(free_parents, free_.kinds, acceptance_, target_cost_, kProbeMinProb, kProbeMinObserved);
        }
        if (!keep.empty()) {
            out = free_;
            keep_nodes(keep, 0, out.tokens, out.parents, out.kinds, out.probs);
            used_ = lookup_.get();
            plain_steps_ = 0;
        }
        stats_.n_proposed += int64_t(out.tokens.size());
    }

    void accept(const std::vector<int32_t>& committed, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        const bool by_model = used_ && used_ == chain_.get();
        const bool by_head = used_ && (used_ == head_chain_.get() || used_ == head_tree_.get());
        if (by_model || by_head) {
            // The accepted path and the target's next token.
            const int32_t* actual = committed.data() + committed.size() - size_t(n_accepted) - 1;
            AcceptanceStats& stats = by_model ? acceptance_ : *head_.acceptance;
            stats.record_outcome(chain_draft_.tokens, chain_draft_.parents, chain_draft_.kinds, actual, n_accepted + 1);
        }
        // The draft model keeps its cache up to the accepted path; the target's next token is not
        // in it (nor, after a wholly accepted chain, its last token: one more token to read).
        if (by_model) model_synced_ = int32_t(committed.size()) - 1;
        if (by_head) stats_.n_head_accepted += n_accepted;
        scorer_.score(committed);
        if (used_) used_->accept(committed, n_accepted);
    }

    void observe_target(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                        const std::vector<int32_t>& target_argmax) override {
        if (used_) used_->observe_target(tokens, parents, target_argmax);
    }

    bool observes_target() const override { return used_ && used_->observes_target(); }

    void end(const std::vector<int32_t>& committed) override {
        scorer_.score(committed);
        acceptance_.end_request();
        lookup_->end(committed);
    }

    DrafterStats stats() const override {
        DrafterStats s = stats_;
        s.n_model_decodes = chain_ ? chain_->stats().n_model_decodes : 0;
        return s;
    }

private:
    static std::vector<int32_t> parents_of(const Draft& draft) {
        return draft.parents.empty() ? chain_parents(int32_t(draft.tokens.size())) : draft.parents;
    }

    // The corpus chain (AutoParams::use_corpus) as one more branch of the free proposal, below
    // the root, unless a branch there already starts with its first token.
    void add_corpus_branch(const std::vector<int32_t>& committed, int32_t max_depth, int32_t max_nodes) {
        const int32_t room = std::min({params_.corpus_max_depth, max_depth, max_nodes - int32_t(free_.tokens.size())});
        if (room <= 0) return;
        context_.assign(committed.end() - std::min<ptrdiff_t>(ptrdiff_t(committed.size()), corpus_->max_context()),
                        committed.end());
        const size_t n_context = context_.size();
        corpus_kinds_.clear();
        const bool chain = free_.parents.empty();
        NgramTable::Hit hit;
        while (int32_t(corpus_kinds_.size()) < room &&
               corpus_->predict(context_.data(), int32_t(context_.size()), uint32_t(params_.corpus_min_total), hit) &&
               hit.confidence() >= kCorpusMinConfidence) {
            if (corpus_kinds_.empty()) {  // a branch below the root already starting so: nothing to add
                for (size_t i = 0; i < free_.tokens.size(); ++i) {
                    if ((chain ? i == 0 : free_.parents[i] < 0) && free_.tokens[i] == hit.token) return;
                }
            }
            context_.push_back(hit.token);
            corpus_kinds_.push_back(kind_corpus(hit.confidence()));
        }
        if (corpus_kinds_.empty()) return;
        // Alone it stays a chain (parents empty); beside other branches the tree gets its parents.
        const bool alone = free_.tokens.empty();
        if (free_.kinds.size() < free_.tokens.size()) free_.kinds.resize(free_.tokens.size(), kKindUnknown);
        if (chain && !alone) free_.parents = chain_parents(int32_t(free_.tokens.size()));
        for (size_t d = 0; d < corpus_kinds_.size(); ++d) {
            if (!alone) free_.parents.push_back(d == 0 ? -1 : int32_t(free_.tokens.size()) - 1);
            free_.tokens.push_back(context_[n_context + d]);
            free_.kinds.push_back(corpus_kinds_[d]);
        }
    }

    void draft_with_model(const DraftRequest& request, int32_t gamma, Draft& out) {
        const auto t0 = Clock::now();
        // The chain drafter catches up on the tokens committed since it last drafted itself.
        if (!chain_) {
            chain_ = make_model_chain_drafter(*model_);
            chain_->begin(*request.tokens);  // catches up on the prompt and the output so far
        }
        // Its one-token cost is learnt only from drafts without a catch-up (charged apart).
        const bool in_sync = tokens_behind(request) <= 1;
        const int64_t decodes_before = chain_->stats().n_model_decodes;
        DraftRequest model_request = request;
        model_request.n_draft_max = gamma;
        chain_->draft(model_request, out);
        used_ = chain_.get();
        const double sunk_ms = ms_since(t0);
        const int64_t n_decodes = chain_->stats().n_model_decodes - decodes_before;
        if (in_sync && n_decodes > 0) draft_costs_.observe(1, sunk_ms / double(n_decodes));
        if (request.sampling->greedy()) {
            // The chain's length may depend on the drafted tokens only when they are not sampled.
            if (step_ms_.size() < out.tokens.size() + 2) {
                target_cost_.table(int32_t(out.tokens.size()) + 1, params_.adapt_costs, step_ms_);
            }
            const DraftPlan plan = plan_draft(parents_of(out), out.kinds, acceptance_, step_ms_, sunk_ms);
            keep_nodes(plan.keep, model_->n_vocab(), out.tokens, out.parents, out.kinds, out.probs);
        }
        keep_chain_draft(out);
    }

    void draft_with_head(const DraftRequest& request, int32_t gamma, Draft& out) {
        const auto t0 = Clock::now();
        const int64_t steps_before = head_chain_->stats().n_model_decodes;
        DraftRequest head_request = request;
        head_request.n_draft_max = gamma;
        head_chain_->draft(head_request, out);
        used_ = head_chain_.get();
        const double ms = ms_since(t0);
        const int64_t n_steps = head_chain_->stats().n_model_decodes - steps_before;
        if (n_steps > 0) head_.step_cost->observe(1, ms / double(n_steps));
        ++stats_.n_head_drafts;
        keep_chain_draft(out);
    }

    // A head tree (EAGLE-2) as deep as the head may draft, pruned to the nodes worth verifying
    // with the head's acceptance statistics, its top choices and its others apart.
    void draft_head_tree(const DraftRequest& request, int32_t depth, Draft& out) {
        const auto t0 = Clock::now();
        const int64_t steps_before = head_tree_->stats().n_model_decodes;
        DraftRequest head_request = request;
        head_request.n_draft_max = depth;
        head_request.n_nodes_max = std::min(request.n_nodes_max, params_.head_tree_nodes);
        head_tree_->draft(head_request, out);
        used_ = head_tree_.get();
        const double sunk_ms = ms_since(t0);
        const int64_t n_steps = head_tree_->stats().n_model_decodes - steps_before;
        if (n_steps > 0) head_.step_cost->observe(1, sunk_ms / double(n_steps));
        if (step_ms_.size() < out.tokens.size() + 2) {
            target_cost_.table(int32_t(out.tokens.size()) + 1, params_.adapt_costs, step_ms_);
        }
        // The tree's nodes are the head's deterministic choices: pruning them is exact when sampling too.
        const DraftPlan plan = plan_draft(parents_of(out), out.kinds, *head_.acceptance, step_ms_, sunk_ms);
        keep_nodes(plan.keep, 0, out.tokens, out.parents, out.kinds, out.probs);
        if (!out.tokens.empty()) ++stats_.n_head_drafts;
        keep_chain_draft(out);
    }

    // The chain as it goes to verification, for the acceptance statistics.
    void keep_chain_draft(const Draft& out) {
        chain_draft_.tokens = out.tokens;
        chain_draft_.parents = out.parents;
        chain_draft_.kinds = out.kinds;
        stats_.n_proposed += int64_t(out.tokens.size());
    }

    // The head's acceptance at depths 0 .. n - 1, as plan_chain takes it.
    std::vector<double> head_acceptance(int32_t n) const {
        std::vector<double> alpha(size_t(std::max(n, 0)));
        for (int32_t d = 0; d < n; ++d) alpha[size_t(d)] = head_.acceptance->estimate(kind_head(), d);
        return alpha;
    }

    // What one head step of one row costs now. A head has no calibration: the first time auto
    // considers it, two steps are timed on this request's hidden state and the faster one (the
    // first run of a graph may allocate) is the prior, which the head's drafts then correct.
    double head_step_ms(const DraftRequest& request) {
        CostModel& cost = *head_.step_cost;
        if (cost.empty()) {
            DraftHead& head = *head_.head;
            std::vector<float> state(size_t(head.n_embd())), logits(size_t(head.n_kept()));
            const int32_t row = head.row_of(request.tokens->back());
            double fastest = 1e300;
            for (int i = 0; i < 2; ++i) {
                head.initial_state(request.target_hidden, state.data(), 1);
                const auto t0 = Clock::now();
                head.step(request.target_hidden, state.data(), &row, 1, logits.data());
                fastest = std::min(fastest, ms_since(t0));
            }
            cost.set_prior(CostCurve{{1}, {std::max(fastest, 1e-6)}});
        }
        return params_.adapt_costs ? cost.at(1) : cost.prior().at(1);
    }

    // What one draft-model decode costs now, for plan_chain: the draft's calibrated one-token
    // time, corrected (a CostModel, as the target's) by the measured drafting time per decode of
    // the drafts that had no catch-up (catch_up_ms), from the model's second draft of the request
    // on: the draft model slows down with the machine as the target does, and a plan that
    // believes it cheap drafts chains that lose.
    double draft_decode_ms() const { return params_.adapt_costs ? draft_costs_.at(1) : draft_cost_->at(1); }

    // Committed tokens the draft model's next draft must decode before its first draft token
    // (1 when in sync: the last committed token, which every draft decodes).
    int32_t tokens_behind(const DraftRequest& request) const {
        return int32_t(request.tokens->size()) - model_synced_;
    }

    // What the draft model's next draft pays, beyond its usual one-token decodes, to read the
    // committed tokens its cache lacks: one decode of them all in place of the decode of the last
    // one (a prefill past n_batch is several decodes; the curve extended linearly stands for them).
    double catch_up_ms(const DraftRequest& request) const {
        const int32_t behind = tokens_behind(request);
        if (behind <= 1) return 0.0;
        const double per_size = params_.adapt_costs ? draft_costs_.at(behind) : draft_cost_->at(behind);
        return std::max(0.0, per_size - draft_decode_ms());
    }

    std::unique_ptr<Drafter> lookup_;
    const NgramTable* corpus_;        // null: no corpus branch
    std::vector<int32_t> context_;    // the corpus chain's context and its nodes
    std::vector<uint8_t> corpus_kinds_;
    std::unique_ptr<Drafter> chain_;  // the draft model's chain drafter, once it has drafted
    std::unique_ptr<Drafter> head_chain_;  // the head's (one beam), when the engine has a head
    std::unique_ptr<Drafter> head_tree_;   // the head's trees (params_.head_tree_nodes > 0)
    Model* model_;                    // null: the draft model is not considered
    const CostCurve* draft_cost_;
    const CostModel& target_cost_;
    std::vector<double> step_ms_;     // this step's cost table: target_cost_.table(...)
    AcceptanceStats& acceptance_;
    AutoParams params_;
    AutoHead head_;
    Drafter* used_ = nullptr;         // the drafter whose proposal went out last step (null: none)
    int32_t plain_steps_ = 0;         // plain steps since the last draft (probes, see kProbeAfterPlainSteps)
    int32_t model_synced_ = 0;        // committed tokens the draft model's cache holds (at most)
    CostModel draft_costs_;           // prior: *draft_cost_; observed: ms per draft decode (size 1)
    Draft free_;
    Draft chain_draft_;  // the last draft-model or head chain as verified (tokens, parents, kinds)
    ProposalScorer scorer_{acceptance_};  // the free proposals, against what gets committed
    DrafterStats stats_;
};

}  // namespace

void validate(const AutoParams& params) {
    if (params.max_depth < 1) throw InvalidArgumentError("auto max_depth must be >= 1, got " + std::to_string(params.max_depth));
    if (params.max_nodes < 1 || params.max_nodes > kMaxDraftTokens) {
        throw InvalidArgumentError("auto max_nodes must be in [1, " + std::to_string(kMaxDraftTokens) + "], got " +
                                   std::to_string(params.max_nodes));
    }
    if (params.max_gamma < 1) throw InvalidArgumentError("auto max_gamma must be >= 1, got " + std::to_string(params.max_gamma));
    if (params.corpus_max_depth < 0 || params.corpus_max_depth > kMaxDraftTokens) {
        throw InvalidArgumentError("auto corpus_max_depth must be in [0, " + std::to_string(kMaxDraftTokens) + "], got " +
                                   std::to_string(params.corpus_max_depth));
    }
    if (params.corpus_min_total < 1) {
        throw InvalidArgumentError("auto corpus_min_total must be >= 1, got " + std::to_string(params.corpus_min_total));
    }
    if (params.head_tree_nodes < 0 || params.head_tree_nodes > kMaxTreeNodes) {
        throw InvalidArgumentError("auto head_tree_nodes must be in [0, " + std::to_string(kMaxTreeNodes) + "], got " +
                                   std::to_string(params.head_tree_nodes));
    }
}

std::unique_ptr<Drafter> make_auto_drafter(Model* draft_model, const CostCurve* draft_cost, const CostModel& target_cost,
                                           AcceptanceStats& stats, PhrasePool* pool, const LookupParams& lookup,
                                           const PoolParams& pool_params, const AutoParams& params,
                                           const AutoHead& head, const NgramTable* corpus) {
    validate(params);
    validate(target_cost.prior());
    if (draft_cost) validate(*draft_cost);
    if (head.head && !(head.step_cost && head.acceptance)) {
        throw InvalidArgumentError("auto with a draft head needs its step cost model and acceptance statistics");
    }
    return std::make_unique<AutoDrafter>(draft_model, draft_cost, target_cost, stats, pool, lookup, pool_params, params,
                                         head, corpus);
}

}  // namespace spec
