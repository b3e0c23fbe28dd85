// Unit tests for sampling transforms and chain verification, on hand-made logits and probability
// rows. Greedy paths are checked exactly; rejection sampling is checked statistically: the tokens
// it emits must be distributed as sampling from the target directly (chi-square at alpha = 1e-3
// against hard-coded critical values), whatever the draft distribution was.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "spec/error.h"
#include "spec/rng.h"
#include "spec/sampling.h"
#include "spec/verify.h"

namespace {

// Chi-square critical values at alpha = 1e-3, by degrees of freedom (standard tables; checked
// against the regularised incomplete gamma function).
double chi2_critical(int df) {
    static const std::map<int, double> table = {
        {1, 10.828}, {2, 13.816},  {3, 16.266},  {4, 18.467},   {8, 26.124},
        {9, 27.877}, {24, 51.179}, {49, 85.351}, {124, 178.408},
    };
    const auto it = table.find(df);
    if (it == table.end()) {
        std::fprintf(stderr, "no chi-square critical value for df = %d\n", df);
        return -1.0;  // makes the caller's check fail
    }
    return it->second;
}

// Pearson chi-square of `counts` against `expected_probs` over the cells with nonzero expected
// probability; a count in a zero-probability cell fails the check on its own. Prints the result.
void check_distribution(const char* name, const std::vector<long>& counts,
                        const std::vector<double>& expected_probs) {
    long n_trials = 0;
    for (long c : counts) {
        n_trials += c;
    }
    double chi2 = 0.0;
    int n_cells = 0;
    long in_zero_cells = 0;
    double min_expected = 1e300;
    for (size_t i = 0; i < counts.size(); ++i) {
        if (expected_probs[i] <= 0.0) {
            in_zero_cells += counts[i];
            continue;
        }
        const double expected = expected_probs[i] * double(n_trials);
        chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
        min_expected = std::min(min_expected, expected);
        ++n_cells;
    }
    const int df = n_cells - 1;
    const double critical = chi2_critical(df);
    std::printf("  %-44s chi2 = %8.3f  df = %3d  critical(1e-3) = %7.3f  n = %ld\n", name, chi2,
                df, critical, n_trials);
    CHECK(min_expected >= 5.0);  // otherwise the chi-square approximation is not valid
    CHECK(in_zero_cells == 0);
    CHECK(chi2 < critical);
}

std::vector<float> normalised(std::vector<float> row) {
    double sum = 0.0;
    for (float v : row) {
        sum += v;
    }
    for (float& v : row) {
        v = float(v / sum);
    }
    return row;
}

std::vector<float> logits_of(const std::vector<float>& probs) {
    std::vector<float> logits;
    for (float p : probs) {
        logits.push_back(p > 0.0f ? std::log(p) : -INFINITY);
    }
    return logits;
}

// ---------------------------------------------------------------------------------------------
// Sampling

void test_validate() {
    spec::SamplingParams params;
    params.temperature = -1.0f;
    CHECK(throws_invalid([&] { spec::validate(params); }, "temperature must be finite and >= 0, got -1"));
    params.temperature = NAN;
    CHECK(throws_invalid([&] { spec::validate(params); }, "temperature must be finite and >= 0"));
    params.temperature = INFINITY;  // logits / inf would make every row uniform, whatever the model says
    CHECK(throws_invalid([&] { spec::validate(params); }, "temperature must be finite and >= 0, got inf"));

    params = {};
    params.top_p = 1.5f;
    CHECK(throws_invalid([&] { spec::validate(params); }, "top_p must be in (0, 1], got 1.5"));
    params.top_p = 0.0f;
    CHECK(throws_invalid([&] { spec::validate(params); }, "top_p must be in (0, 1], got 0"));

    params = {};
    params.min_p = 2.0f;
    CHECK(throws_invalid([&] { spec::validate(params); }, "min_p must be in [0, 1), got 2"));
    params.min_p = 1.0f;
    CHECK(throws_invalid([&] { spec::validate(params); }, "min_p must be in [0, 1), got 1"));
    params.min_p = -0.1f;
    CHECK(throws_invalid([&] { spec::validate(params); }, "min_p must be in [0, 1), got -0.1"));

    params = {};
    params.top_k = -3;
    CHECK(throws_invalid([&] { spec::validate(params); }, "top_k must be >= 0"));
    CHECK(throws_invalid([&] { spec::validate(params); }, "got -3"));

    // compute_probs validates too, before touching the logits.
    std::vector<float> probs;
    std::vector<int32_t> scratch;
    const float logits[3] = {0.0f, 1.0f, 2.0f};
    CHECK(throws_invalid([&] { spec::compute_probs(logits, 3, params, probs, scratch); },
                         "top_k must be >= 0"));

    // The boundaries that are allowed.
    params = {};
    params.temperature = 0.7f;
    params.top_p = 1.0f;
    params.min_p = 0.0f;
    params.top_k = 0;
    bool threw = false;
    try {
        spec::validate(params);
        params.min_p = 0.999f;
        params.top_p = 1e-6f;
        spec::validate(params);
    } catch (const spec::Error&) {
        threw = true;
    }
    CHECK(!threw);
}

void test_argmax_and_greedy() {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    CHECK(spec::argmax(logits.data(), 5) == 1);  // tie between 1 and 3 goes to the lower index
    CHECK(throws_invalid([&] { spec::argmax(logits.data(), 0); }, "n must be > 0"));

    spec::SamplingParams params;  // temperature 0: greedy, other fields ignored
    params.top_k = 2;
    params.top_p = 0.5f;
    std::vector<float> probs = {9.0f};  // stale content and wrong size must not leak through
    std::vector<int32_t> scratch;
    spec::compute_probs(logits.data(), 5, params, probs, scratch);
    CHECK(probs.size() == 5);
    CHECK(probs == (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f, 0.0f}));
}

void test_softmax() {
    spec::Rng rng(7);
    std::vector<float> logits(1000);
    for (float& l : logits) {
        l = float(rng.uniform() * 20.0 - 10.0);
    }
    std::vector<float> probs;
    spec::softmax(logits.data(), 1000, probs);
    CHECK(probs.size() == 1000);
    CHECK_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-5);
    CHECK_NEAR(probs[3] / probs[7], std::exp(double(logits[3]) - logits[7]), 1e-4 * probs[3] / probs[7]);

    // Large logits: stable (max subtracted), no inf/NaN.
    const std::vector<float> large = {1000.0f, 1001.0f, 999.0f};
    spec::softmax(large.data(), 3, probs);
    const double z = std::exp(-1.0) + 1.0 + std::exp(-2.0);
    CHECK_NEAR(probs[0], std::exp(-1.0) / z, 1e-6);
    CHECK_NEAR(probs[1], 1.0 / z, 1e-6);
    CHECK_NEAR(probs[2], std::exp(-2.0) / z, 1e-6);

    // compute_probs at temperature 1 without truncation is the same softmax.
    std::vector<float> sampled;
    std::vector<int32_t> scratch;
    spec::SamplingParams params;
    params.temperature = 1.0f;
    spec::compute_probs(logits.data(), 1000, params, sampled, scratch);
    CHECK_NEAR(std::accumulate(sampled.begin(), sampled.end(), 0.0), 1.0, 1e-5);
    spec::softmax(logits.data(), 1000, probs);
    double max_diff = 0.0;
    for (size_t i = 0; i < probs.size(); ++i) {
        max_diff = std::max(max_diff, double(std::fabs(sampled[i] - probs[i])));
    }
    CHECK(max_diff < 1e-7);
}

// compute_probs on `probs_in` (as logits log p) must give exactly `survivors` non-zero, with the
// surviving probabilities renormalised.
void check_survivors(const char* name, const std::vector<float>& probs_in,
                     const spec::SamplingParams& params, const std::vector<int32_t>& survivors) {
    const std::vector<float> logits = logits_of(probs_in);
    std::vector<float> probs;
    std::vector<int32_t> scratch;
    spec::compute_probs(logits.data(), int32_t(logits.size()), params, probs, scratch);
    double kept_mass = 0.0;  // at temperature t, weight p^(1/t)
    for (int32_t i : survivors) {
        kept_mass += std::pow(double(probs_in[i]), 1.0 / params.temperature);
    }
    bool ok = probs.size() == probs_in.size();
    for (size_t i = 0; ok && i < probs.size(); ++i) {
        const bool kept = std::find(survivors.begin(), survivors.end(), int32_t(i)) != survivors.end();
        const double expected =
            kept ? std::pow(double(probs_in[i]), 1.0 / params.temperature) / kept_mass : 0.0;
        ok = kept ? std::fabs(probs[i] - expected) < 1e-6 : probs[i] == 0.0f;
    }
    if (!ok) {
        std::fprintf(stderr, "  %s: got", name);
        for (size_t i = 0; i < std::min<size_t>(probs.size(), 12); ++i) {
            std::fprintf(stderr, " %.6f", probs[i]);
        }
        std::fprintf(stderr, "%s\n", probs.size() > 12 ? " ..." : "");
    }
    CHECK(ok);
}

void test_truncation() {
    const std::vector<float> p = {0.5f, 0.25f, 0.15f, 0.1f};
    spec::SamplingParams params;
    params.temperature = 1.0f;
    check_survivors("none", p, params, {0, 1, 2, 3});

    params.top_k = 2;
    check_survivors("top_k 2", p, params, {0, 1});
    params.top_k = 4;
    check_survivors("top_k = n", p, params, {0, 1, 2, 3});
    params.top_k = 100;
    check_survivors("top_k > n", p, params, {0, 1, 2, 3});
    params.top_k = 0;

    params.top_p = 0.45f;
    check_survivors("top_p 0.45", p, params, {0});
    params.top_p = 0.7f;
    check_survivors("top_p 0.7", p, params, {0, 1});
    params.top_p = 0.8f;
    check_survivors("top_p 0.8", p, params, {0, 1, 2});
    params.top_p = 0.95f;
    check_survivors("top_p 0.95", p, params, {0, 1, 2, 3});
    params.top_p = 1.0f;

    params.min_p = 0.25f;  // keep p >= 0.125
    check_survivors("min_p 0.25", p, params, {0, 1, 2});
    params.min_p = 0.4f;  // keep p >= 0.2
    check_survivors("min_p 0.4", p, params, {0, 1});
    params.min_p = 0.0f;

    // top_p measures mass after top_k: top-3 mass 0.9, 0.8 of it is 0.72 -> {0, 1}. Applied to
    // the full distribution top_p 0.8 would keep {0, 1, 2}.
    params.top_k = 3;
    params.top_p = 0.8f;
    check_survivors("top_k 3 then top_p 0.8", p, params, {0, 1});
    params.top_k = 0;
    params.min_p = 0.4f;
    check_survivors("top_p 0.8 and min_p 0.4", p, params, {0, 1});
    params.top_p = 0.45f;
    params.min_p = 0.1f;
    check_survivors("top_p 0.45 and min_p 0.1", p, params, {0});
    // min_p does not change the mass top_p is measured against: the nucleus of 0.8 is {0, 1, 2}
    // (0.75 < 0.8); measured against the min_p survivors (0.9) it would wrongly be {0, 1}.
    params.top_p = 0.8f;
    params.min_p = 0.25f;
    check_survivors("top_p 0.8 and min_p 0.25", p, params, {0, 1, 2});
    params.top_k = 3;
    params.top_p = 1.0f;
    params.min_p = 0.25f;
    check_survivors("top_k 3 and min_p 0.25", p, params, {0, 1, 2});

    // Temperature 2: weights p^(1/2), then the same truncation rules on the tempered distribution.
    params = {};
    params.temperature = 2.0f;
    check_survivors("temperature 2", p, params, {0, 1, 2, 3});
    params.temperature = 0.5f;
    params.top_p = 0.7f;  // tempered: 0.25, 0.0625, 0.0225, 0.01 -> 0.723, 0.181, ...
    check_survivors("temperature 0.5 top_p 0.7", p, params, {0});

    // Ties at the top_k boundary go to the lower index.
    const std::vector<float> tied = {0.1f, 0.3f, 0.2f, 0.1f, 0.3f};
    params = {};
    params.temperature = 1.0f;
    params.top_k = 1;
    check_survivors("top_k 1 tie", tied, params, {1});
    params.top_k = 2;
    check_survivors("top_k 2 tie", tied, params, {1, 4});
    params.top_k = 4;
    check_survivors("top_k 4 tie", tied, params, {0, 1, 2, 4});
    params.top_k = 0;
    params.top_p = 0.35f;  // nucleus ties also ordered by index
    check_survivors("top_p tie", tied, params, {1, 4});

    // All logits equal: the nucleus and top_k take the lowest indices, exactly. (0.25 is exact in
    // float; 0.3f is slightly above 0.3 and would need 301 tokens.)
    const std::vector<float> flat(1000, 0.001f);
    std::vector<int32_t> first_250(250);
    std::iota(first_250.begin(), first_250.end(), 0);
    params = {};
    params.temperature = 1.0f;
    params.top_p = 0.25f;
    check_survivors("flat top_p 0.25", flat, params, first_250);
    params.top_p = 1.0f;
    params.top_k = 250;
    check_survivors("flat top_k 250", flat, params, first_250);

    // -inf logits (masked tokens) stay exactly 0 and never enter the nucleus.
    const std::vector<float> masked = {0.0f, 0.6f, 0.0f, 0.4f};
    params = {};
    params.temperature = 1.0f;
    params.top_p = 0.99f;
    check_survivors("masked top_p", masked, params, {1, 3});
}

void test_non_finite_logits() {
    // NaN logits count as -inf: weight 0, never selected.
    const std::vector<float> logits = {1.0f, NAN, 2.0f, -INFINITY};
    std::vector<float> probs;
    std::vector<int32_t> scratch;
    spec::SamplingParams params;
    params.temperature = 1.0f;
    for (int32_t top_k : {0, 2, 3}) {
        params.top_k = top_k;
        spec::compute_probs(logits.data(), 4, params, probs, scratch);
        const double z = std::exp(-1.0) + 1.0;
        CHECK_NEAR(probs[0], std::exp(-1.0) / z, 1e-6);
        CHECK(probs[1] == 0.0f);
        CHECK_NEAR(probs[2], 1.0 / z, 1e-6);
        CHECK(probs[3] == 0.0f);
    }
    CHECK(spec::argmax(logits.data(), 4) == 2);

    // No possible token at all is an error, not a silent distribution.
    const std::vector<float> impossible = {-INFINITY, NAN, -INFINITY};
    params.top_k = 0;
    CHECK(throws_invalid([&] { spec::compute_probs(impossible.data(), 3, params, probs, scratch); },
                         "largest logit must be finite"));
    params.top_k = 2;
    CHECK(throws_invalid([&] { spec::compute_probs(impossible.data(), 3, params, probs, scratch); },
                         "largest logit must be finite"));
}

// The straightforward definition, with full sorts: compute_probs must agree with it on a
// vocabulary-sized row. Weights are computed the way the implementation documents them.
std::vector<float> reference_probs(const std::vector<float>& logits,
                                   const spec::SamplingParams& params) {
    const int32_t n = int32_t(logits.size());
    const float max_logit = *std::max_element(logits.begin(), logits.end());
    std::vector<double> weight(n);
    for (int32_t i = 0; i < n; ++i) {
        weight[i] = std::exp(float((double(logits[i]) - max_logit) / double(params.temperature)));
    }
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    size_t n_keep = params.top_k > 0 ? std::min<size_t>(n, params.top_k) : n;
    double mass = 0.0;
    for (size_t j = 0; j < n_keep; ++j) {
        mass += weight[order[j]];
    }
    if (params.top_p < 1.0f) {
        double cumulative = 0.0;
        for (size_t j = 0; j < n_keep; ++j) {
            cumulative += weight[order[j]];
            if (cumulative >= params.top_p * mass) {
                n_keep = j + 1;
                break;
            }
        }
    }
    std::vector<float> probs(n, 0.0f);
    double kept = 0.0;
    for (size_t j = 0; j < n_keep; ++j) {
        if (weight[order[j]] >= params.min_p) {
            kept += weight[order[j]];
        }
    }
    for (size_t j = 0; j < n_keep; ++j) {
        if (weight[order[j]] >= params.min_p) {
            probs[order[j]] = float(weight[order[j]] / kept);
        }
    }
    return probs;
}

void test_compute_probs_matches_reference() {
    const int32_t n_vocab = 151936;
    spec::Rng rng(11);
    std::vector<float> logits(n_vocab);
    for (float& l : logits) {
        // Roughly normal (sum of uniforms), a few strong tokens, many ties from rounding to 1/8.
        const double z = rng.uniform() + rng.uniform() + rng.uniform() - 1.5;
        l = float(std::round(z * 3.0 * 8.0) / 8.0);
    }
    logits[42] = 9.0f;
    logits[77] = 8.5f;
    logits[1000] = 8.5f;

    struct Case {
        float temperature;
        int32_t top_k;
        float top_p;
        float min_p;
    };
    const Case cases[] = {
        {1.0f, 0, 1.0f, 0.0f},  {0.8f, 40, 1.0f, 0.0f},  {0.8f, 0, 0.9f, 0.0f},
        {1.5f, 0, 0.95f, 0.0f}, {1.0f, 0, 1.0f, 0.05f},  {0.7f, 50, 0.8f, 0.02f},
        {1.0f, 1, 1.0f, 0.0f},  {2.0f, 0, 0.3f, 0.0f},   {1.0f, 5000, 0.99f, 0.001f},
        {1.5f, 0, 0.99f, 0.0f}, {4.0f, 0, 0.9f, 0.0f},   {1.0f, 20000, 0.7f, 0.0f},
        {0.5f, 0, 0.999f, 1e-4f},
    };
    std::vector<float> probs;
    std::vector<int32_t> scratch;
    for (const Case& c : cases) {
        spec::SamplingParams params;
        params.temperature = c.temperature;
        params.top_k = c.top_k;
        params.top_p = c.top_p;
        params.min_p = c.min_p;
        spec::compute_probs(logits.data(), n_vocab, params, probs, scratch);
        const std::vector<float> expected = reference_probs(logits, params);
        int n_set_mismatch = 0;
        double max_diff = 0.0;
        double sum = 0.0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            n_set_mismatch += (probs[i] == 0.0f) != (expected[i] == 0.0f);
            max_diff = std::max(max_diff, double(std::fabs(probs[i] - expected[i])));
            sum += probs[i];
        }
        if (n_set_mismatch != 0 || max_diff > 1e-7) {
            std::fprintf(stderr, "  case t=%g k=%d p=%g min_p=%g: %d set mismatches, max diff %g\n",
                         c.temperature, c.top_k, c.top_p, c.min_p, n_set_mismatch, max_diff);
        }
        CHECK(n_set_mismatch == 0);
        CHECK(max_diff <= 1e-7);
        CHECK_NEAR(sum, 1.0, 1e-4);
    }
}

void test_sample_from() {
    // Unnormalised on purpose (sum 2): sample_from renormalises by the actual sum.
    const std::vector<float> probs = {0.0f, 0.6f, 0.0f, 1.0f, 0.4f, 0.0f};
    spec::Rng rng(3);
    std::vector<long> counts(probs.size(), 0);
    for (int t = 0; t < 100000; ++t) {
        ++counts[spec::sample_from(probs.data(), int32_t(probs.size()), rng)];
    }
    check_distribution("sample_from", counts, {0.0, 0.3, 0.0, 0.5, 0.2, 0.0});

    // A long row (many 256-entry blocks) with zeros every 5th entry: draws never land on a zero,
    // and the mass per 500-entry bin matches.
    const int32_t n_long = 5000;
    std::vector<float> long_row(n_long);
    std::vector<double> bin_probs(10, 0.0);
    double long_sum = 0.0;
    for (int32_t i = 0; i < n_long; ++i) {
        long_row[i] = i % 5 == 0 ? 0.0f : float(i % 7 + 1 + i / 1000);
        long_sum += long_row[i];
    }
    for (int32_t i = 0; i < n_long; ++i) {
        bin_probs[i / 500] += long_row[i] / long_sum;
    }
    std::vector<long> bin_counts(10, 0);
    bool never_zero = true;
    for (int t = 0; t < 200000; ++t) {
        const int32_t i = spec::sample_from(long_row.data(), n_long, rng);
        never_zero = never_zero && long_row[i] > 0.0f;
        ++bin_counts[i / 500];
    }
    CHECK(never_zero);
    check_distribution("sample_from, 5000 entries in 10 bins", bin_counts, bin_probs);

    // One nonzero entry at the very end: every draw lands on it.
    const std::vector<float> last = {0.0f, 0.0f, 0.0f, 1e-30f};
    bool all_last = true;
    for (int t = 0; t < 1000; ++t) {
        all_last = all_last && spec::sample_from(last.data(), 4, rng) == 3;
    }
    CHECK(all_last);

    const std::vector<float> zeros = {0.0f, 0.0f};
    CHECK(throws_invalid([&] { spec::sample_from(zeros.data(), 2, rng); }, "positive finite sum"));
}

void test_top_k_entries() {
    const std::vector<float> probs = {0.1f, 0.3f, 0.05f, 0.3f, 0.25f};
    std::vector<int32_t> ids;
    std::vector<float> values;
    spec::top_k_entries(probs.data(), 5, 3, ids, values);
    CHECK(ids == (std::vector<int32_t>{1, 3, 4}));
    CHECK(values == (std::vector<float>{0.3f, 0.3f, 0.25f}));
    spec::top_k_entries(probs.data(), 5, 10, ids, values);
    CHECK(ids == (std::vector<int32_t>{1, 3, 4, 0, 2}));
    CHECK(values.size() == 5);
    spec::top_k_entries(probs.data(), 5, 0, ids, values);
    CHECK(ids.empty() && values.empty());
}

// ---------------------------------------------------------------------------------------------
// Greedy chain

void test_verify_chain_greedy() {
    spec::ChainVerdict v = spec::verify_chain_greedy({5, 6, 7}, {5, 6, 7, 8});
    CHECK(v.n_accepted == 3 && v.next_token == 8 && v.is_bonus);

    v = spec::verify_chain_greedy({5, 6, 7}, {4, 6, 7, 8});
    CHECK(v.n_accepted == 0 && v.next_token == 4 && !v.is_bonus);

    v = spec::verify_chain_greedy({5, 6, 7}, {5, 9, 7, 8});
    CHECK(v.n_accepted == 1 && v.next_token == 9 && !v.is_bonus);

    v = spec::verify_chain_greedy({5, 6, 7}, {5, 6, 1, 8});
    CHECK(v.n_accepted == 2 && v.next_token == 1 && !v.is_bonus);

    v = spec::verify_chain_greedy({}, {3});
    CHECK(v.n_accepted == 0 && v.next_token == 3 && v.is_bonus);

    CHECK(throws_invalid([] { spec::verify_chain_greedy({1, 2}, {1, 2}); }, "n_draft + 1 = 3"));
}

// ---------------------------------------------------------------------------------------------
// Rejection chain, statistically

// A toy language model over a small vocabulary: the next-token row depends on the context, so a
// wrong row index (or reuse of row 0) shows up in the joint distribution.
struct ToyModel {
    int32_t n_vocab;
    std::vector<std::vector<float>> rows;  // chosen by context
    std::vector<float> row(const std::vector<int32_t>& context) const {
        size_t key = context.size();
        for (int32_t t : context) {
            key = key * 7 + size_t(t);
        }
        return rows[key % rows.size()];
    }
};

struct ChainStats {
    std::vector<long> first;  // [n_vocab] counts of the first emitted token
    std::vector<long> joint;  // [n_vocab^depth] counts of the first `depth` emitted tokens
    long n_accepted_at_first = 0;
    long n_full_accept = 0;
    long n_trials = 0;
};

// Runs `n_trials` steps: draw the draft from q token by token, verify against p, and record the
// emitted tokens. When a step emits fewer than `depth` tokens the rest come from p directly, as
// the next step of the decoding loop would; the joint distribution must then be p's.
ChainStats run_chain(const ToyModel& target, const ToyModel& draft, int32_t n_draft, int depth,
                     long n_trials, uint64_t seed) {
    const int32_t n_vocab = target.n_vocab;
    spec::Rng rng(seed);
    ChainStats stats;
    stats.first.assign(n_vocab, 0);
    size_t n_cells = 1;
    for (int d = 0; d < depth; ++d) {
        n_cells *= size_t(n_vocab);
    }
    stats.joint.assign(n_cells, 0);
    std::vector<int32_t> draft_tokens;
    std::vector<float> target_probs;  // [n_draft + 1, n_vocab]
    std::vector<float> draft_probs;   // [n_draft, n_vocab]
    std::vector<float> residual;
    for (long t = 0; t < n_trials; ++t) {
        draft_tokens.clear();
        target_probs.clear();
        draft_probs.clear();
        for (int32_t i = 0; i < n_draft; ++i) {
            const std::vector<float> q = draft.row(draft_tokens);
            const std::vector<float> p = target.row(draft_tokens);
            draft_probs.insert(draft_probs.end(), q.begin(), q.end());
            target_probs.insert(target_probs.end(), p.begin(), p.end());
            draft_tokens.push_back(spec::sample_from(q.data(), n_vocab, rng));
        }
        const std::vector<float> p_bonus = target.row(draft_tokens);
        target_probs.insert(target_probs.end(), p_bonus.begin(), p_bonus.end());

        const spec::ChainVerdict v = spec::verify_chain_rejection(
            draft_tokens, target_probs.data(), draft_probs.data(), n_vocab, rng, residual);

        std::vector<int32_t> emitted(draft_tokens.begin(), draft_tokens.begin() + v.n_accepted);
        emitted.push_back(v.next_token);
        while (int(emitted.size()) < depth) {
            const std::vector<float> p = target.row(emitted);
            emitted.push_back(spec::sample_from(p.data(), n_vocab, rng));
        }
        size_t cell = 0;
        for (int d = 0; d < depth; ++d) {
            cell = cell * size_t(n_vocab) + size_t(emitted[d]);
        }
        ++stats.joint[cell];
        ++stats.first[emitted[0]];
        stats.n_accepted_at_first += v.n_accepted >= 1;
        stats.n_full_accept += v.is_bonus;
        ++stats.n_trials;
    }
    return stats;
}

// P(first `depth` tokens) under the target, by cell.
std::vector<double> joint_probs(const ToyModel& target, int depth) {
    std::vector<double> probs = {1.0};
    std::vector<std::vector<int32_t>> prefixes = {{}};
    for (int d = 0; d < depth; ++d) {
        std::vector<double> next_probs;
        std::vector<std::vector<int32_t>> next_prefixes;
        for (size_t c = 0; c < prefixes.size(); ++c) {
            const std::vector<float> row = target.row(prefixes[c]);
            for (int32_t x = 0; x < target.n_vocab; ++x) {
                next_probs.push_back(probs[c] * row[x]);
                next_prefixes.push_back(prefixes[c]);
                next_prefixes.back().push_back(x);
            }
        }
        probs = next_probs;
        prefixes = next_prefixes;
    }
    return probs;
}

std::vector<double> row_as_double(const std::vector<float>& row) {
    return std::vector<double>(row.begin(), row.end());
}

// Acceptance of the first draft token must be sum_x min(p(x), q(x)) (within 5 sigma).
void check_first_acceptance(const char* name, const ChainStats& stats, const ToyModel& target,
                            const ToyModel& draft) {
    const std::vector<float> p = target.row({});
    const std::vector<float> q = draft.row({});
    double expected = 0.0;
    for (size_t x = 0; x < p.size(); ++x) {
        expected += std::min(p[x], q[x]);
    }
    const double rate = double(stats.n_accepted_at_first) / double(stats.n_trials);
    const double sigma = std::sqrt(expected * (1.0 - expected) / double(stats.n_trials));
    std::printf("  %-44s acceptance = %.4f  expected %.4f\n", name, rate, expected);
    CHECK(std::fabs(rate - expected) <= 5.0 * sigma + 1e-12);
}

void test_rejection_one_draft() {
    const int32_t n_vocab = 5;
    // q over-proposes 0, 1 and 4, and never proposes 3: token 3 can only come from the residual.
    const ToyModel target{n_vocab,
                          {normalised({0.10f, 0.20f, 0.30f, 0.25f, 0.15f}),
                           normalised({0.30f, 0.05f, 0.20f, 0.15f, 0.30f}),
                           normalised({0.22f, 0.18f, 0.20f, 0.20f, 0.20f})}};
    const ToyModel draft{n_vocab,
                         {normalised({0.30f, 0.30f, 0.10f, 0.00f, 0.30f}),
                          normalised({0.10f, 0.40f, 0.10f, 0.30f, 0.10f}),
                          normalised({0.60f, 0.10f, 0.10f, 0.10f, 0.10f})}};
    const ChainStats stats = run_chain(target, draft, 1, 2, 200000, 101);
    check_distribution("n_draft 1: first token", stats.first, row_as_double(target.row({})));
    check_distribution("n_draft 1: first two tokens", stats.joint, joint_probs(target, 2));
    check_first_acceptance("n_draft 1", stats, target, draft);
}

void test_rejection_two_drafts() {
    const int32_t n_vocab = 5;
    const ToyModel target{n_vocab,
                          {normalised({0.10f, 0.20f, 0.30f, 0.25f, 0.15f}),
                           normalised({0.30f, 0.05f, 0.20f, 0.15f, 0.30f}),
                           normalised({0.22f, 0.18f, 0.20f, 0.20f, 0.20f}),
                           normalised({0.40f, 0.10f, 0.10f, 0.30f, 0.10f})}};
    const ToyModel draft{n_vocab,
                         {normalised({0.30f, 0.30f, 0.10f, 0.00f, 0.30f}),
                          normalised({0.10f, 0.40f, 0.10f, 0.30f, 0.10f}),
                          normalised({0.05f, 0.05f, 0.80f, 0.05f, 0.05f})}};
    const ChainStats stats = run_chain(target, draft, 2, 3, 400000, 202);
    check_distribution("n_draft 2: first token", stats.first, row_as_double(target.row({})));
    check_distribution("n_draft 2: first three tokens", stats.joint, joint_probs(target, 3));
    check_first_acceptance("n_draft 2", stats, target, draft);
}

void test_rejection_draft_proposes_impossible_tokens() {
    const int32_t n_vocab = 5;
    // p forbids 1 and 3; q proposes them 60% of the time. They must never be emitted.
    const ToyModel target{n_vocab,
                          {normalised({0.5f, 0.0f, 0.3f, 0.0f, 0.2f}),
                           normalised({0.1f, 0.0f, 0.6f, 0.0f, 0.3f})}};
    const ToyModel draft{n_vocab,
                         {normalised({0.2f, 0.3f, 0.2f, 0.3f, 0.0f}),
                          normalised({0.1f, 0.4f, 0.1f, 0.2f, 0.2f})}};
    ChainStats stats = run_chain(target, draft, 1, 1, 200000, 303);
    check_distribution("p = 0 where q > 0, n_draft 1", stats.first, row_as_double(target.row({})));
    check_first_acceptance("p = 0 where q > 0, n_draft 1", stats, target, draft);
    stats = run_chain(target, draft, 2, 2, 200000, 304);
    check_distribution("p = 0 where q > 0, n_draft 2: two tokens", stats.joint,
                       joint_probs(target, 2));
}

void test_rejection_draft_equals_target() {
    const int32_t n_vocab = 5;
    const ToyModel model{n_vocab,
                         {normalised({0.1f, 0.2f, 0.3f, 0.25f, 0.15f}),
                          normalised({0.0f, 0.5f, 0.0f, 0.25f, 0.25f}),
                          normalised({0.3f, 0.3f, 0.2f, 0.1f, 0.1f})}};
    const long n_trials = 100000;
    const ChainStats stats = run_chain(model, model, 3, 1, n_trials, 404);
    CHECK(stats.n_full_accept == n_trials);  // p == q: every draft token is accepted
    check_distribution("q == p, n_draft 3: first token", stats.first, row_as_double(model.row({})));
}

// A candidate its own draft row gives probability 0 (q(x) = 0) cannot have been drawn from that
// row, so the row does not describe how it was chosen (the likeliest drafter bug: a row that does
// not belong to its token). Verification treats it as a deterministic candidate: accepted with
// probability p(x), removed from p on rejection. The emitted token must then follow p exactly.
void test_rejection_token_outside_draft_support() {
    const int32_t n_vocab = 3;
    const std::vector<float> q = {1.0f, 0.0f, 0.0f};  // the candidate is token 1: q(1) = 0
    struct Case {
        const char* name;
        std::vector<float> p;  // [2, n_vocab]: row 0 verifies the candidate, row 1 gives the bonus
    };
    const Case cases[] = {
        {"q(x) = 0 < p(x)", {0.5f, 0.3f, 0.2f, 0.0f, 0.0f, 1.0f}},
        {"q(x) = 0 = p(x)", {0.5f, 0.0f, 0.5f, 0.0f, 0.0f, 1.0f}},
    };
    std::vector<float> residual;
    spec::Rng rng(5);
    const long n_trials = 20000;
    for (const Case& c : cases) {
        std::vector<long> counts(size_t(n_vocab), 0);
        bool bonus_only_after_acceptance = true;
        for (long t = 0; t < n_trials; ++t) {
            const spec::ChainVerdict v = spec::verify_chain_rejection({1}, c.p.data(), q.data(), n_vocab, rng, residual);
            const int32_t emitted = v.n_accepted == 1 ? 1 : v.next_token;
            ++counts[size_t(emitted)];
            bonus_only_after_acceptance = bonus_only_after_acceptance && v.is_bonus == (v.n_accepted == 1) &&
                                          (v.n_accepted == 0 || v.next_token == 2);
        }
        CHECK(bonus_only_after_acceptance);
        check_distribution(c.name, counts, {c.p[0], c.p[1], c.p[2]});
    }
    // p == q with p(1) = q(1) = 0: rejected, and the token comes from p.
    bool ok_equal = true;
    const std::vector<float> p_equal = {0.5f, 0.0f, 0.5f, 0.0f, 1.0f, 0.0f};
    for (int t = 0; t < 1000; ++t) {
        const spec::ChainVerdict v = spec::verify_chain_rejection({1}, p_equal.data(), p_equal.data(), n_vocab, rng,
                                                                  residual);
        ok_equal = ok_equal && v.n_accepted == 0 && (v.next_token == 0 || v.next_token == 2);
    }
    CHECK(ok_equal);
}

void test_rejection_seeded_determinism() {
    const int32_t n_vocab = 4;
    const std::vector<int32_t> draft = {2, 1, 3};
    const std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.1f, 0.4f, 0.1f,
                                  0.2f, 0.2f, 0.2f, 0.4f, 0.25f, 0.25f, 0.25f, 0.25f};
    const std::vector<float> q = {0.4f, 0.1f, 0.4f, 0.1f, 0.1f, 0.6f, 0.2f, 0.1f,
                                  0.3f, 0.3f, 0.3f, 0.1f};
    std::vector<float> residual;
    std::vector<int32_t> first_run;
    spec::Rng rng(99);
    for (int t = 0; t < 200; ++t) {
        const spec::ChainVerdict v =
            spec::verify_chain_rejection(draft, p.data(), q.data(), n_vocab, rng, residual);
        first_run.push_back(v.n_accepted * 100 + v.next_token);
    }
    rng.reseed(99);
    bool same = true;
    for (int t = 0; t < 200; ++t) {
        const spec::ChainVerdict v =
            spec::verify_chain_rejection(draft, p.data(), q.data(), n_vocab, rng, residual);
        same = same && first_run[t] == v.n_accepted * 100 + v.next_token;
    }
    CHECK(same);
    // Not a constant: the verdicts vary between steps.
    CHECK(std::count(first_run.begin(), first_run.end(), first_run[0]) < 200);

    const std::vector<int32_t> bad_draft = {2, 4, 3};
    CHECK(throws_invalid(
        [&] { spec::verify_chain_rejection(bad_draft, p.data(), q.data(), n_vocab, rng, residual); },
        "draft token 1 is 4, outside the vocabulary [0, 4)"));
}

}  // namespace

// argmax scans the row block by block: the first index of the largest value wherever it falls
// (block edges, ties across blocks), NaN never the largest, an all -inf row gives 0.
void test_argmax_first_largest_across_blocks() {
    for (const int32_t n : {1, 255, 256, 257, 1000, 49152}) {
        std::vector<float> row(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) row[size_t(i)] = float((i * 7919) % 1009) / 1009.0f;
        const auto reference = [&] {
            int32_t best = -1;
            for (int32_t i = 0; i < n; ++i) {
                if (!std::isnan(row[size_t(i)]) && (best < 0 || row[size_t(i)] > row[size_t(best)])) best = i;
            }
            return std::max(best, 0);
        };
        CHECK(spec::argmax(row.data(), n) == reference());
        for (const int32_t at : {0, 255, 256, n - 1}) {
            if (at >= n) continue;
            std::vector<float> saved = row;
            row[size_t(at)] = 2.0f;
            if (at + 300 < n) row[size_t(at + 300)] = 2.0f;  // a tie in a later block
            if (at > 0) row[size_t(at - 1)] = NAN;
            CHECK(spec::argmax(row.data(), n) == at);
            row = saved;
        }
        std::vector<float> low(static_cast<size_t>(n), -INFINITY);
        CHECK(spec::argmax(low.data(), n) == 0);
    }
}

int main() {
    test_validate();
    test_argmax_and_greedy();
    test_argmax_first_largest_across_blocks();
    test_softmax();
    test_truncation();
    test_non_finite_logits();
    test_compute_probs_matches_reference();
    test_sample_from();
    test_top_k_entries();
    test_verify_chain_greedy();
    test_rejection_one_draft();
    test_rejection_two_drafts();
    test_rejection_draft_proposes_impossible_tokens();
    test_rejection_draft_equals_target();
    test_rejection_token_outside_draft_support();
    test_rejection_seeded_determinism();
    std::printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
