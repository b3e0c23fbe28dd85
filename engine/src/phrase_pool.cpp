// Phrase pool operations: insert / refresh / merge / evict, lookups, credit, and the locking
// around them. Data layout and list / table primitives: phrase_pool_store.h; files:
// phrase_pool_file.cpp.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "phrase_pool_store.h"
#include "spec/error.h"
#include "spec/phrase_pool.h"

namespace spec {

using namespace pool_detail;

namespace {

void add_saturating(uint32_t& counter, uint64_t amount) {
    counter = uint32_t(std::min<uint64_t>(uint64_t(counter) + amount, UINT32_MAX));
}

// hashes[n] = hash of tokens[0..n) for n = 0..n_tokens. hashes: [n_tokens + 1]
void prefix_hashes(const int32_t* tokens, int32_t n_tokens, uint64_t* hashes) {
    hashes[0] = kHashSeed;
    for (int32_t i = 0; i < n_tokens; ++i) hashes[i + 1] = hash_step(hashes[i], tokens[i]);
}

void check_tokens(const int32_t* tokens, int32_t n_tokens, int32_t n_vocab, const char* what) {
    if (n_tokens < 0) {
        throw InvalidArgumentError(std::string(what) + ": n_tokens must be >= 0, got " + std::to_string(n_tokens));
    }
    if (n_tokens > 0 && tokens == nullptr) {
        throw InvalidArgumentError(std::string(what) + ": tokens is null with n_tokens > 0");
    }
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || (n_vocab > 0 && tokens[i] >= n_vocab)) {
            throw InvalidArgumentError(std::string(what) + ": token " + std::to_string(tokens[i]) + " at index " +
                                       std::to_string(i) + " is outside the vocabulary [0, " +
                                       (n_vocab > 0 ? std::to_string(n_vocab) : std::string("inf")) + ")");
        }
    }
}

}  // namespace

// ---- Store: the pool's data, no locking ----

Store::Store(const PhrasePoolParams& params_in)
    : params(params_in),
      protected_cap(size_t(double(params_in.capacity) * params_in.protected_fraction)),
      by_key(size_t(params_in.max_key_len)) {}

int32_t Store::find_phrase(const int32_t* phrase, int32_t n_tokens, uint64_t hash) const {
    const size_t cell = by_phrase.find(hash, [&](const PhraseCell& c) {
        const Slot& slot = slots[size_t(c.slot)];
        return slot.hash == hash && slot.n_tokens == n_tokens && std::equal(phrase, phrase + n_tokens, row(c.slot));
    });
    return cell == by_phrase.npos ? -1 : by_phrase.at(cell).slot;
}

int32_t Store::find_phrase(const int32_t* phrase, int32_t n_tokens) const {
    if (n_tokens < 2 || n_tokens > params.max_phrase_len) return -1;
    return find_phrase(phrase, n_tokens, sequence_hash(phrase, n_tokens));
}

size_t Store::find_key(const int32_t* key, int32_t key_len, uint64_t hash) const {
    return by_key[size_t(key_len - 1)].find(
        hash, [&](const KeyCell& c) { return std::equal(key, key + key_len, row(c.any_member())); });
}

uint64_t Store::key_hash(int32_t s, int32_t key_len) const { return sequence_hash(row(s), key_len); }

int32_t Store::collect(size_t cell, int32_t key_len, int32_t max_results,
                       std::vector<std::vector<int32_t>>& out) const {
    const KeyCell& key = by_key[size_t(key_len - 1)].at(cell);
    int32_t n_out = 0;
    for (int32_t group = kProven; group < kRankGroups; ++group) {
        const int32_t front = key.front[group];
        if (front < 0) continue;
        int32_t s = front;
        do {
            if (n_out == max_results) return n_out;
            if (out.size() <= size_t(n_out)) out.emplace_back();
            out[size_t(n_out)].assign(row(s), row(s) + slots[size_t(s)].n_tokens);
            ++n_out;
            s = key_link(s, key_len).next;
        } while (s != front);
    }
    return n_out;
}

int32_t Store::allocate_slot() {
    if (!free_slots.empty()) {
        const int32_t s = free_slots.back();
        free_slots.pop_back();
        return s;
    }
    // Grow by doubling, but never past capacity: a full pool holds exactly capacity rows.
    if (slots.size() == slots.capacity()) {
        const size_t n = std::min(params.capacity, std::max<size_t>(16, 2 * slots.size()));
        slots.reserve(n);
        tokens.reserve(n * size_t(params.max_phrase_len));
        key_links.reserve(n * size_t(params.max_key_len));
    }
    slots.emplace_back();
    tokens.resize(tokens.size() + size_t(params.max_phrase_len));
    key_links.resize(key_links.size() + size_t(params.max_key_len));
    return int32_t(slots.size() - 1);
}

// Adds slot s to the front of its rank group in every key it is indexed under.
void Store::link_keys(int32_t s) {
    const RankGroup group = slots[size_t(s)].group();
    uint64_t h = kHashSeed;
    for (int32_t k = 1; k <= n_key_levels(s); ++k) {
        h = hash_step(h, row(s)[k - 1]);
        auto& table = by_key[size_t(k - 1)];
        auto link_of = [this, k](int32_t i) -> Link& { return key_link(i, k); };
        const size_t cell = find_key(row(s), k, h);
        if (cell != table.npos) {
            list_push_front(table.at(cell).front[group], s, link_of);
            continue;
        }
        KeyCell fresh;
        list_push_front(fresh.front[group], s, link_of);
        table.insert(h, fresh, [this, k](const KeyCell& c) { return key_hash(c.any_member(), k); });
    }
}

void Store::unlink_keys(int32_t s) {
    const RankGroup group = slots[size_t(s)].group();
    uint64_t h = kHashSeed;
    for (int32_t k = 1; k <= n_key_levels(s); ++k) {
        h = hash_step(h, row(s)[k - 1]);
        auto& table = by_key[size_t(k - 1)];
        const size_t cell = find_key(row(s), k, h);
        KeyCell& key = table.at(cell);
        list_unlink(key.front[group], s, [this, k](int32_t i) -> Link& { return key_link(i, k); });
        if (key.is_empty()) table.erase_at(cell, [this, k](const KeyCell& c) { return key_hash(c.any_member(), k); });
    }
}

void Store::move_in_keys(int32_t s, RankGroup from, RankGroup to, bool to_front) {
    uint64_t h = kHashSeed;
    for (int32_t k = 1; k <= n_key_levels(s); ++k) {
        h = hash_step(h, row(s)[k - 1]);
        KeyCell& key = by_key[size_t(k - 1)].at(find_key(row(s), k, h));
        auto link_of = [this, k](int32_t i) -> Link& { return key_link(i, k); };
        list_unlink(key.front[from], s, link_of);
        if (to_front) {
            list_push_front(key.front[to], s, link_of);
        } else {
            list_push_back(key.front[to], s, link_of);
        }
    }
}

void Store::segment_push(int32_t s, Segment segment, bool to_front) {
    auto link_of = [this](int32_t i) -> Link& { return slots[size_t(i)].lru; };
    slots[size_t(s)].segment = uint8_t(segment);
    if (to_front) {
        list_push_front(segment_front[segment], s, link_of);
    } else {
        list_push_back(segment_front[segment], s, link_of);
    }
    ++segment_size[segment];
}

void Store::segment_unlink(int32_t s) {
    const Segment segment = Segment(slots[size_t(s)].segment);
    list_unlink(segment_front[segment], s, [this](int32_t i) -> Link& { return slots[size_t(i)].lru; });
    --segment_size[segment];
}

// Demotes the least recent protected phrases to the front of probation until protected fits.
void Store::enforce_protected_cap() {
    while (segment_size[kProtected] > protected_cap) {
        const int32_t back = slots[size_t(segment_front[kProtected])].lru.prev;
        segment_unlink(back);
        segment_push(back, kProbation, true);
    }
}

void Store::refresh(int32_t s) {
    Slot& slot = slots[size_t(s)];
    add_saturating(slot.n_refreshes, 1);
    slot.touch = ++touch_high;
    move_in_keys(s, slot.group(), slot.group(), true);
    const Segment segment = Segment(slot.segment);
    segment_unlink(s);
    segment_push(s, segment, true);
    ++counters.n_refreshed;
}

void Store::evict_one() {
    const Segment segment = segment_size[kProbation] > 0 ? kProbation : kProtected;
    remove(slots[size_t(segment_front[segment])].lru.prev);
    ++counters.n_evicted;
}

void Store::remove(int32_t s) {
    segment_unlink(s);
    unlink_keys(s);
    const size_t cell = by_phrase.find(slots[size_t(s)].hash, [s](const PhraseCell& c) { return c.slot == s; });
    by_phrase.erase_at(cell, [this](const PhraseCell& c) { return slots[size_t(c.slot)].hash; });
    if (slots[size_t(s)].group() == kProven) --n_proven;
    slots[size_t(s)] = Slot();
    free_slots.push_back(s);
    --n_phrases;
}

bool Store::insert(const int32_t* phrase, int32_t n_tokens, PhraseSource source) {
    n_tokens = std::min(n_tokens, params.max_phrase_len);
    if (n_tokens < 2) return false;
    uint64_t hashes[kPhraseLenLimit + 1];  // [n_tokens + 1] hashes of every prefix
    prefix_hashes(phrase, n_tokens, hashes);
    const int32_t stored = find_phrase(phrase, n_tokens, hashes[n_tokens]);
    if (stored >= 0) {
        refresh(stored);
        return false;
    }
    // Absorb the stored phrases this one extends (see "Merging" in phrase_pool.h).
    Slot merged;
    bool absorbed_protected = false;
    for (int32_t len = 2; len < n_tokens; ++len) {
        const int32_t prefix = find_phrase(phrase, len, hashes[len]);
        if (prefix < 0) continue;
        const Slot& absorbed = slots[size_t(prefix)];
        add_saturating(merged.n_refreshes, absorbed.n_refreshes);
        add_saturating(merged.n_uses, absorbed.n_uses);
        add_saturating(merged.n_hits, absorbed.n_hits);
        add_saturating(merged.n_tokens_accepted, absorbed.n_tokens_accepted);
        absorbed_protected = absorbed_protected || absorbed.segment == kProtected;
        remove(prefix);
        ++counters.n_merged;
    }
    if (n_phrases == params.capacity) evict_one();

    const int32_t s = allocate_slot();
    Slot& slot = slots[size_t(s)];
    slot = merged;
    slot.hash = hashes[n_tokens];
    slot.touch = ++touch_high;
    slot.n_tokens = uint8_t(n_tokens);
    slot.source = source;
    std::copy(phrase, phrase + n_tokens, row(s));
    by_phrase.insert(slot.hash, PhraseCell{s}, [this](const PhraseCell& c) { return slots[size_t(c.slot)].hash; });
    link_keys(s);
    segment_push(s, absorbed_protected ? kProtected : kProbation, true);
    enforce_protected_cap();
    if (slots[size_t(s)].group() == kProven) ++n_proven;
    ++n_phrases;
    ++counters.n_inserted;
    ++counters.n_inserted_by_source[size_t(source)];
    return true;
}

bool Store::record_use(const int32_t* phrase, int32_t n_tokens, int32_t n_accepted) {
    const int32_t s = find_phrase(phrase, n_tokens);
    if (s < 0) return false;
    Slot& slot = slots[size_t(s)];
    const RankGroup group = slot.group();
    add_saturating(slot.n_uses, 1);
    ++counters.n_uses;
    if (n_accepted == 0) {
        // Behind everything else in its rank group and at the eviction end of its segment.
        slot.touch = --touch_low;
        move_in_keys(s, group, group, false);
        const Segment segment = Segment(slot.segment);
        segment_unlink(s);
        segment_push(s, segment, false);
        return true;
    }
    add_saturating(slot.n_hits, 1);
    add_saturating(slot.n_tokens_accepted, uint64_t(n_accepted));
    ++counters.n_phrases_accepted;
    counters.n_tokens_accepted += n_accepted;
    if (group == kUnproven) ++n_proven;
    slot.touch = ++touch_high;
    move_in_keys(s, group, kProven, true);
    segment_unlink(s);
    segment_push(s, kProtected, true);
    enforce_protected_cap();
    return true;
}

bool Store::erase(const int32_t* phrase, int32_t n_tokens) {
    const int32_t s = find_phrase(phrase, n_tokens);
    if (s < 0) return false;
    remove(s);
    ++counters.n_erased;
    return true;
}

size_t Store::memory_bytes() const {
    size_t bytes = sizeof(Store) + slots.capacity() * sizeof(Slot) + tokens.capacity() * sizeof(int32_t) +
                   key_links.capacity() * sizeof(Link) + free_slots.capacity() * sizeof(int32_t) +
                   by_phrase.memory_bytes();
    for (const auto& table : by_key) bytes += sizeof(table) + table.memory_bytes();
    return bytes;
}

// ---- Public API ----

const char* phrase_source_name(PhraseSource source) {
    switch (source) {
        case PhraseSource::prompt: return "prompt";
        case PhraseSource::generated: return "generated";
        case PhraseSource::lookahead: return "lookahead";
        case PhraseSource::verification: return "verification";
        case PhraseSource::loaded: return "loaded";
    }
    return "unknown";
}

void validate(const PhrasePoolParams& params) {
    if (params.capacity < 1 || params.capacity > kPhrasePoolCapacityLimit) {
        throw InvalidArgumentError("phrase pool capacity must be in 1.." + std::to_string(kPhrasePoolCapacityLimit) +
                                   ", got " + std::to_string(params.capacity));
    }
    if (params.max_phrase_len < 2 || params.max_phrase_len > kPhraseLenLimit) {
        throw InvalidArgumentError("phrase pool max_phrase_len must be in 2.." + std::to_string(kPhraseLenLimit) +
                                   ", got " + std::to_string(params.max_phrase_len));
    }
    if (params.max_key_len < 1 || params.max_key_len > kPhraseKeyLimit ||
        params.max_key_len >= params.max_phrase_len) {
        throw InvalidArgumentError("phrase pool max_key_len must satisfy 1 <= max_key_len <= " +
                                   std::to_string(kPhraseKeyLimit) + " and max_key_len < max_phrase_len (" +
                                   std::to_string(params.max_phrase_len) + "), got max_key_len=" +
                                   std::to_string(params.max_key_len));
    }
    if (!(params.protected_fraction >= 0.0 && params.protected_fraction <= 1.0)) {
        char value[32];
        std::snprintf(value, sizeof(value), "%g", params.protected_fraction);
        throw InvalidArgumentError(std::string("phrase pool protected_fraction must be in [0, 1], got ") + value);
    }
    if (params.n_vocab < 0) {
        throw InvalidArgumentError("phrase pool n_vocab must be >= 0 (0: unknown), got " +
                                   std::to_string(params.n_vocab));
    }
}

namespace {
const PhrasePoolParams& validated(const PhrasePoolParams& params) {
    validate(params);
    return params;
}
}  // namespace

PhrasePool::PhrasePool(const PhrasePoolParams& params)
    : params_(validated(params)), store_(std::make_unique<Store>(params_)) {}

PhrasePool::~PhrasePool() = default;

bool PhrasePool::insert(const int32_t* tokens, int32_t n_tokens, PhraseSource source) {
    check_tokens(tokens, n_tokens, params_.n_vocab, "PhrasePool::insert");
    if (uint8_t(source) >= kPhraseSourceCount) {
        throw InvalidArgumentError("PhrasePool::insert: unknown PhraseSource " + std::to_string(int32_t(source)));
    }
    std::unique_lock lock(mutex_);
    return store_->insert(tokens, n_tokens, source);
}

int32_t PhrasePool::lookup(int32_t first_token, int32_t max_results, std::vector<std::vector<int32_t>>& out) const {
    return lookup_ngram(&first_token, 1, max_results, out);
}

int32_t PhrasePool::lookup_ngram(const int32_t* key, int32_t key_len, int32_t max_results,
                                 std::vector<std::vector<int32_t>>& out) const {
    if (key_len < 1 || key_len > params_.max_key_len) {
        throw InvalidArgumentError("PhrasePool::lookup_ngram: key_len must be in 1.." +
                                   std::to_string(params_.max_key_len) + " (max_key_len), got " +
                                   std::to_string(key_len));
    }
    if (key == nullptr) throw InvalidArgumentError("PhrasePool::lookup_ngram: key is null");
    if (max_results < 0) {
        throw InvalidArgumentError("PhrasePool lookup: max_results must be >= 0, got " + std::to_string(max_results));
    }
    int32_t n_out = 0;
    {
        std::shared_lock lock(mutex_);
        const size_t cell = store_->find_key(key, key_len, sequence_hash(key, key_len));
        if (cell != ProbeTable<KeyCell>::npos) n_out = store_->collect(cell, key_len, max_results, out);
    }
    out.resize(size_t(n_out));
    n_lookups_.fetch_add(1, std::memory_order_relaxed);
    if (n_out > 0) n_hits_.fetch_add(1, std::memory_order_relaxed);
    return n_out;
}

bool PhrasePool::record_use(const int32_t* tokens, int32_t n_tokens, int32_t n_accepted) {
    check_tokens(tokens, n_tokens, 0, "PhrasePool::record_use");
    if (n_accepted < 0 || n_accepted > std::max(0, n_tokens - 1)) {
        throw InvalidArgumentError("PhrasePool::record_use: n_accepted must be in 0.." +
                                   std::to_string(std::max(0, n_tokens - 1)) + " (n_tokens - 1), got " +
                                   std::to_string(n_accepted));
    }
    std::unique_lock lock(mutex_);
    return store_->record_use(tokens, n_tokens, n_accepted);
}

bool PhrasePool::erase(const int32_t* tokens, int32_t n_tokens) {
    check_tokens(tokens, n_tokens, 0, "PhrasePool::erase");
    std::unique_lock lock(mutex_);
    return store_->erase(tokens, n_tokens);
}

bool PhrasePool::find(const int32_t* tokens, int32_t n_tokens, PhraseInfo* info) const {
    check_tokens(tokens, n_tokens, 0, "PhrasePool::find");
    std::shared_lock lock(mutex_);
    const int32_t s = store_->find_phrase(tokens, n_tokens);
    if (s < 0) return false;
    if (info != nullptr) {
        const Slot& slot = store_->slots[size_t(s)];
        info->source = slot.source;
        info->is_proven = slot.group() == kProven;
        info->is_protected = slot.segment == kProtected;
        info->n_refreshes = slot.n_refreshes;
        info->n_uses = slot.n_uses;
        info->n_hits = slot.n_hits;
        info->n_tokens_accepted = slot.n_tokens_accepted;
    }
    return true;
}

void PhrasePool::clear() {
    auto fresh = std::make_unique<Store>(params_);
    {
        std::unique_lock lock(mutex_);
        store_.swap(fresh);
        n_lookups_.store(0);
        n_hits_.store(0);
    }
}  // the old store is freed here, outside the lock

PhrasePoolStats PhrasePool::stats() const {
    std::shared_lock lock(mutex_);
    PhrasePoolStats stats = store_->counters;
    stats.size = int64_t(store_->n_phrases);
    stats.n_proven = int64_t(store_->n_proven);
    stats.n_lookups = n_lookups_.load(std::memory_order_relaxed);
    stats.n_hits = n_hits_.load(std::memory_order_relaxed);
    return stats;
}

size_t PhrasePool::size() const {
    std::shared_lock lock(mutex_);
    return store_->n_phrases;
}

size_t PhrasePool::memory_bytes() const {
    std::shared_lock lock(mutex_);
    return sizeof(PhrasePool) + store_->memory_bytes();
}

}  // namespace spec
