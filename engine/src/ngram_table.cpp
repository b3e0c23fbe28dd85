// Static n-gram tables: the file format of spec/ngram_table.h, read and checked whole before use.
#include "spec/ngram_table.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "spec/checksum.h"
#include "spec/error.h"

namespace spec {

namespace {

constexpr char kMagic[8] = {'S', 'P', 'E', 'C', 'N', 'G', 'R', 'M'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFingerprintBytes = 16;
constexpr size_t kHeaderBytes = 8 + 4 * 4 + 8 + kFingerprintBytes;
constexpr size_t kEntryBytes = 8 + 4 + 4 + 4;
constexpr int32_t kContextLimit = 16;

uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

template <typename T>
T read_le(const char* p) {
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= T(uint8_t(p[i])) << (8 * i);
    return v;
}

}  // namespace

uint64_t ngram_key(const int32_t* context, int32_t n) {
    uint64_t h = splitmix64(uint64_t(n));
    for (int32_t j = n - 1; j >= 0; --j) h = splitmix64(h ^ uint64_t(uint32_t(context[j])));
    return h;
}

NgramTable NgramTable::load(const std::string& path, int32_t n_vocab, const std::string& vocab_fingerprint) {
    const auto fail = [&path](const std::string& what) { throw NgramFileError("n-gram table " + path + ": " + what); };
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot be opened (missing or unreadable)");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.size() < kHeaderBytes + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
        fail("not an n-gram table (no SPECNGRM header)");
    }
    const char* p = bytes.data() + sizeof(kMagic);
    const uint32_t version = read_le<uint32_t>(p);
    if (version != kVersion) fail("format version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion));
    const uint32_t file_vocab = read_le<uint32_t>(p + 4);
    const uint32_t min_context = read_le<uint32_t>(p + 8), max_context = read_le<uint32_t>(p + 12);
    const uint64_t n = read_le<uint64_t>(p + 16);
    const std::string fingerprint(p + 24, kFingerprintBytes);
    if (min_context < 1 || min_context > max_context || max_context > uint32_t(kContextLimit)) {
        fail("context sizes " + std::to_string(min_context) + ".." + std::to_string(max_context) + " out of range");
    }
    if (n > (bytes.size() - kHeaderBytes - 8) / kEntryBytes || kHeaderBytes + n * kEntryBytes + 8 != bytes.size()) {
        fail("truncated or padded: " + std::to_string(bytes.size()) + " bytes for " + std::to_string(n) + " entries");
    }
    const size_t body = kHeaderBytes + n * kEntryBytes;
    if (fnv1a64(bytes.data(), body) != read_le<uint64_t>(bytes.data() + body)) fail("checksum mismatch (corrupt file)");
    if (int64_t(file_vocab) != n_vocab || fingerprint != vocab_fingerprint) {
        fail("built for another vocabulary (" + std::to_string(file_vocab) + " tokens, fingerprint " + fingerprint +
             "; the target has " + std::to_string(n_vocab) + ", " + vocab_fingerprint + ")");
    }
    NgramTable t;
    t.path_ = path;
    t.min_context_ = int32_t(min_context);
    t.max_context_ = int32_t(max_context);
    t.keys_.resize(n);
    t.tokens_.resize(n);
    t.counts_.resize(n);
    t.totals_.resize(n);
    const char* keys = bytes.data() + kHeaderBytes;
    const char* tokens = keys + 8 * n;
    const char* counts = tokens + 4 * n;
    const char* totals = counts + 4 * n;
    for (size_t i = 0; i < n; ++i) {
        t.keys_[i] = read_le<uint64_t>(keys + 8 * i);
        t.tokens_[i] = int32_t(read_le<uint32_t>(tokens + 4 * i));
        t.counts_[i] = read_le<uint32_t>(counts + 4 * i);
        t.totals_[i] = read_le<uint32_t>(totals + 4 * i);
        if (i > 0 && t.keys_[i] <= t.keys_[i - 1]) fail("keys not sorted and unique at entry " + std::to_string(i));
        if (t.tokens_[i] < 0 || t.tokens_[i] >= n_vocab) fail("token " + std::to_string(t.tokens_[i]) + " out of the vocabulary");
        if (t.counts_[i] < 1 || t.counts_[i] > t.totals_[i]) fail("count above total at entry " + std::to_string(i));
    }
    return t;
}

bool NgramTable::predict(const int32_t* tokens, int32_t n, uint32_t min_total, Hit& hit) const {
    for (int32_t c = std::min(max_context_, n); c >= min_context_; --c) {
        const uint64_t key = ngram_key(tokens + n - c, c);
        const auto it = std::lower_bound(keys_.begin(), keys_.end(), key);
        if (it == keys_.end() || *it != key) continue;
        const size_t i = size_t(it - keys_.begin());
        if (totals_[i] < min_total) continue;
        hit.token = tokens_[i];
        hit.count = counts_[i];
        hit.total = totals_[i];
        hit.context = c;
        return true;
    }
    return false;
}

}  // namespace spec
