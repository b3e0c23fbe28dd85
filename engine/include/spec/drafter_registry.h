// The drafting methods, in one table: a method's name, the engine resources it drafts with, the
// draft shape it asks the decoder for, its parameter checks and its factory. The engine looks a
// request's method up here and never dispatches on method names itself, so adding a method means
// adding a row to this table (engine/src/drafter_registry.cpp) and writing its drafter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spec/drafter.h"

namespace spec {

struct GenerateParams;
struct CostCurve;
class CostModel;
class AcceptanceStats;
class DraftHead;
class Model;
class PhrasePool;

// Draft depth and node budget a method asks for (before the decoder's per-step limits).
struct DraftShape {
    int32_t depth = 0;    // longest path from the root
    int32_t n_nodes = 0;  // nodes in all
};

// What the engine allows a request, for the parameter checks.
struct MethodLimits {
    int32_t n_draft_max = 0;  // longest chain that fits one target batch and the context window
    int32_t n_ctx = 0;        // the target's context window
    int32_t n_batch = 0;      // the target's batch size (root + nodes of one step)
    int32_t n_seq_max = 0;    // KV sequences of the target and draft contexts: sequence 0 plus
                              // one per tree leaf (target) or decoded tree node (draft)
};

// How a method uses the request's draft model slot (GenerateParams::draft).
enum class DraftModelUse : uint8_t {
    never,     // model-free
    required,  // the request fails with InvalidArgumentError when the slot is empty
    optional,  // drafts with it when the slot has one and wants_draft_model(params) says so
};

// How a method uses the engine's draft head (spec/draft_head.h).
enum class HeadUse : uint8_t {
    never,
    required,  // the request fails with InvalidArgumentError when the engine has no head
    optional,  // drafts with it when the engine has one and wants_head(params) says so
};

// The engine resources a drafter is built from; the method's row says which it needs, and the
// engine leaves the others null. They outlive the request.
struct DrafterResources {
    Model* target = nullptr;
    Model* draft = nullptr;                  // the request's draft slot (null: not used or empty)
    PhrasePool* pool = nullptr;              // the engine's phrase pool (always set)
    const CostModel* target_cost = nullptr;  // needs_cost_curves: measured before the factory runs
    const CostCurve* draft_cost = nullptr;   // needs_cost_curves and a draft: the slot's curve
    AcceptanceStats* acceptance = nullptr;   // needs_cost_curves: the slot's running statistics
    DraftHead* head = nullptr;               // the head when the method uses it (method_uses_head)
    CostModel* head_cost = nullptr;          // with head, for needs_cost_curves: its step cost
    AcceptanceStats* head_acceptance = nullptr;  // and its running statistics (spec/drafter.h, AutoHead)
    const NgramTable* corpus = nullptr;      // the engine's n-gram table, when it has one (method auto)
};

struct DrafterMethod {
    const char* name;
    DraftModelUse draft_model;
    // optional draft-model use: whether this request drafts with the model (null: always)
    bool (*wants_draft_model)(const GenerateParams& params);
    // The engine measures (or takes the cached) cost curves of the target and, when the draft
    // model is used, of the draft, and passes them with the slot's acceptance statistics.
    bool needs_cost_curves;
    // Whether it drafts with the engine's draft head; when it does, the decoder keeps the
    // target's hidden states during generation and passes them in DraftRequest::target_hidden.
    HeadUse head;
    // optional head use: whether this request drafts with the head (null: always)
    bool (*wants_head)(const GenerateParams& params);
    DraftShape (*shape)(const GenerateParams& params);
    // Throws InvalidArgumentError naming the bad field; the engine checks everything else.
    void (*validate)(const GenerateParams& params, const MethodLimits& limits);
    // The request's drafter; null for plain decoding.
    std::unique_ptr<Drafter> (*make)(const GenerateParams& params, const DrafterResources& resources);
};

// Every method, in the order user-facing lists show them ("auto" first).
const std::vector<DrafterMethod>& drafter_methods();

// The method called `name`; throws InvalidArgumentError listing the available ones.
const DrafterMethod& find_drafter_method(const std::string& name);

// Whether a request with this method drafts with its draft slot's model, given whether the slot
// has one: required methods always (the factory fails without one), optional ones when the slot
// is filled and wants_draft_model agrees.
bool method_uses_draft_model(const DrafterMethod& method, const GenerateParams& params, bool slot_has_model);

// Whether a request with this method drafts with the engine's draft head, given whether the
// engine has one, as method_uses_draft_model.
bool method_uses_head(const DrafterMethod& method, const GenerateParams& params, bool engine_has_head);

}  // namespace spec
