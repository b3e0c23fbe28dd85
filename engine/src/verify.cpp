// Verification of chains and trees: greedy, exact rejection sampling, typical acceptance.
#include "spec/verify.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/sampling.h"
#include "spec/tree.h"

namespace spec {

namespace {

void check_token(int32_t token, int32_t n_vocab, size_t position) {
    if (token < 0 || token >= n_vocab) {
        throw InvalidArgumentError("draft token " + std::to_string(position) + " is " +
                                   std::to_string(token) + ", outside the vocabulary [0, " +
                                   std::to_string(n_vocab) + ")");
    }
}

// children[r]: nodes whose parent is row r - 1 (r = 0: the root), in proposal order.
std::vector<std::vector<int32_t>> children_by_row(const std::vector<int32_t>& parents) {
    std::vector<std::vector<int32_t>> children(parents.size() + 1);
    for (size_t i = 0; i < parents.size(); ++i) children[size_t(parents[i] + 1)].push_back(int32_t(i));
    return children;
}

void check_tree_args(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents, int32_t n_vocab,
                     const char* who) {
    if (tokens.size() != parents.size()) {
        throw InvalidArgumentError(std::string(who) + ": " + std::to_string(tokens.size()) + " tokens but " +
                                   std::to_string(parents.size()) + " parents");
    }
    if (n_vocab <= 0) throw InvalidArgumentError(std::string(who) + ": n_vocab must be > 0, got " + std::to_string(n_vocab));
    validate_tree(parents);
    for (size_t i = 0; i < tokens.size(); ++i) check_token(tokens[i], n_vocab, i);
}

// From the root, descends into the child whose token is token_at(row) (the first match), until
// none matches; next_token is that row's token. Greedy verification (token_at: the argmax) and
// verification of deterministic candidates (token_at: one draw from the row) are both this walk.
template <typename TokenAt>
TreeVerdict walk_matching(const std::vector<int32_t>& tokens, const std::vector<std::vector<int32_t>>& children,
                          TokenAt token_at) {
    TreeVerdict verdict;
    size_t row = 0;
    for (;;) {
        const int32_t want = token_at(row);
        int32_t next = -1;
        for (int32_t c : children[row]) {
            if (tokens[size_t(c)] == want) {
                next = c;
                break;
            }
        }
        if (next < 0) {
            verdict.next_token = want;
            verdict.is_bonus = children[row].empty();
            return verdict;
        }
        verdict.path.push_back(next);
        row = size_t(next) + 1;
    }
}

ChainVerdict to_chain(const TreeVerdict& verdict) {
    return {int32_t(verdict.path.size()), verdict.next_token, verdict.is_bonus};
}

}  // namespace

TreeVerdict verify_tree_greedy(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                               const std::vector<int32_t>& target_argmax) {
    if (target_argmax.size() != tokens.size() + 1) {
        throw InvalidArgumentError("verify_tree_greedy: need n + 1 = " + std::to_string(tokens.size() + 1) +
                                   " target tokens, got " + std::to_string(target_argmax.size()));
    }
    if (tokens.size() != parents.size()) {
        throw InvalidArgumentError("verify_tree_greedy: " + std::to_string(tokens.size()) + " tokens but " +
                                   std::to_string(parents.size()) + " parents");
    }
    validate_tree(parents);
    return walk_matching(tokens, children_by_row(parents), [&](size_t row) { return target_argmax[row]; });
}

TreeVerdict verify_tree_greedy(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                               const std::function<int32_t(int32_t row)>& target_token) {
    if (tokens.size() != parents.size()) {
        throw InvalidArgumentError("verify_tree_greedy: " + std::to_string(tokens.size()) + " tokens but " +
                                   std::to_string(parents.size()) + " parents");
    }
    validate_tree(parents);
    return walk_matching(tokens, children_by_row(parents), [&](size_t row) { return target_token(int32_t(row)); });
}

TreeVerdict verify_tree_rejection(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                  const float* target_probs, const float* draft_probs, int32_t n_vocab,
                                  Rng& rng, std::vector<float>& residual) {
    const size_t row_size = size_t(std::max(n_vocab, 0));
    return verify_tree_rejection(tokens, parents, [&](int32_t row) { return target_probs + size_t(row) * row_size; },
                                 draft_probs, n_vocab, rng, residual);
}

TreeVerdict verify_tree_rejection(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                  const TargetRowFn& target_row, const float* draft_probs, int32_t n_vocab,
                                  Rng& rng, std::vector<float>& residual) {
    check_tree_args(tokens, parents, n_vocab, "verify_tree_rejection");
    const auto children = children_by_row(parents);
    const size_t row_size = size_t(n_vocab);
    if (!draft_probs) {
        // Deterministic candidates: one draw per row, matched against the children (see header).
        return walk_matching(tokens, children,
                             [&](size_t row) { return sample_from(target_row(int32_t(row)), n_vocab, rng); });
    }
    TreeVerdict verdict;
    size_t row = 0;
    for (;;) {
        const float* p = target_row(int32_t(row));  // the current target: row, then residuals
        bool residual_in_use = false;
        int32_t next = -1;
        for (int32_t c : children[row]) {
            const int32_t x = tokens[size_t(c)];
            const float* q = draft_probs + size_t(c) * row_size;
            const float q_x = q[x];
            // A candidate its own row gives no probability (q(x) = 0, or NaN) was not drawn from
            // that row, so the row says nothing about how it was chosen. Verify it as a
            // deterministic candidate (one-hot q): accepted with probability p(x), and on
            // rejection x leaves the residual. That is exact however x was chosen.
            const bool one_hot = !(q_x > 0.0f);
            // Accept with probability min(1, p/q), as u * q < p to avoid the division.
            const double u = rng.uniform();
            const bool accept = one_hot ? u < p[x] : u * q_x < p[x];
            if (accept) {
                next = c;
                break;
            }
            // p <- norm(max(0, p - q)), q one-hot at x for a deterministic candidate.
            double mass = 0.0;
            if (one_hot) {
                for (size_t j = 0; j < row_size; ++j) mass += j == size_t(x) ? 0.0f : p[j];
            } else {
                for (size_t j = 0; j < row_size; ++j) mass += std::max(0.0f, p[j] - q[j]);
            }
            // A rejection that leaves nothing (only through rounding): p itself is then the
            // right distribution; keep it.
            if (mass <= 0.0) continue;
            if (!residual_in_use) {
                residual.assign(p, p + row_size);
                p = residual.data();
                residual_in_use = true;
            }
            const float inv = float(1.0 / mass);
            if (one_hot) {
                residual[size_t(x)] = 0.0f;
                for (size_t j = 0; j < row_size; ++j) residual[j] *= inv;
            } else {
                for (size_t j = 0; j < row_size; ++j) residual[j] = std::max(0.0f, residual[j] - q[j]) * inv;
            }
        }
        if (next < 0) {
            verdict.is_bonus = children[row].empty();
            verdict.next_token = sample_from(p, n_vocab, rng);
            return verdict;
        }
        verdict.path.push_back(next);
        row = size_t(next) + 1;
    }
}

TreeVerdict verify_tree_typical(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                const float* target_probs, int32_t n_vocab, float epsilon, float delta,
                                Rng& rng) {
    const size_t row_size = size_t(std::max(n_vocab, 0));
    return verify_tree_typical(tokens, parents, [&](int32_t row) { return target_probs + size_t(row) * row_size; },
                               n_vocab, epsilon, delta, rng);
}

TreeVerdict verify_tree_typical(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                const TargetRowFn& target_row, int32_t n_vocab, float epsilon, float delta,
                                Rng& rng) {
    check_tree_args(tokens, parents, n_vocab, "verify_tree_typical");
    const auto children = children_by_row(parents);
    const size_t row_size = size_t(n_vocab);
    TreeVerdict verdict;
    size_t row = 0;
    for (;;) {
        const float* p = target_row(int32_t(row));
        double entropy = 0.0;
        for (size_t j = 0; j < row_size; ++j) {
            if (p[j] > 0.0f) entropy -= double(p[j]) * std::log(double(p[j]));
        }
        const double threshold = std::min(double(epsilon), double(delta) * std::exp(-entropy));
        int32_t next = -1;
        for (int32_t c : children[row]) {
            if (double(p[size_t(tokens[size_t(c)])]) > threshold) {
                next = c;
                break;
            }
        }
        if (next < 0) {
            verdict.is_bonus = children[row].empty();
            verdict.next_token = sample_from(p, n_vocab, rng);
            return verdict;
        }
        verdict.path.push_back(next);
        row = size_t(next) + 1;
    }
}

ChainVerdict verify_chain_greedy(const std::vector<int32_t>& draft_tokens,
                                 const std::vector<int32_t>& target_argmax) {
    if (target_argmax.size() != draft_tokens.size() + 1) {
        throw InvalidArgumentError("verify_chain_greedy: need n_draft + 1 = " +
                                   std::to_string(draft_tokens.size() + 1) +
                                   " target tokens, got " + std::to_string(target_argmax.size()));
    }
    return to_chain(verify_tree_greedy(draft_tokens, chain_parents(int32_t(draft_tokens.size())), target_argmax));
}

ChainVerdict verify_chain_rejection(const std::vector<int32_t>& draft_tokens,
                                    const float* target_probs, const float* draft_probs,
                                    int32_t n_vocab, Rng& rng, std::vector<float>& residual) {
    if (n_vocab <= 0) {
        throw InvalidArgumentError("verify_chain_rejection: n_vocab must be > 0, got " +
                                   std::to_string(n_vocab));
    }
    return to_chain(verify_tree_rejection(draft_tokens, chain_parents(int32_t(draft_tokens.size())),
                                          target_probs, draft_probs, n_vocab, rng, residual));
}

void check_draft(const Draft& draft, int32_t n_vocab) {
    const size_t n = draft.tokens.size();
    const auto fail = [&](const std::string& what) {
        throw InvalidArgumentError("malformed draft of " + std::to_string(n) + " tokens: " + what);
    };
    if (!draft.parents.empty() && draft.parents.size() != n) {
        fail(std::to_string(draft.parents.size()) + " parents");
    }
    if (!draft.kinds.empty() && draft.kinds.size() != n) fail(std::to_string(draft.kinds.size()) + " node kinds");
    if (n_vocab <= 0) fail("n_vocab must be > 0, got " + std::to_string(n_vocab));
    if (!draft.probs.empty() && draft.probs.size() != n * size_t(n_vocab)) {
        fail(std::to_string(draft.probs.size()) + " probability values, expected " + std::to_string(n) + " rows of " +
             std::to_string(n_vocab));
    }
    for (size_t i = 0; i < n; ++i) check_token(draft.tokens[i], n_vocab, i);
}

}  // namespace spec
