// Measuring a model's cost curve on this machine (spec/schedule.h): the time of one decode of k
// tokens, at the thread count and backend the model was loaded with.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
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

// Decodes on top of cached tokens with llama.cpp's flash attention off and on, one token (a plain
// step) and `batch` tokens with a logits row each (a verification), for deciding which setting a
// model runs with on this machine. Each setting gets a context of its own on the model's weights
// (the model's own context and cache are left alone), as wide as the model's context up to
// kFlashAttnTimingWindow cells (the window changes what a decode without flash attention costs),
// filled with ordinary tokens to each of `depths` in turn (ascending); at each depth `rounds`
// rounds of `n_decodes` decodes of each size, the two settings alternating and swapping which
// goes first every round. A round times both settings within a few decodes of each other, so the
// ratio of its two means is little moved by a slow spell of a shared machine that would move
// either median; FlashAttentionTiming keeps the medians of the decodes and the median of the
// per-round ratios. Throws InvalidArgumentError for no depths, depths not ascending or < 1,
// n_decodes, rounds or batch < 1, ModelLoadError when llama.cpp cannot create either context,
// DecodeError when a decode fails.
struct FlashAttentionTiming {
    int32_t depth = 0;
    int32_t window = 0;         // cells of the timing contexts
    double ms_off = 0.0;        // median one-token decode, flash attention off
    double ms_on = 0.0;         // the same, on
    double batch_ms_off = 0.0;  // median decode of `batch` tokens, off
    double batch_ms_on = 0.0;   // the same, on
    double ratio = 0.0;         // median over rounds of (one-token decodes on) / (off), paired
    double batch_ratio = 0.0;   // the same for decodes of `batch` tokens
    int32_t rounds = 0;
};
std::vector<FlashAttentionTiming> time_flash_attention(Model& model, const std::vector<int32_t>& depths,
                                                       int32_t n_decodes, int32_t rounds, int32_t batch,
                                                       const CalibrationProgress& progress = nullptr);

// The flash-attention choice "auto" makes (Python `Engine(flash_attn="auto")`, the C API's
// pyspec_engine_decide_flash_attn): decodes timed at two depths of the window
// (flash_attention_depths: 256 and 1,024 tokens, a quarter and a half of the window when it is
// smaller than 2,048), read at the depth of a typical request's steps (flash_attention_at_depth:
// 320 tokens, or half a smaller window). The bundled suites' median prompts are 47 (chat), 67
// (math), 156 (code) and 240 (edit) tokens long, their answers 128-512, so a median step runs at
// ~170-300 tokens of context; 320 leans toward the longer requests, which take more steps.
constexpr int32_t kFlashAttnBatch = 8;          // the verification timed beside a one-token decode
constexpr int32_t kFlashAttnRequestDepth = 320;
constexpr double kFlashAttnMargin = 0.02;       // on only where at least this much cheaper
std::pair<int32_t, int32_t> flash_attention_depths(int32_t n_ctx);
int32_t flash_attention_at_depth(int32_t n_ctx);

// The choice from the timings at the two depths (shallow first): each paired ratio on / off is a
// straight line through its two depths, read at `at_depth`; a plain step's and a verification's
// count alike (their geometric mean, `ratio`: requests with nothing to copy are nearly all plain
// steps, copying ones spend much of their time verifying); on where `ratio` is below
// 1 - kFlashAttnMargin. Off is the setting the engine's numerics are characterised with first.
struct FlashAttentionDecision {
    FlashAttentionTiming near, far;
    int32_t at_depth = 0;
    double plain_ratio = 1.0;   // a one-token decode on / off at at_depth
    double verify_ratio = 1.0;  // a kFlashAttnBatch-token decode on / off at at_depth
    double ratio = 1.0;         // their geometric mean
    bool on = false;
};
FlashAttentionDecision choose_flash_attention(const FlashAttentionTiming& near, const FlashAttentionTiming& far,
                                              int32_t at_depth);
// Times the model at flash_attention_depths(model.n_ctx()) and chooses for
// flash_attention_at_depth(model.n_ctx()). Errors as time_flash_attention's.
FlashAttentionDecision decide_flash_attention(Model& model, int32_t n_decodes = 2, int32_t rounds = 12,
                                              const CalibrationProgress& progress = nullptr);

// The sizes measured when none are given: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64.
std::vector<int32_t> default_calibration_sizes();

}  // namespace spec
