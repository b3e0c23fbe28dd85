// Unit tests for the phrase pool on hand-made phrases: sources, lookups by first token and by
// n-gram key, ranking, dedup, prefix merging, segmented-LRU eviction (by hand and against a naive
// reference model under random operations), save / load round trips and damaged files, clear,
// concurrent readers and writers, memory for a full default pool, and the harvest helpers.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "phrase_pool_reference.h"
#include "pool_file_bytes.h"
#include "spec/error.h"
#include "spec/phrase_pool.h"
#include "spec/rng.h"

namespace {

using namespace pool_test;

std::filesystem::path temp_dir() { return pool_test::temp_dir("test_phrase_pool_"); }

// ---- Tests ----

void test_validation() {
    CHECK(throws_invalid([] { PhrasePool pool(make_params(0)); }, "capacity must be in 1..16777216, got 0"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 1, 1)); }, "max_phrase_len must be in 2..64, got 1"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 65, 4)); }, "got 65"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 8, 0)); }, "got max_key_len=0"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 4, 4)); }, "max_key_len < max_phrase_len (4)"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 16, 9)); }, "max_key_len=9"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 8, 3, 1.5)); },
                         "protected_fraction must be in [0, 1], got 1.5"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 8, 3, -0.1)); }, "protected_fraction"));
    CHECK(throws_invalid([] { PhrasePool pool(make_params(4, 8, 3, 0.5, -1)); }, "n_vocab must be >= 0"));
    PhrasePool defaults;
    CHECK(defaults.params().capacity == 65536 && defaults.params().max_phrase_len == 16);

    PhrasePool pool(make_params(8, 8, 3, 0.5, 100));
    CHECK(throws_invalid([&] { insert(pool, {1, -2}); }, "token -2 at index 1 is outside the vocabulary [0, 100)"));
    CHECK(throws_invalid([&] { insert(pool, {1, 100}); }, "token 100"));
    CHECK(throws_invalid([&] { pool.insert(nullptr, 3, PhraseSource::prompt); }, "tokens is null"));
    CHECK(throws_invalid([&] { pool.insert(nullptr, -1, PhraseSource::prompt); }, "n_tokens must be >= 0, got -1"));
    CHECK(throws_invalid([&] { insert(pool, {1, 2}, PhraseSource(7)); }, "unknown PhraseSource 7"));
    Phrases out;
    CHECK(throws_invalid([&] { pool.lookup(1, -1, out); }, "max_results must be >= 0, got -1"));
    const Tokens key = {1, 2, 3, 4};
    CHECK(throws_invalid([&] { pool.lookup_ngram(key.data(), 4, 1, out); },
                         "key_len must be in 1..3 (max_key_len), got 4"));
    CHECK(throws_invalid([&] { pool.lookup_ngram(key.data(), 0, 1, out); }, "got 0"));
    CHECK(throws_invalid([&] { pool.lookup_ngram(nullptr, 2, 1, out); }, "key is null"));
    CHECK(throws_invalid([&] { record_use(pool, {1, 2, 3}, 3); },
                         "n_accepted must be in 0..2 (n_tokens - 1), got 3"));
    CHECK(throws_invalid([&] { record_use(pool, {1, 2, 3}, -1); }, "got -1"));
    CHECK(pool.size() == 0);
}

void test_insert_from_each_source() {
    PhrasePool pool(make_params(16));
    const PhraseSource sources[] = {PhraseSource::prompt, PhraseSource::generated, PhraseSource::lookahead,
                                    PhraseSource::verification, PhraseSource::loaded};
    const char* names[] = {"prompt", "generated", "lookahead", "verification", "loaded"};
    for (int32_t i = 0; i < spec::kPhraseSourceCount; ++i) {
        CHECK(insert(pool, {10 + i, 20 + i, 30 + i}, sources[i]));
        CHECK(std::string(spec::phrase_source_name(sources[i])) == names[i]);
    }
    for (int32_t i = 0; i < spec::kPhraseSourceCount; ++i) {
        CHECK(info(pool, {10 + i, 20 + i, 30 + i}).source == sources[i]);
        CHECK((lookup(pool, 10 + i) == Phrases{{10 + i, 20 + i, 30 + i}}));
    }
    // A later insert from another source refreshes; the first source stays.
    CHECK(!insert(pool, {10, 20, 30}, PhraseSource::verification));
    CHECK(info(pool, {10, 20, 30}).source == PhraseSource::prompt);
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.size == 5 && s.n_inserted == 5 && s.n_refreshed == 1);
    for (int32_t i = 0; i < spec::kPhraseSourceCount; ++i) CHECK(s.n_inserted_by_source[i] == 1);
}

void test_phrase_lengths() {
    PhrasePool pool(make_params(16, 4, 2));
    CHECK(!insert(pool, {}));
    CHECK(!insert(pool, {7}));
    CHECK(pool.insert(nullptr, 0, PhraseSource::prompt) == false);
    CHECK(pool.size() == 0);
    CHECK(insert(pool, {1, 2}));
    CHECK(insert(pool, {3, 4, 5, 6, 7, 8}));  // cut to max_phrase_len = 4
    CHECK(has(pool, {3, 4, 5, 6}) && !has(pool, {3, 4, 5, 6, 7, 8}));
    CHECK((lookup(pool, 3) == Phrases{{3, 4, 5, 6}}));
    CHECK(!insert(pool, {3, 4, 5, 6, 9}));  // the same phrase once cut: a refresh
    CHECK(pool.size() == 2);
}

void test_lookup_by_first_token() {
    PhrasePool pool(make_params(16));
    insert(pool, {1, 2, 3});
    insert(pool, {1, 4});
    insert(pool, {2, 1, 2, 3});
    insert(pool, {5, 6, 7, 8, 9});
    CHECK((lookup(pool, 1) == Phrases{{1, 4}, {1, 2, 3}}));
    CHECK((lookup(pool, 2) == Phrases{{2, 1, 2, 3}}));
    CHECK((lookup(pool, 1, 1) == Phrases{{1, 4}}));
    CHECK(lookup(pool, 1, 0).empty());
    CHECK(lookup(pool, 3).empty());   // 3 only occurs inside phrases
    CHECK(lookup(pool, 99).empty());
    // out is overwritten, not appended to.
    Phrases out = {{42}, {43}, {44}};
    CHECK(pool.lookup(5, 8, out) == 1);
    CHECK((out == Phrases{{5, 6, 7, 8, 9}}));
    CHECK(pool.lookup(99, 8, out) == 0 && out.empty());
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.n_lookups == 8 && s.n_hits == 4);
}

void test_lookup_by_ngram() {
    PhrasePool pool(make_params(16, 8, 3));
    insert(pool, {1, 2, 3, 4});
    insert(pool, {1, 2, 5});
    insert(pool, {1, 2});
    insert(pool, {1, 7, 3, 4});
    CHECK((lookup_ngram(pool, {1}) == Phrases{{1, 7, 3, 4}, {1, 2}, {1, 2, 5}, {1, 2, 3, 4}}));
    CHECK(lookup_ngram(pool, {1}) == lookup(pool, 1));
    // [1 2] is stored but leaves no continuation after the key [1 2]: not offered.
    CHECK((lookup_ngram(pool, {1, 2}) == Phrases{{1, 2, 5}, {1, 2, 3, 4}}));
    CHECK((lookup_ngram(pool, {1, 2, 3}) == Phrases{{1, 2, 3, 4}}));
    CHECK(lookup_ngram(pool, {1, 2, 5}).empty());
    CHECK(lookup_ngram(pool, {2, 3}).empty());
    CHECK((lookup_ngram(pool, {1, 7}, 1) == Phrases{{1, 7, 3, 4}}));
    // The continuation to propose after a matched suffix ... 1 2 3:
    const Phrases found = lookup_ngram(pool, {1, 2, 3});
    CHECK((Tokens(found[0].begin() + 3, found[0].end()) == Tokens{4}));
}

void test_ranking() {
    PhrasePool pool(make_params(16));
    const Tokens a = {1, 2, 3}, b = {1, 4, 5}, c = {1, 6, 7};
    insert(pool, a);
    insert(pool, b);
    insert(pool, c);
    CHECK((lookup(pool, 1) == Phrases{c, b, a}));  // most recent first
    CHECK(record_use(pool, a, 2));                  // accepted: proven phrases rank first
    CHECK((lookup(pool, 1) == Phrases{a, c, b}));
    CHECK(record_use(pool, c, 0));                  // rejected: behind the rest of its group
    CHECK((lookup(pool, 1) == Phrases{a, b, c}));
    insert(pool, c);                                // a refresh touches it again
    CHECK((lookup(pool, 1) == Phrases{a, c, b}));
    CHECK(record_use(pool, b, 1));                  // the most recently credited proven phrase first
    CHECK((lookup(pool, 1) == Phrases{b, a, c}));
    CHECK(record_use(pool, b, 0));                  // a failed proven phrase stays proven, last of them
    CHECK((lookup(pool, 1) == Phrases{a, b, c}));
    CHECK((lookup(pool, 1, 2) == Phrases{a, b}));
    CHECK((lookup_ngram(pool, {1, 4}) == Phrases{b}));
    CHECK(!record_use(pool, {1, 9}, 1));            // not stored: nothing changes
    const spec::PhraseInfo ib = info(pool, b);
    CHECK(ib.is_proven && ib.n_uses == 2 && ib.n_hits == 1 && ib.n_tokens_accepted == 1);
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.n_uses == 4 && s.n_phrases_accepted == 2 && s.n_tokens_accepted == 3 && s.n_proven == 2);
}

void test_dedup() {
    PhrasePool pool(make_params(16));
    CHECK(insert(pool, {3, 1, 4}));
    CHECK(!insert(pool, {3, 1, 4}, PhraseSource::prompt));
    CHECK(!insert(pool, {3, 1, 4}, PhraseSource::lookahead));
    CHECK(pool.size() == 1);
    CHECK((lookup(pool, 3) == Phrases{{3, 1, 4}}));
    CHECK(info(pool, {3, 1, 4}).n_refreshes == 2);
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.n_inserted == 1 && s.n_refreshed == 2);
}

void test_prefix_merge() {
    PhrasePool pool(make_params(16));
    insert(pool, {1, 2});
    CHECK(record_use(pool, {1, 2}, 1));
    CHECK(insert(pool, {1, 2, 3}));  // extends [1 2]: absorbs it and its statistics
    CHECK(!has(pool, {1, 2}) && has(pool, {1, 2, 3}));
    const spec::PhraseInfo merged = info(pool, {1, 2, 3});
    CHECK(merged.is_proven && merged.is_protected && merged.n_uses == 1 && merged.n_tokens_accepted == 1);
    CHECK((lookup(pool, 1) == Phrases{{1, 2, 3}}));
    // The reverse order is not merged: a prefix of a stored phrase is stored on its own.
    insert(pool, {5, 6, 7});
    CHECK(insert(pool, {5, 6}));
    CHECK(has(pool, {5, 6}) && has(pool, {5, 6, 7}));
    // A longer phrase absorbs every stored proper prefix at once.
    CHECK(insert(pool, {5, 6, 7, 8}));
    CHECK(!has(pool, {5, 6}) && !has(pool, {5, 6, 7}) && has(pool, {5, 6, 7, 8}));
    // Same first tokens but not a prefix: both stay.
    CHECK(insert(pool, {5, 6, 9}));
    CHECK(has(pool, {5, 6, 9}) && has(pool, {5, 6, 7, 8}));
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.n_merged == 3 && s.size == 3);
}

void test_eviction_least_recent_first() {
    PhrasePool pool(make_params(3));
    const Tokens p1 = {1, 1}, p2 = {2, 2}, p3 = {3, 3}, p4 = {4, 4}, p5 = {5, 5}, p6 = {6, 6};
    insert(pool, p1);
    insert(pool, p2);
    insert(pool, p3);
    insert(pool, p4);  // full: the least recent goes
    CHECK(!has(pool, p1) && has(pool, p2) && has(pool, p3) && has(pool, p4));
    insert(pool, p2);  // refreshed: p3 is now the least recent
    insert(pool, p5);
    CHECK(!has(pool, p3) && has(pool, p2) && has(pool, p4) && has(pool, p5));
    CHECK(record_use(pool, p5, 0));  // rejected: first to go
    insert(pool, p6);
    CHECK(!has(pool, p5) && has(pool, p2) && has(pool, p4) && has(pool, p6));
    CHECK(lookup(pool, 1).empty() && lookup(pool, 5).empty());
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.size == 3 && s.n_evicted == 3 && s.n_inserted == 6);
}

void test_eviction_keeps_accepted_phrases() {
    PhrasePool pool(make_params(4, 8, 3, 0.5));  // at most 2 protected
    const Tokens a = {100, 1}, b = {101, 1};
    insert(pool, a);
    insert(pool, b);
    record_use(pool, a, 1);
    record_use(pool, b, 1);
    for (int32_t i = 0; i < 20; ++i) insert(pool, {i, i});  // a flood of one-off phrases
    CHECK(has(pool, a) && has(pool, b));
    CHECK(has(pool, {18, 18}) && has(pool, {19, 19}) && !has(pool, {17, 17}));
    CHECK(info(pool, a).is_protected && info(pool, b).is_protected);

    // Protected overflows: its least recent phrase (a) is demoted to the front of probation ...
    record_use(pool, {19, 19}, 1);
    CHECK(!info(pool, a).is_protected && info(pool, a).is_proven);
    insert(pool, {50, 50});  // ... so the older probation phrase goes first,
    CHECK(!has(pool, {18, 18}) && has(pool, a));
    insert(pool, {51, 51});  // then a, unless it is credited again meanwhile.
    CHECK(!has(pool, a) && has(pool, b) && has(pool, {19, 19}));
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.size == 4 && s.n_proven == 2);
}

void test_eviction_all_protected() {
    PhrasePool pool(make_params(2, 8, 3, 1.0));
    const Tokens a = {1, 1}, b = {2, 2};
    insert(pool, a);
    insert(pool, b);
    record_use(pool, b, 1);
    record_use(pool, a, 1);
    insert(pool, {3, 3});  // probation is empty: the least recent protected phrase goes
    CHECK(!has(pool, b) && has(pool, a) && has(pool, {3, 3}));
    PhrasePool unprotected(make_params(2, 8, 3, 0.0));  // plain LRU with credit as a touch
    insert(unprotected, a);
    insert(unprotected, b);
    record_use(unprotected, a, 1);
    CHECK(!info(unprotected, a).is_protected);
    insert(unprotected, {3, 3});
    CHECK(has(unprotected, a) && !has(unprotected, b));
}

void test_matches_reference_model() {
    struct Config {
        size_t capacity;
        int32_t max_phrase_len, max_key_len;
        double protected_fraction;
    };
    const Config configs[] = {{20, 5, 3, 0.5}, {7, 4, 2, 0.0}, {7, 6, 3, 1.0}, {1, 3, 2, 0.5}, {40, 6, 4, 0.8}};
    const int32_t n_vocab = 4;
    for (const Config& c : configs) {
        const spec::PhrasePoolParams params =
            make_params(c.capacity, c.max_phrase_len, c.max_key_len, c.protected_fraction);
        PhrasePool pool(params);
        RefPool ref(params);
        spec::Rng rng(c.capacity * 31 + uint64_t(c.max_phrase_len));
        int32_t n_differences = 0;
        for (int32_t step = 0; step < 1500; ++step) {
            random_op(rng, pool, ref, n_vocab);
            if (!same_as_reference(pool, ref, n_vocab)) ++n_differences;
        }
        CHECK(n_differences == 0);
        CHECK(pool.stats().n_evicted > 0);
    }
}

void test_save_load_round_trip() {
    const spec::PhrasePoolParams params = make_params(30, 6, 3, 0.5, 5);
    PhrasePool pool(params);
    RefPool ref(params);
    spec::Rng rng(7);
    for (int32_t i = 0; i < 400; ++i) random_op(rng, pool, ref, 5);
    const std::string path = (temp_dir() / "round_trip.pool").string();
    pool.save(path);
    CHECK(std::filesystem::exists(path) && !std::filesystem::exists(path + ".tmp"));

    PhrasePool loaded(params);
    insert(loaded, {4, 4, 4});  // replaced by the file's contents
    loaded.load(path);
    CHECK(same_as_reference(loaded, ref, 5, false));  // lookups, ranking and per-phrase statistics
    CHECK(loaded.stats().n_loaded == int64_t(pool.size()));
    // The eviction order came back too: the same operations keep both pools identical.
    RefPool ref_copy = ref;
    spec::Rng rng_a(8), rng_b(8);
    int32_t n_differences = 0;
    for (int32_t i = 0; i < 300; ++i) {
        random_op(rng_a, pool, ref, 5);
        random_op(rng_b, loaded, ref_copy, 5);
        for (const Tokens& key : all_keys(5, 3)) {
            n_differences += lookup_ngram(pool, key) != lookup_ngram(loaded, key);
        }
    }
    CHECK(n_differences == 0);
    // A saved file loads the same again (saving is deterministic).
    const std::string path2 = (temp_dir() / "round_trip2.pool").string();
    pool.save(path);
    loaded.save(path2);
    CHECK(read_bytes(path) == read_bytes(path2));
    // An empty pool round-trips as well.
    PhrasePool empty(params);
    empty.save(path);
    loaded.load(path);
    CHECK(loaded.size() == 0 && lookup(loaded, 1).empty());
}

void test_load_into_smaller_pool() {
    PhrasePool pool(make_params(10, 8, 3, 0.5));
    for (int32_t i = 0; i < 10; ++i) insert(pool, {i, i});
    record_use(pool, {0, 0}, 1);
    record_use(pool, {1, 1}, 1);
    const std::string path = (temp_dir() / "smaller.pool").string();
    pool.save(path);
    PhrasePool small(make_params(4, 8, 3, 0.5));
    small.load(path);  // keeps the 4 last in eviction order: probation's newest, then protected
    CHECK(small.size() == 4);
    CHECK(has(small, {8, 8}) && has(small, {9, 9}) && has(small, {0, 0}) && has(small, {1, 1}));
    CHECK(info(small, {0, 0}).is_protected && info(small, {1, 1}).is_protected);
    const spec::PhrasePoolStats s = small.stats();
    CHECK(s.n_loaded == 4 && s.n_evicted == 6 && s.n_proven == 2);
    // A smaller protected share demotes the least recently credited.
    PhrasePool less_protected(make_params(10, 8, 3, 0.1));
    less_protected.load(path);
    CHECK(!info(less_protected, {0, 0}).is_protected && info(less_protected, {1, 1}).is_protected);
}

void test_damaged_files() {
    const spec::PhrasePoolParams params = make_params(16, 6, 3, 0.5, 50);
    PhrasePool source(params);
    insert(source, {1, 2, 3});
    insert(source, {1, 4, 5, 6});
    record_use(source, {1, 2, 3}, 2);
    const std::string good_path = (temp_dir() / "good.pool").string();
    source.save(good_path);
    const std::string good = read_bytes(good_path);

    PhrasePool pool(params);
    insert(pool, {7, 8, 9});
    const auto unchanged = [&] {
        return pool.size() == 1 && (lookup(pool, 7) == Phrases{{7, 8, 9}}) && lookup(pool, 1).empty();
    };
    const std::string path = (temp_dir() / "bad.pool").string();
    const auto load_bytes = [&](const std::string& bytes) {
        write_bytes(path, bytes);
        pool.load(path);
    };

    CHECK(throws<spec::PoolFileError>([&] { pool.load((temp_dir() / "missing.pool").string()); },
                                      "cannot open phrase pool file"));
    CHECK(throws<spec::PoolFileError>([&] { load_bytes("not a pool file at all, just text"); },
                                      "is not a phrase pool file"));
    // Cut inside the magic, the header, a phrase, the checksum.
    for (size_t cut : {size_t(0), size_t(5), size_t(8), size_t(13), size_t(20), size_t(40), size_t(60),
                       good.size() - 9, good.size() - 1}) {
        CHECK(throws<spec::PoolFileError>([&] { load_bytes(good.substr(0, cut)); }, "truncated"));
        CHECK(unchanged());
    }
    std::string flipped = good;
    flipped[50] = char(flipped[50] ^ 0x40);  // inside the first phrase
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(flipped); }, "corrupt or truncated (checksum mismatch)"));
    std::string extra = good + "xyz";
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(extra); }, "checksum mismatch"));
    std::string version = good;
    version[8] = 2;
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(version); },
                                      "has format version 2; this build reads version 1"));
    // Edits with a valid checksum reach the checks behind it.
    std::string trailing = good.substr(0, good.size() - 8) + "abcd" + std::string(8, '\0');
    fix_checksum(trailing);
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(trailing); }, "4 bytes after the last phrase"));
    std::string count = good;
    count[16] = 3;  // 3 phrases claimed, 2 stored
    fix_checksum(count);
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(count); }, "corrupt"));
    std::string bad_token = good;
    bad_token[36 + 28] = 60;  // first token of the first phrase: 60 >= n_vocab 50
    fix_checksum(bad_token);
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(bad_token); },
                                      "holds token 60, outside the vocabulary [0, 50)"));
    // Two copies of the same phrase record.
    const size_t first_record = 36, record_bytes = 28 + 4 * size_t(uint8_t(good[36]));
    std::string duplicate =
        good.substr(0, good.size() - 8) + good.substr(first_record, record_bytes) + std::string(8, '\0');
    duplicate[16] = 3;
    fix_checksum(duplicate);
    CHECK(throws<spec::PoolFileError>([&] { load_bytes(duplicate); }, "is stored twice"));
    CHECK(unchanged());

    PhrasePool other_vocab(make_params(16, 6, 3, 0.5, 51));
    CHECK(throws<spec::VocabMismatchError>([&] { other_vocab.load(good_path); },
                                           "saved for a vocabulary of 50 tokens; this pool's n_vocab is 51"));
    PhrasePool shorter(make_params(16, 3, 2, 0.5, 50));
    CHECK(throws<spec::PoolFileError>([&] { shorter.load(good_path); },
                                      "has 4 tokens; this pool's max_phrase_len is 3"));
    PhrasePool unknown_vocab(make_params(16, 6, 3));  // n_vocab 0 accepts any vocabulary
    unknown_vocab.load(good_path);
    CHECK(unknown_vocab.size() == 2);
    CHECK(unchanged());
    CHECK(throws<spec::PoolFileError>([&] { source.save((temp_dir() / "no_such_dir" / "x.pool").string()); },
                                      "cannot write phrase pool file"));
}

void test_clear() {
    PhrasePool pool(make_params(8));
    insert(pool, {1, 2, 3});
    insert(pool, {1, 5});
    record_use(pool, {1, 5}, 1);
    lookup(pool, 1);
    pool.clear();
    CHECK(pool.size() == 0 && lookup(pool, 1).empty() && !has(pool, {1, 5}));
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.size == 0 && s.n_inserted == 0 && s.n_uses == 0 && s.n_proven == 0 && s.n_lookups == 1);
    CHECK(insert(pool, {1, 2, 3}));
    CHECK((lookup(pool, 1) == Phrases{{1, 2, 3}}));
}

// Writers insert, credit and erase while readers look up: no crash, and every result a reader sees
// is well formed (right key, no repeats, proven phrases first as find() reported at the time).
void test_concurrent_readers_and_writers() {
    const int32_t n_vocab = 12;
    PhrasePool pool(make_params(300, 6, 3, 0.5, n_vocab));
    std::atomic<int64_t> n_bad_results{0}, n_lookups{0}, n_nonempty{0};
    std::atomic<bool> writers_done{false};
    std::vector<std::thread> threads;
    for (int32_t w = 0; w < 2; ++w) {
        threads.emplace_back([&pool, w] {
            spec::Rng rng(100 + uint64_t(w));
            for (int32_t i = 0; i < 20000; ++i) {
                const Tokens phrase = random_phrase(rng, n_vocab, 2, 6);
                const uint64_t op = rng.next_u64() % 10;
                if (op < 7) {
                    insert(pool, phrase, PhraseSource(rng.next_u64() % spec::kPhraseSourceCount));
                } else if (op < 9) {
                    Phrases found;
                    if (pool.lookup(phrase[0], 4, found) > 0) record_use(pool, found[0], int32_t(rng.next_u64() % 2));
                } else {
                    pool.erase(phrase.data(), int32_t(phrase.size()));
                }
            }
        });
    }
    for (int32_t r = 0; r < 3; ++r) {
        threads.emplace_back([&, r] {
            spec::Rng rng(200 + uint64_t(r));
            Phrases out;
            while (!writers_done.load()) {
                const int32_t key_len = 1 + int32_t(rng.next_u64() % 3);
                const Tokens key = random_phrase(rng, n_vocab, key_len, key_len);
                const int32_t n = pool.lookup_ngram(key.data(), key_len, 8, out);
                ++n_lookups;
                if (n > 0) ++n_nonempty;
                bool ok = n == int32_t(out.size()) && n <= 8;
                for (int32_t i = 0; ok && i < n; ++i) {
                    const Tokens& p = out[size_t(i)];
                    ok = int32_t(p.size()) > key_len && p.size() <= 6 &&
                         std::equal(key.begin(), key.end(), p.begin());
                    for (int32_t j = 0; ok && j < i; ++j) ok = out[size_t(j)] != p;
                }
                if (!ok) ++n_bad_results;
                (void)pool.stats();
            }
        });
    }
    for (int32_t w = 0; w < 2; ++w) threads[size_t(w)].join();
    writers_done.store(true);
    for (size_t t = 2; t < threads.size(); ++t) threads[t].join();

    CHECK(n_bad_results.load() == 0);
    CHECK(n_lookups.load() > 0);
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.size == int64_t(pool.size()) && s.size <= 300 && s.size > 0);
    CHECK(s.size == s.n_inserted - s.n_evicted - s.n_merged - s.n_erased);
    CHECK(s.n_lookups >= n_lookups.load());
    // The indexes agree with the phrase table after all that churn.
    int64_t n_listed = 0;
    for (int32_t t = 0; t < n_vocab; ++t) {
        for (const Tokens& p : lookup(pool, t, 1000)) {
            CHECK(has(pool, p));
            ++n_listed;
        }
    }
    CHECK(n_listed == s.size);
}

void test_memory_of_a_full_default_pool() {
    PhrasePool pool;  // capacity 65536, max_phrase_len 16, max_key_len 4
    spec::Rng rng(3);
    std::vector<Tokens> kept;
    for (int32_t i = 0; i < 65536 + 1000; ++i) {
        const Tokens phrase = random_phrase(rng, 32000, 16, 16);
        insert(pool, phrase);
        if (i % 9973 == 0) kept.push_back(phrase);
    }
    const size_t bytes = pool.memory_bytes();
    std::printf("full default pool: %zu phrases, %.1f MB\n", pool.size(), double(bytes) / (1 << 20));
    CHECK(pool.size() == 65536);
    CHECK(pool.stats().n_evicted == 1000);
    CHECK(bytes < size_t(20) << 20);
    for (size_t i = 1; i < kept.size(); ++i) {  // kept[0] was the first in, so evicted
        const Phrases found = lookup_ngram(pool, Tokens(kept[i].begin(), kept[i].begin() + 4));
        CHECK(std::find(found.begin(), found.end(), kept[i]) != found.end());
    }
    CHECK(!has(pool, kept[0]));
}

void test_harvest_verification() {
    // Draft 1 2 3 4 5 6 after context token 9; the target disagrees at 1 (7) and 4 (8) and adds
    // bonus-position token 10.
    spec::VerificationHarvest h = spec::harvest_verification(9, {1, 2, 3, 4, 5, 6}, {1, 7, 3, 4, 8, 6, 10});
    CHECK((h.segments == Phrases{{2, 3, 4, 8}, {5, 6, 10}}));
    CHECK((h.corrected == Tokens{9, 1, 7, 3, 4, 8, 6}));
    h = spec::harvest_verification(9, {1, 2, 3, 4, 5, 6}, {1, 7, 3, 4, 8, 6, 10}, 2);
    CHECK((h.segments == Phrases{{2, 3, 4, 8}}));
    h = spec::harvest_verification(9, {1, 2, 3, 4, 5, 6}, {1, 7, 3, 4, 8, 6});  // no bonus row
    CHECK((h.segments == Phrases{{2, 3, 4, 8}, {5, 6}}));
    // Only the first token is wrong: the rest, and the target's token after it, form a phrase.
    h = spec::harvest_verification(0, {5, 6, 7}, {8, 6, 7, 9});
    CHECK((h.segments == Phrases{{5, 6, 7, 9}}));
    CHECK((h.corrected == Tokens{0, 8, 6, 7}));
    // Rejected only at the last token: nothing agrees after it.
    h = spec::harvest_verification(0, {1, 2, 3}, {1, 2, 4});
    CHECK(h.segments.empty() && (h.corrected == Tokens{0, 1, 2, 4}));
    // Accepted whole: nothing was discarded.
    h = spec::harvest_verification(0, {1, 2}, {1, 2, 3});
    CHECK(h.segments.empty() && h.corrected.empty());
    h = spec::harvest_verification(0, {}, {3});
    CHECK(h.segments.empty() && h.corrected.empty());
    // No agreement after the mismatch.
    h = spec::harvest_verification(0, {1, 2, 3}, {4, 5, 6, 7});
    CHECK(h.segments.empty() && (h.corrected == Tokens{0, 4, 5, 6}));
    CHECK(throws_invalid([] { spec::harvest_verification(0, {1, 2}, {1}); },
                         "n_draft or n_draft + 1 tokens (n_draft = 2), got 1"));
    CHECK(throws_invalid([] { spec::harvest_verification(0, {1, 2}, {1, 2, 3, 4}); }, "got 4"));
    CHECK(throws_invalid([] { spec::harvest_verification(0, {1}, {1}, 0); }, "min_match must be >= 1, got 0"));

    // Into the pool, then found by the token the next draft ends with.
    PhrasePool pool(make_params(16));
    h = spec::harvest_verification(9, {1, 2, 3, 4, 5, 6}, {1, 7, 3, 4, 8, 6, 10});
    for (const Tokens& segment : h.segments) insert(pool, segment, PhraseSource::verification);
    CHECK((lookup(pool, 2) == Phrases{{2, 3, 4, 8}}));
    CHECK(pool.stats().n_inserted_by_source[int32_t(PhraseSource::verification)] == 2);
}

void test_extract_phrases() {
    const Tokens tokens = {1, 2, 3, 4, 5, 6, 7};
    CHECK((spec::extract_phrases(tokens, 3) == Tokens{1, 2, 3, 2, 3, 4, 3, 4, 5, 4, 5, 6, 5, 6, 7}));
    CHECK((spec::extract_phrases(tokens, 3, 2) == Tokens{1, 2, 3, 3, 4, 5, 5, 6, 7}));
    CHECK((spec::extract_phrases(tokens, 3, 3) == Tokens{1, 2, 3, 4, 5, 6}));
    CHECK((spec::extract_phrases(tokens, 7, 5) == tokens));
    CHECK(spec::extract_phrases(tokens, 8).empty());
    CHECK(spec::extract_phrases({}, 2).empty());
    CHECK(throws_invalid([&] { spec::extract_phrases(tokens, 1); }, "phrase_len must be >= 2, got 1"));
    CHECK(throws_invalid([&] { spec::extract_phrases(tokens, 2, 0); }, "stride must be >= 1, got 0"));
    // A prompt's windows into the pool: each window is found by its first token.
    PhrasePool pool(make_params(16));
    const std::vector<int32_t> windows = spec::extract_phrases(tokens, 3, 2);
    for (size_t i = 0; i < windows.size(); i += 3) pool.insert(windows.data() + i, 3, PhraseSource::prompt);
    CHECK(pool.size() == 3 && (lookup(pool, 3) == Phrases{{3, 4, 5}}));
}

}  // namespace

int main() {
    test_validation();
    test_insert_from_each_source();
    test_phrase_lengths();
    test_lookup_by_first_token();
    test_lookup_by_ngram();
    test_ranking();
    test_dedup();
    test_prefix_merge();
    test_eviction_least_recent_first();
    test_eviction_keeps_accepted_phrases();
    test_eviction_all_protected();
    test_matches_reference_model();
    test_save_load_round_trip();
    test_load_into_smaller_pool();
    test_damaged_files();
    test_clear();
    test_concurrent_readers_and_writers();
    test_memory_of_a_full_default_pool();
    test_harvest_verification();
    test_extract_phrases();
    std::filesystem::remove_all(temp_dir());
    std::printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
