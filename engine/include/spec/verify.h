// Verification of drafts against the target: pure functions over probability rows, no model.
//
// Names follow the usual convention: `accepted` draft tokens are kept; at the first rejection a
// `recovered` token is drawn from the residual distribution; when every draft token is accepted a
// `bonus` token is drawn from the target's next row. Either way one target token is added, so a
// step always makes progress.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "spec/rng.h"

namespace spec {

struct Draft;

struct ChainVerdict {
    int32_t n_accepted = 0;    // number of draft tokens accepted, 0..n_draft
    int32_t next_token = -1;   // recovered token (on rejection) or bonus token (full acceptance)
    bool is_bonus = false;     // true when all draft tokens were accepted
};

// The chain functions are the tree functions on a chain (parents[i] = i - 1).

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

// ---- Trees ----------------------------------------------------------------------------------
//
// A tree draft (spec/tree.h): tokens [n], parents [n]. Target rows are indexed like the batch:
// row 0 is the root (the last committed token), row i + 1 is node i, so row r is the target's
// distribution for the token that follows the path to r.

struct TreeVerdict {
    std::vector<int32_t> path;  // accepted nodes, root to deepest; n_accepted = path.size()
    int32_t next_token = -1;    // recovered token (at a rejection) or bonus token (at a leaf)
    bool is_bonus = false;      // true when the deepest accepted node has no children
};

// Greedy: from the root, descend into the child whose token is the target's argmax at the
// current node (siblings never repeat a token in a useful tree; the first match wins), until
// none matches; next_token is the argmax there.
// target_argmax: [n + 1]
TreeVerdict verify_tree_greedy(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                               const std::vector<int32_t>& target_argmax);
// The same walk with the target's token of a row computed on demand: target_token(row) is called
// only for the rows the walk reads (the root and each accepted node), each at most once.
TreeVerdict verify_tree_greedy(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                               const std::function<int32_t(int32_t row)>& target_token);

// Exact multi-candidate rejection sampling (SpecInfer's multi-step rule, generalised to
// per-candidate proposals). At the current node, with target distribution p, try the children
// c_1, c_2, ... in order; child c_k's token x_k was drawn from q_k (its draft_probs row; q_k may
// depend on the earlier siblings, e.g. drawn without replacement; one-hot for a deterministic
// candidate). Accept x_k with probability min(1, p(x_k) / q_k(x_k)) and descend into c_k with
// the target's row of c_k; on a rejection set p <- norm(max(0, p - q_k)) and try the next child.
// When every child is rejected, the recovered token is drawn from the last p; at a leaf, the
// bonus token is drawn from the leaf's row.
//
// Why the output is distributed exactly as p: one trial is the chain rule. For any y,
//   P(output y) = P(x_k = y, accepted) + P(rejected) * P(later output y | rejected)
//              = min(p(y), q_k(y)) + (1 - sum_z min(p(z), q_k(z))) * r(y),
// with r = norm(max(0, p - q_k)) (its normaliser is exactly that rejection probability) if, given
// the rejection of x_k, the rest outputs y with probability r(y). Since min(p, q) + max(0, p - q)
// = p, the sum is p(y). "The rest" is the same procedure started with target r and the next
// children, so by induction on the number of children left (the base case, no child, draws from
// the current target directly) every trial outputs its current target distribution. The later
// proposal q_{k+1} may depend on x_k, because the argument holds for each value of x_k
// separately and r does not depend on x_k. An accepted child x is then distributed as p
// restricted to the event of acceptance, and the next token below it comes from the target's
// row of that child, the conditional p(. | path, x): by the chain rule the whole accepted path
// plus the final token is a draw from the target. A one-hot candidate (deterministic proposal)
// is accepted with probability p(x), and on rejection x leaves the residual entirely. A candidate
// whose row gives it q(x) = 0 cannot have been drawn from that row; it is verified as a one-hot
// candidate, which is exact whatever chose it.
//
// When every candidate is deterministic (draft_probs nullptr) the trials at a node collapse into
// one draw: trying one-hot children c_1, c_2, ... in turn outputs c_k with probability p(x_k)
// (accept x_1 with p(x_1); else x_2 with p(x_2) / (1 - p(x_1)), and so on) and otherwise a token
// from p restricted to the other tokens, which is exactly "draw t from p; descend into the child
// whose token is t, or stop with t". That is how it is computed: one uniform per output token
// (sample_from), whatever the draft. So with deterministic drafts (prompt lookup, pool phrases,
// top-k trees, beams) the output for a given random stream does not depend on what was drafted:
// it is token for token what plain decoding (method none) samples from the same seed, up to the
// batch-size numerics of the target's rows.
// target_probs: [n + 1, n_vocab] row-major float32 (row 0: root, row i + 1: node i)
// draft_probs:  [n, n_vocab] (row i: the distribution token i was drawn from), or nullptr when
//               every candidate is deterministic (q one-hot at its token)
// residual: scratch buffer, resized to n_vocab
TreeVerdict verify_tree_rejection(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                  const float* target_probs, const float* draft_probs, int32_t n_vocab,
                                  Rng& rng, std::vector<float>& residual);

// The target's probability row r ([n_vocab] float32, row 0: root, row i + 1: node i), valid until
// the verification returns. The row-accessor forms below ask only for the rows on the path they
// walk (the root, each accepted node), so a caller that computes probabilities on first use pays
// for those rows alone instead of all n + 1.
using TargetRowFn = std::function<const float*(int32_t row)>;
TreeVerdict verify_tree_rejection(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                  const TargetRowFn& target_row, const float* draft_probs, int32_t n_vocab,
                                  Rng& rng, std::vector<float>& residual);

// Typical acceptance (Medusa): at the current node with target distribution p, accept the first
// child whose token has p(x) > min(epsilon, delta * exp(-H(p))); when none qualifies, or at a
// leaf, the next token is drawn from p. LOSSY: the output is not distributed as the target's
// (it favours candidates the drafter proposed); opt-in only, for sampling at temperature > 0.
// target_probs: [n + 1, n_vocab]
TreeVerdict verify_tree_typical(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                const float* target_probs, int32_t n_vocab, float epsilon, float delta,
                                Rng& rng);
TreeVerdict verify_tree_typical(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                const TargetRowFn& target_row, int32_t n_vocab, float epsilon, float delta,
                                Rng& rng);

// Checks that a drafter's output fits what verification reads: parents empty (a chain) or one per
// token, kinds empty or one per token, probs empty (deterministic) or [n_tokens, n_vocab], every
// token in [0, n_vocab). Throws InvalidArgumentError naming the mismatch: a drafter bug caught
// before verification reads past a buffer. The tree's shape is checked by the verify functions.
void check_draft(const Draft& draft, int32_t n_vocab);

}  // namespace spec
