// Chain verification: greedy, and exact rejection sampling over probability rows.
#include "spec/verify.h"

#include <algorithm>
#include <string>

#include "spec/error.h"
#include "spec/sampling.h"

namespace spec {

namespace {

void check_token(int32_t token, int32_t n_vocab, size_t position) {
    if (token < 0 || token >= n_vocab) {
        throw InvalidArgumentError("draft token " + std::to_string(position) + " is " +
                                   std::to_string(token) + ", outside the vocabulary [0, " +
                                   std::to_string(n_vocab) + ")");
    }
}

}  // namespace

ChainVerdict verify_chain_greedy(const std::vector<int32_t>& draft_tokens,
                                 const std::vector<int32_t>& target_argmax) {
    if (target_argmax.size() != draft_tokens.size() + 1) {
        throw InvalidArgumentError("verify_chain_greedy: need n_draft + 1 = " +
                                   std::to_string(draft_tokens.size() + 1) +
                                   " target tokens, got " + std::to_string(target_argmax.size()));
    }
    ChainVerdict verdict;
    const int32_t n_draft = int32_t(draft_tokens.size());
    while (verdict.n_accepted < n_draft &&
           draft_tokens[verdict.n_accepted] == target_argmax[verdict.n_accepted]) {
        ++verdict.n_accepted;
    }
    verdict.next_token = target_argmax[verdict.n_accepted];
    verdict.is_bonus = verdict.n_accepted == n_draft;
    return verdict;
}

ChainVerdict verify_chain_rejection(const std::vector<int32_t>& draft_tokens,
                                    const float* target_probs, const float* draft_probs,
                                    int32_t n_vocab, Rng& rng, std::vector<float>& residual) {
    if (n_vocab <= 0) {
        throw InvalidArgumentError("verify_chain_rejection: n_vocab must be > 0, got " +
                                   std::to_string(n_vocab));
    }
    const size_t row_size = size_t(n_vocab);
    ChainVerdict verdict;
    for (size_t i = 0; i < draft_tokens.size(); ++i) {
        const int32_t token = draft_tokens[i];
        check_token(token, n_vocab, i);
        const float* p = target_probs + i * row_size;
        const float* q = draft_probs + i * row_size;

        // Accept with probability min(1, p/q), as u * q < p to avoid the division. A token q
        // never proposes (q == 0) cannot really have been drawn; accept it iff the target allows
        // it at all.
        const double u = rng.uniform();
        const bool accept = q[token] > 0.0f ? u * q[token] < p[token] : p[token] > 0.0f;
        if (accept) {
            ++verdict.n_accepted;
            continue;
        }

        // Recovered token from norm(max(0, p - q)): the mass p has where q over-proposed less.
        residual.resize(row_size);
        double residual_mass = 0.0;
        for (size_t j = 0; j < row_size; ++j) {
            residual[j] = std::max(0.0f, p[j] - q[j]);
            residual_mass += residual[j];
        }
        // A rejection with p == q (only possible through rounding, or a q == 0 draft token)
        // leaves nothing in the residual; p itself is then the right distribution.
        verdict.next_token = residual_mass > 0.0 ? sample_from(residual.data(), n_vocab, rng)
                                                 : sample_from(p, n_vocab, rng);
        return verdict;
    }
    verdict.is_bonus = true;
    verdict.next_token = sample_from(target_probs + draft_tokens.size() * row_size, n_vocab, rng);
    return verdict;
}

}  // namespace spec
