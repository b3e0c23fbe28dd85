// Typed errors thrown by the engine. Every message names what is wrong (file, value, limit) so a
// user can act on it; the Python binding maps each type to a Python exception class.
#pragma once

#include <stdexcept>
#include <string>

namespace spec {

// Base of every engine error.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A file is missing, unreadable, not GGUF, or truncated; or llama.cpp refused to load it.
struct ModelLoadError : Error {
    using Error::Error;
};

// Target and draft do not share a vocabulary (type, size, special tokens or token text).
struct VocabMismatchError : Error {
    using Error::Error;
};

// A parameter is outside its valid range (sampling values, n_draft, empty prompt, ...).
struct InvalidArgumentError : Error {
    using Error::Error;
};

// The prompt (or a requested draft) does not fit the context window.
struct ContextOverflowError : Error {
    using Error::Error;
};

// llama_decode failed for a reason other than a full context.
struct DecodeError : Error {
    using Error::Error;
};

// A phrase pool file cannot be written, or cannot be read back: missing, truncated, corrupt,
// not a phrase pool file, or from another format version.
struct PoolFileError : Error {
    using Error::Error;
};

// A draft head file is missing, not GGUF, not a head, of another format version, or lacks (or
// misshapes) a key or tensor.
struct HeadFileError : Error {
    using Error::Error;
};

// A draft head was trained for another target (name, architecture, layers, width, vocabulary).
struct HeadMismatchError : Error {
    using Error::Error;
};

// An n-gram table file (spec/ngram_table.h) is missing, truncated, corrupt, of another format
// version, or built for another vocabulary.
struct NgramFileError : Error {
    using Error::Error;
};

// The engine was used after close().
struct ClosedError : Error {
    using Error::Error;
};

}  // namespace spec
