// Output constrained by a GBNF grammar, through llama.cpp's grammar sampler: the target's rows are
// masked to the tokens the grammar allows after the tokens before them, and drafts are cut where
// the grammar forbids a token, so speculation reproduces constrained plain decoding exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llama.h"

namespace spec {

struct Draft;
class Model;

// One position's grammar state: what may follow the tokens accepted so far.
class Grammar {
public:
    // Throws InvalidArgumentError when llama.cpp cannot parse `gbnf` or it has no rule `root`.
    Grammar(const llama_vocab* vocab, const std::string& gbnf, const std::string& root);
    Grammar(const Grammar& other);  // an independent copy of the state
    Grammar& operator=(const Grammar&) = delete;
    ~Grammar();

    bool allows(int32_t token);
    // allowed[i] = whether the grammar allows tokens[i] next (one pass over all of them).
    void allows(const std::vector<int32_t>& tokens, std::vector<uint8_t>& allowed);
    // Advances past `token`, which the grammar must allow (an end-of-generation token is not fed).
    void accept(int32_t token);
    // Sets the logit of every token the grammar forbids to -inf.
    void mask(float* logits, int32_t n_vocab);
    // The argmax of the masked row: the row's own argmax when the grammar allows it (one token
    // checked), else the best allowed token after masking a copy (-1: the grammar allows none).
    int32_t argmax(const float* logits, int32_t n_vocab);

private:
    struct SamplerFree {
        void operator()(llama_sampler* s) const { llama_sampler_free(s); }
    };
    std::unique_ptr<llama_sampler, SamplerFree> sampler_;
    std::vector<llama_token_data> candidates_;
    std::vector<float> masked_;
};

// Drafts from the grammar alone: where it leaves one character possible (JSON's keys, quotes,
// colons and brackets under a schema), that character is as good as written. From a state, the
// text it forces is followed character by character while exactly one printable ASCII character
// (and no end of text) is allowed; where the only choice is an optional space before another
// character (a schema's `space ::= " "?`), the space is taken after ':' and ',' and left out
// elsewhere (the layout Python's json.dumps writes and models mostly copy). The text, tokenized,
// is a chain: trees cost more per step than such a guess saves. Verification decides what the
// target writes: the draft is a proposal like any other.

// The target's single-character tokens the scan tries, then its end-of-text token.
struct ForcedChars {
    std::vector<int32_t> tokens;
    std::vector<char> chars;  // [tokens - 1]
    explicit ForcedChars(const Model& target);
};

class ForcedText {
public:
    // chars: ForcedChars of target (built once per engine: it tokenizes ~100 strings).
    ForcedText(const Model& target, const ForcedChars& chars) : target_(target), chars_(chars) {}
    // Replaces `out` (an empty draft) by the forced continuation of `state`, at most n_max tokens.
    // last_char: the output's last character (whether an optional space comes first). Leaves
    // `out` empty when nothing is forced.
    void draft(const Grammar& state, char last_char, int32_t n_max, Draft& out);

    const Model& target_;
    const ForcedChars& chars_;
    std::vector<uint8_t> allowed_;
};

// The grammar states of one verification step: row 0 is the committed state, row i + 1 the state
// after node i (its parent's row after the node's token).
class StepGrammar {
public:
    // Drops every node the grammar forbids after its parent (with its descendants), so that each
    // remaining row has a state; keeps a chain a chain. draft.probs and draft.kinds follow.
    void prune(Grammar& committed, Draft& draft);
    Grammar& row(int32_t r) { return r == 0 ? *committed_ : *rows_[size_t(r - 1)]; }

private:
    Grammar* committed_ = nullptr;
    std::vector<std::unique_ptr<Grammar>> rows_;
};

}  // namespace spec
