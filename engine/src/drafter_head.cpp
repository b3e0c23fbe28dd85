// ReDrafter: beam search over a draft head (spec/draft_head.h) from the target's hidden state,
// compressed into a prefix tree (prefix_match) and verified by the decoder in one target call.
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

class HeadBeamDrafter final : public Drafter {
public:
    HeadBeamDrafter(DraftHead& head, const BeamParams& params) : head_(head), params_(params) {}

    std::string name() const override { return "redrafter"; }

    void begin(const std::vector<int32_t>&) override {}

    // K beams of L tokens, scored by summed head log-probabilities: the first step expands the
    // last committed token (one row), each later step all K beams in one head call. The head
    // has no cache: everything it needs is the hidden state and the beams' states.
    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        drafted_ = false;
        // No hidden state before the first target decode of a request: a plain step.
        if (!request.target_hidden) return;
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
        top_columns(logits_.data(), V, K);
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
                top_columns(logits_.data() + b * V, V, K);
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
        out.kinds.assign(out.tokens.size(), kind_head());
        out.n_candidate_tokens = int32_t(K * L);
        stats_.n_proposed += int64_t(out.tokens.size());
        ++stats_.n_head_drafts;
        drafted_ = true;
    }

    void accept(const std::vector<int32_t>&, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        if (drafted_) stats_.n_head_accepted += n_accepted;
    }

    DrafterStats stats() const override { return stats_; }

private:
    struct Column {
        int32_t column;
        double log_prob;
    };
    struct Extension {
        double score;
        size_t beam;
        int32_t column;
    };

    // The k likeliest columns of one logits row with their log-softmax, likeliest first (ties:
    // the lower column).
    void top_columns(const float* logits, size_t n, size_t k) {
        order_.resize(n);
        for (size_t c = 0; c < n; ++c) order_[c] = int32_t(c);
        std::partial_sort(order_.begin(), order_.begin() + long(k), order_.end(), [logits](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        const float peak = logits[order_[0]];
        double sum = 0.0;
        for (size_t c = 0; c < n; ++c) sum += std::exp(double(logits[c] - peak));
        const double log_norm = double(peak) + std::log(sum);
        top_.clear();
        for (size_t i = 0; i < k; ++i) top_.push_back({order_[i], double(logits[order_[i]]) - log_norm});
    }

    DraftHead& head_;
    BeamParams params_;
    DrafterStats stats_;
    bool drafted_ = false;       // the last draft() proposed tokens (n_head_drafts)
    std::vector<float> hidden_;  // [K, d] the hidden state, once per beam
    std::vector<float> state_;   // [d]
    std::vector<int32_t> rows_;  // [K]
    std::vector<float> logits_;  // [K, V']
    std::vector<int32_t> order_;
    std::vector<Column> top_;
    std::vector<Extension> ext_;
};

}  // namespace

std::unique_ptr<Drafter> make_head_beam_drafter(DraftHead& head, const BeamParams& params) {
    validate(params);
    return std::make_unique<HeadBeamDrafter>(head, params);
}

}  // namespace spec
