// The speculative decoding loop: prefill, then per step draft -> one target decode -> verify ->
// commit -> roll back rejected KV, until EOG, max_tokens, a stop string, the context window, or
// cancellation. Plain decoding (method "none") runs through the same loop with no drafter.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "spec/calibrate.h"
#include "spec/draft_head.h"
#include "spec/cost_model.h"
#include "spec/drafter.h"
#include "spec/grammar.h"
#include "spec/model.h"
#include "spec/ngram_table.h"
#include "spec/phrase_pool.h"
#include "spec/rng.h"
#include "spec/sampling.h"
#include "spec/penalties.h"
#include "spec/schedule.h"

namespace spec {

struct GenerateParams {
    int32_t max_tokens = 256;
    SamplingParams sampling;
    std::vector<std::string> stop;
    // a name from drafter_methods() (spec/drafter_registry.h): "auto" | "none" | "chain" |
    // "tree" | "beam" | "lookup" | "ouroboros"
    std::string method = "chain";
    std::string draft;             // the draft slot that drafts ("": the constructor's draft)
    int32_t n_draft = 4;           // longest chain proposed per step (chain, lookup; ouroboros: gamma)
    AutoParams scheduler;          // method "auto" (its lookup and pool use `lookup` and `pool`)
    TreeParams tree;               // method "tree"
    BeamParams beam;               // method "beam"
    LookupParams lookup;           // n-gram sizes of method "lookup"
    PoolParams pool;               // phrase pool use of "lookup" and "ouroboros"
    // How sampled drafts are verified: "exact" (rejection sampling, the target's distribution)
    // or "typical" (Medusa's typical acceptance: LOSSY, accepts x when p(x) > min(epsilon,
    // delta * exp(-H(p))); see verify_tree_typical). Greedy decoding ignores it.
    std::string acceptance = "exact";
    float typical_epsilon = 0.09f;
    float typical_delta = 0.3f;
    // The trace records every step (GenerateResult::trace); trace_top_k > 0 adds the target's
    // top-k (and its probability of the rejected token) at each rejected position, a softmax of
    // that row on the host. 0: steps only.
    int32_t trace_top_k = 0;
    bool return_logits = false;    // keep the target's logits row behind every generated token
    // Greedy requests that read nothing of a row but its argmax (no logprobs, return_logits,
    // trace_top_k, grammar or penalties) can take it on the target's backend
    // (Model::set_backend_argmax): the same tokens, no logits rows copied to the host.
    // -1: where the target's output layer runs on a GPU (Model::output_on_gpu);
    // 0: never; 1: whenever the request allows it.
    int32_t backend_argmax = -1;
    // -1: no log-probabilities (nothing computed). k >= 0: each generated token's log-probability
    // and those of the k likeliest tokens of the same target row (GenerateResult::token_logprobs).
    int32_t logprobs = -1;
    std::optional<uint64_t> seed;  // this request's own random stream (the engine's stays as it is)
    // A GBNF grammar the output must follow (empty: none), from rule grammar_root. The target's
    // rows are masked to what the grammar allows, drafts are cut at the first token it forbids:
    // greedy output equals constrained plain decoding, sampled output the masked distribution.
    std::string grammar;
    std::string grammar_root = "root";
    // With a grammar and a method that drafts: a step whose drafter proposes nothing drafts the
    // text the grammar forces (spec/grammar.h, ForcedText) instead.
    bool grammar_drafts = true;
    // Penalties and biases on the target's logits (spec/penalties.h): every row is penalised for
    // the output on its own path, so greedy output equals penalised plain decoding and sampled
    // output follows the penalised distribution. Log-probabilities stay the target's own.
    PenaltyParams penalties;
};

struct Stats {
    int32_t n_prompt_tokens = 0;
    // Prompt tokens whose KV the target kept from earlier requests (the prefix cache): prefill
    // evaluated only the other n_prompt_tokens - n_prompt_cached.
    int32_t n_prompt_cached = 0;
    int32_t n_generated = 0;       // tokens in the result
    int32_t n_target_calls = 0;    // target decodes after prefill (one per step)
    int32_t n_drafted = 0;         // draft tokens proposed (tree nodes for trees)
    int32_t n_candidate_tokens = 0;  // tokens drafted before compression (beam: K * L per step)
    int32_t n_accepted = 0;        // draft tokens accepted and used (none after the end of the output)
    int32_t n_draft_decodes = 0;   // draft model decodes (0 for model-free drafting)
    int32_t n_empty_drafts = 0;    // steps that verified no draft token (plain decoding steps)
    int32_t n_head_drafts = 0;     // steps that verified a draft of the draft head (redrafter, auto)
    int32_t n_head_accepted = 0;   // draft tokens of the head accepted
    bool backend_argmax = false;   // the target's rows' argmax was taken on its backend (no rows on the host)
    std::vector<int32_t> accept_histogram;  // [max depth + 1] steps that accepted i draft tokens
    double t_prefill_ms = 0, t_draft_ms = 0, t_verify_ms = 0, t_other_ms = 0;
    double t_target_ms = 0;        // part of t_verify_ms: the target decodes (host work is the rest)
    double t_total_ms = 0;         // prefill + generation

    double acceptance_rate() const { return n_drafted ? double(n_accepted) / n_drafted : 0.0; }
    double mean_draft_size() const { return n_target_calls ? double(n_drafted) / n_target_calls : 0.0; }
    double mean_accepted_depth() const { return n_target_calls ? double(n_accepted) / n_target_calls : 0.0; }
    // Beam tokens per tree node (1 for chains and trees).
    double compression_ratio() const { return n_drafted ? double(n_candidate_tokens) / n_drafted : 0.0; }
    double tokens_per_target_call() const {
        return n_target_calls ? double(n_generated) / n_target_calls : 0.0;
    }
    // Generated tokens per second of generation time (prefill excluded).
    double tokens_per_second() const {
        const double t = t_total_ms - t_prefill_ms;
        return t > 0 ? 1000.0 * n_generated / t : 0.0;
    }
};

// One verification step, for the online trainer.
struct StepTrace {
    int32_t position = 0;                // index in the generated tokens of the first draft token
    // [n] chains: the whole draft; trees: the accepted path, then (when rejected) the first
    // candidate tried at the rejected position
    std::vector<int32_t> draft_tokens;
    int32_t n_accepted = 0;
    int32_t target_token = 0;            // the recovered or bonus token the target added
    bool rejected = false;               // a draft token was rejected at position + n_accepted
    // With GenerateParams::trace_top_k = k > 0 (empty otherwise):
    std::vector<int32_t> top_ids;        // [k] target top-k at the rejected position (T = 1)
    std::vector<float> top_probs;        // [k] over the whole vocabulary: they sum to <= 1
    // The target's probability (T = 1) of the rejected draft token, draft_tokens[n_accepted],
    // inside the top-k or not: a trainer needs it to push the draft off that token.
    float rejected_prob = std::numeric_limits<float>::quiet_NaN();  // NaN: trace_top_k was 0
};

struct GenerateResult {
    std::string text;
    std::vector<int32_t> prompt_tokens;
    std::vector<int32_t> tokens;         // generated tokens
    std::string finish_reason;           // "stop" | "length" | "cancelled"
    int64_t draft_version = 0;           // version of the draft slot that drafted (0: no draft model)
    int64_t head_version = 0;            // version of the draft head that drafted (0: no head)
    Stats stats;
    std::vector<StepTrace> trace;
    std::vector<float> step_ms;          // [n_target_calls] time of each step's decode + verification
    std::vector<int32_t> step_sizes;     // [n_target_calls] tokens each step decoded (1 + draft nodes)
    std::vector<float> logits;           // [n_tokens, n_vocab] when return_logits: the target row
                                         // each generated token was chosen from
    // When params.logprobs = k >= 0: log-probabilities under the target's own distribution (log
    // softmax of the row each token was chosen from, temperature 1, before top-k / top-p / min-p),
    // of every generated token and of the k likeliest tokens of its row, likeliest first.
    int32_t n_top_logprobs = 0;          // k
    std::vector<float> token_logprobs;   // [n_tokens]
    std::vector<int32_t> top_logprob_ids;  // [n_tokens, k]
    std::vector<float> top_logprobs;     // [n_tokens, k]
};

// Called with each newly safe piece of text and the result so far (its tokens and
// log-probabilities cover every token generated up to now, including those whose text is still
// held back; valid only during the call). Return false to cancel the generation.
using TextCallback = std::function<bool(const std::string& piece, const GenerateResult& so_far)>;

struct EngineParams {
    ModelParams model;
    PhrasePoolParams pool;  // the engine's phrase pool (n_vocab is set from the target)
    uint64_t seed = 0;
};

// Threads: one generation at a time. generate, evaluate, the measure_* calls, swap_draft,
// remove_draft and close must not overlap (the Python Engine serialises them with one lock);
// the pool, shared_target() and the draft-slot queries may be used from any thread at any
// time, also while those run and while close() runs.
class Engine {
public:
    // draft_path empty: no draft model (only the model-free methods none and lookup). Both contexts
    // get kMaxTreeSeqs sequences (spec/tree.h) for tree drafts, or as many as the batch has rows
    // when n_batch (or n_ctx) is smaller: validate() then refuses trees that need more. Throws on
    // load errors and on a target/draft vocabulary mismatch, before any generation.
    Engine(const std::string& target_path, const std::string& draft_path, const EngineParams& params);
    ~Engine();

    Model& target();
    // The target, kept alive for the caller even if close() runs meanwhile (tokenizing on another
    // thread); throws ClosedError after close().
    std::shared_ptr<const Model> shared_target() const;

    // Draft slots. The engine holds named draft models that all share the target's vocabulary;
    // the constructor's draft sits in slot "" and a request picks a slot with
    // GenerateParams::draft (one target, several drafts: per-domain routing). Each slot owns
    // its model and context (weights + KV cache of n_ctx tokens per draft).
    bool has_draft(const std::string& name = "") const;
    // Throws InvalidArgumentError when slot `name` is empty.
    Model& draft(const std::string& name = "");
    std::vector<std::string> draft_names() const;  // the filled slots, sorted
    // How many models slot `name` has received: 1 after the constructor loaded the default
    // draft, +1 per swap_draft; 0 for a slot that never held one (it stays counted after
    // remove_draft, so a later model continues the count).
    int64_t draft_version(const std::string& name = "") const;

    // Hot reload, in two phases so that a server keeps generating while a new draft loads:
    // load_draft reads the GGUF and creates its context with the draft ModelParams of the
    // constructor (n_ctx, n_batch, threads, kMaxTreeSeqs sequences); it reads no mutable engine
    // state, so it may run on another thread while generate() runs. Throws ModelLoadError
    // (missing, not GGUF, truncated, refused by llama.cpp).
    std::unique_ptr<Model> load_draft(const std::string& path) const;
    // Puts `draft` into slot `name` once check_vocab_compatible(target, draft) passes, freeing
    // the model it replaces, and counts a new version. On VocabMismatchError (or ClosedError)
    // the slot keeps its old model and `draft` is freed. Must not run while generate() runs on
    // the engine (the Python Engine holds its lock around it): the old draft's context is freed.
    void swap_draft(std::unique_ptr<Model> draft, const std::string& name = "");
    // load_draft + swap_draft: on any error the old draft keeps serving.
    void reload_draft(const std::string& path, const std::string& name = "");
    // Frees the model of slot `name` (its version count stays); InvalidArgumentError when empty.
    // Like swap_draft, not while generate() runs.
    void remove_draft(const std::string& name);

    // The draft head (method "redrafter", spec/draft_head.h): at most one per engine, trained for
    // the target. Hot reload in the same two phases as drafts: load_head reads the file and
    // checks it against the target (HeadFileError, HeadMismatchError) without touching mutable
    // engine state, so it may run while generate() runs; swap_head installs it and counts a new
    // version, between generations (not while generate() runs); reload_head does both. Any
    // failure leaves the old head serving.
    std::unique_ptr<DraftHead> load_head(const std::string& path) const;
    void swap_head(std::unique_ptr<DraftHead> head);
    void reload_head(const std::string& path);
    void remove_head();  // not while generate() runs; the version count stays
    bool has_head() const;
    int64_t head_version() const;  // heads installed so far (0: never one)
    std::string head_path() const;  // "" without a head

    // The static n-gram table method auto drafts from where nothing is copied (spec/ngram_table.h,
    // AutoParams::use_corpus): at most one per engine. In two phases as the head: load_ngram reads
    // the file and checks it against the target's vocabulary (NgramFileError) without touching
    // mutable engine state, so it may run while generate() runs; swap_ngram installs it between
    // generations. A bad file leaves the old table in place.
    std::unique_ptr<NgramTable> load_ngram(const std::string& path) const;
    void swap_ngram(std::unique_ptr<NgramTable> table);
    void remove_ngram();  // no-op without a table; not while generate() runs
    std::string ngram_path() const;  // "" without a table
    int64_t ngram_size() const;      // entries of the table (0 without one)

    // Generates from already tokenized input. Throws InvalidArgumentError / ContextOverflowError
    // for bad input before touching the models; a cancelled generation returns normally with
    // finish_reason "cancelled" and leaves the engine ready for the next call. An exception after
    // the generation started (llama.cpp failed a decode, on_text threw) propagates, and when
    // `partial` is not null *partial receives the output produced until then (tokens, text,
    // stats, trace) with finish_reason "error"; the engine stays usable.
    GenerateResult generate(const std::vector<int32_t>& prompt_tokens, const GenerateParams& params,
                            const TextCallback& on_text = nullptr, GenerateResult* partial = nullptr);

    // Evaluates `tokens` from an empty KV cache of the target (or the draft of slot `draft_name`)
    // and returns logits: the rows from `first_row` on ([n_tokens - first_row, n_vocab]) when
    // all_rows, else the last row ([n_vocab]). Rows before first_row are never computed (a
    // trainer wants the rows of a continuation, not of its prompt). For tests and tools
    // (reference distributions, golden comparisons, distillation); not used by generate().
    // InvalidArgumentError unless 0 <= first_row < n_tokens.
    std::vector<float> evaluate(const std::vector<int32_t>& tokens, bool use_draft, bool all_rows,
                                const std::string& draft_name = "", int32_t first_row = 0);
    // evaluate() of the target with every row, also returning each row's hidden state in `hidden`
    // ([n_tokens, n_hidden], see Model::hidden): the input of a draft head and its training data.
    std::vector<float> evaluate_hidden(const std::vector<int32_t>& tokens, std::vector<float>& hidden);
    // Draft-head training data without any full logits row kept: the target's k likeliest tokens
    // and their probabilities (temperature 1, over the whole vocabulary, likeliest first) and the
    // hidden state of rows first_row .. n_tokens - 1 of `tokens` evaluated from scratch.
    // top_ids / top_probs: [n_tokens - first_row, k]; hidden: [n_tokens - first_row, n_hidden].
    // InvalidArgumentError unless 0 <= first_row < n_tokens and 1 <= k <= n_vocab.
    void evaluate_top_k(const std::vector<int32_t>& tokens, int32_t first_row, int32_t k,
                        std::vector<int32_t>& top_ids, std::vector<float>& top_probs, std::vector<float>& hidden);

    // The phrase pool shared by all requests (thread-safe; save / load / clear / stats), kept
    // alive for the caller even if close() runs meanwhile. Throws ClosedError after close().
    std::shared_ptr<PhrasePool> pool();

    // Cost curves of method "auto" (spec/schedule.h): the target's time to verify k tokens (all
    // rows) and a draft's time to decode k tokens (last row). measure_* times them on this
    // machine (spec/calibrate.h; sizes empty: default_calibration_sizes()) and installs the
    // result; set_* installs a curve measured earlier (the Python layer caches them per model
    // file, threads and backend). A generation with method "auto" measures what is missing
    // first. swap_draft drops the slot's curve: the new file may be quantized differently, so
    // its cost is measured or looked up for it (the Python layer caches curves by
    // Model::cost_signature).
    // context: tokens in the cache under the timed decodes (spec/calibrate.h).
    CostCurve measure_target_cost(const std::vector<int32_t>& sizes = {}, int32_t repeats = 3,
                                  const CalibrationProgress& progress = nullptr,
                                  int32_t context = kCalibrationContext);
    CostCurve measure_draft_cost(const std::string& name = "", const std::vector<int32_t>& sizes = {},
                                 int32_t repeats = 3, const CalibrationProgress& progress = nullptr,
                                 int32_t context = kCalibrationContext);
    void set_target_cost(const CostCurve& curve);
    void set_draft_cost(const CostCurve& curve, const std::string& name = "");
    CostCurve target_cost() const;                            // empty when not measured
    // The target's cost model: the curve above as its prior, corrected from the time of every
    // step this engine has decoded (any method; spec/cost_model.h). set_/measure_target_cost
    // install a new prior and forget the corrections. A copy taken under a lock: any thread may
    // call it while a generation updates the model.
    CostModel target_cost_model() const;
    CostCurve draft_cost(const std::string& name = "") const;  // empty when not measured

    // What method auto has learnt across requests: its acceptance statistics per draft slot,
    // the target's cost corrections and what it knows of the head. restore_learnt puts a copy
    // back, so that a benchmark can run one prompt again from the state it first met (the
    // phrase pool has save_pool / load_pool for the same). Between generations only, as the
    // statistics change during one. The head's part is restored only if the same head is still
    // loaded; a calibration installed since is replaced by the copy's.
    struct Learnt {
        std::map<std::string, AcceptanceStats> acceptance;
        CostModel target_costs;
        CostModel head_costs;
        AcceptanceStats head_acceptance;
        int64_t head_version = 0;
    };
    Learnt learnt() const;
    void restore_learnt(const Learnt& state);
    // Method auto's acceptance statistics alone, as plain counts per statistics key (the draft
    // slot's name, plus a line naming lookup settings that give the kinds other meanings;
    // AcceptanceStats::counts), to keep across processes. set_acceptance_counts replaces every
    // key's statistics by the given ones (keys not given start empty), after checking them all:
    // on an error nothing changes; the keys in without_model lose their draft model's counts
    // (AcceptanceStats::clear_model: learnt with another draft). Between generations only.
    std::map<std::string, std::vector<double>> acceptance_counts() const;
    void set_acceptance_counts(const std::map<std::string, std::vector<double>>& counts,
                               const std::vector<std::string>& without_model = {});

    // Frees the models (a pool or target still held by a caller goes when that caller lets go);
    // any later call throws ClosedError.
    void close();
    bool closed() const;

private:
    struct DraftSlot {
        std::unique_ptr<Model> model;  // null after remove_draft
        int64_t version = 0;
        CostCurve cost;                // empty until measured or set
    };

    void check_open() const;
    void validate(const std::vector<int32_t>& prompt_tokens, const GenerateParams& params) const;
    std::unique_ptr<Drafter> make_drafter(const GenerateParams& params);
    Model* find_draft(const std::string& name) const;  // null when the slot is empty
    // evaluate(): the rows from first_output on; hidden non-null: their hidden states appended
    // there ([n - first_output, n_hidden]).
    std::vector<float> evaluate_rows(Model& model, const std::vector<int32_t>& tokens, int32_t first_output,
                                     std::vector<float>* hidden);

    EngineParams params_;
    ModelParams draft_params_;  // every draft's ModelParams (n_seq_max raised for trees)
    std::shared_ptr<Model> target_;
    std::vector<int32_t> control_tokens_;  // the target's (Model::control_tokens)
    std::vector<int32_t> blank_line_tokens_, unit_start_tokens_, fence_tokens_;  // the target's (Model::layout_tokens)
    std::unique_ptr<ForcedChars> forced_chars_;  // the target's, built by the first request with grammar drafts
    // Slot bookkeeping and the target_ / pool_ handles are guarded by drafts_mutex_, so
    // has_draft / draft_version / draft_names / pool() / shared_target() may run on any thread;
    // the models themselves are only replaced between generations.
    mutable std::mutex drafts_mutex_;
    std::map<std::string, DraftSlot> drafts_;
    std::shared_ptr<PhrasePool> pool_;
    // Written by generate() (every step) and the calls that install curves; read by generate()'s
    // drafter on its own thread without the lock, copied for other threads under costs_mutex_.
    mutable std::mutex costs_mutex_;
    CostModel target_costs_;
    std::unique_ptr<DraftHead> head_;  // guarded like the slots: replaced between generations
    std::unique_ptr<NgramTable> ngram_;  // guarded like the head
    int64_t head_version_ = 0;
    // What method auto learnt of the head (spec/drafter.h, AutoHead): its step cost and
    // acceptance, across requests; forgotten when the head is replaced or removed.
    CostModel head_costs_;
    AcceptanceStats head_acceptance_;
    void forget_head_record();
    // The auto scheduler's running acceptance statistics per draft slot, across requests.
    std::map<std::string, AcceptanceStats> acceptance_;
    Rng rng_;
};

}  // namespace spec
