// Drafters that use the engine's phrase pool (Ouroboros): prompt lookup plus pool branches
// ("lookup"), and the draft model drafting phrase by phrase plus pool lengthening ("ouroboros").
#include <algorithm>
#include <string>
#include <vector>

#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/model.h"
#include "spec/phrase_pool.h"
#include "spec/schedule.h"
#include "spec/sampling.h"
#include "spec/tree.h"

namespace spec {
namespace {

// A pool phrase proposed in the last draft: the phrase as stored, how many of its first tokens
// were the lookup key, and the tree node its continuation hangs below.
struct UsedPhrase {
    std::vector<int32_t> phrase;
    int32_t n_key = 1;
    int32_t parent = -1;
};

// What the pool side of both drafters shares: harvesting and crediting.
class PoolUser {
public:
    PoolUser(PhrasePool* pool, const PoolParams& params) : pool_(params.enabled ? pool : nullptr), params_(params) {}

    bool active() const { return pool_ != nullptr; }

    void harvest_prompt(const std::vector<int32_t>& prompt) {
        n_prompt_ = int32_t(prompt.size());
        if (!pool_ || !params_.harvest_prompt) return;
        insert_windows(prompt, 0, PhraseSource::prompt);
    }

    // The output's n-grams, with enough prompt before it that phrases bridge the boundary.
    void harvest_generated(const std::vector<int32_t>& committed) {
        if (!pool_ || !params_.harvest_generated) return;
        insert_windows(committed, std::max(0, n_prompt_ - params_.phrase_len + 1), PhraseSource::generated);
    }

    // Target-confirmed pieces of the rejected part of every root-to-leaf path (Ouroboros §3.3).
    void harvest_verification(int32_t root_token, const std::vector<int32_t>& tokens,
                              const std::vector<int32_t>& parents, const std::vector<int32_t>& target_argmax) {
        if (!pool_ || !params_.harvest_verification || tokens.empty()) return;
        std::vector<bool> has_child(tokens.size(), false);
        for (int32_t p : parents) {
            if (p >= 0) has_child[size_t(p)] = true;
        }
        std::vector<int32_t> path, draft, target;
        for (size_t leaf = 0; leaf < tokens.size(); ++leaf) {
            if (has_child[leaf]) continue;
            path.clear();
            for (int32_t n = int32_t(leaf); n >= 0; n = parents[size_t(n)]) path.push_back(n);
            std::reverse(path.begin(), path.end());
            draft.clear();
            target.assign(1, target_argmax[0]);
            for (int32_t n : path) {
                draft.push_back(tokens[size_t(n)]);
                target.push_back(target_argmax[size_t(n) + 1]);
            }
            const VerificationHarvest harvest = spec::harvest_verification(root_token, draft, target);
            for (const auto& segment : harvest.segments) {
                pool_->insert(segment.data(), int32_t(segment.size()), PhraseSource::verification);
            }
        }
    }

    // Adds up to n_branches pool continuations of `context` below node `parent`. The longest
    // lookup key that finds phrases goes first (more context, better odds).
    void add_branches(const std::vector<int32_t>& context, int32_t parent, int32_t depth_max, int32_t max_nodes,
                      Draft& out) {
        used_.clear();
        if (!pool_ || params_.n_branches <= 0 || depth_max <= 0) return;
        const int32_t n_key_max = std::min<int32_t>(pool_->params().max_key_len, int32_t(context.size()));
        for (int32_t k = n_key_max; k >= 1 && int32_t(used_.size()) < params_.n_branches; --k) {
            pool_->lookup_ngram(context.data() + context.size() - size_t(k), k, params_.n_branches, found_);
            for (const auto& phrase : found_) {
                if (int32_t(used_.size()) >= params_.n_branches || int32_t(out.tokens.size()) >= max_nodes) break;
                bool seen = false;
                for (const auto& u : used_) seen = seen || u.phrase == phrase;
                if (seen) continue;
                const int32_t n = std::min<int32_t>(int32_t(phrase.size()) - k, depth_max);
                out.kinds.resize(out.tokens.size(), kKindUnknown);
                const size_t n_before = out.tokens.size();
                const int32_t deepest = add_chain(out.tokens, out.parents, parent, phrase.data() + k, n, max_nodes);
                // The new nodes are the end of the phrase's placed part; the node at phrase
                // offset c continues a match of k + c tokens (spec/schedule.h, node kinds).
                int32_t n_placed = 0;
                for (int32_t v = deepest; v != parent; v = out.parents[size_t(v)]) ++n_placed;
                const int32_t first = n_placed - int32_t(out.tokens.size() - n_before);
                for (size_t i = n_before; i < out.tokens.size(); ++i) {
                    out.kinds.push_back(kind_pool(k + first + int32_t(i - n_before)));
                }
                used_.push_back({phrase, k, parent});
            }
        }
    }

    // Credits the phrases of the last draft: accepted holds the accepted tokens below the root;
    // a phrase hanging below depth d (d tokens of the path before it) earns the tokens it
    // predicted after them.
    void credit(const std::vector<int32_t>& accepted, const std::vector<int32_t>& depth_of_parent) {
        if (!pool_) return;
        for (size_t i = 0; i < used_.size(); ++i) {
            const UsedPhrase& u = used_[i];
            const int32_t d = depth_of_parent[i];
            int32_t n_match = 0;
            if (d > int32_t(accepted.size())) continue;  // the path never reached it
            {
                while (u.n_key + n_match < int32_t(u.phrase.size()) && d + n_match < int32_t(accepted.size()) &&
                       u.phrase[size_t(u.n_key + n_match)] == accepted[size_t(d + n_match)]) {
                    ++n_match;
                }
            }
            pool_->record_use(u.phrase.data(), int32_t(u.phrase.size()), n_match);
        }
    }

    const std::vector<UsedPhrase>& used() const { return used_; }

private:
    void insert_windows(const std::vector<int32_t>& tokens, int32_t from, PhraseSource source) {
        const int32_t n = params_.phrase_len;
        for (int32_t i = from; i + n <= int32_t(tokens.size()); ++i) pool_->insert(tokens.data() + i, n, source);
    }

    PhrasePool* pool_;
    PoolParams params_;
    int32_t n_prompt_ = 0;
    std::vector<UsedPhrase> used_;
    std::vector<std::vector<int32_t>> found_;
};

// ---- lookup: prompt lookup + pool branches ----------------------------------------------------

class PoolLookupDrafter final : public Drafter {
public:
    PoolLookupDrafter(const LookupParams& lookup, PhrasePool* pool, const PoolParams& params)
        : chain_(make_prompt_lookup_drafter(lookup)), pool_(pool, params) {}

    std::string name() const override { return pool_.active() ? "prompt-lookup+pool" : "prompt-lookup"; }

    void begin(const std::vector<int32_t>& prompt) override {
        chain_->begin(prompt);
        pool_.harvest_prompt(prompt);
    }

    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        chain_->draft(request, chain_draft_);
        last_root_ = request.tokens->back();
        if (!pool_.active()) {
            out.tokens = chain_draft_.tokens;  // a chain: parents stay empty
            out.kinds = chain_draft_.kinds;
            stats_.n_proposed += int64_t(out.tokens.size());
            return;
        }
        const int32_t max_nodes = request.n_nodes_max;  // max(n_draft, pool max_nodes), see the decoder
        add_chain(out.tokens, out.parents, -1, chain_draft_.tokens.data(),
                  std::min<int32_t>(int32_t(chain_draft_.tokens.size()), max_nodes), max_nodes);
        out.kinds.assign(chain_draft_.kinds.begin(), chain_draft_.kinds.begin() + std::ptrdiff_t(out.tokens.size()));
        pool_.add_branches(*request.tokens, -1, request.n_draft_max, max_nodes, out);
        stats_.n_proposed += int64_t(out.tokens.size());
    }

    void accept(const std::vector<int32_t>& committed, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        chain_->accept(committed, n_accepted);
        // Branches hang below the root: their predictions start at the first accepted token.
        const std::vector<int32_t> accepted(committed.end() - 1 - n_accepted, committed.end() - 1);
        pool_.credit(accepted, std::vector<int32_t>(pool_.used().size(), 0));
    }

    void observe_target(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                        const std::vector<int32_t>& target_argmax) override {
        pool_.harvest_verification(last_root_, tokens, parents, target_argmax);
    }

    bool observes_target() const override { return true; }

    void end(const std::vector<int32_t>& committed) override { pool_.harvest_generated(committed); }

    DrafterStats stats() const override { return stats_; }

private:
    std::unique_ptr<Drafter> chain_;
    PoolUser pool_;
    Draft chain_draft_;
    int32_t last_root_ = 0;
    DrafterStats stats_;
};

// ---- ouroboros: draft model phrase by phrase + pool lengthening -------------------------------

class OuroborosDrafter final : public Drafter {
public:
    OuroborosDrafter(Model& model, PhrasePool& pool, const PoolParams& params, int32_t n_draft)
        : model_(model), pool_(&pool, params), pool_ref_(pool), n_draft_(n_draft) {}

    std::string name() const override { return "ouroboros"; }

    void begin(const std::vector<int32_t>& prompt) override {
        stats_.n_model_decodes += model_.prefill_prompt(prompt);
        n_past_ = int32_t(prompt.size()) - 1;
        context_.clear();
        n_committed_at_draft_ = 0;
        pool_.harvest_prompt(prompt);
    }

    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        const std::vector<int32_t>& committed = *request.tokens;
        const int32_t gamma = std::min({n_draft_, request.n_draft_max, model_.n_ctx() - int32_t(committed.size())});
        // context_ = committed + this step's draft. It still starts with the committed tokens
        // known at the last draft (the committed sequence only grows): keep those, append the rest.
        const size_t n_known = std::min(context_.size(), size_t(n_committed_at_draft_));
        context_.resize(n_known);
        context_.insert(context_.end(), committed.begin() + std::ptrdiff_t(n_known), committed.end());
        pending_.assign(committed.begin() + n_past_, committed.end());
        n_committed_at_draft_ = int32_t(committed.size());
        if (request.sampling->greedy()) {
            draft_greedy(gamma, out);
        } else {
            draft_sampled(gamma, *request.sampling, *request.rng, out);
        }
        n_trunk_ = int32_t(out.tokens.size());
        // Lengthening: pool phrases continuing the chain, below its last token.
        if (n_trunk_ > 0) {
            const int32_t max_nodes = std::min(request.n_nodes_max, kMaxTreeNodes);
            out.parents = chain_parents(n_trunk_);
            const size_t n_before = out.tokens.size();
            pool_.add_branches(context_, n_trunk_ - 1, request.n_draft_max - n_trunk_, max_nodes, out);
            if (!out.probs.empty() && out.tokens.size() > n_before) {
                // Pool branches are deterministic: one-hot rows.
                const size_t n_vocab = size_t(model_.n_vocab());
                out.probs.resize(out.tokens.size() * n_vocab, 0.0f);
                for (size_t i = n_before; i < out.tokens.size(); ++i) out.probs[i * n_vocab + size_t(out.tokens[i])] = 1.0f;
            }
        }
        last_root_ = committed.back();
        stats_.n_proposed += int64_t(out.tokens.size());
    }

    void accept(const std::vector<int32_t>& committed, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        // The trunk comes first in the path; the draft's cache holds committed tokens plus the
        // trunk tokens it decoded (all but the last).
        const int32_t n_trunk_accepted = std::min(n_accepted, n_trunk_);
        const int32_t n_valid = std::min(n_past_, n_committed_at_draft_ + n_trunk_accepted);
        model_.kv_remove(0, n_valid, -1);
        n_past_ = n_valid;
        const std::vector<int32_t> accepted(committed.end() - 1 - n_accepted, committed.end() - 1);
        pool_.credit(accepted, std::vector<int32_t>(pool_.used().size(), n_trunk_));
    }

    void observe_target(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                        const std::vector<int32_t>& target_argmax) override {
        pool_.harvest_verification(last_root_, tokens, parents, target_argmax);
    }

    bool observes_target() const override { return true; }

    void end(const std::vector<int32_t>& committed) override { pool_.harvest_generated(committed); }

    DrafterStats stats() const override { return stats_; }

private:
    // Greedy: each draft decode feeds the pending tokens plus a guessed continuation (the best
    // pool phrase for the current context) and keeps the guessed tokens the draft itself would
    // have produced: 1 + (matching guess tokens) draft tokens per decode.
    void draft_greedy(int32_t gamma, Draft& out) {
        const int32_t n_vocab = model_.n_vocab();
        while (int32_t(out.tokens.size()) < gamma) {
            guess(gamma - int32_t(out.tokens.size()) - 1);
            batch_.clear();
            int32_t pos = n_past_;
            for (size_t i = 0; i < pending_.size(); ++i) {
                batch_.push_back({pending_[i], pos++, {}, i + 1 == pending_.size()});
            }
            for (int32_t t : guess_) batch_.push_back({t, pos++, {}, true});
            model_.decode(batch_);
            ++stats_.n_model_decodes;
            int32_t token = argmax(model_.logits(0), n_vocab);
            int32_t n_guess_ok = 0;
            bool stop = push(token, out);
            while (!stop && n_guess_ok < int32_t(guess_.size()) && guess_[size_t(n_guess_ok)] == token &&
                   int32_t(out.tokens.size()) < gamma) {
                ++n_guess_ok;
                token = argmax(model_.logits(n_guess_ok), n_vocab);
                stop = push(token, out);
            }
            // The cache keeps the pending tokens and the confirmed guess tokens; the last drafted
            // token is pending for the next decode.
            n_past_ += int32_t(pending_.size()) + n_guess_ok;
            if (!guess_.empty()) model_.kv_remove(0, n_past_, -1);
            pending_.assign(1, token);
            if (stop) break;
        }
    }

    // Sampled: token by token from the draft's sampling distribution (no guessing), q rows kept.
    void draft_sampled(int32_t gamma, const SamplingParams& sampling, Rng& rng, Draft& out) {
        const int32_t n_vocab = model_.n_vocab();
        for (int32_t i = 0; i < gamma; ++i) {
            model_.decode_seq(pending_.data(), int32_t(pending_.size()), n_past_, false);
            ++stats_.n_model_decodes;
            n_past_ += int32_t(pending_.size());
            compute_probs(model_.logits(0), n_vocab, sampling, probs_row_, scratch_);
            const int32_t token = sample_from(probs_row_.data(), n_vocab, rng);
            out.probs.insert(out.probs.end(), probs_row_.begin(), probs_row_.end());
            const bool stop = push(token, out);
            pending_.assign(1, token);
            if (stop) break;
        }
    }

    // Appends a draft token; true when drafting must stop (end of generation).
    bool push(int32_t token, Draft& out) {
        out.tokens.push_back(token);
        context_.push_back(token);
        return model_.is_eog(token);
    }

    // guess_ = the best pool continuation of context_, at most n_max tokens.
    void guess(int32_t n_max) {
        guess_.clear();
        if (!pool_.active() || n_max <= 0) return;
        const int32_t n_key_max = std::min<int32_t>(pool_ref_.params().max_key_len, int32_t(context_.size()));
        for (int32_t k = n_key_max; k >= 1; --k) {
            if (pool_ref_.lookup_ngram(context_.data() + context_.size() - size_t(k), k, 1, found_) == 0) continue;
            const auto& phrase = found_[0];
            const int32_t n = std::min<int32_t>(int32_t(phrase.size()) - k, n_max);
            guess_.assign(phrase.begin() + k, phrase.begin() + k + n);
            return;
        }
    }

    Model& model_;
    PoolUser pool_;
    PhrasePool& pool_ref_;
    int32_t n_draft_;                  // gamma: longest draft-model chain
    int32_t n_past_ = 0;               // tokens in the draft's KV cache
    int32_t n_committed_at_draft_ = 0;
    int32_t n_trunk_ = 0;              // draft-model tokens at the start of the last draft
    int32_t last_root_ = 0;
    std::vector<int32_t> context_;     // committed + drafted so far
    std::vector<int32_t> pending_, guess_;
    std::vector<BatchToken> batch_;
    std::vector<std::vector<int32_t>> found_;
    std::vector<float> probs_row_;
    std::vector<int32_t> scratch_;
    DrafterStats stats_;
};

}  // namespace

void validate(const PoolParams& params) {
    if (params.n_branches < 0 || params.n_branches > kMaxTreeSeqs - 2) {
        throw InvalidArgumentError("pool n_branches must be in [0, " + std::to_string(kMaxTreeSeqs - 2) + "], got " +
                                   std::to_string(params.n_branches));
    }
    if (params.phrase_len < 2 || params.phrase_len > kPhraseLenLimit) {
        throw InvalidArgumentError("pool phrase_len must be in [2, " + std::to_string(kPhraseLenLimit) + "], got " +
                                   std::to_string(params.phrase_len));
    }
    if (params.max_nodes < 1 || params.max_nodes > kMaxTreeNodes) {
        throw InvalidArgumentError("pool max_nodes must be in [1, " + std::to_string(kMaxTreeNodes) + "], got " +
                                   std::to_string(params.max_nodes));
    }
}

std::unique_ptr<Drafter> make_pool_lookup_drafter(const LookupParams& lookup, PhrasePool* pool,
                                                  const PoolParams& params) {
    validate(params);
    return std::make_unique<PoolLookupDrafter>(lookup, pool, params);
}

std::unique_ptr<Drafter> make_ouroboros_drafter(Model& draft_model, PhrasePool& pool, const PoolParams& params,
                                                int32_t n_draft) {
    validate(params);
    if (n_draft < 1) throw InvalidArgumentError("ouroboros n_draft must be >= 1, got " + std::to_string(n_draft));
    return std::make_unique<OuroborosDrafter>(draft_model, pool, params, n_draft);
}

}  // namespace spec
