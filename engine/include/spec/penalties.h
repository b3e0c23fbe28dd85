// Penalties and biases on the target's logits, applied to every verification row under the
// tokens of that row's own path (the output so far plus the draft tokens above the row), so that
// speculation reproduces exactly the penalised distribution plain decoding samples from.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace spec {

struct PenaltyParams {
    // OpenAI's: logit[t] -= presence_penalty * (t occurred) + frequency_penalty * count(t), over
    // the generated tokens. 0: off. Each in [-2, 2].
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    // The multiplicative repetition penalty of CTRL (as in transformers and vLLM): for every token
    // that occurred in the prompt or the output, logit / r where the logit is positive, logit * r
    // otherwise. 1: off. In (0, 10].
    float repetition_penalty = 1.0f;
    // (token, bias) pairs added to the logits of every row; OpenAI's logit_bias, each in [-100, 100].
    std::vector<std::pair<int32_t, float>> logit_bias;

    bool active() const {
        return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
               !logit_bias.empty();
    }
};

// Throws InvalidArgumentError naming the value outside its range (or a bias token outside the
// vocabulary).
void validate(const PenaltyParams& params, int32_t n_vocab);

// The counts one request's penalties read: the tokens generated so far and those of the prompt.
class PenaltyState {
public:
    PenaltyState(const PenaltyParams& params, const std::vector<int32_t>& prompt);

    // One more generated token.
    void push(int32_t token);

    // logits: [n_vocab] one row, changed in place: the penalties for the output so far plus
    // `extra` (the draft tokens on the row's path, root first), then the biases.
    void apply(float* logits, int32_t n_vocab, const std::vector<int32_t>& extra) const;

private:
    PenaltyParams params_;
    std::unordered_map<int32_t, int32_t> counts_;  // generated token -> occurrences
    std::unordered_set<int32_t> in_prompt_;        // prompt tokens (repetition penalty only)
    mutable std::unordered_map<int32_t, int32_t> row_counts_;  // apply's scratch
};

}  // namespace spec
