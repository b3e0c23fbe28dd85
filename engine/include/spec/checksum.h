// FNV-1a 64: the checksum of pyspec's own file formats (phrase pool files, n-gram tables), also
// computed incrementally while a file is read.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spec {

constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnv1aPrime = 0x100000001b3ULL;

// Continues hash h over n bytes (start from kFnv1aOffset).
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
    return h;
}

}  // namespace spec
