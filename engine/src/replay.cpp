// Replay of the auto scheduler on known greedy outputs (spec/replay.h).
#include "spec/replay.h"

#include <string>

#include "spec/cost_model.h"
#include "spec/error.h"
#include "spec/rng.h"
#include "spec/sampling.h"

namespace spec {
namespace {

// The drafted nodes greedy verification accepts: down the tree along `actual`, one child per
// level (siblings tried in order, as verify_tree_greedy does). actual: the target's tokens after
// the root, [n_actual].
int32_t accepted_length(const Draft& draft, const int32_t* actual, int32_t n_actual) {
    const int32_t n = int32_t(draft.tokens.size());
    int32_t node = -1, depth = 0;
    while (depth < n_actual) {
        int32_t next = -1;
        for (int32_t i = node + 1; i < n; ++i) {
            const int32_t parent = draft.parents.empty() ? i - 1 : draft.parents[size_t(i)];
            if (parent == node && draft.tokens[size_t(i)] == actual[depth]) {
                next = i;
                break;
            }
        }
        if (next < 0) break;
        node = next;
        ++depth;
    }
    return depth;
}

}  // namespace

std::vector<ReplaySteps> replay_auto(const std::vector<ReplayRequest>& requests, const CostCurve& curve,
                                     const LookupParams& lookup, const PoolParams& pool_params,
                                     const PhrasePoolParams& pool_settings, const AutoParams& params) {
    validate(curve);
    CostModel costs;
    costs.set_prior(curve);
    AcceptanceStats stats;
    PhrasePool pool(pool_settings);
    AutoParams model_free = params;
    model_free.use_draft_model = false;
    const SamplingParams greedy;
    Rng rng;

    std::vector<ReplaySteps> out;
    out.reserve(requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
        const ReplayRequest& request = requests[r];
        if (request.prompt.empty() || request.output.empty()) {
            throw InvalidArgumentError("replay_auto: request " + std::to_string(r) + " has an empty " +
                                       (request.prompt.empty() ? "prompt" : "output"));
        }
        std::unique_ptr<Drafter> drafter =
            make_auto_drafter(nullptr, nullptr, costs, stats, &pool, lookup, pool_params, model_free);
        std::vector<int32_t> committed = request.prompt;
        drafter->begin(committed);
        ReplaySteps steps;
        const int32_t n_out = int32_t(request.output.size());
        int32_t n_done = 0;
        Draft draft;
        while (n_done < n_out) {
            const int32_t n_remaining = n_out - n_done;
            DraftRequest dreq{&committed, std::min(params.max_depth, n_remaining - 1), &greedy, &rng,
                              params.max_nodes, nullptr};
            draft.clear();
            if (dreq.n_draft_max > 0) drafter->draft(dreq, draft);
            const int32_t n_accepted = accepted_length(draft, request.output.data() + n_done, n_remaining);
            const int32_t size = 1 + int32_t(draft.tokens.size());
            costs.observe(size, curve.at(size));
            steps.sizes.push_back(size);
            steps.accepted.push_back(n_accepted);
            // The accepted tokens and the target's own next token.
            const int32_t n_commit = std::min(n_accepted + 1, n_remaining);
            committed.insert(committed.end(), request.output.begin() + n_done,
                             request.output.begin() + n_done + n_commit);
            n_done += n_commit;
            if (n_done < n_out) drafter->accept(committed, n_accepted);
        }
        drafter->end(committed);
        out.push_back(std::move(steps));
    }
    return out;
}

}  // namespace spec
