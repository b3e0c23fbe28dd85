// Drafters propose tokens for the target to verify. The decoder talks to every drafter through
// this interface only (begin / draft / accept / stats) and never special-cases a type.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "spec/rng.h"
#include "spec/sampling.h"

namespace spec {

class Model;

struct DraftRequest {
    const std::vector<int32_t>* tokens = nullptr;  // committed sequence: prompt + generated so far
    int32_t n_draft_max = 0;                       // propose at most this many tokens
    const SamplingParams* sampling = nullptr;      // the target's sampling transform (q must match)
    Rng* rng = nullptr;
};

struct Draft {
    std::vector<int32_t> tokens;  // [n] the proposed chain
    // [n, n_vocab] row i: the distribution tokens[i] was drawn from. Empty when the proposal is
    // deterministic (greedy drafting, lookup): verification then treats q as one-hot.
    std::vector<float> probs;
};

struct DrafterStats {
    int64_t n_draft_calls = 0;    // draft() calls
    int64_t n_model_decodes = 0;  // llama_decode calls spent drafting (0 for model-free drafters)
    int64_t n_proposed = 0;
    int64_t n_accepted = 0;
};

class Drafter {
public:
    virtual ~Drafter() = default;
    virtual std::string name() const = 0;
    // A new request starts; `prompt` are all prompt tokens.
    virtual void begin(const std::vector<int32_t>& prompt) = 0;
    // Proposes up to request.n_draft_max tokens that follow *request.tokens.
    virtual void draft(const DraftRequest& request, Draft& out) = 0;
    // The target accepted the first n_accepted tokens of the last draft; committed is the new
    // committed sequence (it ends with the recovered/bonus token, not yet seen by the drafter).
    virtual void accept(const std::vector<int32_t>& committed, int32_t n_accepted) = 0;
    virtual DrafterStats stats() const = 0;
};

// A GGUF draft model proposing a chain autoregressively. Its KV cache is kept in step with the
// target: rejected draft tokens are dropped, committed tokens it has not seen are fed on the next
// draft() call together with the first draft decode.
std::unique_ptr<Drafter> make_model_chain_drafter(Model& draft_model);

// Settings of the prompt-lookup drafter. Matches of ngram_max tokens are tried first, then
// shorter ones down to ngram_min; 1 <= ngram_min <= ngram_max <= kLookupNgramLimit.
struct LookupParams {
    int32_t ngram_max = 3;  // longest suffix of the committed sequence searched for
    int32_t ngram_min = 1;  // shortest suffix tried before giving up (no proposal)
};
constexpr int32_t kLookupNgramLimit = 16;

// Prompt lookup decoding, no model: the last n committed tokens (n = ngram_max down to
// ngram_min, longest first) are looked up among earlier positions of the committed sequence
// (prompt + generated); the tokens that followed the most recent earlier occurrence are proposed,
// up to n_draft_max. When the continuation reaches the end of the sequence it goes on through
// the tokens just proposed, which repeats a periodic pattern. No match: an empty draft. The
// proposal is deterministic (Draft.probs stays empty). An n-gram index (hash of n tokens ->
// latest position) grows with the sequence: a step costs O(ngram_max) hash operations per new
// committed token plus O(ngram_max + n_draft_max), never a scan of the sequence.
// Throws InvalidArgumentError when params are outside the range above.
std::unique_ptr<Drafter> make_prompt_lookup_drafter(const LookupParams& params);

// Throws InvalidArgumentError naming the values when params are outside the range above.
void validate(const LookupParams& params);

}  // namespace spec
