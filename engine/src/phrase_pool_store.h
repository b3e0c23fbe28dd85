// Internal to the phrase pool (not installed): the data structures behind PhrasePool, shared by
// phrase_pool.cpp (operations) and phrase_pool_file.cpp (save / load). Not thread-safe by
// itself: PhrasePool guards it with its shared_mutex.
//
// Layout. Phrases live in slots: flat arrays indexed by slot, freed slots reused. Two kinds of
// open-addressing index point into them: by_phrase (all tokens -> slot, for dedup and
// record_use) and by_key[k - 1] (first k tokens -> the phrases starting with them, for lookups).
// Slots are threaded onto intrusive circular lists: one per eviction segment (Slot::lru) and,
// per key, one per rank group (key_links). Circular lists need only their front stored: the back
// is the front's prev.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "spec/phrase_pool.h"

namespace spec {
namespace pool_detail {

// Hash of a token sequence, built front to back, so one pass gives the hash of every prefix:
// prefix_hash(n + 1) = hash_step(prefix_hash(n), token n), prefix_hash(0) = kHashSeed.
constexpr uint64_t kHashSeed = 0x6a09e667f3bcc909ULL;
inline uint64_t hash_step(uint64_t h, int32_t token) {
    uint64_t z = (h ^ uint64_t(uint32_t(token))) + 0x9e3779b97f4a7c15ULL;  // splitmix64 finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

inline uint64_t sequence_hash(const int32_t* tokens, int32_t n_tokens) {
    uint64_t h = kHashSeed;
    for (int32_t i = 0; i < n_tokens; ++i) h = hash_step(h, tokens[i]);
    return h;
}

// A slot's place in a circular doubly linked list.
struct Link {
    int32_t prev = -1;
    int32_t next = -1;
};

// Lists threaded through Links kept elsewhere: link_of(i) returns slot i's Link. A list is known
// by its front slot (-1: empty).
template <class LinkOf>
void list_push_front(int32_t& front, int32_t i, LinkOf&& link_of) {
    Link& li = link_of(i);
    if (front < 0) {
        li.prev = li.next = i;
    } else {
        const int32_t back = link_of(front).prev;
        li.next = front;
        li.prev = back;
        link_of(back).next = i;
        link_of(front).prev = i;
    }
    front = i;
}

template <class LinkOf>
void list_push_back(int32_t& front, int32_t i, LinkOf&& link_of) {
    list_push_front(front, i, link_of);
    front = link_of(i).next;  // i is now the back
}

template <class LinkOf>
void list_unlink(int32_t& front, int32_t i, LinkOf&& link_of) {
    Link& li = link_of(i);
    if (li.next == i) {
        front = -1;
    } else {
        link_of(li.prev).next = li.next;
        link_of(li.next).prev = li.prev;
        if (front == i) front = li.next;
    }
    li.prev = li.next = -1;
}

// Open addressing with linear probing. Cells point into the slots, where the keys live, so find()
// takes a hash and a test on a cell, and operations that move cells (growth, erase) take a
// function giving an occupied cell's hash. Load factor <= 3/4; erase shifts the following cells
// back instead of leaving tombstones, so probe chains stay short under churn.
template <class Cell>
class ProbeTable {
public:
    static constexpr size_t npos = size_t(-1);

    // Index of the first cell on hash's probe chain that `matches`, or npos.
    template <class Matches>
    size_t find(uint64_t hash, Matches&& matches) const {
        if (cells_.empty()) return npos;
        const size_t mask = cells_.size() - 1;
        for (size_t i = size_t(hash) & mask;; i = (i + 1) & mask) {
            if (cells_[i].is_empty()) return npos;
            if (matches(cells_[i])) return i;
        }
    }

    // Adds a non-empty cell whose key is not present yet. Returns its index, valid until the
    // next insert or erase.
    template <class HashOf>
    size_t insert(uint64_t hash, const Cell& cell, HashOf&& hash_of) {
        if (4 * (n_used_ + 1) > 3 * cells_.size()) rehash(cells_.empty() ? 16 : 2 * cells_.size(), hash_of);
        ++n_used_;
        return place(hash, cell);
    }

    // Empties cell `hole` and moves back the cells after it whose probe chain passed it.
    template <class HashOf>
    void erase_at(size_t hole, HashOf&& hash_of) {
        const size_t mask = cells_.size() - 1;
        for (size_t j = (hole + 1) & mask; !cells_[j].is_empty(); j = (j + 1) & mask) {
            const size_t home = size_t(hash_of(cells_[j])) & mask;
            // cells_[j] stays unless its home lies cyclically in (hole, j].
            const bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
            if (stays) continue;
            cells_[hole] = cells_[j];
            hole = j;
        }
        cells_[hole] = Cell();
        --n_used_;
    }

    Cell& at(size_t i) { return cells_[i]; }
    const Cell& at(size_t i) const { return cells_[i]; }
    size_t size() const { return n_used_; }
    size_t memory_bytes() const { return cells_.capacity() * sizeof(Cell); }

private:
    size_t place(uint64_t hash, const Cell& cell) {
        const size_t mask = cells_.size() - 1;
        size_t i = size_t(hash) & mask;
        while (!cells_[i].is_empty()) i = (i + 1) & mask;
        cells_[i] = cell;
        return i;
    }

    template <class HashOf>
    void rehash(size_t n_cells, HashOf&& hash_of) {
        std::vector<Cell> old(n_cells);
        old.swap(cells_);
        for (const Cell& cell : old) {
            if (!cell.is_empty()) place(hash_of(cell), cell);
        }
    }

    std::vector<Cell> cells_;  // [power of two]
    size_t n_used_ = 0;
};

// by_phrase cell: the slot holding the phrase.
struct PhraseCell {
    int32_t slot = -1;
    bool is_empty() const { return slot < 0; }
};

// Rank groups of the phrases that share a key, best first.
enum RankGroup : int32_t { kProven = 0, kUnproven = 1, kRankGroups = 2 };

// by_key cell: the phrases starting with one key, as one list per rank group, most recently
// touched first. A cell with both lists empty is erased at once (an empty cell ends probe chains).
struct KeyCell {
    int32_t front[kRankGroups] = {-1, -1};
    bool is_empty() const { return front[kProven] < 0 && front[kUnproven] < 0; }
    int32_t any_member() const { return front[kProven] >= 0 ? front[kProven] : front[kUnproven]; }
};

// Eviction segments.
enum Segment : int32_t { kProbation = 0, kProtected = 1, kSegments = 2 };

struct Slot {
    uint64_t hash = 0;   // of all n_tokens tokens
    // Rank stamp: touches take stamps above every earlier one, demotions (record_use with no
    // accepted token) stamps below every earlier one; each key's lists are ordered by it.
    int64_t touch = 0;
    uint32_t n_refreshes = 0;
    uint32_t n_uses = 0;
    uint32_t n_hits = 0;             // > 0: proven
    uint32_t n_tokens_accepted = 0;  // saturates
    Link lru;                        // in segment `segment`, most recent first
    uint8_t n_tokens = 0;            // 0: free slot
    PhraseSource source = PhraseSource::prompt;
    uint8_t segment = kProbation;

    RankGroup group() const { return n_hits > 0 ? kProven : kUnproven; }
};

// One phrase as save() writes it and load() reads it.
struct PhraseRecord {
    std::vector<int32_t> tokens;  // [n_tokens]
    Slot stats;                   // touch, counters, source, segment (links and hash unused)
};

struct Store {
    explicit Store(const PhrasePoolParams& params);

    bool insert(const int32_t* tokens, int32_t n_tokens, PhraseSource source);
    bool record_use(const int32_t* tokens, int32_t n_tokens, int32_t n_accepted);
    bool erase(const int32_t* tokens, int32_t n_tokens);
    // Slot holding exactly tokens[0..n_tokens), or -1; hash = sequence_hash(tokens, n_tokens).
    int32_t find_phrase(const int32_t* tokens, int32_t n_tokens, uint64_t hash) const;
    int32_t find_phrase(const int32_t* tokens, int32_t n_tokens) const;
    // Cell of by_key[key_len - 1] for key[0..key_len), or npos; hash = sequence_hash(key, key_len).
    size_t find_key(const int32_t* key, int32_t key_len, uint64_t hash) const;
    // Appends up to max_results phrases of key cell `cell` at level key_len to out, best first.
    int32_t collect(size_t cell, int32_t key_len, int32_t max_results, std::vector<std::vector<int32_t>>& out) const;
    // Fills an empty store with records (eviction order, least recent first; records[0] is phrase
    // first_index of the file) and the saved stamp counters; throws PoolFileError on a duplicate.
    void restore(const std::vector<PhraseRecord>& records, size_t first_index, int64_t touch_high, int64_t touch_low,
                 const std::string& path);
    // records in eviction order, least recent first.
    std::vector<PhraseRecord> snapshot() const;
    size_t memory_bytes() const;

    const int32_t* row(int32_t s) const { return tokens.data() + size_t(s) * size_t(params.max_phrase_len); }
    int32_t* row(int32_t s) { return tokens.data() + size_t(s) * size_t(params.max_phrase_len); }
    Link& key_link(int32_t s, int32_t key_len) {
        return key_links[size_t(s) * size_t(params.max_key_len) + size_t(key_len - 1)];
    }
    const Link& key_link(int32_t s, int32_t key_len) const {
        return key_links[size_t(s) * size_t(params.max_key_len) + size_t(key_len - 1)];
    }
    // Key lengths a phrase is indexed under: 1..n_key_levels (a key must leave a continuation).
    int32_t n_key_levels(int32_t s) const {
        return std::min<int32_t>(params.max_key_len, slots[size_t(s)].n_tokens - 1);
    }

    void refresh(int32_t s);
    void evict_one();
    void remove(int32_t s);
    int32_t allocate_slot();
    void link_keys(int32_t s);
    void unlink_keys(int32_t s);
    void move_in_keys(int32_t s, RankGroup from, RankGroup to, bool to_front);
    void segment_push(int32_t s, Segment segment, bool to_front);
    void segment_unlink(int32_t s);
    void enforce_protected_cap();
    uint64_t key_hash(int32_t s, int32_t key_len) const;

    const PhrasePoolParams params;
    const size_t protected_cap;  // capacity * protected_fraction

    std::vector<Slot> slots;          // [n_slots]
    std::vector<int32_t> tokens;      // [n_slots, max_phrase_len] row s: slot s's tokens
    std::vector<Link> key_links;      // [n_slots, max_key_len] row s, column k - 1: in its key-k list
    std::vector<int32_t> free_slots;  // freed slots, reused first
    ProbeTable<PhraseCell> by_phrase;
    std::vector<ProbeTable<KeyCell>> by_key;  // [max_key_len] entry k - 1: keys of k tokens
    int32_t segment_front[kSegments] = {-1, -1};
    size_t segment_size[kSegments] = {0, 0};
    int64_t touch_high = 0;  // last stamp given to a touch
    int64_t touch_low = 0;   // last stamp given to a demotion
    size_t n_phrases = 0;
    size_t n_proven = 0;
    PhrasePoolStats counters;  // the operation counters (size, n_proven, lookups kept elsewhere)
};

}  // namespace pool_detail
}  // namespace spec
