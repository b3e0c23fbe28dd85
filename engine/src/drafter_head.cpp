// Drafting over a draft head (spec/draft_head.h) from the target's hidden state, verified by the
// decoder in one target call: ReDrafter's beam search, compressed into a prefix tree
// (prefix_match), and EAGLE-2's dynamic tree.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "spec/draft_head.h"
#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/schedule.h"
#include "spec/tree.h"

namespace spec {
namespace {

// A column of a head's logits with its log-softmax.
struct Column {
    int32_t column;
    double log_prob;
};

// The k likeliest columns of one row of head logits with their log-softmax, likeliest first (ties:
// the lower column). logits: [n]; order: scratch.
void top_columns(const float* logits, size_t n, size_t k, std::vector<int32_t>& order, std::vector<Column>& top) {
    order.resize(n);
    for (size_t c = 0; c < n; ++c) order[c] = int32_t(c);
    std::partial_sort(order.begin(), order.begin() + long(k), order.end(), [logits](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const float peak = logits[order[0]];
    double sum = 0.0;
    for (size_t c = 0; c < n; ++c) sum += std::exp(double(logits[c] - peak));
    const double log_norm = double(peak) + std::log(sum);
    top.clear();
    for (size_t i = 0; i < k; ++i) top.push_back({order[i], double(logits[order[i]]) - log_norm});
}

// What both head drafters share: the head, the counters, and the bookkeeping of accepted tokens.
class HeadDrafter : public Drafter {
public:
    explicit HeadDrafter(DraftHead& head) : head_(head) {}

    void begin(const std::vector<int32_t>&) override {}

    void accept(const std::vector<int32_t>&, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        if (drafted_) stats_.n_head_accepted += n_accepted;
    }

    DrafterStats stats() const override { return stats_; }

protected:
    // Starts a draft; false when there is nothing to draft from: no hidden state before the
    // first target decode of a request (a plain step).
    bool start(const DraftRequest& request, Draft& out) {
        out.clear();
        ++stats_.n_draft_calls;
        drafted_ = false;
        return request.target_hidden != nullptr;
    }

    // Ends a draft that proposed `out` (kinds: kind_head for every node unless already set).
    void finish(Draft& out) {
        if (out.kinds.size() != out.tokens.size()) out.kinds.assign(out.tokens.size(), kind_head());
        stats_.n_proposed += int64_t(out.tokens.size());
        if (out.tokens.empty()) return;
        ++stats_.n_head_drafts;
        drafted_ = true;
    }

    DraftHead& head_;
    DrafterStats stats_;
    std::vector<int32_t> order_;  // top_columns' scratch
    std::vector<Column> top_;

private:
    bool drafted_ = false;  // the last draft() proposed tokens (n_head_drafts)
};

class HeadBeamDrafter final : public HeadDrafter {
public:
    HeadBeamDrafter(DraftHead& head, const BeamParams& params) : HeadDrafter(head), params_(params) {}

    std::string name() const override { return "redrafter"; }

    // K beams of L tokens, scored by summed head log-probabilities: the first step expands the
    // last committed token (one row), each later step all K beams in one head call. The head
    // has no cache: everything it needs is the hidden state and the beams' states.
    void draft(const DraftRequest& request, Draft& out) override {
        if (!start(request, out)) return;
        const size_t K = size_t(std::min(params_.n_beams, request.n_nodes_max));
        size_t L = size_t(std::min(params_.length, request.n_draft_max));
        if (K == 0 || L == 0) return;
        L = std::min(L, size_t(request.n_nodes_max) / K);
        if (L == 0 || size_t(head_.n_kept()) < K) return;
        const size_t d = size_t(head_.n_embd()), V = size_t(head_.n_kept());

        hidden_.assign(request.target_hidden, request.target_hidden + d);
        state_.resize(d);
        head_.initial_state(hidden_.data(), state_.data(), 1);
        rows_.assign(1, head_.row_of(request.tokens->back()));
        logits_.resize(V);
        head_.step(hidden_.data(), state_.data(), rows_.data(), 1, logits_.data());
        ++stats_.n_model_decodes;

        // beams: [K, L] kept-vocabulary columns; every beam starts from the one first state.
        std::vector<int32_t> beams(K * L), next_beams(K * L);
        std::vector<double> score(K), next_score(K);
        top_columns(logits_.data(), V, K, order_, top_);
        for (size_t b = 0; b < K; ++b) {
            beams[b * L] = top_.at(b).column;
            score[b] = top_.at(b).log_prob;
        }
        std::vector<float> states(K * d), next_states(K * d);
        for (size_t b = 0; b < K; ++b) std::copy(state_.begin(), state_.end(), states.begin() + long(b * d));
        hidden_.resize(K * d);
        for (size_t b = 1; b < K; ++b) std::copy_n(request.target_hidden, d, hidden_.begin() + long(b * d));
        logits_.resize(K * V);
        rows_.resize(K);

        for (size_t t = 1; t < L; ++t) {
            for (size_t b = 0; b < K; ++b) rows_[b] = beams[b * L + t - 1];
            head_.step(hidden_.data(), states.data(), rows_.data(), int32_t(K), logits_.data());
            ++stats_.n_model_decodes;
            // The K best extensions over all beams (ties: the earlier beam, then the likelier token).
            ext_.clear();
            for (size_t b = 0; b < K; ++b) {
                top_columns(logits_.data() + b * V, V, K, order_, top_);
                for (const Column& c : top_) ext_.push_back({score[b] + c.log_prob, b, c.column});
            }
            std::stable_sort(ext_.begin(), ext_.end(), [](const Extension& x, const Extension& y) { return x.score > y.score; });
            for (size_t b = 0; b < K; ++b) {
                const Extension& e = ext_[b];
                std::copy_n(beams.begin() + long(e.beam * L), t, next_beams.begin() + long(b * L));
                next_beams[b * L + t] = e.column;
                next_score[b] = e.score;
                std::copy_n(states.begin() + long(e.beam * d), d, next_states.begin() + long(b * d));
            }
            beams.swap(next_beams);
            score.swap(next_score);
            states.swap(next_states);
        }

        std::vector<int32_t> tokens(K * L);
        for (size_t i = 0; i < K * L; ++i) tokens[i] = head_.vocab()[size_t(beams[i])];
        const BeamTree tree = beams_to_tree(tokens, int32_t(K), int32_t(L));
        out.tokens = tree.tokens;
        out.parents = tree.parents;
        out.n_candidate_tokens = int32_t(K * L);
        finish(out);
    }

private:
    struct Extension {
        double score;
        size_t beam;
        int32_t column;
    };

    BeamParams params_;
    std::vector<float> hidden_;  // [K, d] the hidden state, once per beam
    std::vector<float> state_;   // [d]
    std::vector<int32_t> rows_;  // [K]
    std::vector<float> logits_;  // [K, V']
    std::vector<Extension> ext_;
};

class HeadTreeDrafter final : public HeadDrafter {
public:
    HeadTreeDrafter(DraftHead& head, const TreeParams& params) : HeadDrafter(head), params_(params) {}

    std::string name() const override { return "eagle"; }

    // EAGLE-2's dynamic tree over the head: the root's children are the head's `branching`
    // likeliest tokens after the last committed one; each layer then steps the n_expand
    // best-scoring candidates of the layer in one head call (each from its parent's state) and
    // adds their `branching` likeliest tokens as the next layer; the n_nodes best-scoring
    // candidates of all layers are verified. A score is the product of the head's probabilities
    // along the path, so a child never outscores its parent and the kept candidates form a
    // tree. The children are the head's top-k (deterministic: one-hot q, exact when sampling).
    void draft(const DraftRequest& request, Draft& out) override {
        if (!start(request, out)) return;
        const int32_t n_nodes_max = std::min({params_.n_nodes, request.n_nodes_max, kMaxTreeNodes});
        const int32_t depth_max = std::min(params_.depth, request.n_draft_max);
        if (n_nodes_max <= 0 || depth_max <= 0) return;
        const size_t d = size_t(head_.n_embd()), V = size_t(head_.n_kept());
        const size_t branching = std::min(size_t(params_.branching), V);

        cands_.clear();
        states_.clear();  // [n_cands, d] state each candidate is stepped from: its parent's, after the parent's step
        hidden_.assign(request.target_hidden, request.target_hidden + d);
        step_states_.resize(d);
        head_.initial_state(hidden_.data(), step_states_.data(), 1);
        rows_.assign(1, head_.row_of(request.tokens->back()));
        logits_.resize(V);
        head_.step(hidden_.data(), step_states_.data(), rows_.data(), 1, logits_.data());
        ++stats_.n_model_decodes;
        push_children(logits_.data(), V, branching, -1, 0.0, step_states_.data());

        // Layer by layer: the candidates [layer_begin, end) are the last layer's.
        size_t layer_begin = 0;
        std::vector<int32_t>& layer = layer_;
        for (int32_t depth = 0; depth + 1 < depth_max; ++depth) {
            const size_t layer_end = cands_.size();
            layer.clear();
            for (size_t c = layer_begin; c < layer_end; ++c) layer.push_back(int32_t(c));
            layer_begin = layer_end;
            if (layer.empty()) break;
            std::stable_sort(layer.begin(), layer.end(), [this](int32_t x, int32_t y) {
                return cands_[size_t(x)].log_score > cands_[size_t(y)].log_score;
            });
            layer.resize(std::min(layer.size(), size_t(params_.n_expand)));
            const size_t n = layer.size();
            hidden_.resize(n * d);
            step_states_.resize(n * d);
            rows_.resize(n);
            for (size_t i = 0; i < n; ++i) {
                const size_t c = size_t(layer[i]);
                std::copy_n(request.target_hidden, d, hidden_.begin() + long(i * d));
                std::copy_n(states_.begin() + long(c * d), d, step_states_.begin() + long(i * d));
                rows_[i] = cands_[c].row;
            }
            logits_.resize(n * V);
            head_.step(hidden_.data(), step_states_.data(), rows_.data(), int32_t(n), logits_.data());
            ++stats_.n_model_decodes;
            for (size_t i = 0; i < n; ++i) {
                const Candidate parent = cands_[size_t(layer[i])];
                push_children(logits_.data() + i * V, V, branching, layer[i], parent.log_score, step_states_.data() + i * d);
            }
        }
        select(n_nodes_max, out);
        finish(out);
    }

private:
    struct Candidate {
        int32_t token, row, parent;  // row: the head's embedding row of token; parent: -1 for the root
        double log_score;            // summed log-probabilities of the head along the path
        bool top;                    // its parent's likeliest child under the head
    };

    // The k likeliest columns of one row of head logits become children of `parent`, each to be
    // stepped from `state` (the parent's state after its step): [d].
    void push_children(const float* logits, size_t V, size_t k, int32_t parent, double parent_log_score,
                       const float* state) {
        top_columns(logits, V, k, order_, top_);
        const size_t d = size_t(head_.n_embd());
        for (const Column& c : top_) {
            cands_.push_back({head_.vocab()[size_t(c.column)], c.column, parent, parent_log_score + c.log_prob,
                              &c == &top_.front()});
            states_.insert(states_.end(), state, state + d);
        }
    }

    // The n best candidates, best first (a parent before its children, siblings likeliest first).
    void select(int32_t n, Draft& out) {
        std::vector<int32_t> parent(cands_.size());
        std::vector<double> score(cands_.size());
        for (size_t c = 0; c < cands_.size(); ++c) {
            parent[c] = cands_[c].parent;
            score[c] = cands_[c].log_score;
        }
        for (int32_t c : select_tree_nodes(parent, score, n, out.parents)) {
            out.tokens.push_back(cands_[size_t(c)].token);
            out.kinds.push_back(cands_[size_t(c)].top ? kind_head() : kind_head_alternative());
        }
    }

    TreeParams params_;
    std::vector<Candidate> cands_;
    std::vector<float> states_;       // [n_cands, d]
    std::vector<float> hidden_;       // [n, d] the target's hidden state, once per stepped row
    std::vector<float> step_states_;  // [n, d] the stepped rows' states, updated by the step
    std::vector<int32_t> layer_;      // the candidates a layer steps
    std::vector<int32_t> rows_;       // [n]
    std::vector<float> logits_;       // [n, V']
};

}  // namespace

std::unique_ptr<Drafter> make_head_tree_drafter(DraftHead& head, const TreeParams& params) {
    validate(params);
    return std::make_unique<HeadTreeDrafter>(head, params);
}

std::unique_ptr<Drafter> make_head_beam_drafter(DraftHead& head, const BeamParams& params) {
    validate(params);
    return std::make_unique<HeadBeamDrafter>(head, params);
}

}  // namespace spec
