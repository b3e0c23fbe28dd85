// Minimal checking for the C++ unit tests: CHECK / CHECK_NEAR count failures and report them
// with file and line; each test's main() prints the totals and returns non-zero on failure.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "spec/error.h"

inline int g_checks = 0;
inline int g_failures = 0;

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        ++g_checks;                                                                       \
        if (!(cond)) {                                                                    \
            ++g_failures;                                                                 \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                                 \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                  \
    do {                                                                                       \
        ++g_checks;                                                                            \
        const double a_ = (a), b_ = (b);                                                       \
        if (!(std::fabs(a_ - b_) <= (tol))) {                                                  \
            ++g_failures;                                                                      \
            std::fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, tol %g\n", \
                         __FILE__, __LINE__, #a, a_, #b, b_, double(tol));                     \
        }                                                                                      \
    } while (0)

// True when `call` throws InvalidArgumentError whose message contains `expected`.
inline bool throws_invalid(const std::function<void()>& call, const std::string& expected) {
    try {
        call();
    } catch (const spec::InvalidArgumentError& e) {
        if (std::string(e.what()).find(expected) != std::string::npos) return true;
        std::fprintf(stderr, "  message was: %s\n  expected to contain: %s\n", e.what(), expected.c_str());
        return false;
    }
    return false;
}

// True when `call` throws an E whose message contains `expected` (anything else: false, said why).
template <class E>
bool throws(const std::function<void()>& call, const std::string& expected) {
    try {
        call();
    } catch (const E& e) {
        if (std::string(e.what()).find(expected) != std::string::npos) return true;
        std::fprintf(stderr, "  message was: %s\n  expected to contain: %s\n", e.what(), expected.c_str());
        return false;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "  unexpected exception: %s\n", e.what());
        return false;
    }
    std::fprintf(stderr, "  nothing thrown, expected: %s\n", expected.c_str());
    return false;
}
