#include "spec/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "spec/cost_model.h"
#include "spec/error.h"

namespace spec {

double CostCurve::at(int32_t k) const {
    if (n_tokens.empty()) return 0.0;
    if (k <= n_tokens.front()) return ms.front();
    const size_t n = n_tokens.size();
    if (n == 1) return ms.front() * k;  // a single point: assume linear
    size_t i = 1;
    while (i + 1 < n && n_tokens[i] < k) ++i;
    // Segment [i - 1, i]; past the end it is the last segment, extended.
    const double x0 = n_tokens[i - 1], x1 = n_tokens[i];
    const double slope = std::max(0.0, (ms[i] - ms[i - 1]) / (x1 - x0));
    return ms[i - 1] + slope * (k - x0);
}

void validate(const CostCurve& curve) {
    if (curve.n_tokens.empty()) throw InvalidArgumentError("cost curve is empty");
    if (curve.n_tokens.size() != curve.ms.size()) {
        throw InvalidArgumentError("cost curve has " + std::to_string(curve.n_tokens.size()) + " sizes but " +
                                   std::to_string(curve.ms.size()) + " times");
    }
    if (curve.n_tokens.front() != 1) throw InvalidArgumentError("cost curve must start at 1 token");
    for (size_t i = 0; i < curve.n_tokens.size(); ++i) {
        if (i > 0 && curve.n_tokens[i] <= curve.n_tokens[i - 1]) {
            throw InvalidArgumentError("cost curve sizes must increase strictly");
        }
        if (!std::isfinite(curve.ms[i]) || curve.ms[i] <= 0.0) {
            throw InvalidArgumentError("cost curve time for " + std::to_string(curve.n_tokens[i]) +
                                       " tokens must be finite and > 0");
        }
    }
}

CostCurve monotone(CostCurve curve) {
    for (size_t i = 1; i < curve.ms.size(); ++i) curve.ms[i] = std::max(curve.ms[i], curve.ms[i - 1]);
    return curve;
}

namespace {

// Shortest match length of each bucket; bucket i holds [kBucketStart[i], kBucketStart[i + 1]).
constexpr int32_t kBucketStart[kMatchBuckets] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 17, 25, 33, 49, 65};

int32_t match_bucket(int32_t match_len) {
    int32_t b = 0;
    while (b + 1 < kMatchBuckets && kBucketStart[b + 1] <= match_len) ++b;
    return b;
}

constexpr int32_t kFirstLookup = 1, kFirstPool = kFirstLookup + kMatchBuckets;
constexpr int32_t kFirstModel = kFirstPool + kMatchBuckets, kModelKinds = 10;
constexpr int32_t kLookupEnd = kFirstModel + kModelKinds;
constexpr int32_t kFirstLookupOutput = kLookupEnd + 1;
constexpr int32_t kLookupContested = kFirstLookupOutput + kMatchBuckets;
static_assert(kLookupContested < kNumKinds, "node kinds must fit kNumKinds");
// Prior mean of a contested node (kind_lookup_contested): a guess between continuations, about
// the middle of the measured 0.05-0.13 and well below any uncontested copy.
constexpr double kContestedPrior = 0.1;
constexpr int32_t kHead = kLookupContested + 1;
// Prompt-lookup nodes that continue a match of kLongCopy or more tokens: a copy of a text that
// has run that long. Measured over the recorded greedy outputs of HumanEval, edit, longedit,
// MT-Bench and GSM8K (benchmarks/copy_priors.py: each output position once, uncontested copies
// of the prompt), such a node
// is accepted with P 0.988-0.999 in every length bucket from 17 (4,600 positions), against
// m / (m + 2) = 0.89-0.97, the prior of the shorter matches. On this CPU's cost curve drafting
// 64 tokens pays over drafting 3 only above about 0.97, so with the old prior a request's first
// long copy went by in 3-token steps until the statistics had learnt it. Their prior is
// m^2 / (m^2 + 4) (0.986 for the 17-24 bucket), at most kLongCopyPriorMax.
constexpr int32_t kLongCopy = 17;
constexpr double kLongCopyPriorMax = 0.99;
// Corpus nodes (kind_corpus) by confidence bucket, kCorpusBucketStart[i] the lowest of bucket i.
constexpr int32_t kFirstCorpus = kHead + 1, kCorpusKinds = 8;
constexpr double kCorpusBucketStart[kCorpusKinds] = {0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95};
// Their prior means, below the confidence itself since the corpus was not written by the target:
// about the lowest rate each bucket's predictions matched the target's greedy token at on the
// recorded MT-Bench, GSM8K and HumanEval outputs with a table of ShareGPT answers
// (benchmarks/corpus_priors.py: 0.18-0.27, 0.21-0.35, 0.21-0.35, 0.36-0.67, 0.50-0.58,
// 0.57-0.84, 0.80-0.97, 0.79-1.00 by bucket); the running statistics take over from there.
constexpr double kCorpusPrior[kCorpusKinds] = {0.2, 0.25, 0.3, 0.4, 0.45, 0.55, 0.7, 0.85};
static_assert(kFirstCorpus + kCorpusKinds <= kNumKinds, "node kinds must fit kNumKinds");
// Boundary nodes (kind_lookup_boundary) by match bucket. Their prior: an even guess. On the
// recorded greedy outputs (benchmarks/copy_priors.py over the Zen 4 bench runs, each output
// position once, uncontested prompt copies) the answers copied such a node at 15 of 21 positions
// in edit and in HumanEval, and at none of 14 in longedit (none of the 10 after 17 or more
// copied tokens): which it is depends on the stream, so the statistics decide.
constexpr int32_t kFirstBoundary = kFirstCorpus + kCorpusKinds;
constexpr double kBoundaryPrior = 0.5;
static_assert(kFirstBoundary + kMatchBuckets <= kNumKinds, "node kinds must fit kNumKinds");
// Substituted nodes (kind_lookup_substituted): a replacement the request's output made once,
// applied to a later copy. Their prior: a little better than even; the statistics decide.
constexpr int32_t kLookupSubstituted = kFirstBoundary + kMatchBuckets;
constexpr double kSubstitutedPrior = 0.6;
static_assert(kLookupSubstituted < kNumKinds, "node kinds must fit kNumKinds");
// Resynced nodes (kind_lookup_resync): a guess on a one-token key, an even prior at every depth;
// the statistics decide.
constexpr int32_t kLookupResync = kLookupSubstituted + 1;
constexpr double kResyncPrior = 0.5;
static_assert(kLookupResync < kNumKinds, "node kinds must fit kNumKinds");
// Loosely substituted nodes (kind_lookup_substituted_loose): a replacement applied after another
// token than where it was learnt. An even prior; the statistics decide.
constexpr int32_t kLookupSubstitutedLoose = kLookupResync + 1;
constexpr double kSubstitutedLoosePrior = 0.5;
static_assert(kLookupSubstitutedLoose < kNumKinds, "node kinds must fit kNumKinds");
// Fence nodes (kind_lookup_fence): 0.9 at every depth, as an answer that opened a code block where
// the prompt has one mostly writes the block out (HumanEval, edit); the statistics learn a stream
// whose answers do not. Answer-start nodes (kind_lookup_answer_start): an even prior, as a first
// step drafted with confidence is lost where an answer writes lines of its own first (imports).
// Both chosen on the replays (docs/results-speed.md, "Code fences").
constexpr int32_t kLookupFence = kLookupSubstitutedLoose + 1;
constexpr double kFencePrior = 0.9;
static_assert(kLookupFence < kNumKinds, "node kinds must fit kNumKinds");
constexpr int32_t kLookupAnswerStart = kLookupFence + 1;
constexpr double kAnswerStartPrior = 0.5;
static_assert(kLookupAnswerStart < kNumKinds, "node kinds must fit kNumKinds");
static_assert(kHead < kNumKinds, "node kinds must fit kNumKinds");
// A head tree's other children (kind_head_alternative): the head's second and later choices. A
// low prior, as a head's top choice is accepted far more often than its others; the statistics
// decide (they are the head's own, apart from the other drafters').
constexpr int32_t kHeadAlternative = kLookupAnswerStart + 1;
constexpr double kHeadAlternativePrior = 0.2;
static_assert(kHeadAlternative < kNumKinds, "node kinds must fit kNumKinds");

bool is_corpus_kind(int32_t kind) { return kind >= kFirstCorpus && kind < kFirstCorpus + kCorpusKinds; }

bool is_lookup_output_kind(int32_t kind) {
    return kind >= kFirstLookupOutput && kind < kFirstLookupOutput + kMatchBuckets;
}

bool is_boundary_kind(int32_t kind) { return kind >= kFirstBoundary && kind < kFirstBoundary + kMatchBuckets; }

// The history's log-odds stay within this, so that a long request in one stream can still turn.
constexpr double kMaxLogOdds = 8.0;

double prior_mean(int32_t kind) {
    if (kind == kLookupContested) return kContestedPrior;
    if (is_model_kind(uint8_t(kind))) return (kind - kFirstModel + 0.5) / kModelKinds;
    if (kind == kHead) return kHeadPrior;
    if (kind == kHeadAlternative) return kHeadAlternativePrior;
    if (is_corpus_kind(kind)) return kCorpusPrior[kind - kFirstCorpus];
    if (is_boundary_kind(kind)) return kBoundaryPrior;
    if (kind == kLookupSubstituted) return kSubstitutedPrior;
    if (kind == kLookupResync) return kResyncPrior;
    if (kind == kLookupSubstitutedLoose) return kSubstitutedLoosePrior;
    if (kind == kLookupFence) return kFencePrior;
    if (kind == kLookupAnswerStart) return kAnswerStartPrior;
    if (kind >= kFirstLookup && kind < kFirstPool && kBucketStart[kind - kFirstLookup] >= kLongCopy) {
        const double m = kBucketStart[kind - kFirstLookup];
        return std::min(kLongCopyPriorMax, m * m / (m * m + 4.0));
    }
    if (kind >= kFirstLookup && kind < kFirstModel) {
        const double m = kBucketStart[(kind - kFirstLookup) % kMatchBuckets];
        return m / (m + 2.0);
    }
    if (is_lookup_output_kind(kind)) {
        const double m = kBucketStart[kind - kFirstLookupOutput];
        return m / (m + 2.0);
    }
    return 0.5;
}

int32_t depth_cell(int32_t kind, int32_t depth) {
    return kind_has_depth(uint8_t(kind)) ? std::clamp(depth, 0, kKindDepths - 1) : 0;
}

// Whether a kind's prior is a measured acceptance rate (context matches, the corpus), so that
// outcomes against it tell a fresh stream from the history; the draft model's and the head's
// are optimistic on purpose.
bool measured_prior(int32_t kind) {
    return kind != kKindUnknown && !is_model_kind(uint8_t(kind)) && kind != kHead && kind != kHeadAlternative;
}

}  // namespace

uint8_t kind_lookup(int32_t match_len) { return uint8_t(kFirstLookup + match_bucket(match_len)); }
uint8_t kind_pool(int32_t match_len) { return uint8_t(kFirstPool + match_bucket(match_len)); }
uint8_t kind_model(float probability) {
    const int32_t decile = std::clamp(int32_t(probability * kModelKinds), 0, kModelKinds - 1);
    return uint8_t(kFirstModel + decile);
}
uint8_t kind_lookup_end() { return uint8_t(kLookupEnd); }
uint8_t kind_lookup_contested() { return uint8_t(kLookupContested); }
uint8_t kind_lookup_output(int32_t root_match_len) {
    return uint8_t(kFirstLookupOutput + match_bucket(root_match_len));
}
uint8_t kind_head() { return uint8_t(kHead); }
uint8_t kind_head_alternative() { return uint8_t(kHeadAlternative); }
uint8_t kind_lookup_boundary(int32_t match_len) { return uint8_t(kFirstBoundary + match_bucket(match_len)); }
uint8_t kind_lookup_substituted() { return uint8_t(kLookupSubstituted); }
uint8_t kind_lookup_resync() { return uint8_t(kLookupResync); }
uint8_t kind_lookup_substituted_loose() { return uint8_t(kLookupSubstitutedLoose); }
uint8_t kind_lookup_fence() { return uint8_t(kLookupFence); }
uint8_t kind_lookup_answer_start() { return uint8_t(kLookupAnswerStart); }
uint8_t kind_corpus(double confidence) {
    int32_t b = 0;
    while (b + 1 < kCorpusKinds && kCorpusBucketStart[b + 1] <= confidence) ++b;
    return uint8_t(kFirstCorpus + b);
}
bool is_model_kind(uint8_t kind) { return kind >= kFirstModel && kind < kFirstModel + kModelKinds; }
std::string kind_name(uint8_t kind) {
    const auto bucket = [](int32_t b) { return " m" + std::to_string(kBucketStart[b]); };
    if (kind >= kFirstLookup && kind < kFirstPool) return "lookup" + bucket(kind - kFirstLookup);
    if (kind >= kFirstPool && kind < kFirstModel) return "pool" + bucket(kind - kFirstPool);
    if (is_model_kind(kind)) return "model p0." + std::to_string(kind - kFirstModel);
    if (kind == kLookupEnd) return "lookup-end";
    if (is_lookup_output_kind(kind)) return "lookup-output" + bucket(kind - kFirstLookupOutput);
    if (kind == kLookupContested) return "contested";
    if (kind == kHead) return "head";
    if (kind == kHeadAlternative) return "head-alternative";
    if (is_boundary_kind(kind)) return "lookup-boundary" + bucket(kind - kFirstBoundary);
    if (kind == kLookupSubstituted) return "lookup-substituted";
    if (kind == kLookupResync) return "lookup-resync";
    if (kind == kLookupSubstitutedLoose) return "lookup-substituted-loose";
    if (kind == kLookupFence) return "lookup-fence";
    if (kind == kLookupAnswerStart) return "lookup-answer-start";
    if (is_corpus_kind(kind)) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "corpus c%.2g", kCorpusBucketStart[kind - kFirstCorpus]);
        return buf;
    }
    return "unknown";
}
bool kind_has_depth(uint8_t kind) {
    return kind < kFirstLookup || is_model_kind(kind) || is_lookup_output_kind(kind) || kind == kHead ||
           kind == kHeadAlternative || kind == kLookupResync || kind == kLookupFence || kind == kLookupAnswerStart;
}

AcceptanceStats::AcceptanceStats() { clear(); }

void AcceptanceStats::clear() {
    for (int32_t k = 0; k < kNumKinds; ++k) {
        for (int32_t d = 0; d < kKindDepths; ++d) hits_[k][d] = tries_[k][d] = 0.0;
    }
    model_hits_ = model_tries_ = 0.0;
    in_request_ = false;
}

void AcceptanceStats::begin_request() {
    for (int32_t k = 0; k < kNumKinds; ++k) {
        for (int32_t d = 0; d < kKindDepths; ++d) request_hits_[k][d] = request_tries_[k][d] = 0.0;
    }
    history_log_odds_ = std::log(kHistoryPrior / (1.0 - kHistoryPrior));
    in_request_ = true;
}

void AcceptanceStats::end_request() { in_request_ = false; }

std::vector<double> AcceptanceStats::counts() const {
    std::vector<double> out;
    out.reserve(kCountsSize);
    for (const auto* table : {&hits_, &tries_}) {
        for (int32_t k = 0; k < kNumKinds; ++k) out.insert(out.end(), (*table)[k], (*table)[k] + kKindDepths);
    }
    out.push_back(model_hits_);
    out.push_back(model_tries_);
    return out;
}

void AcceptanceStats::set_counts(const std::vector<double>& counts) {
    if (counts.size() != kCountsSize) {
        throw InvalidArgumentError("acceptance counts: expected " + std::to_string(kCountsSize) + " values, got " +
                                   std::to_string(counts.size()));
    }
    const size_t n_cells = size_t(kNumKinds * kKindDepths);
    for (size_t i = 0; i < counts.size(); ++i) {
        if (!std::isfinite(counts[i]) || counts[i] < 0.0) {
            throw InvalidArgumentError("acceptance counts: value " + std::to_string(i) + " is " +
                                       std::to_string(counts[i]) + ", not a finite count >= 0");
        }
    }
    const auto more_hits = [](double hits, double tries) { return hits > tries * (1.0 + 1e-9) + 1e-9; };
    for (size_t i = 0; i < n_cells; ++i) {
        if (more_hits(counts[i], counts[n_cells + i])) {
            throw InvalidArgumentError("acceptance counts: cell " + std::to_string(i) + " has more hits than tries");
        }
    }
    if (more_hits(counts[2 * n_cells], counts[2 * n_cells + 1])) {
        throw InvalidArgumentError("acceptance counts: the draft model has more hits than tries");
    }
    for (int32_t k = 0; k < kNumKinds; ++k) {
        for (int32_t d = 0; d < kKindDepths; ++d) {
            hits_[k][d] = counts[size_t(k * kKindDepths + d)];
            tries_[k][d] = counts[n_cells + size_t(k * kKindDepths + d)];
        }
    }
    model_hits_ = counts[2 * n_cells];
    model_tries_ = counts[2 * n_cells + 1];
    in_request_ = false;
}

void AcceptanceStats::clear_model() {
    for (int32_t k = 0; k < kNumKinds; ++k) {
        if (!is_model_kind(uint8_t(k))) continue;
        for (int32_t d = 0; d < kKindDepths; ++d) hits_[k][d] = tries_[k][d] = 0.0;
    }
    model_hits_ = model_tries_ = 0.0;
}

double AcceptanceStats::history_weight() const {
    return in_request_ ? 1.0 / (1.0 + std::exp(-history_log_odds_)) : 1.0;
}

namespace {
// A kind's estimate from hits and tries, pulled towards its prior mean: every request's counts
// (the history) or the request's own (the priors alone plus this request's outcomes).
double smoothed(double hits, double tries, int32_t kind) {
    return (hits + AcceptanceStats::kPriorWeight * prior_mean(kind)) / (tries + AcceptanceStats::kPriorWeight);
}
}  // namespace

double AcceptanceStats::estimate(uint8_t kind, int32_t depth) const {
    const int32_t k = kind < kNumKinds ? kind : 0;
    const int32_t d = depth_cell(k, depth);
    const double history = smoothed(hits_[k][d], tries_[k][d], k);
    if (!in_request_ || !measured_prior(k)) return history;
    const double fresh = smoothed(request_hits_[k][d], request_tries_[k][d], k);
    const double w = history_weight();
    return w * history + (1.0 - w) * fresh;
}

void AcceptanceStats::record(uint8_t kind, int32_t depth, bool accepted) {
    const int32_t k = kind < kNumKinds ? kind : 0;
    const int32_t d = depth_cell(k, depth);
    if (in_request_ && measured_prior(k)) {
        // How each account predicted this outcome, before taking it in.
        const double history = smoothed(hits_[k][d], tries_[k][d], k);
        const double fresh = smoothed(request_hits_[k][d], request_tries_[k][d], k);
        history_log_odds_ += accepted ? std::log(history / fresh) : std::log((1.0 - history) / (1.0 - fresh));
        history_log_odds_ = std::clamp(history_log_odds_, -kMaxLogOdds, kMaxLogOdds);
        request_hits_[k][d] += accepted ? 1.0 : 0.0;
        request_tries_[k][d] += 1.0;
    }
    hits_[k][d] += accepted ? 1.0 : 0.0;
    tries_[k][d] += 1.0;
    if (tries_[k][d] >= kHalfLife) {
        hits_[k][d] *= 0.5;
        tries_[k][d] *= 0.5;
    }
    if (is_model_kind(uint8_t(k))) {
        model_hits_ += accepted ? 1.0 : 0.0;
        model_tries_ += 1.0;
        if (model_tries_ >= kHalfLife) {
            model_hits_ *= 0.5;
            model_tries_ *= 0.5;
        }
    }
}

double AcceptanceStats::model_acceptance() const {
    return (model_hits_ + kPriorWeight * kModelPrior) / (model_tries_ + kPriorWeight);
}

namespace {

// One level of a draft tree scored against the token that actually followed `node` (-1: the
// root): every child of node is tried, on_try(child, accepted); returns the first child whose
// token is `actual`, or -1 when none is (or node has no children). parents empty: a chain, whose
// only child of node is node + 1. Children come after their parent.
template <typename OnTry>
int32_t score_children(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents, int32_t node,
                       int32_t actual, OnTry&& on_try) {
    const int32_t n = int32_t(tokens.size());
    if (parents.empty()) {
        if (node + 1 >= n) return -1;
        const bool accepted = tokens[size_t(node + 1)] == actual;
        on_try(node + 1, accepted);
        return accepted ? node + 1 : -1;
    }
    int32_t next = -1;
    for (int32_t i = node + 1; i < n; ++i) {
        if (parents[size_t(i)] != node) continue;
        const bool accepted = tokens[size_t(i)] == actual;
        on_try(i, accepted);
        if (accepted && next < 0) next = i;
    }
    return next;
}

uint8_t kind_of(const std::vector<uint8_t>& kinds, int32_t i) { return kinds.empty() ? kKindUnknown : kinds[size_t(i)]; }

}  // namespace

void AcceptanceStats::record_outcome(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                     const std::vector<uint8_t>& kinds, const int32_t* actual, int32_t n_actual) {
    int32_t node = -1;
    for (int32_t depth = 0; depth < n_actual; ++depth) {
        node = score_children(tokens, parents, node, actual[depth],
                              [&](int32_t i, bool accepted) { record(kind_of(kinds, i), depth, accepted); });
        if (node < 0) return;
    }
}

void ProposalScorer::clear() {
    pending_.clear();
    scored_.clear();
}

void ProposalScorer::add(int32_t position, const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                         const std::vector<uint8_t>& kinds) {
    if (!tokens.empty()) pending_.push_back({position, tokens, parents, kinds});
}

void ProposalScorer::score(const std::vector<int32_t>& committed) {
    const int32_t n_committed = int32_t(committed.size());
    if (int32_t(scored_.size()) < n_committed) scored_.resize(size_t(n_committed));
    size_t n_alive = 0;
    for (size_t j = 0; j < pending_.size(); ++j) {
        Pending& p = pending_[j];
        bool alive = true;
        while (alive && p.position + p.depth < n_committed) {
            const int32_t pos = p.position + p.depth;
            p.node = score_children(p.tokens, p.parents, p.node, committed[size_t(pos)], [&](int32_t i, bool accepted) {
                const uint8_t kind = kind_of(p.kinds, i);
                std::bitset<kNumKinds>& seen = scored_[size_t(pos)][accepted ? 0 : 1];
                const size_t bit = kind < kNumKinds ? kind : kKindUnknown;
                if (kind_has_depth(kind) || !seen[bit]) {
                    seen[bit] = true;
                    stats_.record(kind, p.depth, accepted);
                }
            });
            alive = p.node >= 0;
            ++p.depth;
        }
        if (!alive) continue;
        if (n_alive != j) pending_[n_alive] = std::move(p);
        ++n_alive;
    }
    pending_.resize(n_alive);
}

std::vector<double> path_probabilities(const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                                       const AcceptanceStats& stats) {
    const size_t n = parents.size();
    std::vector<double> path_prob(n, 0.0), mass_used(n + 1, 0.0);  // mass_used[p + 1]
    std::vector<int32_t> depth(n, 0);
    for (size_t i = 0; i < n; ++i) {
        const int32_t p = parents[i];
        depth[i] = p < 0 ? 0 : depth[size_t(p)] + 1;
        const double a = stats.estimate(kinds.empty() ? kKindUnknown : kinds[i], depth[i]);
        const double a_eff = std::max(0.0, std::min(a, 1.0 - mass_used[size_t(p + 1)]));
        mass_used[size_t(p + 1)] += a_eff;
        path_prob[i] = (p < 0 ? 1.0 : path_prob[size_t(p)]) * a_eff;
    }
    return path_prob;
}

std::vector<int32_t> plan_probe(const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                                const AcceptanceStats& stats, const CostModel& costs, double min_prob,
                                int64_t min_observed) {
    const std::vector<double> path_prob = path_probabilities(parents, kinds, stats);
    std::vector<int32_t> keep;
    for (size_t i = 0; i < path_prob.size(); ++i) {
        if (path_prob[i] >= min_prob) keep.push_back(int32_t(i));
    }
    if (keep.empty() || costs.n_observed(int32_t(keep.size()) + 1) >= min_observed) keep.clear();
    return keep;
}

DraftPlan plan_draft(const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                     const AcceptanceStats& stats, const std::vector<double>& step_ms, double sunk_ms) {
    const size_t n = parents.size();
    if (step_ms.size() < n + 2) {
        throw InvalidArgumentError("plan_draft: a cost table of " + std::to_string(step_ms.size()) +
                                   " entries for a draft of " + std::to_string(n) + " nodes");
    }
    const std::vector<double> path_prob = path_probabilities(parents, kinds, stats);
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return path_prob[size_t(a)] > path_prob[size_t(b)]; });

    DraftPlan best;
    best.ms = sunk_ms + step_ms[1];
    double tokens = 1.0;
    size_t best_n = 0;
    for (size_t k = 1; k <= n; ++k) {
        tokens += path_prob[size_t(order[k - 1])];
        const double ms = sunk_ms + step_ms[k + 1];
        if (tokens / ms > best.tokens_per_ms()) {
            best.expected_tokens = tokens;
            best.ms = ms;
            best_n = k;
        }
    }
    best.keep.assign(order.begin(), order.begin() + std::ptrdiff_t(best_n));
    std::sort(best.keep.begin(), best.keep.end());
    return best;
}

ChainPlan plan_chain(double alpha, const std::vector<double>& step_ms, double draft_token_ms, int32_t gamma_max,
                     double fixed_ms) {
    return plan_chain(std::vector<double>(size_t(std::max(gamma_max, 0)), alpha), step_ms, draft_token_ms, gamma_max,
                      fixed_ms);
}

ChainPlan plan_chain(const std::vector<double>& alpha, const std::vector<double>& step_ms, double draft_token_ms,
                     int32_t gamma_max, double fixed_ms) {
    if (int32_t(step_ms.size()) < gamma_max + 2 || int32_t(alpha.size()) < gamma_max) {
        throw InvalidArgumentError("plan_chain: a cost table of " + std::to_string(step_ms.size()) + " entries and " +
                                   std::to_string(alpha.size()) + " acceptances for chains of up to " +
                                   std::to_string(gamma_max) + " tokens");
    }
    ChainPlan best;
    best.ms = step_ms[1];
    double tokens = 1.0, reach = 1.0;
    for (int32_t g = 1; g <= gamma_max; ++g) {
        reach *= alpha[size_t(g - 1)];
        tokens += reach;
        const double ms = fixed_ms + g * draft_token_ms + step_ms[size_t(g + 1)];
        if (tokens / ms > best.tokens_per_ms()) best = {g, tokens, ms};
    }
    return best;
}

void keep_nodes(const std::vector<int32_t>& keep, int32_t n_vocab, std::vector<int32_t>& tokens,
                std::vector<int32_t>& parents, std::vector<uint8_t>& kinds, std::vector<float>& probs) {
    const size_t n = tokens.size();
    std::vector<int32_t> new_index(n, -1);
    for (size_t j = 0; j < keep.size(); ++j) new_index[size_t(keep[j])] = int32_t(j);
    for (size_t j = 0; j < keep.size(); ++j) {
        const size_t i = size_t(keep[j]);
        tokens[j] = tokens[i];
        if (!parents.empty()) {
            const int32_t p = parents[i];
            if (p >= 0 && new_index[size_t(p)] < 0) {
                throw InvalidArgumentError("keep_nodes: node " + std::to_string(i) + " is kept without its parent");
            }
            parents[j] = p < 0 ? -1 : new_index[size_t(p)];
        } else if (i != j) {
            throw InvalidArgumentError("keep_nodes: a chain can only keep a prefix");
        }
        if (!kinds.empty()) kinds[j] = kinds[i];
        if (!probs.empty() && i != j) {
            std::copy(probs.begin() + std::ptrdiff_t(i * size_t(n_vocab)),
                      probs.begin() + std::ptrdiff_t((i + 1) * size_t(n_vocab)),
                      probs.begin() + std::ptrdiff_t(j * size_t(n_vocab)));
        }
    }
    tokens.resize(keep.size());
    if (!parents.empty()) parents.resize(keep.size());
    if (!kinds.empty()) kinds.resize(keep.size());
    if (!probs.empty()) probs.resize(keep.size() * size_t(n_vocab));
}

}  // namespace spec
