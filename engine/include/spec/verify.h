// Verification of drafts against the target: pure functions over probability rows, no model.
//
// Names follow the usual convention: `accepted` draft tokens are kept; at the first rejection a
// `recovered` token is drawn from the residual distribution; when every draft token is accepted a
// `bonus` token is drawn from the target's next row. Either way one target token is added, so a
// step always makes progress.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/rng.h"

namespace spec {

struct ChainVerdict {
    int32_t n_accepted = 0;    // number of draft tokens accepted, 0..n_draft
    int32_t next_token = -1;   // recovered token (on rejection) or bonus token (full acceptance)
    bool is_bonus = false;     // true when all draft tokens were accepted
};

// Greedy chain: accept draft[i] while it equals target_argmax[i]; next_token is
// target_argmax[n_accepted].
// draft_tokens: [n_draft], target_argmax: [n_draft + 1]
ChainVerdict verify_chain_greedy(const std::vector<int32_t>& draft_tokens,
                                 const std::vector<int32_t>& target_argmax);

// Exact chain rejection sampling (Leviathan et al. / Chen et al.). For i = 0..n_draft-1 accept
// x = draft[i] with probability min(1, p_i(x) / q_i(x)); on the first rejection draw the recovered
// token from norm(max(0, p_i - q_i)); if all are accepted draw the bonus token from p_n. The
// output token sequence is distributed exactly as sampling from p step by step, provided q_i is
// the distribution draft[i] was really drawn from and p_i, q_i went through the same transforms.
// draft_tokens: [n_draft]
// target_probs: [n_draft + 1, n_vocab] row-major float32 (row i: target distribution at step i)
// draft_probs:  [n_draft, n_vocab] row-major float32 (row i: distribution draft[i] was drawn from)
// residual: scratch buffer, resized to n_vocab
ChainVerdict verify_chain_rejection(const std::vector<int32_t>& draft_tokens,
                                    const float* target_probs, const float* draft_probs,
                                    int32_t n_vocab, Rng& rng, std::vector<float>& residual);

}  // namespace spec
