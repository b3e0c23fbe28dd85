// Phrase pool files: save() / load() in the format documented in phrase_pool.h. A load reads the
// file through a fixed buffer and validates everything (checksum first) before the pool is
// touched, keeping only the phrases the pool can hold; a save builds the file in memory (bounded
// by the pool's capacity) and replaces the target file in one rename.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <string>

#include "phrase_pool_store.h"
#include "spec/checksum.h"
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
constexpr int64_t kRankStampLimit = int64_t(1) << 62;  // |stamp| in a file, so ++ / -- cannot overflow

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

// Little-endian reads of a file region [begin, end) through a fixed buffer, so that memory does
// not grow with the file; running past the end throws PoolFileError. Optionally hashes every byte
// it reads (FNV-1a).
class FileReader {
public:
    FileReader(std::ifstream& in, uint64_t begin, uint64_t end, const std::string& path)
        : in_(in), pos_(begin), end_(end), path_(path) {
        in_.clear();
        in_.seekg(std::streamoff(begin));
    }

    uint8_t u8() {
        if (buf_pos_ == buf_len_) fill();
        ++pos_;
        const uint8_t b = uint8_t(buf_[buf_pos_++]);
        hash_ = fnv1a64(&b, 1, hash_);
        return b;
    }
    uint32_t u32() {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= uint32_t(u8()) << (8 * i);
        return v;
    }
    uint64_t u64() {
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= uint64_t(u8()) << (8 * i);
        return v;
    }
    uint64_t remaining() const { return end_ - pos_; }
    uint64_t hash() const { return hash_; }

    // FNV-1a of every byte up to the end.
    uint64_t hash_to_end() {
        while (pos_ < end_) {
            if (buf_pos_ == buf_len_) fill();
            const size_t n = size_t(std::min<uint64_t>(buf_len_ - buf_pos_, end_ - pos_));
            hash_ = fnv1a64(buf_.data() + buf_pos_, n, hash_);
            buf_pos_ += n;
            pos_ += n;
        }
        return hash_;
    }

private:
    void fill() {
        if (pos_ >= end_) {
            throw PoolFileError("phrase pool file '" + path_ + "' is truncated or corrupt (a record runs past the end)");
        }
        const size_t want = size_t(std::min<uint64_t>(buf_.size(), end_ - pos_));
        in_.read(buf_.data(), std::streamsize(want));
        buf_len_ = size_t(in_.gcount());
        buf_pos_ = 0;
        if (buf_len_ == 0) throw PoolFileError("cannot read phrase pool file '" + path_ + "'");
    }

    std::ifstream& in_;
    std::vector<char> buf_ = std::vector<char>(size_t(1) << 16);
    size_t buf_pos_ = 0, buf_len_ = 0;
    uint64_t pos_, end_;
    uint64_t hash_ = kFnv1aOffset;
    const std::string& path_;
};

// What a file holds of a store, copied under the pool's lock; written out after it is released.
struct PoolSnapshot {
    std::vector<PhraseRecord> records;
    int64_t touch_high = 0;
    int64_t touch_low = 0;
};

std::string serialize(const PoolSnapshot& snapshot, int32_t n_vocab) {
    const std::vector<PhraseRecord>& records = snapshot.records;
    ByteWriter w;
    w.raw(kMagic, sizeof(kMagic));
    w.u32(kVersion);
    w.u32(uint32_t(n_vocab));
    w.u32(uint32_t(records.size()));
    w.u64(uint64_t(snapshot.touch_high));
    w.u64(uint64_t(snapshot.touch_low));
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
    w.u64(fnv1a64(w.bytes().data(), w.bytes().size()));
    return std::move(w.bytes());
}

struct PoolFile {
    std::vector<PhraseRecord> records;  // the phrases that fit the pool, in eviction order
    size_t n_dropped = 0;               // phrases before them in the file (evicted first)
    int64_t touch_high = 0;
    int64_t touch_low = 0;
};

// Checks and decodes a file, keeping only the `capacity` phrases that load() keeps: memory is
// bounded by the pool, not by the file. Checks the checksum before anything behind the version.
// Throws PoolFileError / VocabMismatchError.
PoolFile parse(const std::string& path, const PhrasePoolParams& params) {
    const std::string where = "phrase pool file '" + path + "'";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw PoolFileError("cannot open phrase pool file '" + path + "': " + std::strerror(errno));
    in.seekg(0, std::ios::end);
    const std::streamoff end = in.tellg();
    if (end < 0) throw PoolFileError("cannot read phrase pool file '" + path + "'");
    const uint64_t size = uint64_t(end);
    char magic[sizeof(kMagic)] = {};
    in.seekg(0);
    in.read(magic, std::streamsize(std::min<uint64_t>(size, sizeof(kMagic))));
    if (size < sizeof(kMagic) && std::memcmp(magic, kMagic, size_t(size)) == 0) {
        throw PoolFileError(where + " is truncated (" + std::to_string(size) + " bytes)");
    }
    if (size < sizeof(kMagic) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
        throw PoolFileError(where + " is not a phrase pool file (no SPECPOOL magic at the start)");
    }
    if (size < kHeaderBytes + kChecksumBytes) {
        throw PoolFileError(where + " is truncated (" + std::to_string(size) + " bytes)");
    }
    const uint64_t body_end = size - kChecksumBytes;
    {
        FileReader header(in, sizeof(kMagic), body_end, path);
        const uint32_t version = header.u32();
        if (version != kVersion) {
            throw PoolFileError(where + " has format version " + std::to_string(version) + "; this build reads version " +
                                std::to_string(kVersion));
        }
    }
    {
        FileReader body(in, 0, body_end, path);
        const uint64_t hash = body.hash_to_end();
        FileReader footer(in, body_end, size, path);
        if (footer.u64() != hash) throw PoolFileError(where + " is corrupt or truncated (checksum mismatch)");
    }
    FileReader header(in, sizeof(kMagic) + 4, body_end, path);
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
    if (n_phrases > kPhrasePoolCapacityLimit) {
        throw PoolFileError(where + " is corrupt: it claims " + std::to_string(n_phrases) +
                            " phrases; no pool holds more than " + std::to_string(kPhrasePoolCapacityLimit));
    }
    if (uint64_t(n_phrases) * (kRecordFixedBytes + 2 * 4) > header.remaining()) {
        throw PoolFileError(where + " is corrupt: it claims " + std::to_string(n_phrases) + " phrases in " +
                            std::to_string(header.remaining()) + " bytes");
    }
    // Stamps move by one per touch or demotion: a live pool never comes near these bounds, and a
    // file within them cannot make the next stamp overflow.
    if (file.touch_high < 0 || file.touch_high > kRankStampLimit || file.touch_low > 0 ||
        file.touch_low < -kRankStampLimit) {
        throw PoolFileError(where + " is corrupt (rank stamps " + std::to_string(file.touch_low) + " .. " +
                            std::to_string(file.touch_high) + " outside [-2^62, 2^62])");
    }
    const int32_t n_vocab = params.n_vocab > 0 ? params.n_vocab : file_vocab;  // 0: unknown
    // Records are in eviction order, so the ones that do not fit are those evicted first.
    file.n_dropped = n_phrases > params.capacity ? n_phrases - params.capacity : 0;
    file.records.resize(n_phrases - file.n_dropped);
    PhraseRecord scratch;  // a dropped record is checked, then overwritten by the next
    for (uint32_t i = 0; i < n_phrases; ++i) {
        PhraseRecord& r = i < file.n_dropped ? scratch : file.records[i - file.n_dropped];
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

// The directory holding `path`, to sync its entry after a rename.
std::string parent_directory(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? std::string("/") : path.substr(0, slash);
}

bool write_all(int fd, const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += size_t(n);
    }
    return true;
}

// Replaces `path` by a file holding `bytes`: either the old file or the whole new one is there,
// also after a crash. The bytes go to a new temporary next to `path`, created exclusively
// (O_CREAT | O_EXCL | O_NOFOLLOW) under a name unique to this process and call, so a file or a
// symlink planted at a predictable name is never written through; it is synced, renamed into
// place, and the directory entry synced.
void replace_file(const std::string& path, const std::string& bytes) {
    static std::atomic<uint64_t> counter{0};
    std::string tmp_path;
    int fd = -1;
    for (int attempt = 0; fd < 0; ++attempt) {
        tmp_path = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
        fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && (errno != EEXIST || attempt >= 100)) {
            throw PoolFileError("cannot write phrase pool file '" + tmp_path + "': " + std::strerror(errno));
        }
    }
    bool written = write_all(fd, bytes) && ::fsync(fd) == 0;
    const int write_errno = errno;
    written = ::close(fd) == 0 && written;
    if (!written) {
        ::unlink(tmp_path.c_str());
        throw PoolFileError("cannot write phrase pool file '" + tmp_path + "': " + std::strerror(write_errno));
    }
    if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
        const std::string reason = std::strerror(errno);
        ::unlink(tmp_path.c_str());
        throw PoolFileError("cannot rename '" + tmp_path + "' to phrase pool file '" + path + "': " + reason);
    }
    const int dir = ::open(parent_directory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        ::fsync(dir);  // best effort: some file systems refuse to sync a directory
        ::close(dir);
    }
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

void Store::restore(const std::vector<PhraseRecord>& records, size_t first_index, int64_t high, int64_t low,
                    const std::string& path) {
    touch_high = high;
    touch_low = low;
    // Slots and segments in file order (each record becomes the most recent of its segment) ...
    for (size_t i = 0; i < records.size(); ++i) {
        const PhraseRecord& r = records[i];
        const int32_t n_tokens = int32_t(r.tokens.size());
        if (find_phrase(r.tokens.data(), n_tokens) >= 0) {
            throw PoolFileError("phrase pool file '" + path + "' is corrupt: phrase " +
                                std::to_string(first_index + i) + " is stored twice");
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
    // Only the copy holds the lock (a generating thread's harvest waits for it), not the encoding
    // and checksum of every byte.
    PoolSnapshot snapshot;
    {
        std::shared_lock lock(mutex_);
        snapshot.records = store_->snapshot();
        snapshot.touch_high = store_->touch_high;
        snapshot.touch_low = store_->touch_low;
    }
    replace_file(path, serialize(snapshot, params_.n_vocab));
}

void PhrasePool::load(const std::string& path) {
    const PoolFile file = parse(path, params_);
    auto fresh = std::make_unique<Store>(params_);
    fresh->restore(file.records, file.n_dropped, file.touch_high, file.touch_low, path);
    {
        std::unique_lock lock(mutex_);
        fresh->counters = store_->counters;
        fresh->counters.n_loaded += int64_t(file.records.size());
        fresh->counters.n_evicted += int64_t(file.n_dropped);
        store_.swap(fresh);
    }
}  // the old store is freed here, outside the lock

}  // namespace spec
