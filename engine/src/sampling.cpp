// Sampling transforms over one row of logits. This runs at least once per generated token over the
// full vocabulary (~152k for Qwen2.5), so the full-row passes are written to vectorise, and nothing
// sorts the vocabulary: top_k keeps a running threshold; top_p first drops the tail that provably
// lies outside the nucleus, then finds the cut from a histogram of the remaining weights and sorts
// only the histogram bucket that holds it.
//
// Order of tokens, wherever it matters (top_k, the nucleus, top_k_entries): larger value first,
// ties to the lower index.
#include "spec/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "spec/error.h"

namespace spec {

namespace {

void check_size(int32_t n, const char* what) {
    if (n <= 0) {
        throw InvalidArgumentError(std::string(what) + ": n must be > 0, got " + std::to_string(n));
    }
}

// A float as the user wrote it ("1.5", "-1"), not std::to_string's "1.500000".
std::string format_value(double value) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", value);
    return buf;
}

// exp(x) for x in [-88, 0] within 1 ulp of the correctly rounded result; exp(0) is exactly 1, and
// x below about -87.7 gives 0 (the scale 2^n is 0 at n = -127; such weights never matter).
// Cephes' expf without branches or library calls, so that loops over it vectorise.
inline float exp_in_range(float x) {
    // x = n * ln2 + r with |r| <= ln2 / 2; truncating x / ln2 - 0.5 rounds it, as x <= 0.
    const int32_t n = int32_t(x * 1.44269504f - 0.5f);
    const float n_float = float(n);
    float r = x - n_float * 0.693359375f;
    r = r - n_float * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t scale_bits = (n + 127) << 23;  // 2^n for n in [-126, 0], 0 for n = -127
    float scale;
    std::memcpy(&scale, &scale_bits, sizeof(scale));
    return p * scale;
}

// Brings x <= 0 into exp_in_range's domain; -inf and NaN (NaN logits) become -88, so weight 0.
inline float clamp_exponent(float x) { return x > -88.0f ? x : -88.0f; }

// Sum in double with independent partial sums, so the loop vectorises instead of waiting on one
// serial chain of additions.
double sum_of(const float* values, int32_t n) {
    double partial[8] = {};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int32_t j = 0; j < 8; ++j) {
            partial[j] += values[i + j];
        }
    }
    double sum = 0.0;
    for (; i < n; ++i) {
        sum += values[i];
    }
    for (double s : partial) {
        sum += s;
    }
    return sum;
}

// weights[i] = exp((logits[i] - max_logit) * inv_temperature) over a whole row; returns their sum.
// Two loops on purpose: with the clamp in the same loop GCC sees that the polynomial is dead for
// clamped inputs, turns the clamp into a branch, and (under its default -ftrapping-math) then
// refuses to vectorise. Apart, both loops vectorise, several times faster than std::exp.
// logits: [n], weights: [n]
double write_weights(const float* logits, int32_t n, float max_logit, float inv_temperature,
                     float* weights) {
    for (int32_t i = 0; i < n; ++i) {
        weights[i] = clamp_exponent((logits[i] - max_logit) * inv_temperature);
    }
    for (int32_t i = 0; i < n; ++i) {
        weights[i] = exp_in_range(weights[i]);
    }
    return sum_of(weights, n);
}

float max_of(const float* values, int32_t n) {
    float partial[8];
    std::fill(partial, partial + 8, -INFINITY);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int32_t j = 0; j < 8; ++j) {
            partial[j] = values[i + j] > partial[j] ? values[i + j] : partial[j];
        }
    }
    float max_value = -INFINITY;
    for (; i < n; ++i) {
        max_value = values[i] > max_value ? values[i] : max_value;
    }
    for (float m : partial) {
        max_value = m > max_value ? m : max_value;
    }
    return max_value;
}

struct LargerFirst {
    const float* values;
    bool operator()(int32_t a, int32_t b) const {
        return values[a] > values[b] || (values[a] == values[b] && a < b);
    }
};

// The k best indices of `values` (see the order above), in no particular order; fewer when fewer
// than k values are above -inf (NaN and -inf never qualify). One pass with a rising threshold:
// once k candidates are known, only a strictly larger value can displace the k-th (a tie loses to
// it, since its index is lower), and the list is cut back to k whenever it fills up.
void select_top_k(const float* values, int32_t n, int32_t k, std::vector<int32_t>& ids) {
    const LargerFirst larger{values};
    const size_t capacity = std::max<size_t>(4 * size_t(k), 1024);
    ids.clear();
    float threshold = -INFINITY;
    for (int32_t i = 0; i < n; ++i) {
        if (values[i] > threshold) {
            ids.push_back(i);
            if (ids.size() == capacity) {
                std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), larger);
                threshold = values[ids[k - 1]];
                ids.resize(k);
            }
        }
    }
    if (ids.size() > size_t(k)) {
        std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), larger);
        ids.resize(k);
    }
}

// Drops (weight 0) every candidate lighter than `floor`, compacting `candidates` (indices into
// `weights`, or every index when `all_indices`). Returns the kept mass.
double keep_at_least(std::vector<float>& weights, float floor, std::vector<int32_t>& candidates,
                     bool all_indices) {
    size_t n_kept = 0;
    // Branch-free: whether a token survives is data-dependent and unpredictable.
    const auto visit = [&](int32_t i) {
        const bool keep = weights[i] >= floor;
        candidates[n_kept] = i;
        n_kept += keep;
        weights[i] *= float(keep);
    };
    if (all_indices) {
        candidates.resize(weights.size());
        for (int32_t i = 0; i < int32_t(weights.size()); ++i) {
            visit(i);
        }
    } else {
        for (int32_t i : candidates) {
            visit(i);
        }
    }
    candidates.resize(n_kept);
    double kept = 0.0;
    for (int32_t i : candidates) {
        kept += weights[i];
    }
    return kept;
}

// Cuts `candidates` (indices into `weights`, all weights in [0, 1]) to the nucleus: the shortest
// prefix, in order of weight, whose mass reaches `target`. Dropped candidates get weight 0; returns
// the kept mass. Weights are bucketed by their top float bits (exponent and 5 mantissa bits, so a
// bucket spans a factor of 2^(1/32)); bucket masses locate the bucket holding the cut, and only that
// bucket is sorted. Linear in the number of candidates, whatever the size of the nucleus.
double keep_nucleus(std::vector<float>& weights, std::vector<int32_t>& candidates, double target) {
    constexpr int bucket_shift = 18;
    constexpr uint32_t n_buckets = (0x3F800000u >> bucket_shift) + 1;  // 0x3F800000 is 1.0f
    const auto bucket_of = [&weights](int32_t i) {
        uint32_t bits;
        std::memcpy(&bits, &weights[i], sizeof(bits));
        return bits >> bucket_shift;  // monotone in the weight, as weights are >= 0
    };
    std::vector<double> bucket_mass(n_buckets, 0.0);
    for (int32_t i : candidates) {
        bucket_mass[bucket_of(i)] += weights[i];
    }
    double kept = 0.0;  // mass of the buckets above the cut's
    uint32_t cut_bucket = n_buckets;
    for (uint32_t b = n_buckets; b-- > 0;) {
        if (kept + bucket_mass[b] >= target) {
            cut_bucket = b;
            break;
        }
        kept += bucket_mass[b];
    }
    if (cut_bucket == n_buckets) {
        return kept;  // rounding kept the target out of reach: the nucleus is everything
    }

    // [heavier buckets | the cut's bucket, sorted | lighter buckets]
    const auto in_bucket_above = [&](int32_t i) { return bucket_of(i) > cut_bucket; };
    const auto in_cut_bucket = [&](int32_t i) { return bucket_of(i) == cut_bucket; };
    const auto bucket_begin =
        std::partition(candidates.begin(), candidates.end(), in_bucket_above);
    const auto bucket_end = std::partition(bucket_begin, candidates.end(), in_cut_bucket);
    std::sort(bucket_begin, bucket_end, LargerFirst{weights.data()});
    auto cut = bucket_end;
    for (auto it = bucket_begin; it != bucket_end; ++it) {
        kept += weights[*it];
        if (kept >= target) {
            cut = it + 1;
            break;
        }
    }
    for (auto it = cut; it != candidates.end(); ++it) {
        weights[*it] = 0.0f;
    }
    candidates.erase(cut, candidates.end());
    return kept;
}

}  // namespace

void validate(const SamplingParams& params) {
    // Written so that NaN fails every check.
    if (!(params.temperature >= 0.0f) || std::isinf(params.temperature)) {
        throw InvalidArgumentError("temperature must be finite and >= 0, got " +
                                   format_value(params.temperature));
    }
    if (params.top_k < 0) {
        throw InvalidArgumentError("top_k must be >= 0 (0 disables), got " +
                                   std::to_string(params.top_k));
    }
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
        throw InvalidArgumentError("top_p must be in (0, 1], got " + format_value(params.top_p));
    }
    if (!(params.min_p >= 0.0f && params.min_p < 1.0f)) {
        throw InvalidArgumentError("min_p must be in [0, 1), got " + format_value(params.min_p));
    }
}

int32_t argmax(const float* logits, int32_t n_vocab) {
    check_size(n_vocab, "argmax");
    // One pass over the row: the largest value of each block (max_of vectorises), keeping the
    // first block that holds the row's largest; then the first index of it within that block.
    // NaN is never the largest, as in max_of.
    constexpr int32_t kBlock = 256;
    float best = -INFINITY;
    int32_t best_block = -1;
    for (int32_t b = 0; b < n_vocab; b += kBlock) {
        const float m = max_of(logits + b, std::min(kBlock, n_vocab - b));
        if (m > best) {
            best = m;
            best_block = b;
        }
    }
    if (best_block >= 0) {
        for (int32_t i = best_block;; ++i) {
            if (logits[i] == best) return i;
        }
    }
    // Every logit is -inf or NaN: the first -inf, as below.
    const float max_value = max_of(logits, n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (logits[i] == max_value) {
            return i;
        }
    }
    return 0;  // every logit is NaN
}

void compute_probs(const float* logits, int32_t n_vocab, const SamplingParams& params,
                   std::vector<float>& probs, std::vector<int32_t>& scratch) {
    validate(params);
    check_size(n_vocab, "compute_probs");
    if (params.greedy()) {
        const int32_t best = argmax(logits, n_vocab);
        probs.assign(n_vocab, 0.0f);
        probs[best] = 1.0f;
        return;
    }

    // Weights exp((logit - max) / T): the best token has weight exactly 1, the others are in
    // [0, 1]. 1/T is capped so that a denormal temperature cannot give 0 * inf at the maximum.
    const float inv_temperature = float(std::min(1.0 / double(params.temperature), 1e30));
    std::vector<int32_t>& candidates = scratch;  // when in use, lists every nonzero weight
    const bool use_top_k = params.top_k > 0 && params.top_k < n_vocab;
    bool use_candidates = use_top_k;
    float max_logit = -INFINITY;  // NaN logits count as -inf throughout: never chosen, weight 0
    if (use_top_k) {
        select_top_k(logits, n_vocab, params.top_k, candidates);
        for (int32_t i : candidates) {
            max_logit = std::max(max_logit, logits[i]);
        }
    } else {
        max_logit = max_of(logits, n_vocab);
    }
    if (!std::isfinite(max_logit)) {
        throw InvalidArgumentError(
            "compute_probs: the largest logit must be finite (some token must be possible), got " +
            format_value(max_logit));
    }

    double mass = 0.0;  // of the distribution after top_k: what top_p is measured against
    if (use_top_k) {
        probs.assign(n_vocab, 0.0f);
        for (int32_t i : candidates) {
            probs[i] = exp_in_range(clamp_exponent((logits[i] - max_logit) * inv_temperature));
            mass += probs[i];
        }
    } else {
        probs.resize(n_vocab);
        mass = write_weights(logits, n_vocab, max_logit, inv_temperature, probs.data());
    }

    // The nucleus and the min_p set are both prefixes of the same order, so the result is the
    // shorter of the two, and both can drop light tokens before the nucleus is searched:
    // - min_p keeps weight >= min_p (p_max has weight 1);
    // - the tokens lighter than floor_top_p weigh less than n * floor_top_p = (1 - top_p) * mass / 2
    //   together, so the heavier ones alone exceed top_p * mass: the nucleus lies among them.
    const bool use_top_p = params.top_p < 1.0f;
    const size_t n_weighted = use_top_k ? candidates.size() : size_t(n_vocab);
    const double floor_top_p =
        use_top_p ? 0.5 * (1.0 - double(params.top_p)) * mass / double(n_weighted) : 0.0;
    const float floor = std::max(params.min_p, float(floor_top_p));
    double kept_mass = mass;
    if (floor > 0.0f) {
        kept_mass = keep_at_least(probs, floor, candidates, !use_candidates);
        use_candidates = true;
    }
    if (use_top_p) {
        kept_mass = keep_nucleus(probs, candidates, double(params.top_p) * mass);
    }

    const float scale = float(1.0 / kept_mass);
    if (use_candidates) {
        for (int32_t i : candidates) {
            probs[i] *= scale;
        }
    } else {
        for (float& p : probs) {
            p *= scale;
        }
    }
}

void softmax(const float* logits, int32_t n_vocab, std::vector<float>& probs) {
    check_size(n_vocab, "softmax");
    const float max_logit = max_of(logits, n_vocab);
    probs.resize(n_vocab);
    const float scale = float(1.0 / write_weights(logits, n_vocab, max_logit, 1.0f, probs.data()));
    for (float& p : probs) {
        p *= scale;
    }
}

int32_t sample_from(const float* probs, int32_t n, Rng& rng) {
    check_size(n, "sample_from");
    const double sum = sum_of(probs, n);
    if (!(sum > 0.0 && std::isfinite(sum))) {
        throw InvalidArgumentError(
            "sample_from: probabilities must have a positive finite sum, got " +
            format_value(sum));
    }
    const double threshold = rng.uniform() * sum;
    // Skip whole blocks by their sum, then scan the block the threshold falls in.
    constexpr int32_t block = 256;
    double cumulative = 0.0;
    int32_t last_nonzero = -1;
    for (int32_t start = 0; start < n; start += block) {
        const int32_t end = std::min(n, start + block);
        const double block_sum = sum_of(probs + start, end - start);
        if (threshold >= cumulative + block_sum) {
            cumulative += block_sum;
            continue;
        }
        for (int32_t i = start; i < end; ++i) {
            if (probs[i] > 0.0f) {
                cumulative += probs[i];
                last_nonzero = i;
                if (threshold < cumulative) {
                    return i;
                }
            }
        }
        // Rounding of the block sum; the threshold is still inside this block.
        if (last_nonzero >= start) {
            return last_nonzero;
        }
    }
    // Rounding put the threshold past the end; never return a zero-probability index.
    for (int32_t i = n - 1; i >= 0; --i) {
        if (probs[i] > 0.0f) {
            return i;
        }
    }
    return last_nonzero;  // unreachable: sum > 0
}

void top_k_entries(const float* probs, int32_t n, int32_t k, std::vector<int32_t>& ids,
                   std::vector<float>& values) {
    ids.clear();
    if (k > 0 && n > 0) {
        select_top_k(probs, n, std::min(k, n), ids);
        std::sort(ids.begin(), ids.end(), LargerFirst{probs});
    }
    values.resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
        values[j] = probs[ids[j]];
    }
}

float token_probability(const float* logits, int32_t n_vocab, int32_t token) {
    check_size(n_vocab, "token_probability");
    // The vectorised weights (float exp, double sum), not a serial double exp per entry: this
    // runs once per drafted token on the hot path.
    thread_local std::vector<float> weights;
    weights.resize(size_t(n_vocab));
    const double sum = write_weights(logits, n_vocab, max_of(logits, n_vocab), 1.0f, weights.data());
    return sum > 0.0 ? float(double(weights[size_t(token)]) / sum) : 0.0f;
}

float token_logprobs(const float* logits, int32_t n_vocab, int32_t token, int32_t k, std::vector<int32_t>& top_ids,
                     std::vector<float>& top_logprobs) {
    const float max = logits[argmax(logits, n_vocab)];
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i] - max));
    const float log_norm = max + float(std::log(sum));
    top_k_entries(logits, n_vocab, k, top_ids, top_logprobs);  // logits rank like probabilities
    for (float& value : top_logprobs) value -= log_norm;
    return logits[token] - log_norm;
}

}  // namespace spec
