// Draft model, chain proposals. The draft's KV cache holds a prefix of the committed sequence
// plus the draft tokens it decoded last step; accept() trims it back to what the target kept.
#include <algorithm>
#include <vector>

#include "spec/drafter.h"
#include "spec/model.h"
#include "spec/schedule.h"

namespace spec {
namespace {

class ModelChainDrafter final : public Drafter {
public:
    explicit ModelChainDrafter(Model& model) : model_(model) {}

    std::string name() const override { return "draft-model-chain"; }

    void begin(const std::vector<int32_t>& prompt) override {
        // All but the last prompt token; draft() feeds the rest with its first decode.
        stats_.n_model_decodes += model_.prefill_prompt(prompt);
        n_past_ = int32_t(prompt.size()) - 1;
        n_drafted_last_ = 0;
    }

    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        const std::vector<int32_t>& tokens = *request.tokens;
        const SamplingParams& sampling = *request.sampling;
        const int32_t n_vocab = model_.n_vocab();
        const int32_t n_ctx = model_.n_ctx();

        // Feed committed tokens the draft has not seen yet: usually the last one or two; after a
        // stretch without drafting (method auto) possibly many, caught up in n_batch chunks.
        const int32_t n_batch = model_.params().n_batch;
        int32_t pos = n_past_;
        while (int32_t(tokens.size()) - pos > n_batch) {
            model_.decode_seq(tokens.data() + pos, n_batch, pos, false);
            ++stats_.n_model_decodes;
            pos += n_batch;
        }
        pending_.assign(tokens.begin() + pos, tokens.end());
        const int32_t n_max = std::min(request.n_draft_max, n_ctx - int32_t(tokens.size()));
        for (int32_t i = 0; i < n_max; ++i) {
            model_.decode_seq(pending_.data(), int32_t(pending_.size()), pos, false);
            ++stats_.n_model_decodes;
            pos += int32_t(pending_.size());
            const float* logits = model_.logits(0);
            int32_t token;
            float confidence;  // the draft's probability of its token: the scheduler's node kind
            if (sampling.greedy()) {
                token = argmax(logits, n_vocab);
                confidence = token_probability(logits, n_vocab, token);
            } else {
                compute_probs(logits, n_vocab, sampling, probs_row_, scratch_);
                token = sample_from(probs_row_.data(), n_vocab, *request.rng);
                confidence = probs_row_[size_t(token)];
                out.probs.insert(out.probs.end(), probs_row_.begin(), probs_row_.end());
            }
            out.tokens.push_back(token);
            out.kinds.push_back(kind_model(confidence));
            if (model_.is_eog(token)) break;  // nothing useful follows an end of generation
            pending_.assign(1, token);
        }
        n_past_ = pos;  // committed tokens + all draft tokens but the last are in the KV cache
        n_committed_at_draft_ = int32_t(tokens.size());
        n_drafted_last_ = int32_t(out.tokens.size());
        stats_.n_proposed += n_drafted_last_;
    }

    void accept(const std::vector<int32_t>& /*committed*/, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        // Valid KV: the committed prefix plus the accepted draft tokens that were decoded.
        const int32_t n_valid = std::min(n_past_, n_committed_at_draft_ + n_accepted);
        model_.kv_remove(0, n_valid, -1);
        n_past_ = n_valid;
    }

    DrafterStats stats() const override { return stats_; }

private:
    Model& model_;
    int32_t n_past_ = 0;               // tokens in the draft's KV cache (positions 0..n_past-1)
    int32_t n_committed_at_draft_ = 0;
    int32_t n_drafted_last_ = 0;
    std::vector<int32_t> pending_;
    std::vector<float> probs_row_;     // [n_vocab]
    std::vector<int32_t> scratch_;
    DrafterStats stats_;
};

}  // namespace

std::unique_ptr<Drafter> make_model_chain_drafter(Model& draft_model) {
    return std::make_unique<ModelChainDrafter>(draft_model);
}

}  // namespace spec
