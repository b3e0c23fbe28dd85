// Sampling transforms: turn one row of logits into the probability distribution a token is drawn
// from. The same transform must be applied to the target's and the draft's logits, since exact
// rejection sampling compares p and q after the transforms (not the raw softmax).
#pragma once

#include <cstdint>
#include <vector>

#include "spec/rng.h"

namespace spec {

struct SamplingParams {
    float temperature = 0.0f;  // 0 means greedy (argmax); must be >= 0
    int32_t top_k = 0;         // keep the k most likely tokens; <= 0 disables
    float top_p = 1.0f;        // nucleus: smallest set with mass >= top_p; in (0, 1]
    float min_p = 0.0f;        // drop tokens with p < min_p * p_max; in [0, 1)

    bool greedy() const { return temperature <= 0.0f; }
};

// Throws InvalidArgumentError naming the bad field.
void validate(const SamplingParams& params);

// Index of the largest logit; ties go to the lowest index.
// logits: [n_vocab]
int32_t argmax(const float* logits, int32_t n_vocab);

// Writes the sampling distribution for `logits` into `probs` (resized to n_vocab): softmax of
// logits / temperature restricted to the tokens that survive top_k, then top_p, then min_p, and
// renormalised; every other entry is exactly 0. For greedy params the result is one-hot at the
// argmax. `scratch` is reused between calls to avoid allocation on the per-token path.
// logits: [n_vocab] float32, probs: [n_vocab] float32
void compute_probs(const float* logits, int32_t n_vocab, const SamplingParams& params,
                   std::vector<float>& probs, std::vector<int32_t>& scratch);

// Plain softmax at temperature 1, no truncation (what the online trainer learns from).
// logits: [n_vocab], probs: [n_vocab]
void softmax(const float* logits, int32_t n_vocab, std::vector<float>& probs);

// softmax(logits)[token] at temperature 1, without writing the distribution out.
// logits: [n_vocab]
float token_probability(const float* logits, int32_t n_vocab, int32_t token);

// log softmax(logits)[token] at temperature 1 (the model's own distribution, before any sampling
// transform), and the same for the k likeliest tokens: top_ids / top_logprobs are resized to
// min(k, n_vocab), likeliest first (top_k_entries' order). logits: [n_vocab]
float token_logprobs(const float* logits, int32_t n_vocab, int32_t token, int32_t k, std::vector<int32_t>& top_ids,
                     std::vector<float>& top_logprobs);

// Draws an index from a distribution whose entries sum to ~1 (renormalises by the actual sum).
// probs: [n]
int32_t sample_from(const float* probs, int32_t n, Rng& rng);

// The k largest entries of probs, largest first. ids/values are resized to min(k, n).
void top_k_entries(const float* probs, int32_t n, int32_t k, std::vector<int32_t>& ids,
                   std::vector<float>& values);

}  // namespace spec
