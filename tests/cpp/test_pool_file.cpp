// Phrase pool files against hostile and damaged input: rank stamps that would overflow, a symlink
// planted at the temporary save path, a file far larger than the pool (memory must stay bounded by
// the pool), and a fuzz run of mutated files (each either loads into a consistent pool or raises
// PoolFileError / VocabMismatchError and leaves the pool unchanged). PYSPEC_FUZZ_CASES sets the
// number of fuzz cases (default 20000).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "phrase_pool_reference.h"
#include "pool_file_bytes.h"
#include "spec/error.h"
#include "spec/phrase_pool.h"
#include "spec/rng.h"

namespace {

using namespace pool_test;

constexpr size_t kHeaderBytes = 36;  // magic, version, n_vocab, n_phrases, two rank stamps
constexpr size_t kTouchHighOffset = 20, kTouchLowOffset = 28;
constexpr size_t kRecordTouchOffset = 4;  // within a record

std::filesystem::path temp_dir() { return pool_test::temp_dir("test_pool_file_"); }

void put_u64(std::string& bytes, size_t offset, uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes[offset + size_t(i)] = char(uint8_t(v >> (8 * i)));
}

// A small pool with phrases in both segments, saved: the seed of the damaged files below.
std::string saved_pool_bytes(const spec::PhrasePoolParams& params, int32_t n_phrases) {
    PhrasePool pool(params);
    spec::Rng rng(11);
    for (int32_t i = 0; i < n_phrases; ++i) {
        insert(pool, random_phrase(rng, params.n_vocab > 0 ? params.n_vocab : 50, 2, params.max_phrase_len));
    }
    for (int32_t t = 0; t < 10; ++t) {
        for (const auto& phrase : lookup(pool, t)) record_use(pool, phrase, int32_t(phrase.size()) % 2);
    }
    const std::string path = (temp_dir() / "seed.pool").string();
    pool.save(path);
    return read_bytes(path);
}

void test_hostile_rank_stamps() {
    const spec::PhrasePoolParams params = make_params(16, 6, 3, 0.5, 50);
    PhrasePool source(params);
    insert(source, {1, 2, 3});
    const std::string path = (temp_dir() / "stamps.pool").string();
    source.save(path);
    const std::string good = read_bytes(path);
    const auto load = [&](const std::string& bytes, PhrasePool& pool) {
        write_bytes(path, bytes);
        pool.load(path);
    };

    // The newest stamp at INT64_MAX: the next touch would overflow a signed integer.
    std::string high = good;
    put_u64(high, kTouchHighOffset, uint64_t(std::numeric_limits<int64_t>::max()));
    put_u64(high, kHeaderBytes + kRecordTouchOffset, uint64_t(std::numeric_limits<int64_t>::max()));
    fix_checksum(high);
    PhrasePool pool(params);
    insert(pool, {7, 8});
    CHECK(throws<spec::PoolFileError>([&] { load(high, pool); }, "rank stamps"));
    CHECK(has(pool, {7, 8}) && pool.size() == 1);

    // The lowest demotion stamp at INT64_MIN: the next demotion would overflow the other way.
    std::string low = good;
    put_u64(low, kTouchLowOffset, uint64_t(std::numeric_limits<int64_t>::min()));
    put_u64(low, kHeaderBytes + kRecordTouchOffset, uint64_t(std::numeric_limits<int64_t>::min()));
    fix_checksum(low);
    CHECK(throws<spec::PoolFileError>([&] { load(low, pool); }, "rank stamps"));

    // Stamps of the wrong sign cannot come from a pool either.
    std::string negative_high = good;
    put_u64(negative_high, kTouchHighOffset, uint64_t(int64_t(-5)));
    put_u64(negative_high, kTouchLowOffset, uint64_t(int64_t(-9)));
    put_u64(negative_high, kHeaderBytes + kRecordTouchOffset, uint64_t(int64_t(-7)));
    fix_checksum(negative_high);
    CHECK(throws<spec::PoolFileError>([&] { load(negative_high, pool); }, "rank stamps"));

    // At the limit the file loads and the pool keeps working (touches and demotions).
    std::string at_limit = good;
    const int64_t limit = int64_t(1) << 62;
    put_u64(at_limit, kTouchHighOffset, uint64_t(limit));
    put_u64(at_limit, kTouchLowOffset, uint64_t(-limit));
    put_u64(at_limit, kHeaderBytes + kRecordTouchOffset, uint64_t(limit));
    fix_checksum(at_limit);
    load(at_limit, pool);
    CHECK(has(pool, {1, 2, 3}));
    insert(pool, {4, 5});
    CHECK(record_use(pool, {1, 2, 3}, 0));
    CHECK(record_use(pool, {4, 5}, 1));
    CHECK((lookup(pool, 4) == Phrases{{4, 5}}));
}

void test_save_never_writes_through_a_symlink() {
    const std::string victim = (temp_dir() / "victim.txt").string();
    write_bytes(victim, "keep me");
    const std::string path = (temp_dir() / "linked.pool").string();
    std::filesystem::remove(path + ".tmp");
    std::filesystem::create_symlink(victim, path + ".tmp");  // the name the old save wrote through
    PhrasePool pool(make_params(16, 6, 3, 0.5, 50));
    insert(pool, {1, 2, 3});
    pool.save(path);
    CHECK(read_bytes(victim) == "keep me");
    CHECK(std::filesystem::is_regular_file(std::filesystem::symlink_status(path)));
    PhrasePool loaded(make_params(16, 6, 3, 0.5, 50));
    loaded.load(path);
    CHECK(has(loaded, {1, 2, 3}));
    // A symlink at the destination is replaced by the file, not written through.
    const std::string linked_dest = (temp_dir() / "dest_link.pool").string();
    std::filesystem::remove(linked_dest);
    std::filesystem::create_symlink(victim, linked_dest);
    pool.save(linked_dest);
    CHECK(read_bytes(victim) == "keep me");
    CHECK(std::filesystem::is_regular_file(std::filesystem::symlink_status(linked_dest)));
    // No temporary is left behind.
    int n_left = 0;
    for (const auto& entry : std::filesystem::directory_iterator(temp_dir())) {
        n_left += entry.path().filename().string().find(".pool.tmp.") != std::string::npos;
    }
    CHECK(n_left == 0);
}

long peak_rss_kb() {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;  // kilobytes on Linux
}

// A pool file of n_phrases phrases of phrase_len tokens, written as a stream (no copy in memory).
uint64_t write_large_pool_file(const std::string& path, uint32_t n_phrases, int32_t phrase_len) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    uint64_t h = 0xcbf29ce484222325ULL;
    std::string chunk;
    const auto flush = [&] {
        for (char c : chunk) h = fnv1a_step(h, uint8_t(c));
        out.write(chunk.data(), std::streamsize(chunk.size()));
        chunk.clear();
    };
    const auto u8 = [&](uint8_t v) { chunk.push_back(char(v)); };
    const auto u32 = [&](uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(uint8_t(v >> (8 * i)));
    };
    const auto u64 = [&](uint64_t v) {
        for (int i = 0; i < 8; ++i) u8(uint8_t(v >> (8 * i)));
    };
    chunk.append("SPECPOOL");
    u32(1);
    u32(0);  // n_vocab unknown
    u32(n_phrases);
    u64(n_phrases);  // newest stamp
    u64(0);
    for (uint32_t i = 0; i < n_phrases; ++i) {
        u8(uint8_t(phrase_len));
        u8(0);  // source: prompt
        u8(0);
        u8(0);
        u64(uint64_t(i) + 1);
        for (int k = 0; k < 4; ++k) u32(0);
        u32(i / 50000);
        u32(i % 50000);
        for (int32_t k = 2; k < phrase_len; ++k) u32(uint32_t(k));
        if (chunk.size() > (size_t(1) << 20)) flush();
    }
    flush();
    for (int i = 0; i < 8; ++i) {
        const char c = char(uint8_t(h >> (8 * i)));
        out.write(&c, 1);
    }
    return uint64_t(out.tellp());
}

#if defined(__SANITIZE_ADDRESS__)
#define POOL_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_TEST_UNDER_ASAN 1
#endif
#endif

void test_load_memory_is_bounded_by_the_pool() {
#if defined(__linux__) && !defined(POOL_TEST_UNDER_ASAN)
    const std::string path = (temp_dir() / "large.pool").string();
    const uint32_t n_phrases = 400000;
    const uint64_t file_bytes = write_large_pool_file(path, n_phrases, 16);
    PhrasePool pool(make_params(1000, 16, 3, 0.5));
    const long before_kb = peak_rss_kb();
    pool.load(path);
    const long growth_kb = peak_rss_kb() - before_kb;
    std::printf("loading a %.1f MB pool file into a 1000-phrase pool raised peak RSS by %.1f MB\n",
                double(file_bytes) / 1e6, double(growth_kb) / 1e3);
    CHECK(pool.size() == 1000);
    const spec::PhrasePoolStats s = pool.stats();
    CHECK(s.n_loaded == 1000 && s.n_evicted == int64_t(n_phrases) - 1000);
    CHECK(has(pool, {int32_t((n_phrases - 1) / 50000), int32_t((n_phrases - 1) % 50000), 2, 3, 4, 5, 6, 7, 8, 9, 10,
                     11, 12, 13, 14, 15}));
    CHECK(double(growth_kb) * 1024.0 < double(file_bytes) / 4.0);
    std::filesystem::remove(path);
#else
    std::printf("test_load_memory_is_bounded_by_the_pool: not run (needs Linux's ru_maxrss, no ASan)\n");
#endif
}

// One random damage to a pool file.
std::string mutate(const std::string& good, spec::Rng& rng) {
    std::string bytes = good;
    const auto pick = [&](size_t n) { return size_t(rng.uniform() * double(n)) % (n ? n : 1); };
    const int kind = int(pick(9));
    switch (kind) {
        case 0:  // flip a few bits
            for (size_t k = 0, n = 1 + pick(4); k < n; ++k) bytes[pick(bytes.size())] ^= char(1 << pick(8));
            break;
        case 1:  // truncate
            bytes.resize(pick(bytes.size()));
            break;
        case 2:  // append garbage
            for (size_t k = 0, n = 1 + pick(64); k < n; ++k) bytes.push_back(char(pick(256)));
            break;
        case 3: {  // insert garbage in the middle
            std::string junk;
            for (size_t k = 0, n = 1 + pick(32); k < n; ++k) junk.push_back(char(pick(256)));
            bytes.insert(pick(bytes.size()), junk);
            break;
        }
        case 4: {  // a hostile count of phrases
            const uint32_t counts[] = {0u, 1u, 0xFFFFFFFFu, 0x7FFFFFFFu, uint32_t(1) << 24, (uint32_t(1) << 24) + 1,
                                       uint32_t(pick(100))};
            const uint32_t c = counts[pick(7)];
            for (int i = 0; i < 4; ++i) bytes[16 + size_t(i)] = char(uint8_t(c >> (8 * i)));
            break;
        }
        case 5: {  // hostile rank stamps (header or a record)
            const uint64_t values[] = {uint64_t(std::numeric_limits<int64_t>::max()),
                                       uint64_t(std::numeric_limits<int64_t>::min()), (uint64_t(1) << 62) + 1,
                                       uint64_t(-1), uint64_t(pick(1000))};
            const size_t offsets[] = {kTouchHighOffset, kTouchLowOffset, kHeaderBytes + kRecordTouchOffset};
            put_u64(bytes, offsets[pick(3)], values[pick(5)]);
            break;
        }
        case 6:  // a hostile token count in the first record
            bytes[kHeaderBytes] = char(pick(256));
            break;
        case 7:  // n_vocab
            for (int i = 0; i < 4; ++i) bytes[12 + size_t(i)] = char(pick(256));
            break;
        default:  // random bytes anywhere
            for (size_t k = 0, n = 1 + pick(16); k < n; ++k) bytes[pick(bytes.size())] = char(pick(256));
            break;
    }
    if (rng.uniform() < 0.6) fix_checksum(bytes);  // reach the checks behind the checksum
    return bytes;
}

void test_fuzz_pool_files() {
    const char* env = std::getenv("PYSPEC_FUZZ_CASES");
    const long n_cases = env ? std::atol(env) : 20000;
    const spec::PhrasePoolParams params = make_params(64, 8, 3, 0.5, 50);
    const std::string good = saved_pool_bytes(params, 40);
    const spec::PhrasePoolParams loaders[] = {params, make_params(5, 8, 3, 0.2, 50), make_params(64, 4, 2, 0.5, 0)};
    const std::string path = (temp_dir() / "fuzz.pool").string();
    spec::Rng rng(2024);
    long n_loaded = 0, n_rejected = 0, n_wrong = 0;
    for (long c = 0; c < n_cases; ++c) {
        const std::string bytes = mutate(good, rng);
        write_bytes(path, bytes);
        const spec::PhrasePoolParams& loader = loaders[size_t(c) % 3];
        PhrasePool pool(loader);
        insert(pool, {3, 1, 4});
        try {
            pool.load(path);
            ++n_loaded;
            // A file that loads gives a working pool: bounded, searchable, insertable, savable.
            bool ok = pool.size() <= loader.capacity;
            for (int32_t t = 0; t < 50 && ok; ++t) ok = lookup(pool, t).size() <= pool.size();
            insert(pool, {9, 9, 9});
            for (const auto& phrase : lookup(pool, 9)) record_use(pool, phrase, 0);
            pool.save(path);
            PhrasePool again(loader);
            again.load(path);
            ok = ok && again.size() == pool.size();
            if (!ok) ++n_wrong;
        } catch (const spec::PoolFileError&) {
            ++n_rejected;
            if (!(pool.size() == 1 && has(pool, {3, 1, 4}))) ++n_wrong;
        } catch (const spec::VocabMismatchError&) {
            ++n_rejected;
            if (!(pool.size() == 1 && has(pool, {3, 1, 4}))) ++n_wrong;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fuzz case %ld: unexpected %s\n", c, e.what());
            ++n_wrong;
        }
    }
    std::printf("pool file fuzz: %ld cases, %ld loaded, %ld rejected with a typed error, %ld wrong\n", n_cases,
                n_loaded, n_rejected, n_wrong);
    CHECK(n_wrong == 0);
    CHECK(n_rejected > n_cases / 2);  // the mutations do reach the checks
    CHECK(n_loaded > 0);              // and some damage is harmless (a stat counter, a flag)
}

}  // namespace

int main() {
    test_hostile_rank_stamps();
    test_save_never_writes_through_a_symlink();
    test_load_memory_is_bounded_by_the_pool();
    test_fuzz_pool_files();
    std::filesystem::remove_all(temp_dir());
    std::printf("test_pool_file: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
