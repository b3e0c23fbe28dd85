#include "spec/text_stream.h"

#include <algorithm>

#include "spec/error.h"

namespace spec {
namespace {

// Checks the UTF-8 sequence starting at s[i] against the Unicode well-formedness table.
// Returns its length when complete and valid, 0 when invalid; sets `truncated` when the bytes
// present are a valid prefix that runs past the end of s.
size_t utf8_sequence(std::string_view s, size_t i, bool& truncated) {
    truncated = false;
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (size_t k = 1; k < len; ++k) {
        if (i + k >= s.size()) {
            truncated = true;
            return 0;
        }
        const unsigned char b = byte(i + k);
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return len;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
    // Only the last few bytes can start an incomplete sequence.
    const size_t start = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t i = start; i < s.size(); ++i) {
        bool truncated;
        utf8_sequence(s, i, truncated);
        if (truncated) return i;
    }
    return s.size();
}

std::string utf8_sanitize(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        bool truncated;
        const size_t len = utf8_sequence(s, i, truncated);
        if (len == 0) {
            out += "\xEF\xBF\xBD";  // U+FFFD
            ++i;
        } else {
            out.append(s, i, len);
            i += len;
        }
    }
    return out;
}

TextStream::TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {
    for (const auto& s : stop_) {
        if (s.empty()) throw InvalidArgumentError("stop strings must not be empty");
    }
}

std::string TextStream::push(const std::string& piece) {
    if (stopped_) return {};
    const size_t old_size = text_.size();
    text_ += piece;
    size_t safe_end = text_.size();
    if (!stop_.empty()) {
        size_t max_stop = 0;
        for (const auto& s : stop_) max_stop = std::max(max_stop, s.size());
        // A stop string that ends in the new bytes starts at or after this offset.
        const size_t from = old_size >= max_stop ? old_size - max_stop + 1 : 0;
        size_t cut = std::string::npos;
        for (const auto& s : stop_) cut = std::min(cut, text_.find(s, from));
        if (cut != std::string::npos) {
            text_.resize(cut);
            stopped_ = true;
            safe_end = cut;
        } else {
            // Hold back the longest tail that is a proper prefix of some stop string.
            for (const auto& s : stop_) {
                for (size_t n = std::min(s.size() - 1, text_.size()); n > 0; --n) {
                    if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
                        safe_end = std::min(safe_end, text_.size() - n);
                        break;
                    }
                }
            }
        }
    }
    safe_end = std::min(safe_end, utf8_complete_prefix(std::string_view(text_).substr(0, safe_end)));
    if (safe_end <= n_emitted_) return {};
    std::string out = utf8_sanitize(text_.substr(n_emitted_, safe_end - n_emitted_));
    n_emitted_ = safe_end;
    return out;
}

std::string TextStream::finish() {
    std::string out = utf8_sanitize(text_.substr(n_emitted_));
    n_emitted_ = text_.size();
    return out;
}

}  // namespace spec
