#include "spec/calibrate.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "spec/error.h"
#include "spec/model.h"

namespace spec {

std::vector<int32_t> default_calibration_sizes() { return {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}; }

CostCurve measure_cost_curve(Model& model, const std::vector<int32_t>& sizes, int32_t repeats, bool all_rows,
                             const CalibrationProgress& progress, int32_t context, bool non_decreasing) {
    CostCurve shape{sizes, std::vector<double>(sizes.size(), 1.0)};
    validate(shape);
    if (repeats < 1) throw InvalidArgumentError("calibration repeats must be >= 1, got " + std::to_string(repeats));
    const int32_t k_max = sizes.back();
    if (k_max > model.params().n_batch) {
        throw InvalidArgumentError("calibration size " + std::to_string(k_max) + " exceeds n_batch=" +
                                   std::to_string(model.params().n_batch));
    }
    if (context < 1) throw InvalidArgumentError("calibration context must be >= 1, got " + std::to_string(context));
    const int32_t n_context = std::min(context, model.n_ctx() - k_max - 1);
    if (n_context < 1) throw InvalidArgumentError("calibration size " + std::to_string(k_max) + " does not fit the context");

    // Ordinary token ids (any valid ids will do: the cost does not depend on which).
    std::vector<int32_t> tokens(size_t(n_context + k_max));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((1000 + 37 * i) % size_t(model.n_vocab()));
    // The context: tokens[0, n_context) in the cache (prefill_prompt leaves out its last token).
    model.prefill_prompt(std::vector<int32_t>(tokens.begin(), tokens.begin() + n_context + 1));
    auto time_decode = [&](int32_t k) {
        const auto t0 = std::chrono::steady_clock::now();
        model.decode_seq(tokens.data() + n_context, k, n_context, all_rows);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        model.kv_remove(0, n_context, -1);
        return ms;
    };
    time_decode(k_max);  // warm-up: first-use allocations, caches

    std::vector<std::vector<double>> times(sizes.size());
    const int32_t total = repeats * int32_t(sizes.size());
    int32_t done = 0;
    for (int32_t r = 0; r < repeats; ++r) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            times[i].push_back(time_decode(sizes[i]));
            if (progress) progress(++done, total);
        }
    }
    model.kv_clear();
    CostCurve curve{sizes, {}};
    for (auto& t : times) {
        std::sort(t.begin(), t.end());
        const size_t m = t.size();
        curve.ms.push_back(m % 2 ? t[m / 2] : 0.5 * (t[m / 2 - 1] + t[m / 2]));
    }
    return non_decreasing ? monotone(curve) : curve;
}

}  // namespace spec
