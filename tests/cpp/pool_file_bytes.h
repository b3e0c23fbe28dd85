// Byte-level helpers for the pool-file tests: a per-process scratch directory, whole-file reads
// and writes, and the FNV-1a footer recomputed after a test edits a file.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace pool_test {

// A directory of its own under the system's temporary directory, made on first use.
inline std::filesystem::path temp_dir(const std::string& prefix) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir;
}

inline std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

inline uint64_t fnv1a_step(uint64_t h, uint8_t b) { return (h ^ b) * 0x100000001b3ULL; }

// Recomputes the FNV-1a footer of an edited pool file, so a test reaches the checks after it.
inline void fix_checksum(std::string& bytes) {
    if (bytes.size() < 8) return;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < bytes.size() - 8; ++i) h = fnv1a_step(h, uint8_t(bytes[i]));
    for (int i = 0; i < 8; ++i) bytes[bytes.size() - 8 + size_t(i)] = char(uint8_t(h >> (8 * i)));
}

}  // namespace pool_test
