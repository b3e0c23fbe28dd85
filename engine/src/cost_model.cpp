#include "spec/cost_model.h"

#include <algorithm>
#include <cmath>

namespace spec {

void CostModel::set_prior(const CostCurve& prior) {
    validate(prior);
    prior_ = prior;
    log_ratio_.assign(prior.n_tokens.size(), 0.0);
    n_seen_.assign(prior.n_tokens.size(), 0);
    last_seen_.assign(prior.n_tokens.size(), 0);
    n_observed_total_ = 0;
    bucket_of_.clear();  // bucket() computes while it is empty
    std::vector<int32_t> of(size_t(prior_.n_tokens.back()) + 1);
    for (int32_t k = 0; k <= prior_.n_tokens.back(); ++k) of[size_t(k)] = bucket(k);
    bucket_of_ = std::move(of);
}

int32_t CostModel::bucket(int32_t k) const {
    if (!bucket_of_.empty()) return bucket_of_[size_t(std::clamp(k, 0, int32_t(bucket_of_.size()) - 1))];
    // The calibrated size nearest to k on a log scale (sizes grow roughly geometrically).
    const std::vector<int32_t>& sizes = prior_.n_tokens;
    const double lk = std::log(double(std::max(k, 1)));
    int32_t best = 0;
    double best_d = 1e300;
    for (size_t i = 0; i < sizes.size(); ++i) {
        const double d = std::fabs(std::log(double(sizes[i])) - lk);
        if (d < best_d) {
            best_d = d;
            best = int32_t(i);
        }
    }
    return best;
}

bool CostModel::borrowed(int32_t b, double* log_ratio) const {
    // The nearest observed buckets on each side of b (b itself left out), interpolated on a
    // log-size scale; the nearer one alone at an edge.
    int32_t lo = b - 1, hi = b + 1;
    const int32_t n = int32_t(n_seen_.size());
    while (lo >= 0 && n_seen_[size_t(lo)] == 0) --lo;
    while (hi < n && n_seen_[size_t(hi)] == 0) ++hi;
    if (lo < 0 && hi >= n) return false;
    if (lo < 0) {
        *log_ratio = log_ratio_[size_t(hi)];
    } else if (hi >= n) {
        *log_ratio = log_ratio_[size_t(lo)];
    } else {
        const double x = std::log(double(prior_.n_tokens[size_t(b)]));
        const double x0 = std::log(double(prior_.n_tokens[size_t(lo)]));
        const double x1 = std::log(double(prior_.n_tokens[size_t(hi)]));
        const double t = (x - x0) / (x1 - x0);
        *log_ratio = (1.0 - t) * log_ratio_[size_t(lo)] + t * log_ratio_[size_t(hi)];
    }
    return true;
}

double CostModel::correction(int32_t k) const {
    if (prior_.empty() || n_observed_total_ == 0) return 1.0;
    return bucket_correction(size_t(bucket(k)));
}

double CostModel::bucket_correction(size_t b) const {
    double from_neighbours = 0.0;
    if (n_seen_[b] == 0) return borrowed(int32_t(b), &from_neighbours) ? std::exp(from_neighbours) : 1.0;
    // A bucket not seen for a while fades into what its neighbours say now.
    const int64_t idle = n_observed_total_ - last_seen_[b] - kStaleAfter;
    if (idle <= 0 || !borrowed(int32_t(b), &from_neighbours)) return std::exp(log_ratio_[b]);
    const double fade = 1.0 - std::exp2(-double(idle) / kStaleHalfLife);
    return std::exp((1.0 - fade) * log_ratio_[b] + fade * from_neighbours);
}

int64_t CostModel::n_observed(int32_t k) const {
    return prior_.empty() ? 0 : n_seen_[size_t(bucket(k))];
}

double CostModel::at(int32_t k) const {
    if (prior_.empty()) return 0.0;
    return prior_.at(k) * correction(k);
}

std::vector<double> CostModel::table(int32_t k_max, bool corrected) const {
    std::vector<double> ms;
    table(k_max, corrected, ms);
    return ms;
}

void CostModel::table(int32_t k_max, bool corrected, std::vector<double>& ms) const {
    ms.assign(size_t(std::max(k_max, 1)) + 1, 0.0);
    if (prior_.empty()) return;
    // Sizes share their bucket's correction: each bucket's is worked out once.
    const bool any = corrected && n_observed_total_ > 0;
    int32_t b_current = -1;
    double factor = 1.0;
    double running = 0.0;
    for (int32_t k = 1; k <= k_max; ++k) {
        if (any) {
            const int32_t b = bucket(k);
            if (b != b_current) {
                b_current = b;
                factor = bucket_correction(size_t(b));
            }
        }
        running = std::max(running, prior_.at(k) * factor);
        ms[size_t(k)] = running;
    }
}

void CostModel::observe(int32_t k, double ms) {
    if (prior_.empty() || !(ms > 0.0) || !std::isfinite(ms) || k < 1) return;
    const size_t b = size_t(bucket(k));
    const double current = std::log(correction(k));
    const double limit = std::log(kMaxStepFactor);
    const double seen = std::min(std::log(ms / prior_.at(k)), current + limit);
    log_ratio_[b] = current;  // what was borrowed, or what a stale estimate faded to
    ++n_seen_[b];
    last_seen_[b] = n_observed_total_ + 1;
    log_ratio_[b] += std::max(kRate, 1.0 / double(n_seen_[b])) * (seen - log_ratio_[b]);
    ++n_observed_total_;
}

}  // namespace spec
