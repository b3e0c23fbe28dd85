// Replay of the auto scheduler on known greedy outputs, without a model: what `auto` would draft
// and how many tokens each step would accept, step by step, when the target's greedy output is
// already known. With greedy decoding the committed tokens do not depend on the drafts, so a
// recorded `none` output fixes them; the drafter's decisions then depend only on those tokens,
// the acceptance statistics and the cost curve. The replay times nothing: each step is charged
// the curve's time of its size, which makes a policy's effect measurable on a busy machine in
// milliseconds (benchmarks/auto_replay.py). What it leaves out: the draft model (the proposals
// are prompt lookup and pool phrases only) and the pool's harvest of rejected drafts, which needs
// the target's argmax after a rejected token.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/drafter.h"
#include "spec/phrase_pool.h"
#include "spec/schedule.h"

namespace spec {

struct ReplayRequest {
    std::vector<int32_t> prompt;  // the prompt's tokens
    std::vector<int32_t> output;  // the target's greedy output after it
};

// One request's steps: the tokens decoded per target call (1 + drafted), the drafted tokens
// accepted, and the node kind of the draft's first node (spec/schedule.h; kKindUnknown when the
// step drafted nothing), in order. Sum of (accepted + 1) == output length.
struct ReplaySteps {
    std::vector<int32_t> sizes;
    std::vector<int32_t> accepted;
    std::vector<uint8_t> first_kinds;
};

// Replays requests in order through one auto drafter state per request sharing one set of
// acceptance statistics, one phrase pool and one cost model (as one Engine serving them), the
// cost model's prior being `curve` and every step observed at `actual`'s time (null: the curve's
// own; a curve measured at a long context replays a calibration that is wrong for the context).
// corpus: an n-gram table auto also drafts from (null: none). Throws InvalidArgumentError for
// invalid parameters or a request with an empty prompt or output.
std::vector<ReplaySteps> replay_auto(const std::vector<ReplayRequest>& requests, const CostCurve& curve,
                                     const LookupParams& lookup, const PoolParams& pool_params,
                                     const PhrasePoolParams& pool_settings, const AutoParams& params,
                                     const CostCurve* actual = nullptr, const NgramTable* corpus = nullptr);

}  // namespace spec
