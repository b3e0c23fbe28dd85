// Drafters propose tokens for the target to verify. The decoder talks to every drafter through
// this interface only (begin / draft / accept / stats) and never special-cases a type.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "spec/rng.h"
#include "spec/sampling.h"

namespace spec {

class NgramTable;  // spec/ngram_table.h

class Model;

// The most tokens one step may propose (chains; trees are further bounded by kMaxTreeSeqs - 1
// leaves): also bounded by n_batch - 1 and the context window at run time.
constexpr int32_t kMaxDraftTokens = 256;

struct DraftRequest {
    const std::vector<int32_t>* tokens = nullptr;  // committed sequence: prompt + generated so far
    int32_t n_draft_max = 0;                       // propose at most this many tokens in a row (depth)
    const SamplingParams* sampling = nullptr;      // the target's sampling transform (q must match)
    Rng* rng = nullptr;
    int32_t n_nodes_max = 0;                       // tree drafters: at most this many nodes in all
    // Methods whose table row asks for the target's hidden states (spec/drafter_registry.h):
    // [n_hidden] the target's last-layer hidden state of the row that chose the last committed
    // token; null before the request's first target decode. Valid during draft() only.
    const float* target_hidden = nullptr;
};

// A chain or a tree of proposed tokens (spec/tree.h).
struct Draft {
    std::vector<int32_t> tokens;   // [n] the proposed tokens
    // [n] parent of each token (-1: the last committed token), parents before children, siblings
    // in the order verification should try them. Empty: a chain (parent of i is i - 1).
    std::vector<int32_t> parents;
    // [n, n_vocab] row i: the distribution tokens[i] was drawn from. Empty when the proposal is
    // deterministic (greedy drafting, top-k trees, beams, lookup): q is then one-hot.
    std::vector<float> probs;
    // Tokens the drafter considered before compressing them into this draft (beam search: the
    // beams' K * L tokens); 0 means tokens.size().
    int32_t n_candidate_tokens = 0;
    // [n] or empty: what produced each node (spec/schedule.h: kind_lookup, kind_pool,
    // kind_model), the key under which the auto scheduler learns how often such nodes are
    // accepted. Empty: unknown.
    std::vector<uint8_t> kinds;

    void clear() {
        tokens.clear();
        parents.clear();
        probs.clear();
        kinds.clear();
        n_candidate_tokens = 0;
    }
};

struct DrafterStats {
    int64_t n_draft_calls = 0;    // draft() calls
    int64_t n_model_decodes = 0;  // llama_decode calls spent drafting (0 for model-free drafters)
    int64_t n_proposed = 0;
    int64_t n_accepted = 0;
    int64_t n_head_drafts = 0;    // drafts of the draft head (redrafter, auto)
    int64_t n_head_accepted = 0;  // their tokens accepted
};

class Drafter {
public:
    virtual ~Drafter() = default;
    virtual std::string name() const = 0;
    // A new request starts; `prompt` are all prompt tokens.
    virtual void begin(const std::vector<int32_t>& prompt) = 0;
    // Proposes up to request.n_draft_max tokens that follow *request.tokens.
    virtual void draft(const DraftRequest& request, Draft& out) = 0;
    // The target accepted n_accepted tokens of the last draft (a chain prefix, or a path from the
    // root of a tree: the last n_accepted + 1 tokens of committed name it); committed is the new
    // committed sequence (it ends with the recovered/bonus token, not yet seen by the drafter).
    virtual void accept(const std::vector<int32_t>& committed, int32_t n_accepted) = 0;
    virtual DrafterStats stats() const = 0;
    // Greedy decoding only, right after verification of the last draft: tokens / parents are the
    // draft as verified (a chain's parents spelled out), target_argmax[r] the target's token
    // after batch row r (row 0: the last committed token, row i + 1: node i). Drafters may learn
    // from it, e.g. harvest target-confirmed phrases. Default: nothing.
    virtual void observe_target(const std::vector<int32_t>& /*tokens*/, const std::vector<int32_t>& /*parents*/,
                                const std::vector<int32_t>& /*target_argmax*/) {}
    // Whether observe_target reads the draft's rows: without it the decoder computes the target's
    // token only for the rows verification walks through, and calls observe_target with -1 for
    // the others. Default: false.
    virtual bool observes_target() const { return false; }
    // The request ended; committed is the final sequence (prompt + output). Default: nothing.
    virtual void end(const std::vector<int32_t>& /*committed*/) {}
};

// A GGUF draft model proposing a chain autoregressively. Its KV cache is kept in step with the
// target: rejected draft tokens are dropped, committed tokens it has not seen are fed on the next
// draft() call together with the first draft decode.
std::unique_ptr<Drafter> make_model_chain_drafter(Model& draft_model);

// Settings of the draft-model tree drafter.
struct TreeParams {
    int32_t n_nodes = 8;     // nodes verified per step (<= kMaxTreeNodes)
    int32_t depth = 6;       // longest path (draft decodes per step: depth - 1, plus the root)
    int32_t branching = 4;   // children considered per expanded candidate (draft top-k)
    int32_t n_expand = 1;    // candidates of a layer expanded together in one draft decode
};

// EAGLE-2's dynamic draft tree with a draft model: candidates grow layer by layer (each layer's
// n_expand best-scoring candidates are decoded in one batch, each in its own KV sequence that
// shares its ancestors' cells, and their `branching` likeliest tokens form the next layer); a
// candidate's score is the product of draft probabilities along its path; the n_nodes
// best-scoring candidates of all layers are verified (near the end of the context window fewer
// candidates are expanded, so that the draft's cache never overflows). Children are chosen deterministically
// (top-k), so the draft is deterministic (one-hot q) and exact under sampling too. The accepted
// path's KV cells are kept for the next step; every other branch is dropped.
std::unique_ptr<Drafter> make_model_tree_drafter(Model& draft_model, const TreeParams& params);

// Settings of the beam-search drafter.
struct BeamParams {
    int32_t n_beams = 4;  // K (K * (length - 1) <= kMaxTreeNodes)
    int32_t length = 5;   // L
};

// ReDrafter-style beam search with the draft model: K beams of L tokens scored by summed draft
// log-probabilities, one draft decode per beam step (all K beams in one batch), then compressed
// into a tree with prefix_match (spec/tree.h) and verified in one target call. Deterministic.
// When the sampling support (top_k, top_p, min_p) holds fewer than K tokens, that many beams.
std::unique_ptr<Drafter> make_model_beam_drafter(Model& draft_model, const BeamParams& params);

// Throw InvalidArgumentError naming the bad field.
void validate(const TreeParams& params);
void validate(const BeamParams& params);

class DraftHead;

// ReDrafter ("redrafter"): beam search over a draft head (spec/draft_head.h) from the target's
// hidden state (DraftRequest::target_hidden): K beams of L tokens scored by summed head
// log-probabilities, the first step from the last committed token, each later step all K beams
// in one head call; then compressed with prefix_match into a tree verified in one target call.
// Deterministic (one-hot q), so exact under sampling too. Without a hidden state (the first step
// of a request) it proposes nothing.
std::unique_ptr<Drafter> make_head_beam_drafter(DraftHead& head, const BeamParams& params);

// EAGLE-2's dynamic draft tree over a draft head (method "eagle"): as make_model_tree_drafter's,
// with the head in place of the draft model. Each layer steps its n_expand best-scoring
// candidates in one head call (rows: the candidates; the head keeps no cache, so no KV
// sequences), from the parent's state after its step; the n_nodes best-scoring candidates of
// all layers (score: the product of the head's probabilities along the path) are verified.
// Deterministic top-k children: one-hot q, exact under sampling too.
std::unique_ptr<Drafter> make_head_tree_drafter(DraftHead& head, const TreeParams& params);

// Settings of the prompt-lookup drafter. Matches of ngram_max tokens are tried first, then
// shorter ones down to ngram_min; 1 <= ngram_min <= ngram_max <= kLookupNgramLimit.
struct LookupParams {
    int32_t ngram_max = 16;  // longest suffix of the committed sequence searched for
    int32_t ngram_min = 1;  // shortest suffix tried before giving up (no proposal)
    // A continuation stops before any of these tokens. The engine sets them to the target's
    // control and end-of-generation tokens (Model::control_tokens): a chat template's message
    // delimiters end the text a copy can follow, so a copy of a quoted prompt (the code a user
    // pasted) is never drafted past the end of the quote into the template's markup.
    std::vector<int32_t> stop_tokens;
    // Tokens that end a blank line (their text holds "\n\n") and tokens that start at a left
    // margin (text not starting with whitespace): a node of the first kind that the copied text
    // follows with one of the second ends a top-level unit of the source, and gets the kind
    // kind_lookup_boundary (spec/schedule.h). The engine fills both from the target's vocabulary
    // (Model::layout_tokens), the first when unit_ends is set, the second when unit_ends or
    // fences is (fence_tokens); blank_line_tokens empty: no boundary kinds.
    std::vector<int32_t> blank_line_tokens;
    std::vector<int32_t> unit_start_tokens;
    bool unit_ends = true;
    // Tokens that start with a code fence (their text begins with "```"). One followed by a token
    // at the left margin (unit_start_tokens: a language tag, ```python) opens a code block. Before
    // the output's first token, the prompt's last such block that a later fence closes is
    // proposed from its fence on (an answer that writes the given code out again starts with it;
    // a prompt that ends inside an open block asks for its continuation), its first
    // kAnswerStartDepth nodes of kind kind_lookup_answer_start. A copy of the prompt whose key,
    // shorter than kFenceMaxMatch tokens, holds an opening fence, its tag and at least one token more (the
    // output opened a code block where the prompt has one, and the newline after the tag, which
    // answers do not always copy, is behind) gets kind_lookup_fence for its first kFenceDepth
    // nodes: its key is too short for its match length to tell, and the statistics learn whether
    // this stream's answers write the given code out again. The engine fills them from the
    // target's vocabulary (Model::layout_tokens) when fences is set; empty: neither.
    std::vector<int32_t> fence_tokens;
    bool fences = true;
    // Learn the request's substitutions: where a long copy (kSubstitutionMinMatch tokens or more)
    // breaks and the output, after at most kSubstitutionMaxNew tokens of its own, goes on copying
    // the source at most kSubstitutionMaxOld tokens further, the skipped source tokens and the
    // output's replacement make a substitution; later copies propose the replacement wherever they
    // reach the same source tokens after the same source token as where it was learnt
    // (kind_lookup_substituted), and go on through it. A substituted node the target rejects
    // forgets its substitution. Until kSubstitutionResync tokens have agreed, the first place
    // that kSubstitutionProvisional committed tokens agree with is learnt provisionally (a copy
    // that resumes right after a rename can meet the name again before the break settles) and
    // settling forgets it unless it confirms it. A copy of the prompt picked up inside the
    // output after a replacement no proposal ran into (a function renamed where the answer
    // starts) learns it too, where the output and the source agree on the token before it.
    bool substitutions = true;
    // With substitutions: while a long copy's break is not settled yet (the output has written at
    // most kSubstitutionMaxNew tokens of its own since), a copy whose match is shorter than
    // kSubstitutionMinMatch tokens gives way to the source where the broken copy left off: the
    // nearest position at most kSubstitutionMaxOld tokens after the break whose preceding source
    // token is the output's last token (kind_lookup_resync). The copy the output then follows goes
    // on from there, as one through a substitution does, instead of from a new short match.
    bool resync = true;
    // With substitutions: where no substitution was learnt after the source token before a
    // copied stretch, one learnt after another token applies too (kind_lookup_substituted_loose),
    // unless the output already kept that stretch after this token.
    bool loose_substitutions = true;
};
constexpr int32_t kFenceMaxMatch = 8;
constexpr int32_t kFenceDepth = 7;
constexpr int32_t kAnswerStartDepth = 4;
constexpr int32_t kSubstitutionMinMatch = 8;
constexpr int32_t kSubstitutionMaxOld = 8;
constexpr int32_t kSubstitutionMaxNew = 8;
constexpr int32_t kSubstitutionResync = 3;  // tokens that must agree again after a replacement
constexpr int32_t kSubstitutionProvisional = 1;  // of them: enough for a provisional substitution
constexpr int32_t kMaxSubstitutions = 16;   // per request
constexpr int32_t kLookupNgramLimit = 16;

// Prompt lookup decoding, no model: the last n committed tokens (n = ngram_max down to
// ngram_min, longest first) are looked up among earlier positions of the committed sequence
// (prompt + generated); the tokens that followed the most recent earlier occurrence are proposed,
// up to n_draft_max. When the continuation reaches the end of the sequence it goes on through
// the tokens just proposed, which repeats a periodic pattern. No match: an empty draft. The
// proposal is deterministic (Draft.probs stays empty). An n-gram index (hash of n tokens ->
// latest position) grows with the sequence: a step costs O(ngram_max) hash operations per new
// committed token plus O(ngram_max + n_draft_max), never a scan of the sequence.
// Throws InvalidArgumentError when params are outside the range above.
std::unique_ptr<Drafter> make_prompt_lookup_drafter(const LookupParams& params);

// Throws InvalidArgumentError naming the values when params are outside the range above.
void validate(const LookupParams& params);

class PhrasePool;

// How drafters use the engine's phrase pool (spec/phrase_pool.h, Ouroboros).
struct PoolParams {
    bool enabled = true;             // propose pool phrases (false: lookup is plain prompt lookup)
    int32_t n_branches = 2;          // K: pool phrases added as extra branches per step
    int32_t phrase_len = 8;          // N: length of the phrases harvested from prompts and outputs
    int32_t max_nodes = 16;          // lookup: node budget of one step's tree, chain + branches
                                     // (at least the chain's n_draft)
    bool harvest_prompt = true;      // source: n-grams of each prompt
    bool harvest_generated = true;   // source: n-grams of each output (kept for later requests)
    bool harvest_verification = true;  // source: target-confirmed pieces of rejected drafts
};

// Prompt lookup plus the phrase pool ("lookup", no draft model): the prompt-lookup chain, then up
// to K pool phrases whose first tokens equal the end of the committed sequence (longest key
// first), merged into one tree of at most max_nodes nodes. Harvests prompts, outputs and (greedy)
// verification results into the pool, and credits the phrases the target accepted. pool null
// or params.enabled false: plain prompt lookup. Deterministic proposals.
std::unique_ptr<Drafter> make_pool_lookup_drafter(const LookupParams& lookup, PhrasePool* pool,
                                                  const PoolParams& params);

// Ouroboros ("ouroboros"): the draft model drafts a chain of up to n_draft tokens phrase by
// phrase: each draft decode also checks a pool phrase continuing the chain and keeps the prefix
// the draft itself agrees with (greedy), so one draft decode can yield several tokens; the chain
// is then lengthened by up to K pool phrases starting with its last token, as branches verified
// in the same target call. Sampled decoding drafts token by token (q rows), branches one-hot.
std::unique_ptr<Drafter> make_ouroboros_drafter(Model& draft_model, PhrasePool& pool, const PoolParams& params,
                                                int32_t n_draft);

// Throws InvalidArgumentError naming the bad field.
void validate(const PoolParams& params);

struct CostCurve;
class CostModel;
class AcceptanceStats;

// Settings of the auto scheduler ("auto"): the largest proposals it considers per step; the
// planner (spec/schedule.h) keeps what pays.
struct AutoParams {
    int32_t max_depth = 64;        // longest prompt-lookup / pool path considered
    int32_t max_nodes = 80;        // lookup + pool nodes considered (<= kMaxDraftTokens)
    int32_t max_gamma = 8;         // longest draft-model chain considered
    // Consider the draft model at all (needs its cost curve). Seeded sampled requests never use
    // it: with one-hot proposals only, the seed alone fixes their tokens (see the decoder).
    bool use_draft_model = true;
    // Consider the engine's draft head (spec/draft_head.h) when it has one. Its drafts are
    // deterministic, so seeded sampled requests use it too.
    bool use_head = true;
    // Where a head chain pays, draft a head tree of up to this many nodes instead (EAGLE-2's
    // dynamic tree, make_head_tree_drafter: 4 children per expanded node, 4 nodes expanded per
    // head call, as deep as max_gamma) and keep the nodes the planner expects to pay, the head's
    // top choices (kind_head) and its others (kind_head_alternative) each at their measured
    // acceptance. 0: head chains only.
    int32_t head_tree_nodes = 16;
    // Plan with the engine's cost model as corrected from the steps it has timed
    // (spec/cost_model.h); false: with the calibrated curve alone.
    bool adapt_costs = true;
    // Propose from the engine's static n-gram table (spec/ngram_table.h) when it has one: a
    // chain of the table's predictions after the committed tokens, up to corpus_max_depth nodes
    // of confidence >= kCorpusMinConfidence, each from a context seen >= corpus_min_total times,
    // as one more branch of the free proposal (skipped when a lookup or pool branch already
    // starts with its first token). Its nodes are kind_corpus nodes and pay only where the
    // statistics say they are accepted often enough.
    bool use_corpus = true;
    int32_t corpus_max_depth = 8;
    int32_t corpus_min_total = 10;
    // Within a request, weigh the acceptance statistics of the earlier requests against the
    // priors alone by how well each predicts the request's own outcomes
    // (AcceptanceStats::begin_request), so that a change of stream (chat after code) is planned
    // as a fresh engine would plan it; false: the earlier requests' counts alone, as before (for
    // comparisons, benchmarks/auto_streams.py).
    bool check_history = true;
};

// Throws InvalidArgumentError naming the bad field.
void validate(const AutoParams& params);

// The engine's draft head as method auto plans with it. The engine keeps the cost model and the
// statistics across requests and starts them afresh when the head is replaced.
struct AutoHead {
    DraftHead* head = nullptr;               // null: auto does not consider a head
    // ms per head step of one row: no calibration; the prior is the first step auto times,
    // corrected (spec/cost_model.h) by the time of every head chain it drafts.
    CostModel* step_cost = nullptr;
    AcceptanceStats* acceptance = nullptr;   // kind_head nodes by depth (spec/schedule.h)
};

// The auto scheduler as a drafter. Every step it builds the free proposal (prompt lookup + pool
// phrases, up to max_depth / max_nodes) and keeps the node set that maximises expected tokens
// per ms under the target's cost curve and the running acceptance statistics (possibly none:
// plain decoding). When a draft model is given with its cost curve, it also predicts what a
// draft-model chain of each length would earn from the model's running acceptance and drafts
// with the model when that beats the free proposal; greedy chains are then trimmed with the
// draft's own per-token confidence (sampled chains are not: their length must not depend on the
// tokens drawn, or verification would stop being exact). The model's KV cache is filled lazily,
// the first time it drafts. With a draft head (head.head set, and a hidden state: not at a
// request's first step) it predicts a greedy head chain of each length up to max_gamma the same
// way, from the head's acceptance at each depth and its measured step cost, and drafts the head
// chain when that is the best of the three. stats is updated after every step and outlives the request.
// draft_model / draft_cost may be null: no model (the engine passes null when
// params.use_draft_model is off or the request is seeded and sampled); target_cost must not be
// empty. corpus: the engine's n-gram table (null: none, or params.use_corpus off).
std::unique_ptr<Drafter> make_auto_drafter(Model* draft_model, const CostCurve* draft_cost, const CostModel& target_cost,
                                           AcceptanceStats& stats, PhrasePool* pool, const LookupParams& lookup,
                                           const PoolParams& pool_params, const AutoParams& params,
                                           const AutoHead& head = {}, const NgramTable* corpus = nullptr);

}  // namespace spec
