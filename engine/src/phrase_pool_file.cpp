// Phrase pool files: save() / load() in the format documented in phrase_pool.h. A file is built
// and parsed whole in memory, so a load validates everything (checksum first) before the pool is
// touched, and a save replaces the target file in one rename.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <string>

#include "phrase_pool_store.h"
#include "spec/error.h"
#include "spec/phrase_pool.h"

namespace spec {

using namespace pool_detail;

namespace {

constexpr char kMagic[8] = {'S', 'P', 'E', 'C', 'P', 'O', 'O', 'L'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 4 + 8 + 8;
constexpr size_t kRecordFixedBytes = 4 + 8 + 4 * 4;  // a record before its tokens
constexpr size_t kChecksumBytes = 8;
constexpr uint8_t kFlagProtected = 1;

uint64_t fnv1a(const char* bytes, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; ++i) h = (h ^ uint8_t(bytes[i])) * 0x100000001b3ULL;
    return h;
}

// Little-endian writes into a byte string.
class ByteWriter {
public:
    void u8(uint8_t v) { bytes_.push_back(char(v)); }
    void u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(uint8_t(v >> (8 * i)));
    }
    void u64(uint64_t v) {
        for (int i = 0; i < 8; ++i) u8(uint8_t(v >> (8 * i)));
    }
    void raw(const char* p, size_t n) { bytes_.append(p, n); }
    std::string& bytes() { return bytes_; }

private:
    std::string bytes_;
};

// Little-endian reads from a byte string; running past the end throws PoolFileError.
class ByteReader {
public:
    ByteReader(const std::string& bytes, size_t end, const std::string& path)
        : bytes_(bytes), end_(end), path_(path) {}

    uint8_t u8() {
        need(1);
        return uint8_t(bytes_[pos_++]);
    }
    uint32_t u32() {
        need(4);
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(bytes_[pos_++])) << (8 * i);
        return v;
    }
    uint64_t u64() {
        need(8);
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(bytes_[pos_++])) << (8 * i);
        return v;
    }
    size_t remaining() const { return end_ - pos_; }

private:
    void need(size_t n) const {
        if (end_ - pos_ >= n) return;
        throw PoolFileError("phrase pool file '" + path_ + "' is truncated or corrupt (a record runs past the end)");
    }

    const std::string& bytes_;
    size_t end_;
    size_t pos_ = 0;
    const std::string& path_;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw PoolFileError("cannot open phrase pool file '" + path + "': " + std::strerror(errno));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw PoolFileError("cannot read phrase pool file '" + path + "'");
    return bytes;
}

std::string serialize(const Store& store, int32_t n_vocab) {
    const std::vector<PhraseRecord> records = store.snapshot();
    ByteWriter w;
    w.raw(kMagic, sizeof(kMagic));
    w.u32(kVersion);
    w.u32(uint32_t(n_vocab));
    w.u32(uint32_t(records.size()));
    w.u64(uint64_t(store.touch_high));
    w.u64(uint64_t(store.touch_low));
    for (const PhraseRecord& r : records) {
        w.u8(uint8_t(r.tokens.size()));
        w.u8(uint8_t(r.stats.source));
        w.u8(r.stats.segment == kProtected ? kFlagProtected : 0);
        w.u8(0);
        w.u64(uint64_t(r.stats.touch));
        w.u32(r.stats.n_refreshes);
        w.u32(r.stats.n_uses);
        w.u32(r.stats.n_hits);
        w.u32(r.stats.n_tokens_accepted);
        for (int32_t t : r.tokens) w.u32(uint32_t(t));
    }
    w.u64(fnv1a(w.bytes().data(), w.bytes().size()));
    return std::move(w.bytes());
}

struct PoolFile {
    std::vector<PhraseRecord> records;  // in eviction order, least recent first
    int64_t touch_high = 0;
    int64_t touch_low = 0;
};

// Checks and decodes a whole file; throws PoolFileError / VocabMismatchError.
PoolFile parse(const std::string& bytes, const std::string& path, const PhrasePoolParams& params) {
    const std::string where = "phrase pool file '" + path + "'";
    if (bytes.size() < sizeof(kMagic) && std::memcmp(bytes.data(), kMagic, bytes.size()) == 0) {
        throw PoolFileError(where + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
    }
    if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
        throw PoolFileError(where + " is not a phrase pool file (no SPECPOOL magic at the start)");
    }
    if (bytes.size() < kHeaderBytes + kChecksumBytes) {
        throw PoolFileError(where + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
    }
    const size_t body_end = bytes.size() - kChecksumBytes;
    ByteReader header(bytes, body_end, path);
    for (size_t i = 0; i < sizeof(kMagic); ++i) header.u8();
    const uint32_t version = header.u32();
    if (version != kVersion) {
        throw PoolFileError(where + " has format version " + std::to_string(version) + "; this build reads version " +
                            std::to_string(kVersion));
    }
    ByteReader footer(bytes, bytes.size(), path);
    for (size_t i = 0; i < body_end; ++i) footer.u8();
    if (footer.u64() != fnv1a(bytes.data(), body_end)) {
        throw PoolFileError(where + " is corrupt or truncated (checksum mismatch)");
    }
    const int32_t file_vocab = int32_t(header.u32());
    if (file_vocab < 0) throw PoolFileError(where + " is corrupt (n_vocab " + std::to_string(file_vocab) + ")");
    if (file_vocab > 0 && params.n_vocab > 0 && file_vocab != params.n_vocab) {
        throw VocabMismatchError(where + " was saved for a vocabulary of " + std::to_string(file_vocab) +
                                 " tokens; this pool's n_vocab is " + std::to_string(params.n_vocab));
    }
    const uint32_t n_phrases = header.u32();
    PoolFile file;
    file.touch_high = int64_t(header.u64());
    file.touch_low = int64_t(header.u64());
    if (uint64_t(n_phrases) * (kRecordFixedBytes + 2 * 4) > header.remaining()) {
        throw PoolFileError(where + " is corrupt: it claims " + std::to_string(n_phrases) + " phrases in " +
                            std::to_string(header.remaining()) + " bytes");
    }
    const int32_t n_vocab = params.n_vocab > 0 ? params.n_vocab : file_vocab;  // 0: unknown
    file.records.resize(n_phrases);
    for (uint32_t i = 0; i < n_phrases; ++i) {
        PhraseRecord& r = file.records[i];
        const uint8_t n_tokens = header.u8();
        const uint8_t source = header.u8();
        const uint8_t flags = header.u8();
        const uint8_t reserved = header.u8();
        const std::string which = where + " phrase " + std::to_string(i);
        if (n_tokens < 2) throw PoolFileError(which + " is corrupt: " + std::to_string(n_tokens) + " tokens");
        if (n_tokens > params.max_phrase_len) {
            throw PoolFileError(which + " has " + std::to_string(n_tokens) +
                                " tokens; this pool's max_phrase_len is " + std::to_string(params.max_phrase_len));
        }
        if (source >= kPhraseSourceCount || (flags & ~kFlagProtected) != 0 || reserved != 0) {
            throw PoolFileError(which + " is corrupt (source " + std::to_string(source) + ", flags " +
                                std::to_string(flags) + ")");
        }
        r.stats.source = PhraseSource(source);
        r.stats.segment = (flags & kFlagProtected) ? kProtected : kProbation;
        r.stats.touch = int64_t(header.u64());
        if (r.stats.touch > file.touch_high || r.stats.touch < file.touch_low) {
            throw PoolFileError(which + " is corrupt (rank stamp outside the file's range)");
        }
        r.stats.n_refreshes = header.u32();
        r.stats.n_uses = header.u32();
        r.stats.n_hits = header.u32();
        r.stats.n_tokens_accepted = header.u32();
        r.tokens.resize(n_tokens);
        for (int32_t& t : r.tokens) {
            t = int32_t(header.u32());
            if (t < 0 || (n_vocab > 0 && t >= n_vocab)) {
                throw PoolFileError(which + " holds token " + std::to_string(t) + ", outside the vocabulary [0, " +
                                    (n_vocab > 0 ? std::to_string(n_vocab) : std::string("inf")) + ")");
            }
        }
    }
    if (header.remaining() != 0) {
        throw PoolFileError(where + " is corrupt: " + std::to_string(header.remaining()) +
                            " bytes after the last phrase");
    }
    return file;
}

}  // namespace

std::vector<PhraseRecord> Store::snapshot() const {
    std::vector<PhraseRecord> records;
    records.reserve(n_phrases);
    for (Segment segment : {kProbation, kProtected}) {
        const int32_t front = segment_front[segment];
        if (front < 0) continue;
        int32_t s = slots[size_t(front)].lru.prev;  // the back: least recent
        while (true) {
            PhraseRecord r;
            r.tokens.assign(row(s), row(s) + slots[size_t(s)].n_tokens);
            r.stats = slots[size_t(s)];
            records.push_back(std::move(r));
            if (s == front) break;
            s = slots[size_t(s)].lru.prev;
        }
    }
    return records;
}

void Store::restore(const std::vector<PhraseRecord>& records, size_t first, int64_t high, int64_t low,
                    const std::string& path) {
    touch_high = high;
    touch_low = low;
    // Slots and segments in file order (each record becomes the most recent of its segment) ...
    for (size_t i = first; i < records.size(); ++i) {
        const PhraseRecord& r = records[i];
        const int32_t n_tokens = int32_t(r.tokens.size());
        if (find_phrase(r.tokens.data(), n_tokens) >= 0) {
            throw PoolFileError("phrase pool file '" + path + "' is corrupt: phrase " + std::to_string(i) +
                                " is stored twice");
        }
        const int32_t s = allocate_slot();
        Slot& slot = slots[size_t(s)];
        slot = r.stats;
        slot.lru = Link();
        slot.hash = sequence_hash(r.tokens.data(), n_tokens);
        slot.n_tokens = uint8_t(n_tokens);
        std::copy(r.tokens.begin(), r.tokens.end(), row(s));
        by_phrase.insert(slot.hash, PhraseCell{s},
                         [this](const PhraseCell& c) { return slots[size_t(c.slot)].hash; });
        segment_push(s, Segment(r.stats.segment), true);
        if (slot.group() == kProven) ++n_proven;
        ++n_phrases;
    }
    // ... then the key lists in rank-stamp order, so each list ends up most recent first.
    std::vector<int32_t> by_touch(slots.size());
    std::iota(by_touch.begin(), by_touch.end(), 0);
    std::stable_sort(by_touch.begin(), by_touch.end(),
                     [this](int32_t a, int32_t b) { return slots[size_t(a)].touch < slots[size_t(b)].touch; });
    for (int32_t s : by_touch) link_keys(s);
    enforce_protected_cap();  // this pool may protect a smaller share than the saved one
}

void PhrasePool::save(const std::string& path) const {
    std::string bytes;
    {
        std::shared_lock lock(mutex_);
        bytes = serialize(*store_, params_.n_vocab);
    }
    const std::string tmp_path = path + ".tmp";
    {
        std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
        if (!out) throw PoolFileError("cannot write phrase pool file '" + tmp_path + "': " + std::strerror(errno));
        out.write(bytes.data(), std::streamsize(bytes.size()));
        out.close();
        if (!out) {
            std::remove(tmp_path.c_str());
            throw PoolFileError("cannot write phrase pool file '" + tmp_path + "' (disk full?)");
        }
    }
    if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
        const std::string reason = std::strerror(errno);
        std::remove(tmp_path.c_str());
        throw PoolFileError("cannot rename '" + tmp_path + "' to phrase pool file '" + path + "': " + reason);
    }
}

void PhrasePool::load(const std::string& path) {
    const PoolFile file = parse(read_file(path), path, params_);
    const std::vector<PhraseRecord>& records = file.records;
    // Records are in eviction order, so the ones that do not fit are those evicted first.
    const size_t first = records.size() > params_.capacity ? records.size() - params_.capacity : 0;
    auto fresh = std::make_unique<Store>(params_);
    fresh->restore(records, first, file.touch_high, file.touch_low, path);
    {
        std::unique_lock lock(mutex_);
        fresh->counters = store_->counters;
        fresh->counters.n_loaded += int64_t(records.size() - first);
        fresh->counters.n_evicted += int64_t(first);
        store_.swap(fresh);
    }
}  // the old store is freed here, outside the lock

}  // namespace spec
