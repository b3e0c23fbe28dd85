// Replay of the auto scheduler on known greedy outputs (spec/replay.h).
#include "spec/replay.h"

#include <string>

#include "spec/cost_model.h"
#include "spec/error.h"
#include "spec/rng.h"
#include "spec/sampling.h"
#include "spec/tree.h"
#include "spec/verify.h"

namespace spec {
namespace {

// The drafted nodes the engine's greedy verification (verify_tree_greedy) accepts when the
// target's output after the root is `actual` [n_actual]. A row's argmax is the actual token one
// deeper than the row's node: exact for the rows verification walks (the root and accepted
// nodes, whose paths match `actual`); the other rows are never read. -1 past the end.
int32_t accepted_length(const Draft& draft, const int32_t* actual, int32_t n_actual) {
    const int32_t n = int32_t(draft.tokens.size());
    const std::vector<int32_t> parents = draft.parents.empty() ? chain_parents(n) : draft.parents;
    const std::vector<int32_t> depths = tree_depths(parents);
    std::vector<int32_t> argmax(size_t(n) + 1, -1);
    argmax[0] = actual[0];
    for (int32_t i = 0; i < n; ++i) {
        if (depths[size_t(i)] + 1 < n_actual) argmax[size_t(i) + 1] = actual[depths[size_t(i)] + 1];
    }
    return int32_t(verify_tree_greedy(draft.tokens, parents, argmax).path.size());
}

}  // namespace

std::vector<ReplaySteps> replay_auto(const std::vector<ReplayRequest>& requests, const CostCurve& curve,
                                     const LookupParams& lookup, const PoolParams& pool_params,
                                     const PhrasePoolParams& pool_settings, const AutoParams& params,
                                     const CostCurve* actual, const NgramTable* corpus) {
    validate(curve);
    if (actual) validate(*actual);
    const CostCurve& charged = actual ? *actual : curve;
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
            make_auto_drafter(nullptr, nullptr, costs, stats, &pool, lookup, pool_params, model_free, {}, corpus);
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
            costs.observe(size, charged.at(size));
            steps.sizes.push_back(size);
            steps.accepted.push_back(n_accepted);
            steps.first_kinds.push_back(draft.kinds.empty() ? kKindUnknown : draft.kinds[0]);
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
