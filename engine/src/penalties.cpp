#include "spec/penalties.h"

#include <cmath>
#include <string>

#include "spec/error.h"

namespace spec {

void validate(const PenaltyParams& p, int32_t n_vocab) {
    const auto in_range = [](float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; };
    if (!in_range(p.presence_penalty, -2.0f, 2.0f)) {
        throw InvalidArgumentError("presence_penalty must be in [-2, 2], got " + std::to_string(p.presence_penalty));
    }
    if (!in_range(p.frequency_penalty, -2.0f, 2.0f)) {
        throw InvalidArgumentError("frequency_penalty must be in [-2, 2], got " + std::to_string(p.frequency_penalty));
    }
    if (!in_range(p.repetition_penalty, 0.0f, 10.0f) || p.repetition_penalty == 0.0f) {
        throw InvalidArgumentError("repetition_penalty must be in (0, 10], got " +
                                   std::to_string(p.repetition_penalty));
    }
    for (const auto& [token, bias] : p.logit_bias) {
        if (token < 0 || token >= n_vocab) {
            throw InvalidArgumentError("logit_bias token " + std::to_string(token) + " is outside the vocabulary (0.." +
                                       std::to_string(n_vocab - 1) + ")");
        }
        if (!in_range(bias, -100.0f, 100.0f)) {
            throw InvalidArgumentError("logit_bias of token " + std::to_string(token) + " must be in [-100, 100], got " +
                                       std::to_string(bias));
        }
    }
}

PenaltyState::PenaltyState(const PenaltyParams& params, const std::vector<int32_t>& prompt) : params_(params) {
    if (params_.repetition_penalty != 1.0f) {
        in_prompt_.insert(prompt.begin(), prompt.end());
    }
}

void PenaltyState::push(int32_t token) { ++counts_[token]; }

void PenaltyState::apply(float* logits, int32_t n_vocab, const std::vector<int32_t>& extra) const {
    const std::unordered_map<int32_t, int32_t>* counts = &counts_;
    if (!extra.empty()) {
        row_counts_ = counts_;
        for (int32_t token : extra) ++row_counts_[token];
        counts = &row_counts_;
    }
    const float r = params_.repetition_penalty;
    if (r != 1.0f) {
        const auto penalise = [&](int32_t token) {
            if (token < 0 || token >= n_vocab) return;
            float& l = logits[token];
            l = l > 0.0f ? l / r : l * r;
        };
        for (int32_t token : in_prompt_) penalise(token);
        for (const auto& [token, n] : *counts) {
            if (!in_prompt_.count(token)) penalise(token);
        }
    }
    if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
        for (const auto& [token, n] : *counts) {
            if (token < 0 || token >= n_vocab) continue;
            logits[token] -= params_.presence_penalty + params_.frequency_penalty * float(n);
        }
    }
    for (const auto& [token, bias] : params_.logit_bias) logits[token] += bias;
}

}  // namespace spec
