// What a target step costs on this machine right now: the calibrated cost curve (spec/schedule.h)
// as a prior, corrected online from the time every step actually took. A calibration taken on a
// busy machine, a machine that got busier or quieter, or a long context (attention grows with it)
// makes the measured curve wrong by a factor that depends on the batch size; the model learns that
// factor per size from the steps it sees, within a few steps. Pure code, no model.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/schedule.h"

namespace spec {

class CostModel {
public:
    // How fast a correction follows new observations: the weight of the newest step in the
    // running (log-space) average of observed / predicted time, per size bucket. A bucket's
    // first steps are averaged plainly (weights 1, 1/2, 1/3, ...) until the weight falls to
    // kRate, so one step of a size corrects a wrong prior at once, and later a change of load
    // is followed to within ~10% in about 6 steps.
    static constexpr double kRate = 0.3;
    // A single step is believed at most this factor slower than the current estimate (an
    // outlier: the process was descheduled, a page fault storm), so one stall cannot wreck the
    // plan. Faster than expected is not clipped: a step cannot run faster than the machine
    // allows, so a fast step shows the prior was too slow (taken on a busy machine).
    static constexpr double kMaxStepFactor = 3.0;
    // A bucket's correction is only as current as its last step. Once kStaleAfter steps of other
    // sizes went by since it was last seen, it moves toward what its observed neighbours say
    // now, half-way every kStaleHalfLife further steps. Otherwise a bucket the planner came to
    // believe too dear (one slow step among its first) would never be drafted, hence never seen,
    // again: faded, it is tried again and its own steps decide.
    static constexpr int64_t kStaleAfter = 32;
    static constexpr double kStaleHalfLife = 32.0;

    CostModel() = default;
    // Installs a new prior (a calibration) and forgets every correction. The curve must be valid.
    void set_prior(const CostCurve& prior);
    bool empty() const { return prior_.empty(); }
    const CostCurve& prior() const { return prior_; }

    // Expected milliseconds of a step that decodes k tokens: the prior at k times the learnt
    // correction of k's size bucket. A bucket that has seen no step borrows the correction of
    // the nearest bucket that has (the same machine load and context affect every size alike, to
    // first order), or none before any step was seen; a stale one fades into that (kStaleAfter).
    double at(int32_t k) const;
    // at(1..k_max), made non-decreasing in k: what the planner needs for one step. [k_max + 1],
    // entry 0 unused. corrected false: the prior alone.
    std::vector<double> table(int32_t k_max, bool corrected = true) const;
    // The same, written into `ms` (resized; no allocation once it is large enough): what the
    // planner calls every step.
    void table(int32_t k_max, bool corrected, std::vector<double>& ms) const;

    // A step of k tokens took `ms` (the target decode, verification and commit: what the plan
    // pays per step besides drafting).
    void observe(int32_t k, double ms);

    // The current correction factor of k's bucket (1: the prior is right) and how many steps
    // of that bucket were seen since the prior was set.
    double correction(int32_t k) const;
    int64_t n_observed(int32_t k) const;
    int64_t n_observed() const { return n_observed_total_; }

private:
    int32_t bucket(int32_t k) const;
    double bucket_correction(size_t b) const;
    // The correction the observed buckets other than b give b (log); false when there are none.
    bool borrowed(int32_t b, double* log_ratio) const;

    CostCurve prior_;
    std::vector<double> log_ratio_;  // [n sizes of the prior] running mean of log(observed / prior)
    std::vector<int64_t> n_seen_;    // [n sizes of the prior]
    std::vector<int64_t> last_seen_;  // [n sizes of the prior] n_observed_total_ just after its last step
    int64_t n_observed_total_ = 0;
    // [largest calibrated size + 1]: bucket(k) of every k up to the largest size (past it, the
    // last bucket), so a step's table costs no logarithms.
    std::vector<int32_t> bucket_of_;
};

}  // namespace spec
