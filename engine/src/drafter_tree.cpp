// Draft model, tree proposals: best-first token trees and beam search. Both keep the draft's KV
// cache in step with the target the same way (DraftTreeKv below).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/model.h"
#include "spec/tree.h"

namespace spec {
namespace {

// The draft's KV cache during tree drafting. Sequence 0 holds committed tokens [0, n_past).
// Every decoded node gets a sequence of its own, made by copying its parent's sequence first, so
// it holds the committed tokens, the node's ancestors and the node: a query at the node sees
// exactly that. After verification the accepted path is copied into sequence 0 and every node
// sequence dropped.
class DraftTreeKv {
public:
    explicit DraftTreeKv(Model& model) : model_(model) {}

    struct NewNode {
        int32_t token;
        int32_t parent_seq;  // 0: a child of the root
        int32_t depth;       // 0: a child of the root
    };

    void begin(const std::vector<int32_t>& prompt, DrafterStats& stats) {
        next_seq_ = 1;
        // All but the last prompt token; feed() decodes the rest with the root.
        stats.n_model_decodes += model_.prefill_prompt(prompt);
        n_past_ = int32_t(prompt.size()) - 1;
    }

    // Decodes the committed tokens not yet in sequence 0; the last one is the root. Returns the
    // root's logits row ([n_vocab], valid until the next decode).
    const float* feed(const std::vector<int32_t>& committed, DrafterStats& stats) {
        const int32_t n = int32_t(committed.size()) - n_past_;
        if (n <= 0) throw InvalidArgumentError("draft tree: no new committed token to draft from");
        model_.decode_seq(committed.data() + n_past_, n, n_past_, false);
        ++stats.n_model_decodes;
        n_past_ = int32_t(committed.size());
        return model_.logits(0);
    }

    // Decodes nodes in one batch; returns the sequence given to each. Logits row i of the model
    // belongs to nodes[i].
    std::vector<int32_t> decode(const std::vector<NewNode>& nodes, DrafterStats& stats) {
        std::vector<int32_t> seqs;
        batch_.clear();
        for (const NewNode& node : nodes) {
            if (next_seq_ >= model_.params().n_seq_max) {
                throw InvalidArgumentError("draft tree needs more than n_seq_max=" +
                                           std::to_string(model_.params().n_seq_max) + " sequences");
            }
            const int32_t seq = next_seq_++;
            model_.kv_copy(node.parent_seq, seq);
            seqs.push_back(seq);
            batch_.push_back({node.token, n_past_ + node.depth, {seq}, true});
        }
        model_.decode(batch_);
        ++stats.n_model_decodes;
        return seqs;
    }

    // KV cells not yet in use: each decoded node takes one (sequences share their ancestors' cells).
    int32_t free_cells() const { return model_.n_ctx() - n_past_; }

    // Keeps the first n_path tokens of node sequence `seq` (its path below the root) as committed
    // tokens of sequence 0, and drops every node sequence.
    void keep_path(int32_t seq, int32_t n_path) {
        if (seq > 0 && n_path > 0) {
            model_.kv_copy(seq, 0, n_past_, n_past_ + n_path);
            n_past_ += n_path;
        }
        if (next_seq_ > 1) model_.kv_keep(0);
        next_seq_ = 1;
    }

private:
    Model& model_;
    int32_t n_past_ = 0;  // committed tokens in sequence 0
    int32_t next_seq_ = 1;
    std::vector<BatchToken> batch_;
};

// The distribution the tree drafters rank tokens by: the sampling transform for sampled
// decoding (so candidates are ones the target can emit), plain softmax for greedy.
void draft_distribution(const float* logits, int32_t n_vocab, const SamplingParams& sampling,
                        std::vector<float>& probs, std::vector<int32_t>& scratch) {
    if (sampling.greedy()) {
        softmax(logits, n_vocab, probs);
    } else {
        compute_probs(logits, n_vocab, sampling, probs, scratch);
    }
}

// Common part of the two tree drafters: the KV bookkeeping of the accepted path.
class ModelTreeDrafterBase : public Drafter {
public:
    explicit ModelTreeDrafterBase(Model& model) : model_(model), kv_(model) {}

    void begin(const std::vector<int32_t>& prompt) override {
        kv_.begin(prompt, stats_);
        last_tokens_.clear();
        last_parents_.clear();
        node_seq_.clear();
    }

    void accept(const std::vector<int32_t>& committed, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        // The accepted nodes that were decoded are a prefix of the path (a node is decoded only
        // to grow children); keep them, feed the rest with the next root.
        const std::vector<int32_t> path = accepted_path(last_tokens_, last_parents_, committed, n_accepted);
        int32_t node = path.empty() ? -1 : path.back();
        int32_t depth = n_accepted;
        while (node >= 0 && node_seq_[size_t(node)] == 0) {
            node = last_parents_[size_t(node)];
            --depth;
        }
        kv_.keep_path(node >= 0 ? node_seq_[size_t(node)] : 0, depth);
    }

    DrafterStats stats() const override { return stats_; }

protected:
    Model& model_;
    DraftTreeKv kv_;
    DrafterStats stats_;
    std::vector<int32_t> last_tokens_, last_parents_;  // [n] the last draft
    std::vector<int32_t> node_seq_;                    // [n] KV sequence of each node, 0: not decoded
    std::vector<float> probs_;                         // [n_vocab]
    std::vector<int32_t> scratch_, top_ids_;
    std::vector<float> top_probs_;
};

class ModelTreeDrafter final : public ModelTreeDrafterBase {
public:
    ModelTreeDrafter(Model& model, const TreeParams& params) : ModelTreeDrafterBase(model), params_(params) {}

    std::string name() const override { return "draft-model-tree"; }

    // EAGLE-2's dynamic tree: grow candidates layer by layer (each layer: decode the n_expand
    // best-scoring candidates of the layer in one batch, add their `branching` likeliest tokens
    // as the next layer), then keep the n_nodes best-scoring candidates of all layers. A score is
    // the product of draft probabilities along the path, so a child never outscores its parent
    // and the kept candidates form a tree.
    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        const int32_t n_vocab = model_.n_vocab();
        const int32_t n_nodes_max = std::min(params_.n_nodes, request.n_nodes_max);
        const int32_t depth_max = std::min(params_.depth, request.n_draft_max);
        const float* root_logits = kv_.feed(*request.tokens, stats_);
        node_seq_.clear();
        cands_.clear();
        if (n_nodes_max > 0 && depth_max > 0) {
            push_children(root_logits, n_vocab, -1, 0, 1.0, *request.sampling);
            // Near the end of the window the draft's cache has fewer free cells than a full tree
            // would decode: expand fewer candidates rather than overflow it.
            int32_t free_cells = kv_.free_cells();
            size_t layer_begin = 0;
            std::vector<int32_t> layer;
            std::vector<DraftTreeKv::NewNode> batch;
            for (int32_t depth = 0; depth + 1 < depth_max; ++depth) {
                const size_t layer_end = cands_.size();
                layer.clear();
                for (size_t c = layer_begin; c < layer_end; ++c) {
                    if (!model_.is_eog(cands_[c].token)) layer.push_back(int32_t(c));
                }
                layer_begin = layer_end;
                if (layer.empty()) break;
                std::stable_sort(layer.begin(), layer.end(),
                                 [this](int32_t x, int32_t y) { return cands_[size_t(x)].score > cands_[size_t(y)].score; });
                layer.resize(std::min({layer.size(), size_t(params_.n_expand), size_t(std::max(free_cells, 0))}));
                if (layer.empty()) break;
                free_cells -= int32_t(layer.size());
                batch.clear();
                for (int32_t c : layer) {
                    const Candidate& cand = cands_[size_t(c)];
                    batch.push_back({cand.token, cand.parent < 0 ? 0 : cands_[size_t(cand.parent)].seq, cand.depth});
                }
                const std::vector<int32_t> seqs = kv_.decode(batch, stats_);
                for (size_t i = 0; i < layer.size(); ++i) {
                    Candidate& cand = cands_[size_t(layer[i])];
                    cand.seq = seqs[i];
                    push_children(model_.logits(int32_t(i)), n_vocab, layer[i], depth + 1, cand.score, *request.sampling);
                }
            }
            select(n_nodes_max, out);
        }
        last_tokens_ = out.tokens;
        last_parents_ = out.parents;
        stats_.n_proposed += int64_t(out.tokens.size());
    }

private:
    struct Candidate {
        int32_t token, parent, depth;  // parent: candidate index, -1 for the root
        double score;                  // product of draft probabilities along the path
        int32_t seq = 0;               // draft KV sequence once decoded
    };

    void push_children(const float* logits, int32_t n_vocab, int32_t parent, int32_t depth, double parent_score,
                       const SamplingParams& sampling) {
        draft_distribution(logits, n_vocab, sampling, probs_, scratch_);
        top_k_entries(probs_.data(), n_vocab, params_.branching, top_ids_, top_probs_);
        for (size_t k = 0; k < top_ids_.size(); ++k) {
            if (top_probs_[k] <= 0.0f) break;  // outside the sampling support: the target never emits it
            cands_.push_back({top_ids_[k], parent, depth, parent_score * double(top_probs_[k])});
        }
    }

    // The n best candidates, best first (a parent before its children, siblings likeliest first).
    void select(int32_t n, Draft& out) {
        std::vector<int32_t> parent(cands_.size());
        std::vector<double> score(cands_.size());
        for (size_t c = 0; c < cands_.size(); ++c) {
            parent[c] = cands_[c].parent;
            score[c] = cands_[c].score;
        }
        for (int32_t c : select_tree_nodes(parent, score, n, out.parents)) {
            out.tokens.push_back(cands_[size_t(c)].token);
            node_seq_.push_back(cands_[size_t(c)].seq);
        }
    }

    TreeParams params_;
    std::vector<Candidate> cands_;
};

class ModelBeamDrafter final : public ModelTreeDrafterBase {
public:
    ModelBeamDrafter(Model& model, const BeamParams& params) : ModelTreeDrafterBase(model), params_(params) {}

    std::string name() const override { return "draft-model-beam"; }

    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();
        ++stats_.n_draft_calls;
        const int32_t n_vocab = model_.n_vocab();
        const float* root_logits = kv_.feed(*request.tokens, stats_);
        node_seq_.clear();
        last_tokens_.clear();
        last_parents_.clear();
        // K beams of L tokens within the node budget and the depth the decoder allows, and no
        // more beams than the sampling support has tokens (top_k, top_p, min_p; the vocabulary).
        int32_t n_beams = std::min(params_.n_beams, request.n_nodes_max);
        if (n_beams > 0) {
            top_tokens(root_logits, n_vocab, n_beams, *request.sampling);
            n_beams = std::min(n_beams, int32_t(top_ids_.size()));
        }
        int32_t length = std::min(params_.length, request.n_draft_max);
        if (n_beams > 0 && length > 0) length = std::min(length, request.n_nodes_max / n_beams);
        if (n_beams <= 0 || length <= 0) return;
        const size_t K = size_t(n_beams), L = size_t(length);

        // Beam search. A search node is (token, parent search node); beam b is the path of search
        // nodes beam_nodes[b * L + 0 .. t]; a node's KV sequence is search_seq_ (0: not decoded).
        std::vector<int32_t> beam_tokens(K * L), beam_nodes(K * L);
        search_seq_.clear();
        std::vector<double> beam_score(K);  // summed draft log-probabilities
        for (size_t b = 0; b < K; ++b) {
            beam_nodes[b * L] = new_search_node();
            beam_tokens[b * L] = top_ids_[b];
            beam_score[b] = log_prob(top_probs_[b]);
        }
        struct Extension {
            double score;
            size_t beam;
            int32_t token;
        };
        std::vector<Extension> ext;
        std::vector<DraftTreeKv::NewNode> batch;
        std::vector<int32_t> next_tokens(K * L), next_nodes(K * L);
        size_t n_built = 1;  // beam length reached so far
        for (size_t t = 1; t < L; ++t) {
            batch.clear();
            for (size_t b = 0; b < K; ++b) {
                const int32_t parent_node = t >= 2 ? beam_nodes[b * L + t - 2] : -1;
                batch.push_back({beam_tokens[b * L + t - 1], parent_node < 0 ? 0 : search_seq_[size_t(parent_node)],
                                 int32_t(t - 1)});
            }
            const std::vector<int32_t> seqs = kv_.decode(batch, stats_);
            ext.clear();
            for (size_t b = 0; b < K; ++b) {
                search_seq_[size_t(beam_nodes[b * L + t - 1])] = seqs[b];
                top_tokens(model_.logits(int32_t(b)), n_vocab, n_beams, *request.sampling);
                for (size_t k = 0; k < top_ids_.size(); ++k) {
                    ext.push_back({beam_score[b] + log_prob(top_probs_[k]), b, top_ids_[k]});
                }
            }
            if (ext.size() < K) break;
            // The K best extensions over all beams (ties: the earlier beam, then the likelier token).
            std::stable_sort(ext.begin(), ext.end(), [](const Extension& x, const Extension& y) { return x.score > y.score; });
            for (size_t b = 0; b < K; ++b) {
                const Extension& e = ext[b];
                std::copy_n(beam_tokens.begin() + long(e.beam * L), t, next_tokens.begin() + long(b * L));
                std::copy_n(beam_nodes.begin() + long(e.beam * L), t, next_nodes.begin() + long(b * L));
                next_tokens[b * L + t] = e.token;
                next_nodes[b * L + t] = new_search_node();
                beam_score[b] = e.score;
            }
            beam_tokens.swap(next_tokens);
            beam_nodes.swap(next_nodes);
            n_built = t + 1;
        }
        if (n_built < L) {
            // The search stopped early: keep the length every beam reached.
            for (size_t b = 0; b < K; ++b) {
                for (size_t j = 0; j < n_built; ++j) {
                    beam_tokens[b * n_built + j] = beam_tokens[b * L + j];
                    beam_nodes[b * n_built + j] = beam_nodes[b * L + j];
                }
            }
            beam_tokens.resize(K * n_built);
            beam_nodes.resize(K * n_built);
            length = int32_t(n_built);
        }

        const BeamTree tree = beams_to_tree(beam_tokens, n_beams, length);
        out.tokens = tree.tokens;
        out.parents = tree.parents;
        out.n_candidate_tokens = n_beams * length;
        node_seq_.assign(tree.tokens.size(), 0);
        for (size_t i = 0; i < beam_tokens.size(); ++i) {
            node_seq_[size_t(tree.node_of[i])] = search_seq_[size_t(beam_nodes[i])];
        }
        last_tokens_ = out.tokens;
        last_parents_ = out.parents;
        stats_.n_proposed += int64_t(out.tokens.size());
    }

private:
    int32_t new_search_node() {
        search_seq_.push_back(0);
        return int32_t(search_seq_.size()) - 1;
    }

    // The k likeliest tokens of the ranking distribution with their probabilities, dropping tokens
    // outside the sampling support.
    void top_tokens(const float* logits, int32_t n_vocab, int32_t k, const SamplingParams& sampling) {
        draft_distribution(logits, n_vocab, sampling, probs_, scratch_);
        top_k_entries(probs_.data(), n_vocab, k, top_ids_, top_probs_);
        while (!top_probs_.empty() && top_probs_.back() <= 0.0f) {
            top_ids_.pop_back();
            top_probs_.pop_back();
        }
    }

    static double log_prob(float p) { return std::log(double(p)); }

    BeamParams params_;
    std::vector<int32_t> search_seq_;  // [n_search_nodes] KV sequence of each, 0: not decoded
};

}  // namespace

void validate(const TreeParams& params) {
    if (params.n_nodes < 1 || params.n_nodes > kMaxTreeNodes) {
        throw InvalidArgumentError("tree n_nodes must be in [1, " + std::to_string(kMaxTreeNodes) + "], got " +
                                   std::to_string(params.n_nodes));
    }
    if (params.depth < 1) throw InvalidArgumentError("tree depth must be >= 1, got " + std::to_string(params.depth));
    if (params.branching < 1) {
        throw InvalidArgumentError("tree branching must be >= 1, got " + std::to_string(params.branching));
    }
    if (params.n_expand < 1) throw InvalidArgumentError("tree n_expand must be >= 1, got " + std::to_string(params.n_expand));
    // Every decoded candidate holds a KV sequence of the draft model.
    if (int64_t(params.depth - 1) * params.n_expand > kMaxTreeNodes) {
        throw InvalidArgumentError("tree (depth - 1) * n_expand must be <= " + std::to_string(kMaxTreeNodes) + ", got (" +
                                   std::to_string(params.depth) + " - 1) * " + std::to_string(params.n_expand));
    }
}

void validate(const BeamParams& params) {
    if (params.n_beams < 1) throw InvalidArgumentError("beam n_beams must be >= 1, got " + std::to_string(params.n_beams));
    if (params.length < 1) throw InvalidArgumentError("beam length must be >= 1, got " + std::to_string(params.length));
    // Beams x (length - 1) nodes are decoded, one KV sequence each; K x L nodes are verified.
    if (int64_t(params.n_beams) * params.length > kMaxTreeNodes) {
        throw InvalidArgumentError("beam n_beams * length must be <= " + std::to_string(kMaxTreeNodes) + ", got " +
                                   std::to_string(params.n_beams) + " * " + std::to_string(params.length));
    }
}

std::unique_ptr<Drafter> make_model_tree_drafter(Model& draft_model, const TreeParams& params) {
    validate(params);
    return std::make_unique<ModelTreeDrafter>(draft_model, params);
}

std::unique_ptr<Drafter> make_model_beam_drafter(Model& draft_model, const BeamParams& params) {
    validate(params);
    return std::make_unique<ModelBeamDrafter>(draft_model, params);
}

}  // namespace spec
