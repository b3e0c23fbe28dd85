// Prompt lookup decoding: propose what followed the most recent earlier occurrence of the
// committed sequence's last n tokens. No model; an n-gram index grows with the sequence, so a
// draft costs a few hash lookups instead of a scan of the whole sequence.
#include <algorithm>
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "spec/drafter.h"
#include "spec/error.h"
#include "spec/schedule.h"

namespace spec {
namespace {

constexpr uint64_t kHashSeed = 0x2545f4914f6cdd1dULL;

// Earlier occurrences of a match's key read when marking contested nodes (the most recent first):
// enough for a module of a few dozen similar functions, bounded so a key as common as a newline
// costs a bounded walk.
constexpr int32_t kMaxRivals = 32;

// Breaks waiting for the output to copy again (LookupParams::substitutions), the latest kept.
constexpr size_t kMaxPendingBreaks = 4;

// Tokens the output and the source must agree on before a replaced stretch that
// learn_from_pickup learns.
constexpr int32_t kPickupAnchor = 1;

// Calls f(j, r) for each replacement of r source tokens by j output tokens within the
// substitution limits, the fewest tokens in all first (fewer output tokens first among equals),
// until f returns true; whether one did.
template <typename F>
bool first_replacement(F&& f) {
    for (int32_t total = 2; total <= kSubstitutionMaxOld + kSubstitutionMaxNew; ++total) {
        for (int32_t j = std::max(1, total - kSubstitutionMaxOld); j <= std::min(kSubstitutionMaxNew, total - 1); ++j) {
            if (f(j, total - j)) return true;
        }
    }
    return false;
}

// splitmix64's finaliser over (h ^ token): n-gram hashes are built from the last token
// backwards, so one pass gives the hashes of every length ending at one position.
uint64_t hash_step(uint64_t h, int32_t token) {
    uint64_t z = (h ^ uint64_t(uint32_t(token))) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

class PromptLookupDrafter final : public Drafter {
public:
    explicit PromptLookupDrafter(const LookupParams& params)
        : params_(params),
          index_(size_t(params.ngram_max - params.ngram_min + 1)),
          previous_(size_t(params.ngram_max - params.ngram_min + 1)) {
        // The engine hands them sorted (most of a vocabulary starts at the left margin): sorted
        // once per request only when they are not.
        for (auto* tokens : {&params_.stop_tokens, &params_.blank_line_tokens, &params_.unit_start_tokens,
                             &params_.fence_tokens}) {
            if (!std::is_sorted(tokens->begin(), tokens->end())) std::sort(tokens->begin(), tokens->end());
        }
    }

    std::string name() const override { return "prompt-lookup"; }

    void begin(const std::vector<int32_t>& prompt) override {
        reset();
        n_prompt_ = int32_t(prompt.size());
        for (auto& by_hash : index_) by_hash.reserve(prompt.size());
        extend(prompt);
    }

    void draft(const DraftRequest& request, Draft& out) override {
        out.clear();  // deterministic proposal (no probs): verification treats q as one-hot
        ++stats_.n_draft_calls;
        extend(*request.tokens);
        // Where the last proposal ran through a substitution and the output followed it, the copy
        // goes on from there: the sequence's suffix no longer matches the source across the
        // replacement, so the longest match would lose the copy. (Reads the last proposal's node_*
        // before this one rebuilds them.)
        CopyState copy = params_.substitutions ? learn_and_resume() : CopyState{};
        const bool resumed = copy.pos >= 0;
        Match match;
        int32_t n_matched = copy.run;
        bool resynced = false;
        const int32_t answer_start = resumed ? -1 : opening_fence_in_prompt();
        if (answer_start >= 0) {
            copy = {answer_start, -1, 0, 0};
        } else if (!resumed) {
            match = find_continuation();
            n_matched = match.start >= 0 ? matched_length(match) : 0;
            // Shortly after a long copy broke, a short match elsewhere is a worse guess than the
            // source where the copy left off.
            const bool may_resync = params_.substitutions && params_.resync && n_matched < kSubstitutionMinMatch;
            const int32_t resync = may_resync ? find_resync() : -1;
            resynced = resync >= 0 && resync != match.start;
            if (resynced) {
                n_matched = kSubstitutionMinMatch;
                copy = {resync, -1, 0, n_matched};
            } else {
                if (match.start < 0) return;
                if (params_.substitutions) learn_from_pickup(match.start, n_matched);
                copy = {match.start, -1, 0, n_matched};
            }
        }
        const int32_t start = copy.pos;
        // Past the end of the sequence the continuation reads the tokens proposed so far, as if
        // they were committed: a pattern of period n_tokens - start repeats.
        const int32_t n_tokens = int32_t(tokens_.size());
        node_src_.clear();
        node_sub_.clear();
        node_loose_.clear();
        node_next_.clear();
        bool stopped = false;
        while (int32_t(out.tokens.size()) < request.n_draft_max) {
            if (copy.sub < 0 && !subs_.empty() && copy.pos < n_tokens) {
                copy.sub = substitution_at(copy.pos, n_tokens, &copy.loose);
                copy.offset = 0;
            }
            int32_t token = 0, src = -1;
            const int32_t sub = copy.sub;
            if (sub >= 0) {  // the replacement's next token; past its end the copy skips the old stretch
                const Substitution& s = subs_[size_t(sub)];
                if (copy.offset >= int32_t(s.new_tokens.size())) {
                    copy.pos += int32_t(s.old_tokens.size());
                    copy.sub = -1;
                    copy.offset = 0;
                    continue;
                }
                token = s.new_tokens[size_t(copy.offset++)];
            } else {
                const int32_t pos = copy.pos;
                if (pos >= n_tokens && pos - n_tokens >= int32_t(out.tokens.size())) break;
                token = pos < n_tokens ? tokens_[size_t(pos)] : out.tokens[size_t(pos - n_tokens)];
                src = pos;
                ++copy.pos;
            }
            stopped = std::binary_search(params_.stop_tokens.begin(), params_.stop_tokens.end(), token);
            if (stopped) break;
            out.tokens.push_back(token);
            node_src_.push_back(src);
            node_sub_.push_back(sub);
            node_loose_.push_back(sub >= 0 && copy.loose);
            node_next_.push_back(copy);
        }
        // Node i continues a match of match.n + i tokens (spec/schedule.h, node kinds), except
        // the last one before a stop token; a short match inside the output, the answer-start
        // proposal's first nodes and the first nodes after a short key holding an opening fence
        // (LookupParams::fence_tokens) are kinds of their own.
        const bool short_output_match =
            !resumed && !resynced && answer_start < 0 && start > n_prompt_ && n_matched < kLongOutputMatch;
        const bool fenced = !resumed && !resynced && !short_output_match && n_matched < kFenceMaxMatch &&
                            key_opens_block(n_matched);
        out.kinds.resize(out.tokens.size());
        size_t first_substituted = out.tokens.size();
        for (size_t i = 0; i < out.tokens.size(); ++i) {
            const int32_t n_run = n_matched + int32_t(i);
            if (node_sub_[i] >= 0) {
                out.kinds[i] = node_loose_[i] ? kind_lookup_substituted_loose() : kind_lookup_substituted();
                first_substituted = std::min(first_substituted, i);
            } else if (resynced) {
                out.kinds[i] = kind_lookup_resync();
            } else if (answer_start >= 0) {
                out.kinds[i] = int32_t(i) < kAnswerStartDepth ? kind_lookup_answer_start() : kind_lookup(n_run);
            } else if (fenced && int32_t(i) < kFenceDepth) {
                out.kinds[i] = kind_lookup_fence();
            } else {
                out.kinds[i] = short_output_match ? kind_lookup_output(n_matched)
                               : ends_unit(out, i)  ? kind_lookup_boundary(n_run)
                                                    : kind_lookup(n_run);
            }
        }
        // A resumed or resynced copy has no key of its own to compare with other occurrences.
        if (!resumed && !resynced && answer_start < 0) mark_contested(match, out, first_substituted);
        if (stopped && !out.kinds.empty()) out.kinds.back() = kind_lookup_end();
        stats_.n_proposed += int64_t(out.tokens.size());
        // A resync the output does not follow is no break of its own (the break it guesses the end
        // of is still pending); one it follows goes on as a resumed copy (learn_and_resume).
        if (params_.substitutions) remember(out, n_tokens, resynced ? kSubstitutionMinMatch - 1 : n_matched, resynced);
    }

    void accept(const std::vector<int32_t>& committed, int32_t n_accepted) override {
        stats_.n_accepted += n_accepted;
        extend(committed);
    }

    DrafterStats stats() const override { return stats_; }

private:
    void reset() {
        tokens_.clear();
        fences_.clear();
        n_indexed_ = 0;
        for (auto& by_hash : index_) by_hash.clear();
        for (auto& prev : previous_) prev.clear();
        subs_.clear();
        breaks_.clear();
        last_pickup_ = -1;
        expected_.clear();
    }

    // Appends the committed tokens not seen yet and indexes every n-gram that now has a
    // following token. Within a request the committed sequence only grows; a shorter one means
    // begin() was skipped, and the index is rebuilt.
    void extend(const std::vector<int32_t>& committed) {
        if (committed.size() < tokens_.size()) reset();
        for (size_t i = tokens_.size(); i < committed.size(); ++i) {
            if (contains(params_.fence_tokens, committed[i])) fences_.push_back(int32_t(i));
        }
        tokens_.insert(tokens_.end(), committed.begin() + std::ptrdiff_t(tokens_.size()), committed.end());
        for (; n_indexed_ + 1 < int32_t(tokens_.size()); ++n_indexed_) index_ngrams_ending_at(n_indexed_);
    }

    // Records position last + 1 as the continuation of every n-gram ending at `last`. Positions
    // are indexed in increasing order, so each entry ends up holding the most recent occurrence.
    // The entry it replaces becomes the previous occurrence of that n-gram (previous_).
    void index_ngrams_ending_at(int32_t last) {
        uint64_t h = kHashSeed;
        const int32_t n_max = std::min(params_.ngram_max, last + 1);
        for (size_t i = 0; i < previous_.size(); ++i) previous_[i].resize(size_t(last) + 2, -1);
        for (int32_t n = 1; n <= n_max; ++n) {
            h = hash_step(h, tokens_[size_t(last - n + 1)]);
            if (n < params_.ngram_min) continue;
            const size_t i = size_t(n - params_.ngram_min);
            const auto [it, inserted] = index_[i].try_emplace(h, last + 1);
            if (!inserted) {
                previous_[i][size_t(last) + 1] = it->second;
                it->second = last + 1;
            }
        }
    }

    struct Match {
        int32_t start = -1;  // first continuation token
        int32_t n = 0;       // tokens of the matched suffix
    };

    // Start of the tokens that followed the longest, then most recent, earlier occurrence of a
    // suffix of the sequence (ngram_max down to ngram_min tokens); start -1 when there is none.
    // The index only holds n-grams with a following token, so the suffix never matches itself.
    Match find_continuation() const {
        const int32_t n_tokens = int32_t(tokens_.size());
        const int32_t n_max = std::min(params_.ngram_max, n_tokens);
        uint64_t suffix_hash[kLookupNgramLimit + 1] = {};  // [n] hash of the last n tokens
        uint64_t h = kHashSeed;
        for (int32_t n = 1; n <= n_max; ++n) {
            h = hash_step(h, tokens_[size_t(n_tokens - n)]);
            suffix_hash[n] = h;
        }
        for (int32_t n = n_max; n >= params_.ngram_min; --n) {
            const auto& by_hash = index_[size_t(n - params_.ngram_min)];
            const auto it = by_hash.find(suffix_hash[n]);
            if (it == by_hash.end()) continue;
            const int32_t start = it->second;
            // A hash collision is possible in principle; only a real match counts.
            if (std::equal(tokens_.end() - n, tokens_.end(), tokens_.begin() + (start - n))) return {start, n};
        }
        return {};
    }

    static bool contains(const std::vector<int32_t>& sorted, int32_t token) {
        return std::binary_search(sorted.begin(), sorted.end(), token);
    }

    // Whether proposal node i (copied from source position node_src_[i]) ends a blank line that the
    // copied text follows with a token at the left margin: the end of a top-level unit of the
    // source. The token after it is the source's, or the proposal's own next node past the
    // sequence's end.
    bool ends_unit(const Draft& out, size_t i) const {
        if (!contains(params_.blank_line_tokens, out.tokens[i])) return false;
        const int32_t next_pos = node_src_[i] + 1;
        const int32_t n_tokens = int32_t(tokens_.size());
        int32_t next = -1;
        if (next_pos < n_tokens) {
            next = tokens_[size_t(next_pos)];
        } else if (i + 1 < out.tokens.size()) {
            next = out.tokens[i + 1];
        }
        return next >= 0 && contains(params_.unit_start_tokens, next);
    }

    // Whether the fence token at position p opens a code block: its next token, at the left
    // margin, is a language tag (```python), where a closing fence or one quoted in prose
    // (```\n, ``` code) goes on with whitespace.
    bool opens_block(int32_t p) const {
        return p + 1 < int32_t(tokens_.size()) && contains(params_.unit_start_tokens, tokens_[size_t(p) + 1]);
    }

    // Before the output's first token: the prompt's last fence that opens a code block the prompt
    // also closes, where an answer that writes the given code out again starts; -1 when there is
    // none or the output has begun. A block counts as closed when a later fence token or a stop
    // token (the end of a chat message) follows it: a closing fence can be split across tokens
    // ("``" "`\n\n"), and a prompt that ends inside an open block asks for its continuation, not
    // for the block again.
    int32_t opening_fence_in_prompt() const {
        if (int32_t(tokens_.size()) != n_prompt_) return -1;
        int32_t last_stop = -1;
        for (int32_t i = n_prompt_ - 1; i >= 0 && last_stop < 0; --i) {
            if (contains(params_.stop_tokens, tokens_[size_t(i)])) last_stop = i;
        }
        for (size_t i = fences_.size(); i-- > 0;) {
            const int32_t p = fences_[i];
            const bool closed = i + 1 < fences_.size() || p < last_stop;
            if (closed && opens_block(p)) return p;
        }
        return -1;
    }

    // Whether the sequence's last n tokens (a match's key) hold a fence that opens a code block,
    // its tag and at least one token more.
    bool key_opens_block(int32_t n) const {
        const int32_t n_tokens = int32_t(tokens_.size());
        const auto first = std::lower_bound(fences_.begin(), fences_.end(), n_tokens - n);
        return std::any_of(first, fences_.end(), [&](int32_t p) { return p + 2 < n_tokens && opens_block(p); });
    }

    // How many tokens before the continuation agree with the end of the sequence: the n-gram the
    // index found, extended backwards up to kMaxMatchLen (the index only knows up to ngram_max).
    int32_t matched_length(const Match& match) const {
        const int32_t n_tokens = int32_t(tokens_.size());
        int32_t n = match.n;
        while (n < kMaxMatchLen && match.start - n - 1 >= 0 &&
               tokens_[size_t(match.start - n - 1)] == tokens_[size_t(n_tokens - n - 1)]) {
            ++n;
        }
        return n;
    }

    // Marks the nodes where the key's earlier occurrences disagree (kind_lookup_contested): the
    // copy follows the most recent occurrence of its key; every other occurrence whose
    // continuation has agreed with the draft so far is a rival, and a node where a rival went on
    // differently is a guess between them (a module of similar functions repeats short keys with
    // different continuations). Rivals are followed only through committed tokens, and only up to
    // node `limit` (the first substituted node: past it the proposal no longer lines up with the
    // source).
    void mark_contested(const Match& match, Draft& out, size_t limit) const {
        const int32_t n_tokens = int32_t(tokens_.size());
        const std::vector<int32_t>& prev = previous_[size_t(match.n - params_.ngram_min)];
        rivals_.clear();
        for (int32_t r = prev[size_t(match.start)]; r >= 0 && int32_t(rivals_.size()) < kMaxRivals;
             r = prev[size_t(r)]) {
            // Same hash; only a real occurrence of the key counts.
            if (std::equal(tokens_.end() - match.n, tokens_.end(), tokens_.begin() + (r - match.n))) rivals_.push_back(r);
        }
        for (size_t i = 0; i < limit && !rivals_.empty(); ++i) {
            bool contested = false;
            size_t n_alive = 0;
            for (const int32_t r : rivals_) {
                const int32_t pos = r + int32_t(i);
                if (pos >= n_tokens) continue;  // its continuation is not known yet
                if (tokens_[size_t(pos)] != out.tokens[i]) {
                    contested = true;
                    continue;
                }
                rivals_[n_alive++] = r;
            }
            rivals_.resize(n_alive);
            if (contested) out.kinds[i] = kind_lookup_contested();
        }
    }

    // ---- substitutions (LookupParams::substitutions) ----

    struct Substitution {
        int32_t before = -1;              // the source's token before the stretch
        std::vector<int32_t> old_tokens;  // the source's stretch
        std::vector<int32_t> new_tokens;  // what the output wrote instead
        bool alive = true;
        int32_t provisional_for = -1;     // learnt before the break at this output position settled
        std::vector<int32_t> kept_after;  // tokens after which the output kept the old stretch
    };

    // Where a copy goes on: source position pos, or first the rest of substitution `sub` from
    // its token `offset` (then pos is the start of the stretch it replaces). run: the match
    // length the copy counts from. pos -1: no copy.
    struct CopyState {
        int32_t pos = -1;
        int32_t sub = -1;
        int32_t offset = 0;
        int32_t run = 0;
        bool loose = false;  // sub was learnt after another token than the one before pos
    };

    // A long copy broke: the output's token at `out` was not the source's at `src`.
    struct Break {
        int32_t src;
        int32_t out;
    };

    // The substitution whose old stretch starts at source position pos after the same token as
    // where it was learnt (the longest), or -1. The token before keeps a replacement to the
    // context it was seen in: an answer that renames a variable keeps the same word in its prose.
    // Failing that, with loose set, the longest learnt after another token, unless the output
    // kept the old stretch after this one (kept_after); *loose says which it found.
    int32_t substitution_at(int32_t pos, int32_t n_tokens, bool* loose) const {
        int32_t best = -1, best_loose = -1;
        size_t best_len = 0, best_loose_len = 0;
        *loose = false;
        if (pos < 1) return best;
        const int32_t before = tokens_[size_t(pos - 1)];
        for (size_t i = 0; i < subs_.size(); ++i) {
            const Substitution& s = subs_[i];
            const size_t len = s.old_tokens.size();
            if (!s.alive || size_t(pos) + len > size_t(n_tokens)) continue;
            const bool same = before == s.before;
            if (same ? len <= best_len : len <= best_loose_len) continue;
            if (!same && std::find(s.kept_after.begin(), s.kept_after.end(), before) != s.kept_after.end()) continue;
            if (std::equal(s.old_tokens.begin(), s.old_tokens.end(), tokens_.begin() + pos)) {
                (same ? best : best_loose) = int32_t(i);
                (same ? best_len : best_loose_len) = len;
            }
        }
        if (best >= 0 || !params_.loose_substitutions) return best;
        *loose = best_loose >= 0;
        return best_loose;
    }

    // The proposal just made, to compare with what gets committed (learn_and_resume); its
    // per-node state stays in node_src_, node_sub_ and node_next_ until the next draft.
    void remember(const Draft& out, int32_t n_tokens, int32_t n_matched, bool resynced) {
        expected_ = out.tokens;
        expected_at_ = n_tokens;
        expected_run_ = n_matched;
        expected_resynced_ = resynced;
    }

    // Where the copy goes on after the latest pending break (LookupParams::resync), while the
    // output has written at most kSubstitutionMaxNew tokens of its own since: the nearest source
    // position at most kSubstitutionMaxOld tokens after the break whose preceding source token is
    // the output's last token. -1: none.
    int32_t find_resync() const {
        if (breaks_.empty()) return -1;
        const Break& b = breaks_.back();
        const int32_t n_tokens = int32_t(tokens_.size());
        const int32_t n_new = n_tokens - b.out;  // the output's tokens since, the one that broke it first
        if (n_new < 1 || n_new > kSubstitutionMaxNew) return -1;
        const int32_t last = tokens_[size_t(n_tokens - 1)];
        for (int32_t r = 1; r <= kSubstitutionMaxOld && b.src + r < b.out; ++r) {
            if (tokens_[size_t(b.src + r - 1)] == last) return b.src + r;
        }
        return -1;
    }

    // Compares the tokens committed since the last proposal with it: a substituted node the
    // output did not follow forgets its substitution; a long copy's node it did not follow is a
    // break, settled into a substitution once the output copies again (settle). When the output
    // followed the whole proposal so far and that ran through a substitution or resumed the copy
    // after a break (find_resync), the copy state to resume from; else pos -1.
    CopyState learn_and_resume() {
        CopyState resume;
        const int32_t n_tokens = int32_t(tokens_.size());
        if (!expected_.empty() && expected_at_ <= n_tokens) {
            const int32_t n_new = n_tokens - expected_at_;
            const int32_t n_expected = int32_t(expected_.size());
            int32_t k = 0;
            while (k < n_new && k < n_expected && tokens_[size_t(expected_at_ + k)] == expected_[size_t(k)]) ++k;
            if (k < n_new && k < n_expected) {
                const int32_t sub = node_sub_[size_t(k)];
                const int32_t src = node_src_[size_t(k)];
                if (sub >= 0 && node_loose_[size_t(k)]) {
                    // Kept the old stretch (or wrote something else) after this token: not here.
                    Substitution& s = subs_[size_t(sub)];
                    const int32_t pos = node_next_[size_t(k)].pos;
                    if (pos >= 1) s.kept_after.push_back(tokens_[size_t(pos - 1)]);
                } else if (sub >= 0) {
                    subs_[size_t(sub)].alive = false;
                } else if (expected_run_ + k >= kSubstitutionMinMatch && src >= 0 && src < expected_at_) {
                    breaks_.push_back({src, expected_at_ + k});
                    if (breaks_.size() > kMaxPendingBreaks) {
                        forget_provisional(breaks_.front(), -1);
                        breaks_.erase(breaks_.begin());
                    }
                }
            } else if (k == n_new && k > 0) {
                const bool through_substitution =
                    std::any_of(node_sub_.begin(), node_sub_.begin() + k, [](int32_t s) { return s >= 0; });
                const CopyState& next = node_next_[size_t(k - 1)];
                if ((through_substitution || expected_resynced_) && (next.sub < 0 || subs_[size_t(next.sub)].alive)) {
                    resume = next;
                    resume.run = std::min(expected_run_ + k, kMaxMatchLen);
                }
            }
        }
        expected_.clear();
        breaks_.erase(std::remove_if(breaks_.begin(), breaks_.end(), [&](const Break& b) { return settle(b, n_tokens); }),
                      breaks_.end());
        return resume;
    }

    // A copy of the prompt picked up inside the output (n_matched tokens agree, kSubstitutionResync
    // or more) after the output replaced a stretch of the source without a proposal having run
    // into it (a function renamed where the answer starts): where the output and the source agree
    // again on kPickupAnchor tokens at most kSubstitutionMaxNew / kSubstitutionMaxOld tokens before
    // the match, the fewest tokens in all, the stretches between make a substitution.
    void learn_from_pickup(int32_t start, int32_t n_matched) {
        const int32_t n_tokens = int32_t(tokens_.size());
        const int32_t o = n_tokens - n_matched;  // first matched output token
        const int32_t src = start - n_matched;   // first matched source token
        if (n_matched < kSubstitutionResync || n_matched >= kMaxMatchLen || src > n_prompt_ || o <= n_prompt_) return;
        if (o == last_pickup_) return;
        last_pickup_ = o;
        first_replacement([&](int32_t j, int32_t r) {
            if (o - j - kPickupAnchor < n_prompt_ || src - r - kPickupAnchor < 0) return false;
            if (!std::equal(tokens_.begin() + (o - j - kPickupAnchor), tokens_.begin() + (o - j),
                            tokens_.begin() + (src - r - kPickupAnchor))) {
                return false;
            }
            learn(tokens_[size_t(src - r - 1)], {tokens_.begin() + (src - r), tokens_.begin() + src},
                  {tokens_.begin() + (o - j), tokens_.begin() + o});
            return true;
        });
    }

    // Looks for where the output copies the source again after break b: the fewest tokens of
    // its own (j) and skipped source tokens (r) after which kSubstitutionResync tokens agree
    // again; learns old = the r source tokens, new = the j output tokens. True when settled
    // (learnt, or no such place within the limits), false while the output is too short to tell.
    // While it is, the first place whose committed tokens agree so far (at least
    // kSubstitutionProvisional of them) is learnt provisionally: a copy that resumes after a
    // rename can meet the renamed name again before three tokens have confirmed it. Settling
    // forgets a provisional substitution it does not confirm.
    bool settle(const Break& b, int32_t n_tokens) {
        bool settled = true;
        const bool found = first_replacement([&](int32_t j, int32_t r) {
            if (b.src + r + kSubstitutionResync > b.out) return false;
            const int32_t n_known = std::min(kSubstitutionResync, n_tokens - (b.out + j));
            if (n_known > 0 && !std::equal(tokens_.begin() + (b.out + j), tokens_.begin() + (b.out + j + n_known),
                                           tokens_.begin() + (b.src + r))) {
                return false;
            }
            settled = n_known >= kSubstitutionResync;
            if (settled || n_known >= kSubstitutionProvisional) learn_at(b, r, j, !settled);
            return true;
        });
        if (!found) forget_provisional(b, -1);
        return settled;
    }

    // Learns that the output replaced the r source tokens after break b with its j tokens.
    void learn_at(const Break& b, int32_t r, int32_t j, bool provisional) {
        int32_t slot = -1;
        if (b.src >= 1) {
            slot = learn(tokens_[size_t(b.src - 1)], {tokens_.begin() + b.src, tokens_.begin() + (b.src + r)},
                         {tokens_.begin() + b.out, tokens_.begin() + (b.out + j)});
        }
        forget_provisional(b, slot);
        if (slot >= 0) subs_[size_t(slot)].provisional_for = provisional ? b.out : -1;
    }

    // Forgets what break b learnt provisionally, except slot `keep`.
    void forget_provisional(const Break& b, int32_t keep) {
        for (size_t i = 0; i < subs_.size(); ++i) {
            if (int32_t(i) != keep && subs_[i].provisional_for == b.out) {
                subs_[i].alive = false;
                subs_[i].provisional_for = -1;
            }
        }
    }

    // The slot of the substitution learnt (or updated), -1 when none was.
    int32_t learn(int32_t before, std::vector<int32_t> old_tokens, std::vector<int32_t> new_tokens) {
        for (const int32_t t : new_tokens) {
            if (contains(params_.stop_tokens, t)) return -1;
        }
        for (size_t i = 0; i < subs_.size(); ++i) {  // the same stretch replaced again: the latest replacement
            Substitution& s = subs_[i];
            if (s.alive && s.before == before && s.old_tokens == old_tokens) {
                s.new_tokens = std::move(new_tokens);
                return int32_t(i);
            }
        }
        Substitution learnt{before, std::move(old_tokens), std::move(new_tokens), true, -1, {}};
        for (size_t i = 0; i < subs_.size(); ++i) {  // a forgotten one's slot (proposals refer to slots)
            if (!subs_[i].alive) {
                subs_[i] = std::move(learnt);
                return int32_t(i);
            }
        }
        if (int32_t(subs_.size()) >= kMaxSubstitutions) return -1;
        subs_.push_back(std::move(learnt));
        return int32_t(subs_.size()) - 1;
    }

    LookupParams params_;
    std::vector<int32_t> tokens_;  // [n_tokens] the committed sequence seen so far
    std::vector<int32_t> fences_;  // positions in tokens_ of its fence tokens, increasing
    int32_t n_prompt_ = 0;         // tokens_[0, n_prompt_) is the request's prompt
    int32_t n_indexed_ = 0;        // n-grams ending at positions < n_indexed_ are in the index
    int32_t last_pickup_ = -1;     // output position of the last copy learn_from_pickup looked at
    // [ngram_max - ngram_min + 1] per n-gram length n (from ngram_min): hash of the n tokens ->
    // position of the token that followed their most recent occurrence.
    std::vector<std::unordered_map<uint64_t, int32_t>> index_;
    // [same][n_tokens] per n-gram length: continuation position -> the continuation position of
    // the previous occurrence of the n-gram before it (-1: none), a chain through all occurrences.
    std::vector<std::vector<int32_t>> previous_;
    mutable std::vector<int32_t> rivals_;  // mark_contested's scratch
    // The proposal being built (and, until the next draft, the last one), per node: its source
    // position (-1 for a substituted node), its substitution (-1 for a copied node), and the copy
    // state after it.
    std::vector<int32_t> node_src_, node_sub_;
    std::vector<char> node_loose_;  // [same] a loosely substituted node
    std::vector<CopyState> node_next_;
    std::vector<Substitution> subs_;  // learnt in this request (slots; forgotten ones not alive)
    std::vector<Break> breaks_;       // not settled yet
    // The last proposal's tokens (remember), from sequence position expected_at_.
    std::vector<int32_t> expected_;
    int32_t expected_at_ = 0;
    int32_t expected_run_ = 0;  // the match length its first node continues
    bool expected_resynced_ = false;  // it resumed the copy after a break (find_resync)
    DrafterStats stats_;
};

}  // namespace

void validate(const LookupParams& params) {
    if (params.ngram_min < 1 || params.ngram_min > params.ngram_max || params.ngram_max > kLookupNgramLimit) {
        throw InvalidArgumentError("lookup n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= " +
                                   std::to_string(kLookupNgramLimit) + ", got ngram_min=" +
                                   std::to_string(params.ngram_min) +
                                   ", ngram_max=" + std::to_string(params.ngram_max));
    }
}

std::unique_ptr<Drafter> make_prompt_lookup_drafter(const LookupParams& params) {
    validate(params);
    return std::make_unique<PromptLookupDrafter>(params);
}

}  // namespace spec
