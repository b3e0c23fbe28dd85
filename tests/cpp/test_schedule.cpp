// The auto scheduler's pure parts: cost curves, acceptance statistics (including scoring a
// proposal against what was committed), the planner's choices on hand-computed cases, pruning a
// tree, and one-draw verification of deterministic candidates. No model.
#include <cmath>
#include <cstdio>
#include <vector>

#include "check.h"
#include "spec/cost_model.h"
#include "spec/drafter.h"
#include "spec/rng.h"
#include "spec/sampling.h"
#include "spec/schedule.h"
#include "spec/tree.h"
#include "spec/verify.h"

using namespace spec;
using Ids = std::vector<int32_t>;
using Kinds = std::vector<uint8_t>;

CostCurve curve(Ids n_tokens, std::vector<double> ms) { return CostCurve{std::move(n_tokens), std::move(ms)}; }

void test_cost_curve() {
    const CostCurve c = curve({1, 2, 4}, {100, 120, 200});
    CHECK_NEAR(c.at(0), 100, 1e-9);
    CHECK_NEAR(c.at(1), 100, 1e-9);
    CHECK_NEAR(c.at(3), 160, 1e-9);  // between 2 and 4
    CHECK_NEAR(c.at(6), 280, 1e-9);  // past the end: the last slope, 40 ms per token
    CHECK(throws_invalid([] { validate(curve({2, 4}, {1, 2})); }, "start at 1"));
    CHECK(throws_invalid([] { validate(curve({1, 1}, {1, 2})); }, "increase strictly"));
    CHECK(throws_invalid([] { validate(curve({1, 2}, {1})); }, "2 sizes but 1 times"));
    CHECK(throws_invalid([] { validate(curve({1, 2}, {1, -1})); }, "finite and > 0"));
    CHECK(throws_invalid([] { validate(CostCurve{}); }, "empty"));
    // A noisy measurement where 8 tokens timed faster than 4 is made non-decreasing.
    const CostCurve m = monotone(curve({1, 4, 8}, {100, 300, 250}));
    CHECK((m.ms == std::vector<double>{100, 300, 300}));
}

// step_ms table [k_max + 1] from a curve, as CostModel::table gives it with no correction.
std::vector<double> table(const CostCurve& c, int32_t k_max) {
    std::vector<double> t(size_t(k_max) + 1, 0.0);
    for (int32_t k = 1; k <= k_max; ++k) t[size_t(k)] = c.at(k);
    return t;
}

void test_kinds() {
    // Context-match kinds are keyed by match length buckets; lookup, pool and model kinds differ.
    CHECK(kind_lookup(1) != kind_lookup(2));
    CHECK(kind_lookup(9) == kind_lookup(10));   // 9-10
    CHECK(kind_lookup(13) == kind_lookup(16));  // 13-16
    CHECK(kind_lookup(65) == kind_lookup(1000));
    CHECK(kind_lookup(64) != kind_lookup(65));
    CHECK(kind_pool(3) != kind_lookup(3));
    CHECK(kind_lookup_end() != kind_lookup(65) && !is_model_kind(kind_lookup_end()));
    CHECK(!kind_has_depth(kind_lookup_end()) && kind_lookup_end() < kNumKinds);
    CHECK(!is_model_kind(kind_pool(200)));
    CHECK(is_model_kind(kind_model(0.0f)) && is_model_kind(kind_model(1.0f)));
    CHECK(!kind_has_depth(kind_lookup(5)) && !kind_has_depth(kind_pool(5)));
    CHECK(kind_has_depth(kind_model(0.5f)) && kind_has_depth(kKindUnknown));
    // Short matches inside the output: their own kinds, keyed by depth as well.
    CHECK(kind_lookup_output(3) != kind_lookup(3) && kind_lookup_output(3) != kind_pool(3));
    CHECK(kind_lookup_output(3) != kind_lookup_output(4) && kind_lookup_output(9) == kind_lookup_output(10));
    CHECK(kind_has_depth(kind_lookup_output(3)) && !is_model_kind(kind_lookup_output(16)));
    CHECK(kind_lookup_output(16) < kNumKinds && kind_lookup_output(1) != kind_lookup_end());
    // Head nodes: a kind of their own, keyed by depth, with the optimistic prior at every depth.
    CHECK(kind_head() < kNumKinds && kind_head() != kind_lookup_output(65) && !is_model_kind(kind_head()));
    CHECK(kind_has_depth(kind_head()) && kind_head() != kind_lookup_contested());
    CHECK_NEAR(AcceptanceStats().estimate(kind_head(), 5), kHeadPrior, 1e-12);
    // A head tree's other choices: a kind of their own, keyed by depth, prior 0.2.
    const uint8_t alternative = kind_head_alternative();
    CHECK(alternative < kNumKinds && alternative != kind_head() && alternative != kind_lookup_answer_start());
    CHECK(kind_has_depth(alternative) && !is_model_kind(alternative) && kind_name(alternative) == "head-alternative");
    CHECK_NEAR(AcceptanceStats().estimate(alternative, 3), 0.2, 1e-12);
}

void test_acceptance_stats() {
    AcceptanceStats s;
    CHECK_NEAR(s.estimate(kind_lookup(3), 0), 3.0 / 5.0, 1e-12);    // prior m / (m + 2)
    CHECK_NEAR(s.estimate(kind_lookup(16), 0), 13.0 / 15.0, 1e-12); // bucket 13-16
    // Long prompt copies (17 tokens and more): m^2 / (m^2 + 4), at most 0.99, as measured.
    CHECK_NEAR(s.estimate(kind_lookup(20), 0), 289.0 / 293.0, 1e-12);  // bucket 17-24
    CHECK_NEAR(s.estimate(kind_lookup(40), 0), 0.99, 1e-12);            // bucket 33-48
    CHECK_NEAR(s.estimate(kind_lookup(80), 0), 0.99, 1e-12);            // 65 and more
    CHECK_NEAR(s.estimate(kind_pool(40), 0), 33.0 / 35.0, 1e-12);       // pool phrases: m / (m + 2)
    CHECK_NEAR(s.estimate(kind_lookup_output(16), 0), 13.0 / 15.0, 1e-12);
    CHECK_NEAR(s.estimate(kind_model(0.93f), 0), 0.95, 1e-12);      // decile middle
    CHECK_NEAR(s.estimate(kKindUnknown, 0), 0.5, 1e-12);
    CHECK_NEAR(s.model_acceptance(), AcceptanceStats::kModelPrior, 1e-12);
    for (int i = 0; i < 8; ++i) s.record(kind_model(0.55f), 2, true);
    // (8 + 2 * 0.55) / (8 + 2)
    CHECK_NEAR(s.estimate(kind_model(0.55f), 2), 0.91, 1e-12);
    CHECK_NEAR(s.estimate(kind_model(0.55f), 1), 0.55, 1e-12);  // model depths are apart
    CHECK_NEAR(s.estimate(kind_model(0.75f), 2), 0.75, 1e-12);  // and deciles
    // Context-match kinds carry their depth in the match length: one cell for every depth.
    for (int i = 0; i < 8; ++i) s.record(kind_lookup(4), 5, false);
    CHECK_NEAR(s.estimate(kind_lookup(4), 0), (0 + 2 * 4.0 / 6.0) / 10.0, 1e-12);
    CHECK_NEAR(s.estimate(kind_pool(4), 0), 4.0 / 6.0, 1e-12);
    // Depth 7 and deeper share a cell.
    s.record(kKindUnknown, 9, false);
    CHECK_NEAR(s.estimate(kKindUnknown, 7), 1.0 / 3.0, 1e-12);
    // Half-life: after many rejections the old acceptances fade.
    for (int i = 0; i < 200; ++i) s.record(kind_model(0.55f), 2, false);
    CHECK(s.estimate(kind_model(0.55f), 2) < 0.05);
    s.clear();
    CHECK_NEAR(s.estimate(kind_model(0.55f), 2), 0.55, 1e-12);
}

// Within a request, the history (every earlier request's counts) competes with the priors alone,
// both updated with the request's own outcomes; estimate() mixes them by how well each predicted
// those outcomes.
void test_request_history_weight() {
    const uint8_t copy = kind_lookup(4);  // prior 4 / 6
    const double prior = 4.0 / 6.0;
    AcceptanceStats s;
    // A stream where such copies go on: 40 accepted across earlier requests.
    for (int i = 0; i < 40; ++i) s.record(copy, 0, true);
    const double history = (40 + 2 * prior) / 42.0;
    CHECK_NEAR(s.estimate(copy, 0), history, 1e-12);  // outside a request: the counts alone
    CHECK_NEAR(s.history_weight(), 1.0, 1e-12);

    s.begin_request();
    const double w0 = AcceptanceStats::kHistoryPrior;
    CHECK_NEAR(s.history_weight(), w0, 1e-12);
    CHECK_NEAR(s.estimate(copy, 0), w0 * history + (1 - w0) * prior, 1e-12);
    // The draft model's and the head's kinds (optimistic priors) are not mixed.
    CHECK_NEAR(s.estimate(kind_model(0.55f), 0), 0.55, 1e-12);
    // The same stream: acceptances, which the history predicted better, raise its weight.
    s.record(copy, 0, true);
    const double odds = w0 / (1 - w0) * (history / prior);
    CHECK_NEAR(s.history_weight(), odds / (1 + odds), 1e-12);
    const double w1 = s.history_weight();
    for (int i = 0; i < 5; ++i) s.record(copy, 0, true);
    CHECK(s.history_weight() > w1 && s.history_weight() > 0.95);
    s.end_request();

    // Another stream: rejections. Within a few the request is planned from the priors and its
    // own outcomes, where the counts alone would still expect the copies to go on.
    s.begin_request();
    for (int i = 0; i < 3; ++i) s.record(copy, 0, false);
    CHECK(s.history_weight() < 0.01);
    const double counts = (46 + 2 * prior) / 51.0;  // what the estimate was before: 46 of 49 tries accepted
    const double fresh = (0 + 2 * prior) / 5.0;
    CHECK(counts > 0.9);
    CHECK(std::fabs(s.estimate(copy, 0) - fresh) < 0.01);
    // Other context-match kinds follow at once: the weight is one for the whole request.
    CHECK(std::fabs(s.estimate(kind_lookup(8), 0) - 0.8) < 0.01);
    s.end_request();
    CHECK(s.estimate(copy, 0) > 0.85);  // and after the request, the counts alone again

    // A fresh engine: the history is the request's own outcomes, so nothing changes.
    AcceptanceStats t;
    t.begin_request();
    for (int i = 0; i < 4; ++i) t.record(copy, 0, i % 2 == 0);
    CHECK_NEAR(t.history_weight(), w0, 1e-9);
    CHECK_NEAR(t.estimate(copy, 0), (2 + 2 * prior) / 6.0, 1e-12);
    t.end_request();

    // Counts out and back in; clear_model forgets the draft model's alone.
    for (int i = 0; i < 4; ++i) t.record(kind_model(0.55f), 1, true);
    AcceptanceStats u;
    u.set_counts(t.counts());
    CHECK(u.counts() == t.counts());
    CHECK_NEAR(u.estimate(kind_model(0.55f), 1), (4 + 2 * 0.55) / 6.0, 1e-12);
    u.clear_model();
    CHECK_NEAR(u.estimate(kind_model(0.55f), 1), 0.55, 1e-12);
    CHECK_NEAR(u.model_acceptance(), AcceptanceStats::kModelPrior, 1e-12);
    CHECK_NEAR(u.estimate(copy, 0), (2 + 2 * prior) / 6.0, 1e-12);
    std::vector<double> bad = t.counts();
    bad[0] = bad[kNumKinds * kKindDepths] + 1.0;  // more hits than tries
    CHECK(throws_invalid([&] { u.set_counts(bad); }, "more hits than tries"));
    CHECK(throws_invalid([&] { u.set_counts({1.0}); }, "expected"));
}

void test_record_outcome() {
    // root -> 0:a -> 1:b -> 2:c        actual: a b x
    //      -> 3:d
    //              -> 4:e (below 0)
    const Ids tokens = {10, 11, 12, 13, 14};
    const Ids parents = {-1, 0, 1, -1, 0};
    const Kinds kinds = {kind_lookup(1), kind_lookup(2), kind_lookup(3), kind_pool(1), kind_pool(2)};
    AcceptanceStats s;
    const Ids actual = {10, 11, 99};
    s.record_outcome(tokens, parents, kinds, actual.data(), 3);
    // Tried: 0 (accepted), 3 (rejected), 1 and 4 below 0 (1 accepted, 4 rejected), 2 (rejected).
    auto prior = [](double m) { return m / (m + 2.0); };
    CHECK_NEAR(s.estimate(kind_lookup(1), 0), (1 + 2 * prior(1)) / 3.0, 1e-12);
    CHECK_NEAR(s.estimate(kind_pool(1), 0), (0 + 2 * prior(1)) / 3.0, 1e-12);
    CHECK_NEAR(s.estimate(kind_lookup(2), 1), (1 + 2 * prior(2)) / 3.0, 1e-12);
    CHECK_NEAR(s.estimate(kind_pool(2), 1), (0 + 2 * prior(2)) / 3.0, 1e-12);
    CHECK_NEAR(s.estimate(kind_lookup(3), 2), (0 + 2 * prior(3)) / 3.0, 1e-12);
    // Only as deep as there are actual tokens: with one token, depth 1 is not scored.
    AcceptanceStats t;
    t.record_outcome(tokens, parents, kinds, actual.data(), 1);
    CHECK_NEAR(t.estimate(kind_lookup(1), 0), (1 + 2 * prior(1)) / 3.0, 1e-12);
    CHECK_NEAR(t.estimate(kind_lookup(2), 1), prior(2), 1e-12);
    // A chain (parents empty).
    AcceptanceStats u;
    const Ids chain = {5, 6, 7};
    const Ids actual_chain = {5, 8, 7};
    u.record_outcome(chain, {}, {}, actual_chain.data(), 3);
    CHECK_NEAR(u.estimate(kKindUnknown, 0), 2.0 / 3.0, 1e-12);
    CHECK_NEAR(u.estimate(kKindUnknown, 1), 1.0 / 3.0, 1e-12);
    CHECK_NEAR(u.estimate(kKindUnknown, 2), 0.5, 1e-12);  // never tried: its parent was rejected
}

void test_proposal_scorer() {
    // Two proposals of consecutive steps copy the same text: the first at position 10 predicts
    // 1 2 3 4, the second at 11 predicts 2 3 4, every node a long copy. The text went 1 2 3 9:
    // the copy turns at position 13.
    const uint8_t k = kind_lookup(65);
    const double prior = AcceptanceStats().estimate(k, 0);
    Ids committed(10, 0);
    AcceptanceStats s;
    ProposalScorer scorer(s);
    scorer.add(10, {1, 2, 3, 4}, {}, Kinds(4, k));
    committed.push_back(1);  // position 10: the second proposal was made after it
    scorer.score(committed);
    scorer.add(11, {2, 3, 4}, {}, Kinds(3, k));
    // Node by node as tokens are committed: positions 10 and 11 are scored before 12 exists.
    committed.push_back(2);
    scorer.score(committed);
    CHECK_NEAR(s.estimate(k, 0), (2 + 2 * prior) / (2 + 2), 1e-12);
    CHECK(scorer.n_pending() == 2);
    committed.push_back(3);
    committed.push_back(9);
    scorer.score(committed);
    // Each position once, although both proposals predicted 11, 12 and the turn at 13: 3 hits and
    // 1 miss (scoring each proposal on its own would record 5 hits and 2 misses).
    CHECK_NEAR(s.estimate(k, 0), (3 + 2 * prior) / (4 + 2), 1e-12);
    CHECK(scorer.n_pending() == 0);  // both missed: dropped
    committed.push_back(5);
    scorer.score(committed);
    CHECK_NEAR(s.estimate(k, 0), (3 + 2 * prior) / (4 + 2), 1e-12);

    // Another kind at the same position is another observation; so is a kind keyed by depth, at
    // every depth it is tried. A tree: both children of the root are tried.
    AcceptanceStats t;
    ProposalScorer trees(t);
    const uint8_t pool = kind_pool(3), model = kind_model(0.55f);
    trees.add(0, {7, 8}, {-1, -1}, {k, pool});  // siblings: 7 (lookup) and 8 (pool)
    trees.add(0, {7}, {}, {k});                 // the same prediction again: not counted
    trees.add(0, {7, 6}, {}, {model, model});   // draft-model kinds: scored every time
    trees.add(1, {6}, {}, {model});
    trees.score({7, 6});
    CHECK_NEAR(t.estimate(k, 0), (1 + 2 * prior) / 3.0, 1e-12);
    CHECK_NEAR(t.estimate(pool, 0), (0 + 2 * 3.0 / 5.0) / 3.0, 1e-12);
    // Depth 0: the third proposal's node at position 0 and the fourth's at position 1; depth 1:
    // the third's at position 1, the same position as the fourth's but another cell.
    CHECK_NEAR(t.estimate(model, 0), (2 + 2 * 0.55) / 4.0, 1e-12);
    CHECK_NEAR(t.estimate(model, 1), (1 + 2 * 0.55) / 3.0, 1e-12);
    trees.clear();
    CHECK(trees.n_pending() == 0);
}

void test_contested_kind() {
    const uint8_t c = kind_lookup_contested();
    CHECK(c < kNumKinds && !is_model_kind(c) && !kind_has_depth(c));
    CHECK(c != kind_lookup_end() && c != kind_lookup_output(16) && c != kind_pool(65));
    AcceptanceStats s;
    CHECK_NEAR(s.estimate(c, 0), 0.1, 1e-12);  // its prior: well below any copy node's
    CHECK(s.estimate(c, 0) < s.estimate(kind_lookup(1), 0));
    s.record(c, 5, true);
    CHECK_NEAR(s.estimate(c, 0), (1 + 2 * 0.1) / 3.0, 1e-12);  // one cell for every depth
}

void test_boundary_kinds() {
    // One kind per match bucket, apart from every other family, with an even prior and no depth.
    const uint8_t b17 = kind_lookup_boundary(17), b20 = kind_lookup_boundary(20), b65 = kind_lookup_boundary(200);
    CHECK(b17 == b20 && b17 != b65 && b65 < kNumKinds && kind_lookup_boundary(1) != b17);
    for (const uint8_t other : {kind_lookup(17), kind_pool(17), kind_lookup_output(17), kind_lookup_end(),
                                kind_lookup_contested(), kind_head(), kind_corpus(0.99)}) {
        CHECK(b17 != other && b65 != other && kind_lookup_boundary(1) != other);
    }
    CHECK(!is_model_kind(b17) && !kind_has_depth(b17));
    CHECK(kind_name(b17) == "lookup-boundary m17" && kind_name(kind_lookup_boundary(1)) == "lookup-boundary m1");
    AcceptanceStats s;
    CHECK_NEAR(s.estimate(b65, 0), 0.5, 1e-12);  // an even guess, far below a long copy's prior
    CHECK(s.estimate(b65, 0) < s.estimate(kind_lookup(65), 0));
    s.record(b65, 3, false);
    CHECK_NEAR(s.estimate(b65, 0), (0 + 2 * 0.5) / 3.0, 1e-12);
}

void test_substituted_kind() {
    // One kind apart from every other, with its prior (0.6) and no depth.
    const uint8_t sub = kind_lookup_substituted();
    CHECK(sub < kNumKinds && !is_model_kind(sub) && !kind_has_depth(sub));
    for (const uint8_t other : {kind_lookup(17), kind_pool(17), kind_lookup_output(17), kind_lookup_end(),
                                kind_lookup_contested(), kind_head(), kind_corpus(0.99), kind_lookup_boundary(1),
                                kind_lookup_boundary(200)}) {
        CHECK(sub != other);
    }
    CHECK(kind_name(sub) == "lookup-substituted");
    AcceptanceStats s;
    CHECK_NEAR(s.estimate(sub, 0), 0.6, 1e-12);
    s.record(sub, 4, true);
    CHECK_NEAR(s.estimate(sub, 0), (1 + 2 * 0.6) / 3.0, 1e-12);
    // The loose one: another kind, an even prior, no depth.
    const uint8_t loose = kind_lookup_substituted_loose();
    CHECK(loose < kNumKinds && loose != sub && loose != kind_lookup_resync() && !kind_has_depth(loose));
    CHECK(kind_name(loose) == "lookup-substituted-loose");
    CHECK_NEAR(s.estimate(loose, 3), 0.5, 1e-12);
}

void test_fence_kinds() {
    // Two kinds apart from every other, each keyed by depth; priors 0.9 (a fence copy) and 0.5.
    const uint8_t fence = kind_lookup_fence(), start = kind_lookup_answer_start();
    CHECK(fence < kNumKinds && start < kNumKinds && fence != start);
    for (const uint8_t other : {kind_lookup(17), kind_pool(17), kind_lookup_output(17), kind_lookup_end(),
                                kind_lookup_contested(), kind_head(), kind_corpus(0.99), kind_lookup_boundary(1),
                                kind_lookup_boundary(200), kind_lookup_substituted(), kind_lookup_resync(),
                                kind_lookup_substituted_loose()}) {
        CHECK(fence != other && start != other);
    }
    CHECK(kind_has_depth(fence) && kind_has_depth(start) && !is_model_kind(fence) && !is_model_kind(start));
    CHECK(kind_name(fence) == "lookup-fence" && kind_name(start) == "lookup-answer-start");
    AcceptanceStats s;
    CHECK_NEAR(s.estimate(fence, 0), 0.9, 1e-12);
    CHECK_NEAR(s.estimate(start, 5), 0.5, 1e-12);
    s.record(start, 2, true);  // depth 2's cell alone
    CHECK_NEAR(s.estimate(start, 2), (1 + 2 * 0.5) / 3.0, 1e-12);
    CHECK_NEAR(s.estimate(start, 1), 0.5, 1e-12);
    CHECK_NEAR(s.estimate(fence, 2), 0.9, 1e-12);
}

void test_plan_draft_hand_computed() {
    // A chain of three unknown-kind nodes (estimate 0.5 each): P = 0.5, 0.25, 0.125.
    // Cost: 100 ms + 20 ms per extra token. Rates: none 1/100, one node 1.5/120 = 0.0125,
    // two 1.75/140 = 0.0125 (not better), three 1.875/160. The first best is kept: one node.
    AcceptanceStats s;
    const std::vector<double> c = table(curve({1, 2, 3, 4}, {100, 120, 140, 160}), 4);
    const DraftPlan p = plan_draft(chain_parents(3), {}, s, c, 0.0);
    CHECK((p.keep == Ids{0}));
    CHECK_NEAR(p.expected_tokens, 1.5, 1e-12);
    CHECK_NEAR(p.ms, 120, 1e-12);
    // Drafting time already spent counts in every option, which favours longer drafts: with 50 ms
    // sunk, two nodes win (1.75 / 190 > 1.875 / 210 > 1.5 / 170 > 1 / 150).
    CHECK((plan_draft(chain_parents(3), {}, s, c, 50.0).keep == Ids{0, 1}));
    // Verification as dear as decoding one token at a time never pays.
    const std::vector<double> linear = table(curve({1, 2, 3, 4}, {100, 200, 300, 400}), 4);
    CHECK(plan_draft(chain_parents(3), {}, s, linear, 0.0).keep.empty());
    // Well-accepted nodes on a flat curve: everything is kept.
    for (int i = 0; i < 20; ++i) s.record(kind_lookup(2), 0, true);
    const std::vector<double> flat = table(curve({1, 8}, {100, 100}), 8);
    const DraftPlan all = plan_draft(chain_parents(3), Kinds(3, kind_lookup(2)), s, flat, 0.0);
    CHECK((all.keep == Ids{0, 1, 2}));
    // A cost table too short for the draft is a caller's error, named.
    CHECK(throws_invalid([&] { plan_draft(chain_parents(3), {}, s, std::vector<double>(3, 1.0), 0.0); },
                         "cost table"));
}

void test_plan_draft_siblings_share_mass() {
    // Two children of the root, both of a kind accepted 90% of the time: they compete for the
    // same target token, so the second can only have the 10% left. With 60 ms per extra token
    // the first pays (1.9 / 160 > 1 / 100) and the second does not.
    AcceptanceStats s;
    for (int i = 0; i < 40; ++i) s.record(kind_pool(4), 0, i % 10 != 0);
    const double a = s.estimate(kind_pool(4), 0);
    CHECK(a > 0.85);
    const std::vector<double> c = table(curve({1, 2, 3}, {100, 160, 220}), 3);
    const DraftPlan p = plan_draft({-1, -1}, Kinds(2, kind_pool(4)), s, c, 0.0);
    CHECK((p.keep == Ids{0}));
    CHECK_NEAR(p.expected_tokens, 1.0 + a, 1e-12);
}

void test_plan_probe() {
    // A chain whose nodes are accepted ~95% of the time: P falls 0.95, 0.90, ... and crosses 0.5
    // after 13 nodes. A calibration that makes every draft look too dear (taken on a busy
    // machine) plans none; the probe drafts the 13 likely nodes while their step size (14) has
    // been timed fewer than 3 times, and no longer after.
    AcceptanceStats s;
    for (int i = 0; i < 200; ++i) s.record(kind_lookup(30), 0, i % 20 != 0);
    const Kinds kinds(20, kind_lookup(30));
    const std::vector<int32_t> parents = chain_parents(20);
    const std::vector<double> path = path_probabilities(parents, kinds, s);
    int32_t n_likely = 0;
    for (double p : path) n_likely += p >= 0.5 ? 1 : 0;
    CHECK(n_likely > 5 && n_likely < 20);
    CostModel costs;
    costs.set_prior(curve({1, 8, 16, 32}, {100, 2000, 4000, 8000}));
    for (int i = 0; i < 10; ++i) costs.observe(1, 100.0);  // plain steps, timed as calibrated
    CHECK(plan_draft(parents, kinds, s, costs.table(21, true), 0.0).keep.empty());
    Ids expected(static_cast<size_t>(n_likely));
    for (int32_t i = 0; i < n_likely; ++i) expected[size_t(i)] = i;
    for (int step = 0; step < 3; ++step) {
        CHECK((plan_probe(parents, kinds, s, costs, 0.5, 3) == expected));
        costs.observe(n_likely + 1, 300.0);  // what the step really took
    }
    CHECK(plan_probe(parents, kinds, s, costs, 0.5, 3).empty());
    // The corrected costs now make the likely nodes worth drafting without a probe.
    CHECK(!plan_draft(parents, kinds, s, costs.table(21, true), 0.0).keep.empty());
    // Nothing likely: no probe.
    AcceptanceStats poor;
    for (int i = 0; i < 200; ++i) poor.record(kind_lookup(30), 0, i % 2 == 0);
    CostModel fresh;
    fresh.set_prior(curve({1, 8, 16, 32}, {100, 2000, 4000, 8000}));
    CHECK(plan_probe(parents, kinds, poor, fresh, 0.5, 3).size() == 1);  // only the first node has P >= 0.5
    AcceptanceStats worse;
    for (int i = 0; i < 200; ++i) worse.record(kind_lookup(30), 0, i % 4 == 0);
    CHECK(plan_probe(parents, kinds, worse, fresh, 0.5, 3).empty());
}

void test_plan_chain() {
    const std::vector<double> target = table(curve({1, 16}, {100, 100}), 16);  // verification free up to 16
    CHECK(plan_chain(0.9, target, 1.0, 8).gamma == 8);
    CHECK(plan_chain(0.0, target, 1.0, 8).gamma == 0);
    CHECK(plan_chain(0.9, target, 200.0, 8).gamma == 0);  // a draft token costs two target tokens
    const ChainPlan one = plan_chain(0.5, table(curve({1, 2}, {100, 110}), 2), 10.0, 1);
    CHECK(one.gamma == 1);
    CHECK_NEAR(one.expected_tokens, 1.5, 1e-12);
    CHECK_NEAR(one.ms, 120, 1e-12);
    // A fixed cost (the draft's catch-up) is spread best over a longer chain, and a big one
    // makes plain decoding better: alpha 0.7, draft 10 ms, verification 100 ms for any size.
    const std::vector<double> flat = table(curve({1, 16}, {100, 100}), 16);
    CHECK(plan_chain(0.7, flat, 10.0, 8).gamma == 4);
    CHECK(plan_chain(0.7, flat, 10.0, 8, 100.0).gamma == 6);
    CHECK(plan_chain(0.7, flat, 10.0, 8, 300.0).gamma == 0);
    CHECK_NEAR(plan_chain(0.7, flat, 10.0, 8, 100.0).ms, 100 + 60 + 100, 1e-12);
    // Acceptance per depth (a draft head's): a weak first token makes any chain lose, however
    // good the later ones; a strong first and a weak second stop the chain at one token.
    CHECK(plan_chain(std::vector<double>{0.05, 0.99, 0.99, 0.99}, flat, 10.0, 4).gamma == 0);
    const ChainPlan first = plan_chain(std::vector<double>{0.9, 0.05, 0.9, 0.9}, flat, 10.0, 4);
    CHECK(first.gamma == 1);
    CHECK_NEAR(first.expected_tokens, 1.9, 1e-12);
    // One acceptance for every depth is the scalar plan.
    CHECK(plan_chain(std::vector<double>(8, 0.7), flat, 10.0, 8, 100.0).gamma == 6);
}

void test_keep_nodes() {
    // root -> 0 -> 1, root -> 2 -> 3; keep 0, 2, 3.
    Ids tokens = {10, 11, 12, 13}, parents = {-1, 0, -1, 2};
    Kinds kinds = {1, 2, 3, 4};
    std::vector<float> probs = {0, 0, 1, 1, 2, 2, 3, 3};  // two-token rows
    keep_nodes({0, 2, 3}, 2, tokens, parents, kinds, probs);
    CHECK((tokens == Ids{10, 12, 13}));
    CHECK((parents == Ids{-1, -1, 1}));
    CHECK((kinds == Kinds{1, 3, 4}));
    CHECK((probs == std::vector<float>{0, 0, 2, 2, 3, 3}));
    Ids t2 = {1, 2, 3}, p2 = {-1, 0, 1};
    Kinds k2;
    std::vector<float> q2;
    CHECK(throws_invalid([&] { keep_nodes({0, 2}, 1, t2, p2, k2, q2); }, "without its parent"));
    Ids chain = {1, 2, 3}, none;
    CHECK(throws_invalid([&] { keep_nodes({1}, 1, chain, none, k2, q2); }, "prefix"));
}

void test_deterministic_candidates_follow_the_random_stream() {
    // With one-hot candidates, verification draws one token per row from the target: the
    // output is what sampling the rows directly gives from the same stream, whatever the draft.
    const int32_t n_vocab = 4;
    const std::vector<float> row = {0.1f, 0.2f, 0.3f, 0.4f};
    std::vector<float> target;  // [5, 4]: the same row everywhere
    for (int i = 0; i < 5; ++i) target.insert(target.end(), row.begin(), row.end());
    std::vector<float> residual;
    for (uint64_t seed = 0; seed < 200; ++seed) {
        Rng plain(seed);
        Ids sampled;
        for (int i = 0; i < 5; ++i) sampled.push_back(sample_from(row.data(), n_vocab, plain));
        // A chain proposing the first two sampled tokens, then a wrong one, then anything.
        const Ids draft = {sampled[0], sampled[1], (sampled[2] + 1) % n_vocab, 0};
        Rng rng(seed);
        const TreeVerdict v = verify_tree_rejection(draft, chain_parents(4), target.data(), nullptr, n_vocab, rng,
                                                    residual);
        CHECK(v.path.size() == 2);
        CHECK(v.next_token == sampled[2]);
        CHECK(!v.is_bonus);
    }
}

int main() {
    test_cost_curve();
    test_kinds();
    test_acceptance_stats();
    test_request_history_weight();
    test_record_outcome();
    test_proposal_scorer();
    test_boundary_kinds();
    test_substituted_kind();
    test_fence_kinds();
    test_contested_kind();
    test_plan_draft_hand_computed();
    test_plan_draft_siblings_share_mass();
    test_plan_probe();
    test_plan_chain();
    test_keep_nodes();
    test_deterministic_candidates_follow_the_random_stream();
    std::printf("test_schedule: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
