// The phrase pool's specification for the tests, written the slow and obvious way (std::map,
// std::list, a scan and a sort per lookup), and helpers that apply one random operation to the
// pool and to this reference and compare everything observable. Also the small wrappers the
// tests call the pool through.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <utility>
#include <vector>

#include "check.h"
#include "spec/phrase_pool.h"
#include "spec/rng.h"

namespace pool_test {

using spec::PhrasePool;
using spec::PhraseSource;
using Tokens = std::vector<int32_t>;
using Phrases = std::vector<Tokens>;

inline spec::PhrasePoolParams make_params(size_t capacity, int32_t max_phrase_len = 8, int32_t max_key_len = 3,
                                          double protected_fraction = 0.5, int32_t n_vocab = 0) {
    spec::PhrasePoolParams params;
    params.capacity = capacity;
    params.max_phrase_len = max_phrase_len;
    params.max_key_len = max_key_len;
    params.protected_fraction = protected_fraction;
    params.n_vocab = n_vocab;
    return params;
}

inline bool insert(PhrasePool& pool, const Tokens& phrase, PhraseSource source = PhraseSource::generated) {
    return pool.insert(phrase.data(), int32_t(phrase.size()), source);
}

inline Phrases lookup(const PhrasePool& pool, int32_t first_token, int32_t max_results = 64) {
    Phrases out;
    const int32_t n = pool.lookup(first_token, max_results, out);
    CHECK(n == int32_t(out.size()));
    return out;
}

inline Phrases lookup_ngram(const PhrasePool& pool, const Tokens& key, int32_t max_results = 64) {
    Phrases out;
    const int32_t n = pool.lookup_ngram(key.data(), int32_t(key.size()), max_results, out);
    CHECK(n == int32_t(out.size()));
    return out;
}

inline bool record_use(PhrasePool& pool, const Tokens& phrase, int32_t n_accepted) {
    return pool.record_use(phrase.data(), int32_t(phrase.size()), n_accepted);
}

inline bool has(const PhrasePool& pool, const Tokens& phrase) {
    return pool.find(phrase.data(), int32_t(phrase.size()), nullptr);
}

inline spec::PhraseInfo info(const PhrasePool& pool, const Tokens& phrase) {
    spec::PhraseInfo out;
    CHECK(pool.find(phrase.data(), int32_t(phrase.size()), &out));
    return out;
}


inline std::vector<Tokens> all_keys(int32_t n_vocab, int32_t max_key_len) {
    std::vector<Tokens> keys;
    std::vector<Tokens> level = {{}};
    for (int32_t k = 1; k <= max_key_len; ++k) {
        std::vector<Tokens> next;
        for (const Tokens& prefix : level) {
            for (int32_t t = 0; t < n_vocab; ++t) {
                Tokens key = prefix;
                key.push_back(t);
                next.push_back(key);
            }
        }
        keys.insert(keys.end(), next.begin(), next.end());
        level = next;
    }
    return keys;
}

// ---- The specification ----

struct RefPool {
    struct Entry {
        PhraseSource source = PhraseSource::prompt;
        int64_t touch = 0;
        int64_t n_refreshes = 0, n_uses = 0, n_hits = 0, n_tokens_accepted = 0;
        int segment = 0;  // 0 probation, 1 protected
    };

    explicit RefPool(const spec::PhrasePoolParams& p)
        : params(p), protected_cap(size_t(double(p.capacity) * p.protected_fraction)) {}

    bool insert(Tokens phrase, PhraseSource source) {
        if (int32_t(phrase.size()) > params.max_phrase_len) phrase.resize(size_t(params.max_phrase_len));
        if (phrase.size() < 2) return false;
        auto it = entries.find(phrase);
        if (it != entries.end()) {
            ++it->second.n_refreshes;
            it->second.touch = ++touch_high;
            move(phrase, it->second.segment, true);
            ++n_refreshed;
            return false;
        }
        Entry merged;
        bool was_protected = false;
        for (size_t len = 2; len < phrase.size(); ++len) {
            const Tokens prefix(phrase.begin(), phrase.begin() + std::ptrdiff_t(len));
            auto p = entries.find(prefix);
            if (p == entries.end()) continue;
            merged.n_refreshes += p->second.n_refreshes;
            merged.n_uses += p->second.n_uses;
            merged.n_hits += p->second.n_hits;
            merged.n_tokens_accepted += p->second.n_tokens_accepted;
            was_protected = was_protected || p->second.segment == 1;
            remove(prefix);
            ++n_merged;
        }
        if (entries.size() == params.capacity) {
            const int victim_segment = segments[0].empty() ? 1 : 0;
            remove(segments[victim_segment].back());
            ++n_evicted;
        }
        merged.source = source;
        merged.touch = ++touch_high;
        merged.segment = was_protected ? 1 : 0;
        entries[phrase] = merged;
        segments[merged.segment].push_front(phrase);
        enforce_cap();
        ++n_inserted;
        return true;
    }

    bool record_use(const Tokens& phrase, int32_t n_accepted) {
        auto it = entries.find(phrase);
        if (it == entries.end()) return false;
        Entry& e = it->second;
        ++e.n_uses;
        if (n_accepted == 0) {
            e.touch = --touch_low;
            move(phrase, e.segment, false);
            return true;
        }
        ++e.n_hits;
        e.n_tokens_accepted += n_accepted;
        e.touch = ++touch_high;
        segments[e.segment].remove(phrase);
        e.segment = 1;
        segments[1].push_front(phrase);
        enforce_cap();
        return true;
    }

    bool erase(const Tokens& phrase) {
        if (entries.count(phrase) == 0) return false;
        remove(phrase);
        ++n_erased;
        return true;
    }

    Phrases lookup(const Tokens& key, size_t max_results) const {
        std::vector<std::pair<const Tokens*, const Entry*>> matches;
        for (const auto& [phrase, e] : entries) {
            if (phrase.size() > key.size() && std::equal(key.begin(), key.end(), phrase.begin())) {
                matches.emplace_back(&phrase, &e);
            }
        }
        std::sort(matches.begin(), matches.end(), [](const auto& a, const auto& b) {
            const bool a_proven = a.second->n_hits > 0, b_proven = b.second->n_hits > 0;
            if (a_proven != b_proven) return a_proven;
            return a.second->touch > b.second->touch;
        });
        Phrases out;
        for (size_t i = 0; i < matches.size() && i < max_results; ++i) out.push_back(*matches[i].first);
        return out;
    }

    void move(const Tokens& phrase, int segment, bool to_front) {
        segments[segment].remove(phrase);
        if (to_front) {
            segments[segment].push_front(phrase);
        } else {
            segments[segment].push_back(phrase);
        }
    }

    void remove(Tokens phrase) {  // a copy: `phrase` may be an element of the list it leaves
        segments[entries.at(phrase).segment].remove(phrase);
        entries.erase(phrase);
    }

    void enforce_cap() {
        while (segments[1].size() > protected_cap) {
            const Tokens demoted = segments[1].back();
            segments[1].pop_back();
            entries.at(demoted).segment = 0;
            segments[0].push_front(demoted);
        }
    }

    spec::PhrasePoolParams params;
    size_t protected_cap;
    std::map<Tokens, Entry> entries;
    std::list<Tokens> segments[2];  // most recent first
    int64_t touch_high = 0, touch_low = 0;
    int64_t n_inserted = 0, n_refreshed = 0, n_merged = 0, n_evicted = 0, n_erased = 0;
};

// Every lookup, every phrase's info and (when compare_counters) the counters of `pool` equal the
// reference's.
inline bool same_as_reference(const PhrasePool& pool, const RefPool& ref, int32_t n_vocab,
                              bool compare_counters = true) {
    bool same = pool.size() == ref.entries.size();
    for (const Tokens& key : all_keys(n_vocab, pool.params().max_key_len)) {
        same = same && lookup_ngram(pool, key, 1000) == ref.lookup(key, 1000);
        same = same && lookup_ngram(pool, key, 2) == ref.lookup(key, 2);
    }
    int64_t n_proven = 0;
    for (const auto& [phrase, e] : ref.entries) {
        spec::PhraseInfo got;
        if (!pool.find(phrase.data(), int32_t(phrase.size()), &got)) return false;
        same = same && got.source == e.source && got.is_proven == (e.n_hits > 0) &&
               got.is_protected == (e.segment == 1) && got.n_refreshes == e.n_refreshes && got.n_uses == e.n_uses &&
               got.n_hits == e.n_hits && got.n_tokens_accepted == e.n_tokens_accepted;
        n_proven += e.n_hits > 0;
    }
    const spec::PhrasePoolStats s = pool.stats();
    same = same && s.n_proven == n_proven && s.size == int64_t(ref.entries.size());
    if (!compare_counters) return same;
    same = same && s.n_inserted == ref.n_inserted && s.n_refreshed == ref.n_refreshed && s.n_merged == ref.n_merged &&
           s.n_evicted == ref.n_evicted && s.n_erased == ref.n_erased;
    return same;
}

inline Tokens random_phrase(spec::Rng& rng, int32_t n_vocab, int32_t min_len, int32_t max_len) {
    Tokens phrase(size_t(min_len + int32_t(rng.next_u64() % uint64_t(max_len - min_len + 1))));
    for (int32_t& t : phrase) t = int32_t(rng.next_u64() % uint64_t(n_vocab));
    return phrase;
}

// One random operation applied to both the pool and the reference (insert / record_use / erase).
inline void random_op(spec::Rng& rng, PhrasePool& pool, RefPool& ref, int32_t n_vocab) {
    const uint64_t op = rng.next_u64() % 100;
    const int32_t max_len = pool.params().max_phrase_len;
    Tokens phrase = random_phrase(rng, n_vocab, 1, max_len + 1);
    if (op >= 60 && !ref.entries.empty() && rng.next_u64() % 4 != 0) {
        auto it = ref.entries.begin();
        std::advance(it, std::ptrdiff_t(rng.next_u64() % ref.entries.size()));
        phrase = it->first;
    }
    if (op < 60) {
        const auto source = PhraseSource(rng.next_u64() % spec::kPhraseSourceCount);
        CHECK(insert(pool, phrase, source) == ref.insert(phrase, source));
    } else if (op < 94) {
        const int32_t n_accepted = int32_t(rng.next_u64() % phrase.size());
        CHECK(record_use(pool, phrase, n_accepted) == ref.record_use(phrase, n_accepted));
    } else {
        CHECK(pool.erase(phrase.data(), int32_t(phrase.size())) == ref.erase(phrase));
    }
}

}  // namespace pool_test
