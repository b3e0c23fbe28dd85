// Measuring a model's cost curve on this machine (spec/schedule.h): the time of one decode of k
// tokens, at the thread count and backend the model was loaded with.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "spec/schedule.h"

namespace spec {

class Model;

// Called after each measured decode with (done, total).
using CalibrationProgress = std::function<void(int32_t, int32_t)>;

// Times one decode of k tokens for every k in `sizes` (increasing, from 1), on top of `context`
// tokens already in the cache (at most what the context window leaves; the default, 128, is a
// short conversation: attention over a long context makes every size slower, 15-34% at 2,048
// tokens on the development CPU), as verification and drafting see it. all_rows: every
// token produces a logits row (the target verifying a draft) or only the last (a draft model
// drafting). One warm-up decode, then `repeats` rounds over all sizes (sizes interleaved, so a
// slow spell of a shared machine hits all of them alike); the median per size, made monotone
// (a running maximum) unless non_decreasing is false (benchmarks that look at the raw shape).
// Clears the model's KV cache before and after. Throws InvalidArgumentError for bad sizes or
// repeats < 1 or context < 1, and when the largest size does not fit n_batch or the context.
constexpr int32_t kCalibrationContext = 128;
CostCurve measure_cost_curve(Model& model, const std::vector<int32_t>& sizes, int32_t repeats, bool all_rows,
                             const CalibrationProgress& progress = nullptr, int32_t context = kCalibrationContext,
                             bool non_decreasing = true);

// The largest window the timing contexts take (cells): V's transposed rows are 8 KiB apart there
// in F16, each on pages of its own as in any wider window, and two such contexts stay small
// beside the engine's own.
constexpr int32_t kFlashAttnTimingWindow = 4096;

// Decodes on top of `depth` cached tokens with llama.cpp's flash attention off and on, one token
// (a plain step) and `batch` tokens with a logits row each (a verification), for deciding which
// setting a model runs with on this machine (FlashAttentionTiming: the median of each). Each
// setting gets a context of its own on the model's weights (the model's own context and cache are
// left alone), as wide as the model's context up to kFlashAttnTimingWindow cells (the window
// changes what a decode without flash attention costs), filled with `depth` ordinary tokens;
// then `rounds` rounds of `n_decodes` decodes of each size, the two settings alternating and
// swapping which goes first every round, so that a slow spell of a shared machine hits both
// alike. Throws InvalidArgumentError for depth, n_decodes, rounds or batch < 1, ModelLoadError
// when llama.cpp cannot create either context, DecodeError when a decode fails.
struct FlashAttentionTiming {
    int32_t depth = 0;
    int32_t window = 0;         // cells of the timing contexts
    double ms_off = 0.0;        // median one-token decode, flash attention off
    double ms_on = 0.0;         // the same, on
    double batch_ms_off = 0.0;  // median decode of `batch` tokens, off
    double batch_ms_on = 0.0;   // the same, on
};
FlashAttentionTiming time_flash_attention(Model& model, int32_t depth, int32_t n_decodes, int32_t rounds,
                                          int32_t batch, const CalibrationProgress& progress = nullptr);

// The sizes measured when none are given: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64.
std::vector<int32_t> default_calibration_sizes();

}  // namespace spec
