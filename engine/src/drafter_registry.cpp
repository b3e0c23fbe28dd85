// The table of drafting methods (spec/drafter_registry.h): one row per method, with the shape,
// the checks and the factory that used to be spread over the decoder.
#include "spec/drafter_registry.h"

#include <algorithm>

#include "spec/decoder.h"
#include "spec/error.h"
#include "spec/tree.h"

namespace spec {
namespace {

// -- shapes ---------------------------------------------------------------------------------------

DraftShape no_shape(const GenerateParams&) { return {0, 0}; }

DraftShape chain_shape(const GenerateParams& params) { return {params.n_draft, params.n_draft}; }

bool pool_branches_on(const GenerateParams& params) {
    return params.pool.enabled && params.pool.n_branches > 0;
}

DraftShape lookup_shape(const GenerateParams& params) {
    return {params.n_draft, pool_branches_on(params) ? std::max(params.n_draft, params.pool.max_nodes) : params.n_draft};
}

DraftShape ouroboros_shape(const GenerateParams& params) {
    // gamma draft-model tokens, then up to K pool branches of up to phrase_len - 1 tokens.
    const bool pool = pool_branches_on(params);
    const int32_t branch = pool ? params.pool.phrase_len - 1 : 0;
    return {params.n_draft + branch,
            std::min(kMaxTreeNodes, params.n_draft + (pool ? params.pool.n_branches * branch : 0))};
}

DraftShape auto_shape(const GenerateParams& params) {
    const AutoParams& a = params.scheduler;
    return {std::max(a.max_depth, a.max_gamma), std::max(a.max_nodes, a.max_gamma)};
}

DraftShape tree_shape(const GenerateParams& params) { return {params.tree.depth, params.tree.n_nodes}; }

DraftShape beam_shape(const GenerateParams& params) {
    return {params.beam.length, params.beam.n_beams * params.beam.length};
}

// -- checks ---------------------------------------------------------------------------------------

void check_nothing(const GenerateParams&, const MethodLimits&) {}

void check_n_draft(const GenerateParams& params, const MethodLimits& limits) {
    if (params.n_draft < 1 || params.n_draft > limits.n_draft_max) {
        throw InvalidArgumentError("n_draft must be in [1, " + std::to_string(limits.n_draft_max) +
                                   "] for this context (n_ctx=" + std::to_string(limits.n_ctx) + ", n_batch=" +
                                   std::to_string(limits.n_batch) + "), got " + std::to_string(params.n_draft));
    }
}

// A tree of the method's node budget, plus its root, must fit one target batch.
void check_tree_fits(const DraftShape& shape, const MethodLimits& limits) {
    if (shape.n_nodes > limits.n_batch - 1) {
        throw InvalidArgumentError("a draft tree of up to " + std::to_string(shape.n_nodes) +
                                   " nodes does not fit n_batch=" + std::to_string(limits.n_batch));
    }
}

void check_chain(const GenerateParams& params, const MethodLimits& limits) { check_n_draft(params, limits); }

void check_lookup(const GenerateParams& params, const MethodLimits& limits) {
    check_n_draft(params, limits);
    validate(params.lookup);
    validate(params.pool);
}

void check_ouroboros(const GenerateParams& params, const MethodLimits& limits) {
    check_n_draft(params, limits);
    validate(params.pool);
}

void check_auto(const GenerateParams& params, const MethodLimits&) {
    validate(params.lookup);
    validate(params.pool);
    validate(params.scheduler);
}

void check_tree(const GenerateParams& params, const MethodLimits& limits) {
    validate(params.tree);
    check_tree_fits(tree_shape(params), limits);
    // Every draft node the tree drafter decodes takes a KV sequence of the draft model.
    const int64_t n_decoded = int64_t(params.tree.depth - 1) * params.tree.n_expand;
    if (n_decoded > limits.n_seq_max - 1) {
        throw InvalidArgumentError("a draft tree decodes up to (tree depth - 1) * n_expand = " + std::to_string(n_decoded) +
                                   " draft nodes, one KV sequence each; this engine has " +
                                   std::to_string(limits.n_seq_max - 1) + " (n_batch=" + std::to_string(limits.n_batch) +
                                   "; an engine gets 64 sequences when n_batch and n_ctx are >= 64)");
    }
}

// The head keeps no cache: no KV sequence per expanded node, only the tree must fit a batch.
void check_head_tree(const GenerateParams& params, const MethodLimits& limits) {
    validate(params.tree);
    check_tree_fits(tree_shape(params), limits);
}

void check_beam(const GenerateParams& params, const MethodLimits& limits) {
    validate(params.beam);
    check_tree_fits(beam_shape(params), limits);
}

// -- factories ------------------------------------------------------------------------------------

std::unique_ptr<Drafter> make_lookup(const GenerateParams& params, const DrafterResources& res) {
    return make_pool_lookup_drafter(params.lookup, res.pool, params.pool);
}

std::unique_ptr<Drafter> make_auto(const GenerateParams& params, const DrafterResources& res) {
    return make_auto_drafter(res.draft, res.draft_cost, *res.target_cost, *res.acceptance, res.pool, params.lookup,
                             params.pool, params.scheduler, {res.head, res.head_cost, res.head_acceptance}, res.corpus);
}

std::unique_ptr<Drafter> make_chain(const GenerateParams&, const DrafterResources& res) {
    return make_model_chain_drafter(*res.draft);
}

std::unique_ptr<Drafter> make_tree(const GenerateParams& params, const DrafterResources& res) {
    return make_model_tree_drafter(*res.draft, params.tree);
}

std::unique_ptr<Drafter> make_beam(const GenerateParams& params, const DrafterResources& res) {
    return make_model_beam_drafter(*res.draft, params.beam);
}

std::unique_ptr<Drafter> make_redrafter(const GenerateParams& params, const DrafterResources& res) {
    return make_head_beam_drafter(*res.head, params.beam);
}

std::unique_ptr<Drafter> make_eagle(const GenerateParams& params, const DrafterResources& res) {
    return make_head_tree_drafter(*res.head, params.tree);
}

std::unique_ptr<Drafter> make_ouroboros(const GenerateParams& params, const DrafterResources& res) {
    return make_ouroboros_drafter(*res.draft, *res.pool, params.pool, params.n_draft);
}

// Whether method "auto" may draft with the draft model. Not for a seeded sampled request: with
// only deterministic proposals, verification draws one token per position from the target
// (verify_tree_rejection), so the seed alone fixes the output, whatever the scheduler learned or
// the phrase pool holds; a sampled draft-model chain would consume the random stream differently.
bool auto_wants_draft_model(const GenerateParams& params) {
    return params.scheduler.use_draft_model && !(params.seed && !params.sampling.greedy());
}

// Whether method "auto" may draft with the engine's draft head: head chains are deterministic
// (one-hot proposals), so seeded sampled requests may too.
bool auto_wants_head(const GenerateParams& params) { return params.scheduler.use_head; }

}  // namespace

const std::vector<DrafterMethod>& drafter_methods() {
    using U = DraftModelUse;
    using H = HeadUse;
    static const std::vector<DrafterMethod> methods = {
        // name        draft model   wants                   curves head         wants            shape            validate         make
        {"auto",       U::optional,  auto_wants_draft_model, true,  H::optional, auto_wants_head, auto_shape,      check_auto,      make_auto},
        {"none",       U::never,     nullptr,                false, H::never,    nullptr,         no_shape,        check_nothing,   nullptr},
        {"chain",      U::required,  nullptr,                false, H::never,    nullptr,         chain_shape,     check_chain,     make_chain},
        {"tree",       U::required,  nullptr,                false, H::never,    nullptr,         tree_shape,      check_tree,      make_tree},
        {"beam",       U::required,  nullptr,                false, H::never,    nullptr,         beam_shape,      check_beam,      make_beam},
        {"lookup",     U::never,     nullptr,                false, H::never,    nullptr,         lookup_shape,    check_lookup,    make_lookup},
        {"ouroboros",  U::required,  nullptr,                false, H::never,    nullptr,         ouroboros_shape, check_ouroboros, make_ouroboros},
        {"redrafter",  U::never,     nullptr,                false, H::required, nullptr,         beam_shape,      check_beam,      make_redrafter},
        {"eagle",      U::never,     nullptr,                false, H::required, nullptr,         tree_shape,      check_head_tree, make_eagle},
    };
    return methods;
}

const DrafterMethod& find_drafter_method(const std::string& name) {
    const std::vector<DrafterMethod>& methods = drafter_methods();
    for (const DrafterMethod& method : methods) {
        if (name == method.name) return method;
    }
    std::string available;
    for (const DrafterMethod& method : methods) available += (available.empty() ? "" : ", ") + std::string(method.name);
    throw InvalidArgumentError("unknown method '" + name + "' (available: " + available + ")");
}

bool method_uses_draft_model(const DrafterMethod& method, const GenerateParams& params, bool slot_has_model) {
    switch (method.draft_model) {
        case DraftModelUse::never: return false;
        case DraftModelUse::required: return true;
        case DraftModelUse::optional:
            return slot_has_model && (!method.wants_draft_model || method.wants_draft_model(params));
    }
    return false;
}

bool method_uses_head(const DrafterMethod& method, const GenerateParams& params, bool engine_has_head) {
    switch (method.head) {
        case HeadUse::never: return false;
        case HeadUse::required: return true;
        case HeadUse::optional: return engine_has_head && (!method.wants_head || method.wants_head(params));
    }
    return false;
}

}  // namespace spec
