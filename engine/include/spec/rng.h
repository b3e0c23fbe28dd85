// Seeded random numbers. One generator per request stream; the same seed gives the same draws on
// every platform (mt19937_64 is fully specified, and we do our own int -> double conversion).
#pragma once

#include <cstdint>
#include <random>

namespace spec {

class Rng {
public:
    explicit Rng(uint64_t seed = 0) : gen_(seed) {}

    void reseed(uint64_t seed) { gen_.seed(seed); }

    // Uniform in [0, 1), 53 random bits.
    double uniform() { return double(gen_() >> 11) * (1.0 / 9007199254740992.0); }

    uint64_t next_u64() { return gen_(); }

private:
    std::mt19937_64 gen_;
};

}  // namespace spec
