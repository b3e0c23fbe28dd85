// The online cost model: a calibration prior corrected from observed step times, per size bucket,
// with unobserved sizes borrowing from their observed neighbours. No model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "check.h"
#include "spec/cost_model.h"
#include "spec/tree.h"

using namespace spec;

namespace {

CostCurve prior() { return CostCurve{{1, 2, 4, 8, 16, 32}, {30, 60, 100, 225, 280, 450}}; }

void test_prior_only() {
    CostModel m;
    CHECK(m.empty());
    CHECK_NEAR(m.at(4), 0.0, 1e-12);
    m.set_prior(prior());
    CHECK(!m.empty());
    for (int32_t k : {1, 3, 8, 20, 64}) CHECK_NEAR(m.at(k), prior().at(k), 1e-9);
    CHECK_NEAR(m.correction(8), 1.0, 1e-12);
    CHECK(m.n_observed() == 0);
    CHECK(throws_invalid([&] { m.set_prior(CostCurve{{2}, {1.0}}); }, "start at 1"));
}

void test_converges_to_a_wrong_prior_factor() {
    // The machine is 1.5x slower than calibrated at every size: within 6 steps of one size the
    // estimate is within 10% of the truth, and other sizes follow through borrowing.
    CostModel m;
    m.set_prior(prior());
    int32_t steps = 0;
    while (std::fabs(m.at(1) / (1.5 * 30.0) - 1.0) > 0.10) {
        m.observe(1, 1.5 * 30.0);
        ++steps;
    }
    CHECK(steps <= 6);
    CHECK_NEAR(m.correction(16), m.correction(1), 1e-12);  // nothing seen near 16: borrowed
    CHECK(m.n_observed(1) == steps && m.n_observed(16) == 0);
    for (int i = 0; i < 30; ++i) m.observe(1, 45.0);
    CHECK_NEAR(m.at(1), 45.0, 0.01);
}

void test_sizes_learn_apart_and_interpolate() {
    // Small steps got slower (a busy machine), big ones faster (the calibration ran busy): the
    // buckets between take the log-size interpolation of their observed neighbours.
    CostModel m;
    m.set_prior(prior());
    for (int i = 0; i < 60; ++i) {
        m.observe(1, 2.0 * 30.0);
        m.observe(32, 0.5 * 450.0);
    }
    CHECK_NEAR(m.correction(1), 2.0, 1e-3);
    CHECK_NEAR(m.correction(32), 0.5, 1e-3);
    // 4 lies halfway between 1 and 32 on a log scale... (log 4 / log 32 = 0.4 of the way).
    CHECK_NEAR(m.correction(4), std::exp(0.6 * std::log(2.0) + 0.4 * std::log(0.5)), 1e-3);
    // The planner's table stays non-decreasing in k.
    const std::vector<double> t = m.table(40);
    for (size_t k = 2; k < t.size(); ++k) CHECK(t[k] >= t[k - 1]);
    // A new prior forgets the corrections.
    m.set_prior(prior());
    CHECK_NEAR(m.correction(1), 1.0, 1e-12);
}

void test_outliers_are_clipped() {
    // One descheduled step (100x) as a size's first observation counts as kMaxStepFactor slower
    // at most; the next steps at the true cost average it away.
    CostModel m;
    m.set_prior(prior());
    m.observe(8, 100.0 * 225.0);
    CHECK_NEAR(m.correction(8), CostModel::kMaxStepFactor, 1e-9);
    m.observe(8, -1.0);                 // nonsense is ignored
    m.observe(8, std::nan(""));
    CHECK(m.n_observed(8) == 1);
    for (int i = 0; i < 20; ++i) m.observe(8, 225.0);
    CHECK_NEAR(m.correction(8), 1.0, 0.01);
    // Once a size is established, one stall moves it by at most kRate * log(kMaxStepFactor).
    m.observe(8, 100.0 * 225.0);
    CHECK(m.correction(8) <= 1.01 * std::exp(CostModel::kRate * std::log(CostModel::kMaxStepFactor)));
}

void test_a_fast_step_corrects_a_busy_calibration_at_once() {
    // Calibrated on a busy machine (everything from 8 tokens on 10x too slow): one step of 16
    // tokens at its real cost puts that size right; faster than expected is never clipped.
    CostModel m;
    m.set_prior(CostCurve{{1, 8, 16}, {30, 2250, 2800}});
    m.observe(16, 280.0);
    CHECK_NEAR(m.at(16), 280.0, 1e-6);
    CHECK(m.n_observed(16) == 1);
}

void test_plans_follow_the_corrected_costs() {
    // A calibration that says verification is free (100 ms whatever the size) makes the planner
    // verify a whole 15-node chain of 90%-accepted nodes; once the steps it times show that 16
    // tokens really cost 16x one token, it keeps far fewer nodes.
    CostModel m;
    m.set_prior(CostCurve{{1, 64}, {100, 100}});
    AcceptanceStats s;
    for (int i = 0; i < 60; ++i) s.record(kind_lookup(20), 0, i % 10 != 0);
    const std::vector<uint8_t> kinds(15, kind_lookup(20));
    CHECK(plan_draft(chain_parents(15), kinds, s, m.table(16), 0.0).keep.size() == 15);
    for (int i = 0; i < 20; ++i) {
        m.observe(1, 100.0);
        m.observe(16, 1600.0);
    }
    const DraftPlan after = plan_draft(chain_parents(15), kinds, s, m.table(16), 0.0);
    CHECK(after.keep.size() < 15);
    // ... and with the prior alone (table(k, false)) it would still keep them all.
    CHECK(plan_draft(chain_parents(15), kinds, s, m.table(16, false), 0.0).keep.size() == 15);
}

void test_a_slow_first_step_fades_into_its_neighbours() {
    // One slow step (1.43x, the machine busy for a moment) is a bucket's only observation while
    // its neighbour reads 1.17x. The planner then finds that size too dear and stops drafting it,
    // so no step of it would ever correct the estimate: after kStaleAfter steps of other sizes it
    // fades toward the neighbour, the planner drafts deep again, and the bucket's own steps decide.
    const CostCurve curve{{1, 16, 32, 48, 64}, {40, 280, 460, 650, 820}};
    CostModel m;
    m.set_prior(curve);
    for (int i = 0; i < 20; ++i) m.observe(32, 1.17 * 460.0);
    m.observe(48, 1.43 * 650.0);
    CHECK_NEAR(m.correction(48), 1.43, 1e-9);
    CHECK_NEAR(m.correction(64), 1.43, 1e-9);  // borrowed from 48, its nearest observed bucket
    AcceptanceStats s;
    for (int i = 0; i < 400; ++i) s.record(kind_lookup(64), 0, i % 200 != 0);
    const std::vector<uint8_t> kinds(63, kind_lookup(64));
    const auto kept = [&] { return plan_draft(chain_parents(63), kinds, s, m.table(64), 0.0).keep.size(); };
    CHECK(kept() < 40);  // 38 nodes
    // Within kStaleAfter steps of other sizes nothing changes.
    for (int64_t i = 0; i < CostModel::kStaleAfter; ++i) m.observe(32, 1.17 * 460.0);
    CHECK_NEAR(m.correction(48), 1.43, 1e-9);
    // Then half-way (in log space) every kStaleHalfLife steps.
    for (int i = 0; i < int(CostModel::kStaleHalfLife); ++i) m.observe(32, 1.17 * 460.0);
    CHECK_NEAR(m.correction(48), std::sqrt(1.43 * 1.17), 1e-3);
    for (int i = 0; i < 8 * int(CostModel::kStaleHalfLife); ++i) m.observe(32, 1.17 * 460.0);
    CHECK_NEAR(m.correction(48), 1.17, 1e-3);
    CHECK(m.n_observed(48) == 1);
    CHECK(kept() >= 47);  // 54 nodes
    // The faded estimate is where the next step of that size starts from: if the size really is
    // that dear, a few of its own steps bring it back.
    for (int i = 0; i < 6; ++i) m.observe(48, 1.43 * 650.0);
    CHECK(m.correction(48) > 1.38);
    CHECK(kept() < 40);
    // A bucket seen all along never fades: sizes that alternate keep their own corrections.
    CostModel a;
    a.set_prior(curve);
    for (int i = 0; i < 300; ++i) {
        a.observe(1, 2.0 * 40.0);
        for (int j = 0; j < 5; ++j) a.observe(32, 0.5 * 460.0);
    }
    CHECK_NEAR(a.correction(1), 2.0, 1e-9);
}

}  // namespace

void test_table_is_the_running_max_of_at() {
    // The planner's table (worked out per bucket, written in place) is at(k) made non-decreasing,
    // before any step, after steps of some sizes, with stale buckets, and past the largest size.
    CostModel m;
    m.set_prior(prior());
    std::vector<double> t;
    auto matches = [&](int32_t k_max, bool corrected) {
        m.table(k_max, corrected, t);
        CHECK(t.size() == size_t(k_max) + 1);
        double running = 0.0;
        for (int32_t k = 1; k <= k_max; ++k) {
            running = std::max(running, corrected ? m.at(k) : prior().at(k));
            CHECK(t[size_t(k)] == running);  // the same arithmetic: equal, not near
        }
        CHECK(m.table(k_max, corrected) == t);
    };
    matches(48, true);
    for (int i = 0; i < 5; ++i) {
        m.observe(2, 2.5 * 60.0);
        m.observe(16, 0.7 * 280.0);
    }
    matches(48, true);
    matches(70, false);
    for (int i = 0; i < 80; ++i) m.observe(1, 31.0);  // 2 and 16 go stale and fade
    matches(64, true);
    matches(3, true);  // shorter than before: resized, nothing left over
}

int main() {
    test_prior_only();
    test_converges_to_a_wrong_prior_factor();
    test_sizes_learn_apart_and_interpolate();
    test_outliers_are_clipped();
    test_a_fast_step_corrects_a_busy_calibration_at_once();
    test_plans_follow_the_corrected_costs();
    test_a_slow_first_step_fades_into_its_neighbours();
    test_table_is_the_running_max_of_at();
    std::printf("test_cost_model: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
