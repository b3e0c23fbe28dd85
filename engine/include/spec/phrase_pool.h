// Ouroboros phrase pool: short token sequences ("phrases") harvested from prompts, generated text,
// lookahead drafting and verification, kept across requests, and looked up by their first token
// (to lengthen a draft by K candidate phrases, Ouroboros §3.2) or by their first n tokens (to
// propose a continuation, prompt-lookup style). Phrases the target has accepted before rank
// first and are the last to be evicted. Pure C++, no model: testable on hand-made token lists.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

namespace spec {

namespace pool_detail {
struct Store;  // phrases, indexes and counters; engine/src/phrase_pool_store.h
}

// Where a phrase came from. Kept per phrase (the source of its first insertion) and counted in
// PhrasePoolStats; it does not change how a phrase is ranked or evicted.
enum class PhraseSource : uint8_t {
    prompt,        // n-grams of a prompt
    generated,     // n-grams of committed output
    lookahead,     // phrases produced by lookahead (Jacobi) drafting
    verification,  // harvest_verification(): target-confirmed pieces of rejected drafts
    loaded,        // read by the caller from outside this process (a corpus, an earlier run)
};
constexpr int32_t kPhraseSourceCount = 5;

// "prompt", "generated", ... (the enumerator's name).
const char* phrase_source_name(PhraseSource source);

constexpr size_t kPhrasePoolCapacityLimit = size_t(1) << 24;
constexpr int32_t kPhraseLenLimit = 64;
constexpr int32_t kPhraseKeyLimit = 8;

struct PhrasePoolParams {
    size_t capacity = 65536;          // phrases stored at most, 1..kPhrasePoolCapacityLimit
    int32_t max_phrase_len = 16;      // 2..kPhraseLenLimit; longer phrases are cut to this length
    int32_t max_key_len = 4;          // lookup_ngram() keys of 1..max_key_len tokens; < max_phrase_len,
                                      // <= kPhraseKeyLimit
    double protected_fraction = 0.8;  // share of capacity that phrases with accepted tokens may
                                      // hold before the least recent of them is demoted; 0..1
    int32_t n_vocab = 0;              // tokens must be < n_vocab; 0: unknown (tokens only >= 0).
                                      // save() records it and load() checks it
};

// Throws InvalidArgumentError naming the value when params are outside the ranges above.
void validate(const PhrasePoolParams& params);

struct PhrasePoolStats {
    int64_t size = 0;                // phrases stored now
    int64_t n_inserted = 0;          // new phrases stored by insert()
    int64_t n_refreshed = 0;         // insert() of a phrase already stored
    int64_t n_merged = 0;            // stored phrases absorbed by a longer phrase extending them
    int64_t n_evicted = 0;           // phrases dropped for capacity (insert, or load into a smaller pool)
    int64_t n_erased = 0;            // phrases removed by erase()
    int64_t n_loaded = 0;            // phrases read by load()
    int64_t n_lookups = 0;           // lookup() and lookup_ngram() calls
    int64_t n_hits = 0;              // lookups that returned at least one phrase
    int64_t n_uses = 0;              // record_use() calls that found their phrase
    int64_t n_phrases_accepted = 0;  // uses that led to >= 1 accepted token
    int64_t n_tokens_accepted = 0;   // tokens accepted over all uses
    int64_t n_proven = 0;            // phrases stored now that have led to >= 1 accepted token
    int64_t n_inserted_by_source[kPhraseSourceCount] = {};  // n_inserted, by PhraseSource
};

// What the pool knows about one stored phrase.
struct PhraseInfo {
    PhraseSource source = PhraseSource::prompt;  // source of its first insertion
    bool is_proven = false;        // has led to >= 1 accepted token (ranks first)
    bool is_protected = false;     // in the protected eviction segment
    int64_t n_refreshes = 0;       // inserts after the first
    int64_t n_uses = 0;            // record_use() calls
    int64_t n_hits = 0;            // uses with >= 1 accepted token
    int64_t n_tokens_accepted = 0;
};

// A bounded, thread-safe pool of phrases of 2..max_phrase_len tokens, each stored once.
//
// Ranking. lookup() and lookup_ngram() return phrases best first: proven phrases (those that led
// to accepted tokens) before the others, and within each group the most recently touched first.
// A touch is an insert, a refresh (inserting it again) or a record_use() with accepted tokens;
// a record_use() with none sends the phrase behind every other phrase of its group, so the next
// lookup offers the alternatives. Acceptance is the target's own judgement of a phrase, so it
// comes first; recency follows the context (Ouroboros measures phrase reuse to depend on how
// similar neighbouring requests are). Counts of accepted tokens are kept (PhraseInfo) but do not
// order the results: an order by count cannot be kept per key in O(1) per update, and counts from
// an earlier topic go stale.
//
// Eviction: segmented LRU. New phrases enter a probation segment; a phrase that leads to accepted
// tokens moves to a protected segment of at most capacity * protected_fraction phrases, whose
// least recent member is demoted back to the front of probation when it overflows. A full pool
// evicts the least recent probation phrase (the least recent protected one when probation is
// empty). This keeps a flood of one-off n-grams (a long prompt, a verbose answer) from flushing
// the phrases that the target has accepted, while a protected phrase that stops being useful
// still ages out through probation. A record_use() with no accepted token moves a phrase to the
// least recent end of its segment. Every step is a linked-list move: O(1) per insert.
//
// Merging. Inserting a phrase removes the stored phrases that are proper prefixes of it and adds
// their statistics to it: verification accepts a prefix of a proposal, so the longer phrase never
// yields fewer accepted tokens and the shorter one would only take one of the K lookup slots. The
// reverse case (inserting a proper prefix of a stored phrase) is stored as a phrase of its own:
// finding it would need every prefix of every phrase indexed.
//
// Cost. insert, record_use and erase: O(phrase length) hash operations; lookups: one hash probe
// plus O(max_results) to copy the results. Memory: (4 * max_phrase_len + 8 * max_key_len + 48)
// bytes per phrase plus the hash tables (memory_bytes()); a full default pool (65536 phrases of
// 16 tokens, max_key_len 4) takes 13 MB.
//
// Threads: every method may be called from any thread. Lookups, find(), stats() and save() take
// a shared lock and run in parallel; insert, record_use, erase, clear and load take it exclusively.
class PhrasePool {
public:
    // Throws InvalidArgumentError (see validate()).
    explicit PhrasePool(const PhrasePoolParams& params = PhrasePoolParams());
    ~PhrasePool();
    PhrasePool(const PhrasePool&) = delete;
    PhrasePool& operator=(const PhrasePool&) = delete;

    // Stores tokens[0..n_tokens) as a phrase, cut to max_phrase_len tokens; fewer than 2 tokens
    // are ignored. A phrase already stored is refreshed (touched, n_refreshes + 1) instead.
    // Returns true when a new phrase was stored. May merge and evict (see above).
    // tokens: [n_tokens]. Throws InvalidArgumentError for n_tokens < 0, a null pointer with
    // n_tokens > 0, or a token outside [0, n_vocab).
    bool insert(const int32_t* tokens, int32_t n_tokens, PhraseSource source);

    // Up to max_results phrases starting with first_token, best first, into out (resized to the
    // count; inner vectors are reused). Returns the count. Does not change the ranking.
    // Throws InvalidArgumentError for max_results < 0.
    int32_t lookup(int32_t first_token, int32_t max_results, std::vector<std::vector<int32_t>>& out) const;

    // Up to max_results phrases whose first key_len tokens equal key and that continue past it
    // (longer than key_len), best first; out[i][key_len..] is the continuation to propose.
    // lookup(t, ...) is lookup_ngram(&t, 1, ...). key: [key_len].
    // Throws InvalidArgumentError for key_len outside 1..max_key_len, a null key, or
    // max_results < 0.
    int32_t lookup_ngram(const int32_t* key, int32_t key_len, int32_t max_results,
                         std::vector<std::vector<int32_t>>& out) const;

    // Credits a stored phrase after verification: n_accepted of its tokens after the first (or
    // after the lookup key) were accepted. n_accepted >= 1 makes it proven and protected and
    // touches it; 0 demotes it (see above). tokens: [n_tokens], the phrase as lookup returned it.
    // Returns false (and changes nothing) when the phrase is not stored, e.g. evicted meanwhile.
    // Throws InvalidArgumentError for n_accepted outside 0..n_tokens - 1.
    bool record_use(const int32_t* tokens, int32_t n_tokens, int32_t n_accepted);

    // Removes a stored phrase (e.g. to replace it by a target-corrected one, Ouroboros §3.3).
    // Returns false when it is not stored.
    bool erase(const int32_t* tokens, int32_t n_tokens);

    // True when tokens[0..n_tokens) is stored; fills *info when info is not null.
    bool find(const int32_t* tokens, int32_t n_tokens, PhraseInfo* info) const;

    // Removes every phrase and resets the statistics: the pool is as newly constructed.
    void clear();

    // Writes every phrase with its statistics, segment and rank to `path` (through a new temporary
    // file next to it, synced and renamed into place, so an existing file is replaced whole or not
    // at all, also after a crash; the temporary is created exclusively and never follows a symlink).
    // Little-endian:
    //   header:  magic "SPECPOOL" | u32 version = 1 | i32 n_vocab | u32 n_phrases |
    //            i64 newest rank stamp | i64 lowest demotion stamp
    //   phrase:  u8 n_tokens | u8 source | u8 flags (bit 0: protected) | u8 0 | i64 rank stamp |
    //            u32 n_refreshes | u32 n_uses | u32 n_hits | u32 n_tokens_accepted | i32 tokens[n_tokens]
    //   footer:  u64 FNV-1a hash of every byte before it
    // Phrases are written in eviction order: probation then protected, least recent first. Rank
    // stamps lie in [-2^62, 2^62] (a pool moves them by one per touch or demotion).
    // Throws PoolFileError when the file cannot be written.
    void save(const std::string& path) const;

    // Replaces the contents by those of a file written by save(): the same lookups, ranking and
    // eviction order as the saved pool. When the file holds more phrases than capacity, those
    // first in eviction order are dropped (counted in n_evicted). Statistics other than size,
    // n_loaded, n_evicted and n_proven are kept. On any error the pool is left unchanged. The
    // file is read through a fixed buffer: memory grows with the phrases kept, not the file size.
    // Throws PoolFileError when the file is missing, truncated, corrupt (checksum, counts, rank
    // stamps), not a phrase pool, of another version, or holds a phrase longer than
    // max_phrase_len; VocabMismatchError
    // when it was saved with an n_vocab other than this pool's (both non-zero).
    void load(const std::string& path);

    PhrasePoolStats stats() const;
    size_t size() const;
    // Bytes held by the pool's arrays and tables (allocator overhead not included).
    size_t memory_bytes() const;
    const PhrasePoolParams& params() const { return params_; }

private:
    const PhrasePoolParams params_;
    mutable std::shared_mutex mutex_;
    std::unique_ptr<pool_detail::Store> store_;  // guarded by mutex_
    // Lookups run under the shared lock, so their counters are atomic.
    mutable std::atomic<int64_t> n_lookups_{0};
    mutable std::atomic<int64_t> n_hits_{0};
};

// ---- Harvesting phrases (pure functions) ----

// Phrases harvested from one verified draft (Ouroboros §3.3).
struct VerificationHarvest {
    // Pieces of the rejected part that the target confirmed. For each maximal run
    // draft[s..e) == target[s..e) after the first mismatch (s > first mismatch, run length >=
    // min_match): draft[s-1], draft[s..e), then target[e] when the target has a token there.
    // Every token after the first is what the target itself produced after the preceding ones.
    std::vector<std::vector<int32_t>> segments;
    // context_token followed by target[0..n_draft): the draft as the target would have written
    // it, to replace the drafted phrase in the pool (§3.3: p_1, v_2..v_beta). Tokens after the
    // first mismatch are conditioned on the rejected draft, so this is a heuristic. Empty when
    // the draft was accepted whole.
    std::vector<int32_t> corrected;
};

// context_token: the token the draft continues (last committed token, or p_1 of a phrase).
// draft_tokens:  [n_draft] the proposed tokens.
// target_tokens: [n_draft] or [n_draft + 1]; target_tokens[i] is the target's token at the
//                position of draft_tokens[i] (given context and draft[0..i)), as for
//                verify_chain_greedy; the extra last one is the bonus position.
// Throws InvalidArgumentError for other target lengths or min_match < 1.
VerificationHarvest harvest_verification(int32_t context_token, const std::vector<int32_t>& draft_tokens,
                                         const std::vector<int32_t>& target_tokens, int32_t min_match = 1);

// Fixed-length phrases of a token sequence (prompt or generated text): the windows
// tokens[i..i + phrase_len) for i = 0, stride, 2 * stride, ... that fit. Returns
// [n_phrases, phrase_len] row-major; empty when tokens are shorter than phrase_len.
// Throws InvalidArgumentError for phrase_len < 2 or stride < 1.
std::vector<int32_t> extract_phrases(const std::vector<int32_t>& tokens, int32_t phrase_len, int32_t stride = 1);

}  // namespace spec
