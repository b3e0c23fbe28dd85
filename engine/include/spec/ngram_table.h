// A static n-gram table: for contexts of min_context..max_context tokens seen in a text corpus
// tokenized with the target's vocabulary, the token that most often followed, how often it did
// (count) and how often the context occurred (total). Method auto drafts from it where nothing is
// copied (the corpus drafter in spec/drafter.h): common phrasing ("as well as", the rest of a
// word split into several tokens) that no earlier text of the request holds. The table is built
// by pyspec.ngram from any text (by default the assistant answers of the ShareGPT
// conversations); it is read-only once loaded, so one table serves every request and thread.
//
// File format (little-endian):
//   magic "SPECNGRM", u32 version (1), u32 n_vocab, u32 min_context, u32 max_context,
//   u64 n_entries, 16 bytes: the vocabulary fingerprint (spec/draft_head.h: vocab_fingerprint,
//   16 hex digits), then four columns of n_entries each, sorted by key, keys unique:
//   u64 key (ngram_key of the context), i32 token, u32 count, u32 total (1 <= count <= total);
//   then u64: FNV-1a 64 of every byte before it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spec {

// The key of a context of n tokens (context[n - 1] the most recent): splitmix64 mixing of n and
// then of each token from the most recent back. pyspec.ngram computes the same with numpy.
uint64_t ngram_key(const int32_t* context, int32_t n);

class NgramTable {
public:
    // Reads and checks a table file; NgramFileError naming what is wrong (missing, truncated,
    // bad magic / version / checksum, unsorted keys, a token outside n_vocab, or a table built
    // for another vocabulary: n_vocab and fingerprint must match the target's).
    static NgramTable load(const std::string& path, int32_t n_vocab, const std::string& vocab_fingerprint);

    struct Hit {
        int32_t token = -1;
        uint32_t count = 0, total = 0;
        int32_t context = 0;  // tokens of the context that matched
        // count / (total + 1): a context seen once predicts with 1/2, not with certainty.
        double confidence() const { return double(count) / (double(total) + 1.0); }
    };
    // The prediction after tokens[0..n): from the longest context (max_context tokens down to
    // min_context) the table holds with total >= min_total; false when none.
    bool predict(const int32_t* tokens, int32_t n, uint32_t min_total, Hit& hit) const;

    int64_t size() const { return int64_t(keys_.size()); }
    int32_t min_context() const { return min_context_; }
    int32_t max_context() const { return max_context_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    int32_t min_context_ = 0, max_context_ = 0;
    std::vector<uint64_t> keys_;
    std::vector<int32_t> tokens_;
    std::vector<uint32_t> counts_, totals_;
};

}  // namespace spec
