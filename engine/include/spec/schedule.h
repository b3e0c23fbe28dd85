// The auto scheduler's parts (method "auto"): what a decode of k tokens costs on this machine
// (a measured cost curve), how often each kind of draft node is accepted (running statistics),
// and the planner that keeps the part of a draft that maximises expected tokens per second,
// possibly nothing (plain decoding). Pure code, no model; the decoder and the auto drafter use it.
//
// Expected tokens of a step that verifies the node set S of a draft tree: 1 (the token the target
// always adds) + sum over nodes v in S of P(v), where P(v) = P(parent) * a(v) is the probability
// that the whole path to v is accepted and a(v) the estimated acceptance of v given its parent.
// (At most one child of a node is accepted, so the accepted path has exactly as many nodes as
// accepted events, and the sum is its expected length.) Siblings compete for the same target
// token, so a later sibling gets at most the probability its earlier siblings leave.
// Its cost: the time already spent drafting + the target's time to decode |S| + 1 tokens.
#pragma once

#include <array>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spec {

class CostModel;  // spec/cost_model.h

// Time of one decode call as a function of the tokens in it, measured at a few sizes.
struct CostCurve {
    std::vector<int32_t> n_tokens;  // strictly increasing, starting at 1
    std::vector<double> ms;         // [same] milliseconds of one decode of that many tokens

    bool empty() const { return n_tokens.empty(); }
    // Linear interpolation between measured sizes; past the last one, the last segment's slope
    // (never decreasing). k <= 1 gives the one-token cost.
    double at(int32_t k) const;
};

// Throws InvalidArgumentError unless n_tokens starts at 1, increases strictly, has as many
// entries as ms, and every time is finite and > 0.
void validate(const CostCurve& curve);

// The measured times made non-decreasing in k (a running maximum): a noisy machine can time a
// bigger batch faster, but the planner must not believe that more tokens are cheaper.
CostCurve monotone(CostCurve curve);

// Node kinds: what produced a draft node, the key of the acceptance statistics. Drafters fill
// Draft::kinds with these (0 when they do not).
//
// Context-match nodes (prompt lookup, pool phrases) are keyed by their effective match length:
// the number of tokens right before the node that agree with the earlier text the proposal was
// copied from, counting the proposal's own nodes above it (a node at depth d below a match of L
// tokens has L + d). The longer a copy has run, the likelier it goes on: that one number carries
// what the depth of the node and the length of the key tell, and lets the planner draft long
// exactly where a long copy is under way. Lengths are grouped into kMatchBuckets buckets
// (1, 2, ..., 8, 9-10, 11-12, 13-16, 17-24, 25-32, 33-48, 49-64, 65 and more).
constexpr uint8_t kKindUnknown = 0;
constexpr int32_t kMatchBuckets = 16;
constexpr int32_t kMaxMatchLen = 65;      // match lengths are measured up to this
uint8_t kind_lookup(int32_t match_len);   // prompt / output lookup: 1..16
uint8_t kind_pool(int32_t match_len);     // phrase-pool phrase: 17..32
uint8_t kind_model(float probability);    // draft model, by the draft's probability decile: 33..42
// The last token of a prompt-lookup continuation that stops at a stop token
// (LookupParams::stop_tokens): the end of a quoted text, where a copy usually turns away (the
// closing fence of a pasted code block). Its own kind keeps that turn from counting against the
// long matches that lead to it. 43.
uint8_t kind_lookup_end();
// A prompt-lookup continuation copied from the request's own output (not its prompt) after a
// match shorter than kLongOutputMatch tokens: keyed by that root match length and by depth, not
// by the effective length. Copies of the prompt go on the longer they have run (a quoted text);
// short matches inside the output mostly do not, however deep (measured on the HumanEval, edit,
// MT-Bench and GSM8K outputs, benchmarks/match_continuation.py: after a 3-4-token match in the
// output the next token follows with P 0.57-0.73 at depths 0-4, after one in the prompt with P
// 0.8 rising to 0.98). 44..59.
constexpr int32_t kLongOutputMatch = 17;
uint8_t kind_lookup_output(int32_t root_match_len);
// A prompt-lookup node where the copied key's earlier occurrences disagree: another occurrence
// whose continuation agreed with the draft up to this node went on with a different token here,
// so the node is a guess between them (a module of similar functions repeats short keys with
// different continuations). One kind whatever its match length: measured on the HumanEval, edit
// and longedit outputs (benchmarks/match_ambiguity.py), such nodes are accepted with P 0.05-0.13
// where uncontested nodes of the same match lengths are accepted with P 0.77-0.99. 60.
uint8_t kind_lookup_contested();
// A draft head's node (spec/draft_head.h), keyed by depth: what method auto expects of a head
// chain. Its prior (kHeadPrior) is optimistic, as the draft model's, so that a head is tried
// where the costs let it pay at all, and dropped once its real acceptance shows it does not. 61.
uint8_t kind_head();
constexpr double kHeadPrior = 0.8;
// A node of the static n-gram table (spec/ngram_table.h), by its confidence count / (total + 1):
// buckets from 0.3 in steps of 0.1 up to 0.9, then 0.9-0.95 and 0.95 and above. Not keyed by
// depth: each node's confidence is already its own given the nodes above it. 62..69.
uint8_t kind_corpus(double confidence);
constexpr double kCorpusMinConfidence = 0.3;  // the corpus drafter proposes no node below this
// A prompt-lookup node whose token ends a blank line where the copied text goes on at its left
// margin (LookupParams::blank_line_tokens followed by one of unit_start_tokens): the end of a
// top-level unit of the source, a function or a paragraph. An answer that rewrites one function
// of a long file copies it to that point and then turns away (closes its code block), while one
// that rewrites a whole short file copies on: the same long match either way, so these nodes get
// kinds of their own, keyed by the effective match length like kind_lookup, and the statistics
// learn which the stream is. 70..85.
uint8_t kind_lookup_boundary(int32_t match_len);
// A prompt-lookup node that a learned substitution put in place of the copied text
// (LookupParams::substitutions): where a copy broke earlier in the request the output replaced a
// stretch of the source with other tokens and then went on copying (a renamed identifier,
// `true` written `True`), and a later copy of the same stretch proposes the replacement. One kind;
// the statistics learn how often the output repeats its replacements. 86.
uint8_t kind_lookup_substituted();
// The nodes of a copy resumed after a break (LookupParams::resync): a long copy broke a few
// tokens ago, the output has not copied again yet, and its last token is the source's token a few
// positions after the break (the end of a replaced stretch: `unique(` written `unique_sorted(`,
// `(s):` written `(s: str):`); the proposal goes on with the source from there. One kind, keyed
// by depth: a one-token key is a weak guess, and the statistics learn how often it holds and how
// far such a copy then goes. 87.
uint8_t kind_lookup_resync();
// A substituted node whose replacement was learnt after another token than the one before the
// copied stretch here (LookupParams::substitutions): a renamed identifier met again in another
// context, where prose may keep the old word. One kind. 88.
uint8_t kind_lookup_substituted_loose();
// The first nodes of a prompt copy whose short key holds an opening code fence, its tag and a
// token more (LookupParams::fence_tokens): the output opened a code block where the prompt has
// one, and may be writing the prompt's code out again. One kind, keyed by depth; prior 0.9. 89.
uint8_t kind_lookup_fence();
// The first nodes of the prompt's last closed code block, proposed from its opening fence before the
// answer's first token (LookupParams::fence_tokens). One kind, keyed by depth; prior 0.5. 90.
uint8_t kind_lookup_answer_start();
// A node of a head tree (method eagle, auto's head trees) that is not its parent's likeliest
// child under the head: keyed by depth, prior 0.2 (the head's top choices are kind_head). 91.
uint8_t kind_head_alternative();
bool is_model_kind(uint8_t kind);
// A readable name of a node kind for reports: "lookup m4" (prompt lookup, match bucket from 4),
// "pool m2", "lookup-output m3", "lookup-end", "contested", "model p0.7" (decile from 0.7),
// "head", "head-alternative", "corpus c0.9" (confidence bucket from 0.9), "lookup-boundary m17", "lookup-substituted", "lookup-resync",
// "lookup-substituted-loose", "lookup-fence", "lookup-answer-start",
// "unknown".
std::string kind_name(uint8_t kind);
// Whether a node's acceptance is also keyed by its depth (draft-model and unknown nodes);
// context-match kinds carry their depth in the match length already.
bool kind_has_depth(uint8_t kind);
constexpr int32_t kNumKinds = 96;         // room for more drafters' kinds
constexpr int32_t kKindDepths = 8;        // depths 0..6 apart, 7 and deeper together

// Running acceptance statistics per (kind, depth): a Beta-like estimate with a prior mean per
// kind (context matches m / (m + 2) for the bucket's shortest match length m, prompt-lookup
// copies of 17 or more tokens m^2 / (m^2 + 4) up to 0.99, as measured (benchmarks/copy_priors.py);
// draft model the middle of its decile) worth kPriorWeight observations; counts are halved once
// a cell has seen kHalfLife tries, so the estimates follow a changing stream (a prompt that
// starts copying, a reloaded draft). Each event should be recorded once (ProposalScorer).
class AcceptanceStats {
public:
    static constexpr double kPriorWeight = 2.0;
    static constexpr double kHalfLife = 64.0;

    AcceptanceStats();
    // P(node accepted | its parent accepted), in (0, 1).
    double estimate(uint8_t kind, int32_t depth) const;
    void record(uint8_t kind, int32_t depth, bool accepted);
    // Records how a draft tree fared against the tokens that actually followed its root
    // (actual[0] the target's token after the root, actual[1] after that, ...): walking down
    // the tree along `actual`, every child of the root and of each matched node was tried, and
    // it was accepted iff its token is the actual one. For a verified draft, actual is the
    // accepted path plus the target's next token. For a proposal that was never verified it is
    // what got committed later: with greedy decoding exactly what verification would have
    // accepted; with sampling, a deterministic (one-hot) proposal x is accepted with
    // probability p(x), the probability that the committed token is x, so the record is
    // unbiased either way. Nodes deeper than n_actual are not recorded.
    // tokens/parents/kinds: [n] (parents empty: a chain; kinds empty: unknown); actual: [n_actual]
    void record_outcome(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                        const std::vector<uint8_t>& kinds, const int32_t* actual, int32_t n_actual);
    // Acceptance of draft-model nodes over all deciles and depths: what a chain the draft model
    // has not drafted yet can expect per token. Its prior is optimistic (kModelPrior), so that
    // a draft model is tried where the cost curves let it pay at all, and dropped once its real
    // acceptance shows it does not.
    static constexpr double kModelPrior = 0.8;
    double model_acceptance() const;
    void clear();

    // One request's evidence about its own stream. The counts above span requests, so an engine
    // that served code and then gets a chat question plans with what code taught it: copies of
    // short matches go on nearly always in code and mostly do not in chat, and each match
    // length is a cell of its own that unlearns alone, a few tries per request (replayed on the
    // recorded Zen 4 outputs, benchmarks/auto_streams.py: MT-Bench and GSM8K requests right after
    // the HumanEval suite at 0.83x and 0.74x of a fresh engine's modelled speed). So within a
    // request two accounts of the stream compete: the counts of every request so far, and the
    // priors alone (a fresh engine's view); both take in the request's own outcomes. Each
    // outcome of a node kind with measured priors (context matches and the corpus; not the draft
    // model's or the head's optimistic ones) adds to the log-odds that the earlier requests'
    // counts describe this stream, and estimate() is the two estimates mixed by those odds,
    // starting from kHistoryPrior. In one stream the history keeps winning and nothing changes;
    // after a change of stream the request is planned as a fresh engine would plan it within a
    // few outcomes. begin_request starts a request's evidence afresh, end_request ends it;
    // outside a request estimate() is the counts alone.
    static constexpr double kHistoryPrior = 0.9;
    void begin_request();
    void end_request();
    // P(the earlier requests' counts describe this request's stream), 1 outside a request.
    double history_weight() const;

    // The counts, to keep them across processes (Engine::acceptance_counts): hits, then tries,
    // of every (kind, depth) cell, kind-major, then the draft model's hits and tries.
    static constexpr size_t kCountsSize = size_t(2 * kNumKinds * kKindDepths + 2);
    std::vector<double> counts() const;
    // Replaces the counts (outside a request) with what counts() gave; throws
    // InvalidArgumentError naming the first bad value (another size, not finite, negative, more
    // hits than tries) and leaves the statistics unchanged.
    void set_counts(const std::vector<double>& counts);
    // Forgets the draft model's counts (its kinds at every depth and its totals), keeping the
    // rest: statistics learnt with another draft model.
    void clear_model();

private:
    double hits_[kNumKinds][kKindDepths];
    double tries_[kNumKinds][kKindDepths];
    double model_hits_ = 0, model_tries_ = 0;
    // The request's own outcomes, and the log-odds of the history against the priors.
    bool in_request_ = false;
    double request_hits_[kNumKinds][kKindDepths] = {};
    double request_tries_[kNumKinds][kKindDepths] = {};
    double history_log_odds_ = 0.0;
};

// Scores draft proposals that were not (or not wholly) verified against the tokens committed
// after them, for the acceptance statistics: node by node as each token is committed (a node is
// tried when its parent was accepted, and accepted when its token is the committed one, as
// AcceptanceStats::record_outcome walks a verified draft), dropping a proposal once it has missed
// or run out of nodes. Proposals of consecutive steps that copy the same text predict the same
// tokens with the same kind (a context match's kind is its effective match length), so each
// committed position is scored at most once per kind and outcome: counted once per overlapping
// proposal, a copy's one turn weighed as up to max_depth rejections at once against the
// statistics' half-life. Kinds keyed by depth as well (kind_has_depth) are scored every time: the
// same position at another depth is another cell.
class ProposalScorer {
public:
    explicit ProposalScorer(AcceptanceStats& stats) : stats_(stats) {}
    // Forgets pending proposals and scored positions (a new request).
    void clear();
    // A proposal whose depth-0 nodes predict committed[position]. parents empty: a chain.
    void add(int32_t position, const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
             const std::vector<uint8_t>& kinds);
    // Scores every node the committed tokens now settle.
    void score(const std::vector<int32_t>& committed);
    size_t n_pending() const { return pending_.size(); }

private:
    struct Pending {
        int32_t position;
        std::vector<int32_t> tokens, parents;
        std::vector<uint8_t> kinds;
        int32_t node = -1;  // the deepest node that matched the committed tokens so far (-1: the root)
        int32_t depth = 0;  // committed tokens compared with so far
    };
    AcceptanceStats& stats_;
    std::vector<Pending> pending_;
    // [position] kinds already scored there: [0] accepted, [1] rejected (one bit per kind).
    std::vector<std::array<std::bitset<kNumKinds>, 2>> scored_;
};

// The nodes of a draft worth verifying.
struct DraftPlan {
    std::vector<int32_t> keep;     // kept node indices, increasing (parents before children)
    double expected_tokens = 1.0;  // 1 + sum of P over kept nodes
    double ms = 0.0;               // sunk drafting time + a target step of keep.size() + 1 tokens
    double tokens_per_ms() const { return ms > 0 ? expected_tokens / ms : 0.0; }
};

// P(path to node i accepted) for each node of a draft: the product of the acceptance estimates
// along its path, siblings sharing their parent's probability mass. parents empty: a chain.
std::vector<double> path_probabilities(const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                                       const AcceptanceStats& stats);

// A probe of the cost model (method auto, spec/cost_model.h): the nodes whose path is accepted
// with P >= min_prob (prefix-closed, since P only falls along a path), when their step size
// (1 + nodes) has been timed fewer than min_observed times; empty otherwise. The cost model
// corrects only the sizes it sees decoded, and the planner never drafts a size it believes
// too dear, so a calibration taken on a busy machine would otherwise keep auto from drafting
// for good; a probe of likely nodes mostly pays for itself in accepted tokens.
std::vector<int32_t> plan_probe(const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                                const AcceptanceStats& stats, const CostModel& costs, double min_prob,
                                int64_t min_observed);

// The prefix-closed node set with the best expected tokens per ms (the empty set, plain
// decoding, included). Nodes are taken in decreasing P(v) order, which keeps parents before
// children since a(v) < 1. parents empty: a chain. kinds empty: all unknown.
// step_ms: [>= n + 2] step_ms[k] is the time of a target step of k tokens (CostModel::table);
// entry 0 is unused.
DraftPlan plan_draft(const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                     const AcceptanceStats& stats, const std::vector<double>& step_ms, double sunk_ms);

// A draft-model chain not yet drafted: the length gamma in [0, gamma_max] with the best expected
// tokens per ms when each token is accepted with probability alpha, drafting costs
// draft_token_ms per token and verification step_ms[gamma + 1] (step_ms: [>= gamma_max + 2], as
// for plan_draft). gamma 0 is plain decoding.
struct ChainPlan {
    int32_t gamma = 0;
    double expected_tokens = 1.0;
    double ms = 0.0;
    double tokens_per_ms() const { return ms > 0 ? expected_tokens / ms : 0.0; }
};
// fixed_ms: paid once by any chain (gamma >= 1), not by plain decoding: what the draft must do
// before its first draft token, such as reading the committed tokens its cache lacks. A longer
// chain spreads it over more expected tokens, so it takes part in choosing gamma.
ChainPlan plan_chain(double alpha, const std::vector<double>& step_ms, double draft_token_ms, int32_t gamma_max,
                     double fixed_ms = 0.0);
// The same with an acceptance per depth: alpha[g - 1] is the probability that the chain's g-th
// token is accepted when the ones before it were (alpha: [>= gamma_max]).
ChainPlan plan_chain(const std::vector<double>& alpha, const std::vector<double>& step_ms, double draft_token_ms,
                     int32_t gamma_max, double fixed_ms = 0.0);

// Keeps only the nodes `keep` (increasing, prefix-closed) of a tree given by tokens / parents /
// kinds / probs rows (each may be empty where the draft has none; parents empty: a chain, which
// stays a chain). n_vocab: the row length of probs.
void keep_nodes(const std::vector<int32_t>& keep, int32_t n_vocab, std::vector<int32_t>& tokens,
                std::vector<int32_t>& parents, std::vector<uint8_t>& kinds, std::vector<float>& probs);

}  // namespace spec
