// Turns generated token pieces into text for streaming: holds back an incomplete UTF-8 sequence
// at the end, and holds back a tail that could still become a stop string, so the streamed text
// is always exactly a prefix of the final text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace spec {

class TextStream {
public:
    explicit TextStream(std::vector<std::string> stop = {});

    // Appends the bytes of one token. Returns the text that is now safe to emit (possibly empty).
    std::string push(const std::string& piece);
    // True once a stop string appeared; the text is then cut just before it.
    bool stopped() const { return stopped_; }
    // Ends the stream: returns whatever was held back (invalid UTF-8 bytes replaced by U+FFFD).
    std::string finish();
    // All text so far (cut at a stop string), including held-back bytes. Only complete at finish().
    const std::string& text() const { return text_; }

private:
    std::vector<std::string> stop_;
    std::string text_;        // accepted text (cut at stop string once stopped)
    size_t n_emitted_ = 0;    // bytes of text_ already returned by push()
    bool stopped_ = false;
};

// Length of the longest prefix of s that ends on a UTF-8 character boundary (an incomplete
// multi-byte sequence at the end is excluded; invalid bytes count as complete characters).
size_t utf8_complete_prefix(std::string_view s);

// s with every invalid UTF-8 byte replaced by U+FFFD.
std::string utf8_sanitize(const std::string& s);

}  // namespace spec
