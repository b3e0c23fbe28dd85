#include "spec/grammar.h"

#include <cmath>
#include <limits>

#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/model.h"
#include "spec/sampling.h"

namespace spec {

Grammar::Grammar(const llama_vocab* vocab, const std::string& gbnf, const std::string& root) {
    if (gbnf.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw InvalidArgumentError("grammar is empty");
    }
    sampler_.reset(llama_sampler_init_grammar(vocab, gbnf.c_str(), root.c_str()));
    if (!sampler_) {
        throw InvalidArgumentError("grammar could not be parsed, or has no rule '" + root +
                                   "' (llama.cpp's log names the error)");
    }
}

Grammar::Grammar(const Grammar& other) : sampler_(llama_sampler_clone(other.sampler_.get())) {}

Grammar::~Grammar() = default;

bool Grammar::allows(int32_t token) {
    llama_token_data one{token, 0.0f, 0.0f};
    llama_token_data_array array{&one, 1, -1, false};
    llama_sampler_apply(sampler_.get(), &array);
    return std::isfinite(one.logit);
}

void Grammar::allows(const std::vector<int32_t>& tokens, std::vector<uint8_t>& allowed) {
    candidates_.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) candidates_[i] = {tokens[i], 0.0f, 0.0f};
    llama_token_data_array array{candidates_.data(), candidates_.size(), -1, false};
    llama_sampler_apply(sampler_.get(), &array);
    allowed.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) allowed[i] = std::isfinite(candidates_[i].logit);
}

void Grammar::accept(int32_t token) { llama_sampler_accept(sampler_.get(), token); }

void Grammar::mask(float* logits, int32_t n_vocab) {
    candidates_.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) candidates_[size_t(i)] = {i, logits[i], 0.0f};
    llama_token_data_array array{candidates_.data(), size_t(n_vocab), -1, false};
    llama_sampler_apply(sampler_.get(), &array);
    // The grammar sampler masks in place and keeps the order; index by id all the same.
    for (size_t i = 0; i < array.size; ++i) logits[array.data[i].id] = array.data[i].logit;
}

int32_t Grammar::argmax(const float* logits, int32_t n_vocab) {
    const int32_t best = spec::argmax(logits, n_vocab);
    if (allows(best)) return best;
    masked_.assign(logits, logits + n_vocab);
    mask(masked_.data(), n_vocab);
    const int32_t allowed = spec::argmax(masked_.data(), n_vocab);
    return std::isfinite(masked_[size_t(allowed)]) ? allowed : -1;
}

namespace {

constexpr int32_t kMaxForcedChars = 64;

}  // namespace

ForcedChars::ForcedChars(const Model& target) {
    // Structure characters first: the scan stops early at the second allowed one.
    std::string order = " \"\n,:{}[]";
    for (int c = 33; c < 127; ++c) {
        if (order.find(char(c)) == std::string::npos) order.push_back(char(c));
    }
    for (char c : order) {
        const std::vector<int32_t> ids = target.tokenize(std::string(1, c), false, false);
        if (ids.size() == 1) {
            tokens.push_back(ids[0]);
            chars.push_back(c);
        }
    }
    const Model::SpecialTokens special = target.special_tokens();
    const int32_t end = special.eos >= 0 ? special.eos : special.eot;
    if (end >= 0) tokens.push_back(end);
}

void ForcedText::draft(const Grammar& state, char last_char, int32_t n_max, Draft& out) {
    if (n_max <= 0 || chars_.chars.empty()) return;
    Grammar g(state);
    std::string text;
    const size_t n_chars = chars_.chars.size();
    char previous = last_char;
    while (int32_t(text.size()) < kMaxForcedChars) {
        g.allows(chars_.tokens, allowed_);
        if (chars_.tokens.size() > n_chars && allowed_[n_chars]) break;  // the text may end here
        int32_t first = -1, second = -1, n_allowed = 0;
        for (size_t i = 0; i < n_chars && n_allowed < 3; ++i) {
            if (!allowed_[i]) continue;
            (n_allowed == 0 ? first : second) = int32_t(i);
            ++n_allowed;
        }
        int32_t pick = -1;
        if (n_allowed == 1) {
            pick = first;
        } else if (n_allowed == 2 && chars_.chars[size_t(first)] == ' ') {
            pick = previous == ':' || previous == ',' ? first : second;
        }
        if (pick < 0) break;
        previous = chars_.chars[size_t(pick)];
        text.push_back(previous);
        g.accept(chars_.tokens[size_t(pick)]);
    }
    if (text.empty()) return;
    out.tokens = target_.tokenize(text, false, false);
    if (out.tokens.size() > size_t(n_max)) out.tokens.resize(size_t(n_max));
}

void StepGrammar::prune(Grammar& committed, Draft& draft) {
    committed_ = &committed;
    rows_.clear();
    const size_t n = draft.tokens.size();
    if (n == 0) return;
    const bool chain = draft.parents.empty();
    const size_t row_size = n > 0 ? draft.probs.size() / n : 0;
    std::vector<int32_t> new_index(n, -1);  // old node -> kept node, -1: dropped
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
        const int32_t parent = chain ? int32_t(i) - 1 : draft.parents[i];
        if (parent >= 0 && new_index[size_t(parent)] < 0) continue;  // its parent was dropped
        Grammar& before = parent < 0 ? committed : *rows_[size_t(new_index[size_t(parent)])];
        const int32_t token = draft.tokens[i];
        if (!before.allows(token)) {
            if (chain) break;
            continue;
        }
        auto state = std::make_unique<Grammar>(before);
        state->accept(token);
        rows_.push_back(std::move(state));
        new_index[i] = int32_t(kept);
        draft.tokens[kept] = token;
        if (!chain) draft.parents[kept] = parent < 0 ? -1 : new_index[size_t(parent)];
        if (!draft.kinds.empty()) draft.kinds[kept] = draft.kinds[i];
        if (row_size > 0 && kept != i) {
            std::copy(draft.probs.begin() + long(i * row_size), draft.probs.begin() + long((i + 1) * row_size),
                      draft.probs.begin() + long(kept * row_size));
        }
        ++kept;
    }
    draft.tokens.resize(kept);
    if (!chain) draft.parents.resize(kept);
    if (!draft.kinds.empty()) draft.kinds.resize(kept);
    if (row_size > 0) draft.probs.resize(kept * row_size);
}

}  // namespace spec
