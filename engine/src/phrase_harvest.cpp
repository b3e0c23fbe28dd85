// Harvesting phrases for the pool: pure functions over token lists, no pool and no model.
#include <string>
#include <vector>

#include "spec/error.h"
#include "spec/phrase_pool.h"

namespace spec {

VerificationHarvest harvest_verification(int32_t context_token, const std::vector<int32_t>& draft_tokens,
                                         const std::vector<int32_t>& target_tokens, int32_t min_match) {
    const size_t n_draft = draft_tokens.size();
    if (target_tokens.size() != n_draft && target_tokens.size() != n_draft + 1) {
        throw InvalidArgumentError(
            "harvest_verification: target_tokens must have n_draft or n_draft + 1 tokens (n_draft = " +
            std::to_string(n_draft) + "), got " + std::to_string(target_tokens.size()));
    }
    if (min_match < 1) {
        throw InvalidArgumentError("harvest_verification: min_match must be >= 1, got " + std::to_string(min_match));
    }
    VerificationHarvest harvest;
    size_t first_mismatch = 0;
    while (first_mismatch < n_draft && draft_tokens[first_mismatch] == target_tokens[first_mismatch]) {
        ++first_mismatch;
    }
    if (first_mismatch == n_draft) return harvest;  // accepted whole: nothing was discarded

    harvest.corrected.reserve(n_draft + 1);
    harvest.corrected.push_back(context_token);
    harvest.corrected.insert(harvest.corrected.end(), target_tokens.begin(),
                             target_tokens.begin() + std::ptrdiff_t(n_draft));

    // Runs of agreement in the discarded part. Position first_mismatch itself disagrees, so a run
    // starts at first_mismatch + 1 at the earliest and always has a draft token before it.
    size_t i = first_mismatch + 1;
    while (i < n_draft) {
        if (draft_tokens[i] != target_tokens[i]) {
            ++i;
            continue;
        }
        const size_t start = i;
        while (i < n_draft && draft_tokens[i] == target_tokens[i]) ++i;
        if (i - start < size_t(min_match)) continue;
        std::vector<int32_t> segment(draft_tokens.begin() + std::ptrdiff_t(start - 1),
                                     draft_tokens.begin() + std::ptrdiff_t(i));
        if (i < target_tokens.size()) segment.push_back(target_tokens[i]);  // the target's token after the run
        harvest.segments.push_back(std::move(segment));
    }
    return harvest;
}

std::vector<int32_t> extract_phrases(const std::vector<int32_t>& tokens, int32_t phrase_len, int32_t stride) {
    if (phrase_len < 2) {
        throw InvalidArgumentError("extract_phrases: phrase_len must be >= 2, got " + std::to_string(phrase_len));
    }
    if (stride < 1) throw InvalidArgumentError("extract_phrases: stride must be >= 1, got " + std::to_string(stride));
    std::vector<int32_t> phrases;  // [n_phrases, phrase_len]
    const size_t len = size_t(phrase_len);
    if (tokens.size() < len) return phrases;
    phrases.reserve(((tokens.size() - len) / size_t(stride) + 1) * len);
    for (size_t start = 0; start + len <= tokens.size(); start += size_t(stride)) {
        const auto window = tokens.begin() + std::ptrdiff_t(start);
        phrases.insert(phrases.end(), window, window + std::ptrdiff_t(len));
    }
    return phrases;
}

}  // namespace spec
