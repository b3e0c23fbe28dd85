// pyspec._core: registrations only. All logic lives in engine/ (C++) or pyspec/ (Python).
#include <algorithm>
#include <cstring>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "spec/checksum.h"
#include "spec/decoder.h"
#include "spec/drafter_registry.h"
#include "spec/error.h"
#include "spec/log.h"
#include "spec/penalties.h"
#include "spec/quantize.h"
#include "spec/replay.h"
#include "spec/rng.h"
#include "spec/rpc.h"
#include "spec/sampling.h"
#include "spec/tree.h"
#include "spec/verify.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using ConstFloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

// Hands a vector to numpy without copying; the capsule owns it.
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& values, std::initializer_list<size_t> shape) {
    auto* owned = new std::vector<T>(std::move(values));
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
    return nb::ndarray<nb::numpy, T>(owned->data(), shape, owner);
}

// Raises the class of that name from pyspec.errors (which gives them Python-friendly bases). The
// message may quote bytes of a corrupt file: invalid UTF-8 becomes U+FFFD, never a decode error.
void raise_as(const char* name, const char* message) {
    nb::object cls = nb::module_::import_("pyspec.errors").attr(name);
    nb::object text = nb::steal(PyUnicode_DecodeUTF8(message, Py_ssize_t(std::strlen(message)), "replace"));
    PyErr_SetObject(cls.ptr(), text.ptr());
}

// A Python callable(done, total), or None, as a calibration progress callback that takes the GIL.
spec::CalibrationProgress progress_callback(nb::object progress) {
    if (progress.is_none()) return {};
    return [progress](int32_t done, int32_t total) {
        nb::gil_scoped_acquire gil;
        progress(done, total);
    };
}

}  // namespace

NB_MODULE(_core, m) {
    m.doc() = "pyspec engine core (C++ on llama.cpp). Use the pyspec package, not this module.";

    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const spec::ModelLoadError& e) { raise_as("ModelLoadError", e.what());
        } catch (const spec::VocabMismatchError& e) { raise_as("VocabMismatchError", e.what());
        } catch (const spec::InvalidArgumentError& e) { raise_as("InvalidArgumentError", e.what());
        } catch (const spec::ContextOverflowError& e) { raise_as("ContextOverflowError", e.what());
        } catch (const spec::DecodeError& e) { raise_as("DecodeError", e.what());
        } catch (const spec::ClosedError& e) { raise_as("EngineClosedError", e.what());
        } catch (const spec::PoolFileError& e) { raise_as("PoolFileError", e.what());
        } catch (const spec::HeadFileError& e) { raise_as("HeadFileError", e.what());
        } catch (const spec::HeadMismatchError& e) { raise_as("HeadMismatchError", e.what());
        } catch (const spec::NgramFileError& e) { raise_as("NgramFileError", e.what());
        } catch (const spec::Error& e) { raise_as("SpecError", e.what());
        }
    });

    nb::class_<spec::LogLine>(m, "LogLine")
        .def_ro("level", &spec::LogLine::level)
        .def_ro("text", &spec::LogLine::text);
    m.def("chat_builtin_templates", &spec::chat_builtin_templates,
          "Names of llama.cpp's built-in chat templates (Engine.apply_chat_template's tmpl).");
    m.def("rpc_supported", &spec::rpc_supported, "Whether this libllama has llama.cpp's RPC backend.");
    m.def("check_rpc_endpoint", &spec::check_rpc_endpoint, "endpoint"_a,
          "Raises InvalidArgumentError unless endpoint is host:port as llama.cpp's RPC backend reads it.");
    m.def("backend_description", &spec::backend_description,
          "llama.cpp's description of the compute backends and CPU features in this process (llama_print_system_info).");
    m.def("drain_logs", &spec::log_drain, "Returns and clears llama.cpp's buffered log lines.");
    m.def("quantize_model", [](const std::string& in, const std::string& out, int32_t file_type,
                               const std::vector<std::pair<std::string, int32_t>>& tensor_types, int32_t n_threads) {
        spec::QuantizeParams params;
        params.file_type = file_type;
        params.tensor_types = tensor_types;
        params.n_threads = n_threads;
        spec::quantize_model(in, out, params);
    }, "in_path"_a, "out_path"_a, "file_type"_a, "tensor_types"_a, "n_threads"_a = 0,
       nb::call_guard<nb::gil_scoped_release>(),
       "Writes out_path = in_path quantized by llama.cpp (llama_model_quantize): file_type is a llama_ftype, "
       "tensor_types (name, ggml_type) pairs override its mix per tensor.");

    nb::class_<spec::Rng>(m, "Rng")
        .def(nb::init<uint64_t>(), "seed"_a = 0)
        .def("uniform", &spec::Rng::uniform);

    nb::class_<spec::SamplingParams>(m, "SamplingParams")
        .def(nb::init<>())
        .def_rw("temperature", &spec::SamplingParams::temperature)
        .def_rw("top_k", &spec::SamplingParams::top_k)
        .def_rw("top_p", &spec::SamplingParams::top_p)
        .def_rw("min_p", &spec::SamplingParams::min_p);

    m.def("validate_sampling", nb::overload_cast<const spec::SamplingParams&>(&spec::validate), "params"_a);
    m.def("validate_penalties", nb::overload_cast<const spec::PenaltyParams&, int32_t>(&spec::validate), "params"_a,
          "n_vocab"_a, "Raises InvalidArgumentError for a penalty or bias outside its range.");
    m.def("compute_probs", [](ConstFloatArray logits, const spec::SamplingParams& params) {
        std::vector<float> probs;
        std::vector<int32_t> scratch;
        spec::compute_probs(logits.data(), int32_t(logits.size()), params, probs, scratch);
        const size_t n = probs.size();
        return to_numpy(std::move(probs), {n});
    }, "logits"_a, "params"_a, "Sampling distribution of one logits row [n_vocab].");

    nb::class_<spec::ChainVerdict>(m, "ChainVerdict")
        .def_ro("n_accepted", &spec::ChainVerdict::n_accepted)
        .def_ro("next_token", &spec::ChainVerdict::next_token)
        .def_ro("is_bonus", &spec::ChainVerdict::is_bonus);
    m.def("verify_chain_greedy", &spec::verify_chain_greedy, "draft_tokens"_a, "target_argmax"_a);
    m.def("verify_chain_rejection", [](const std::vector<int32_t>& draft_tokens, ConstFloatArray target_probs,
                                       ConstFloatArray draft_probs, spec::Rng& rng) {
        const size_t n_draft = draft_tokens.size();
        if (target_probs.ndim() != 2 || target_probs.shape(0) != n_draft + 1 ||
            draft_probs.ndim() != 2 || draft_probs.shape(0) != n_draft ||
            (n_draft > 0 && draft_probs.shape(1) != target_probs.shape(1))) {
            throw spec::InvalidArgumentError("expected target_probs [n_draft + 1, n_vocab] and draft_probs [n_draft, n_vocab]");
        }
        std::vector<float> residual;
        return spec::verify_chain_rejection(draft_tokens, target_probs.data(), draft_probs.data(),
                                            int32_t(target_probs.shape(1)), rng, residual);
    }, "draft_tokens"_a, "target_probs"_a, "draft_probs"_a, "rng"_a);

    nb::class_<spec::TreeVerdict>(m, "TreeVerdict")
        .def_ro("path", &spec::TreeVerdict::path)
        .def_ro("next_token", &spec::TreeVerdict::next_token)
        .def_ro("is_bonus", &spec::TreeVerdict::is_bonus);
    m.def("verify_tree_greedy",
          nb::overload_cast<const std::vector<int32_t>&, const std::vector<int32_t>&, const std::vector<int32_t>&>(
              &spec::verify_tree_greedy),
          "tokens"_a, "parents"_a, "target_argmax"_a);
    m.def("verify_tree_rejection", [](const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                      ConstFloatArray target_probs, std::optional<ConstFloatArray> draft_probs,
                                      spec::Rng& rng) {
        const size_t n = tokens.size();
        if (target_probs.ndim() != 2 || target_probs.shape(0) != n + 1 ||
            (draft_probs && (draft_probs->ndim() != 2 || draft_probs->shape(0) != n ||
                             (n > 0 && draft_probs->shape(1) != target_probs.shape(1))))) {
            throw spec::InvalidArgumentError("expected target_probs [n + 1, n_vocab] and draft_probs [n, n_vocab] or None");
        }
        std::vector<float> residual;
        return spec::verify_tree_rejection(tokens, parents, target_probs.data(), draft_probs ? draft_probs->data() : nullptr,
                                           int32_t(target_probs.shape(1)), rng, residual);
    }, "tokens"_a, "parents"_a, "target_probs"_a, "draft_probs"_a.none(), "rng"_a,
       "Multi-candidate rejection sampling over a tree; draft_probs None: deterministic candidates.");
    m.def("verify_tree_typical", [](const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                    ConstFloatArray target_probs, float epsilon, float delta, spec::Rng& rng) {
        if (target_probs.ndim() != 2 || target_probs.shape(0) != tokens.size() + 1) {
            throw spec::InvalidArgumentError("expected target_probs [n + 1, n_vocab]");
        }
        return spec::verify_tree_typical(tokens, parents, target_probs.data(), int32_t(target_probs.shape(1)), epsilon,
                                         delta, rng);
    }, "tokens"_a, "parents"_a, "target_probs"_a, "epsilon"_a, "delta"_a, "rng"_a);

    nb::class_<spec::TreeBatchLayout>(m, "TreeBatchLayout")
        .def_ro("depth", &spec::TreeBatchLayout::depth)
        .def_prop_ro("seq_ids", [](const spec::TreeBatchLayout& layout) {  // per node, as lists
            std::vector<std::vector<int32_t>> ids(size_t(layout.n_nodes()));
            for (int32_t i = 0; i < layout.n_nodes(); ++i) {
                ids[size_t(i)].assign(layout.node_seq_ids(i), layout.node_seq_ids(i) + layout.n_node_seq_ids(i));
            }
            return ids;
        })
        .def_ro("root_seq_ids", &spec::TreeBatchLayout::root_seq_ids)
        .def_ro("leaf_seq", &spec::TreeBatchLayout::leaf_seq)
        .def_ro("n_leaves", &spec::TreeBatchLayout::n_leaves);
    m.def("layout_tree", static_cast<spec::TreeBatchLayout (*)(const std::vector<int32_t>&)>(&spec::layout_tree),
          "parents"_a);
    m.def("prefix_match", &spec::prefix_match, "beams"_a, "n_beams"_a, "length"_a);
    nb::class_<spec::BeamTree>(m, "BeamTree")
        .def_ro("tokens", &spec::BeamTree::tokens)
        .def_ro("parents", &spec::BeamTree::parents)
        .def_ro("node_of", &spec::BeamTree::node_of);
    m.def("beams_to_tree", &spec::beams_to_tree, "beams"_a, "n_beams"_a, "length"_a);
    m.attr("MAX_TREE_NODES") = spec::kMaxTreeNodes;

    m.def("drafter_methods", [] {
        std::vector<std::tuple<std::string, std::string, bool>> out;
        for (const spec::DrafterMethod& method : spec::drafter_methods()) {
            const char* use = method.draft_model == spec::DraftModelUse::required ? "required"
                            : method.draft_model == spec::DraftModelUse::optional ? "optional" : "never";
            out.emplace_back(method.name, use, method.head == spec::HeadUse::required);
        }
        return out;
    }, "The engine's drafting methods in display order: (name, draft-model use 'never' | 'required' | "
       "'optional', requires a draft head).");

    nb::class_<spec::TreeParams>(m, "TreeParams")
        .def(nb::init<>())
        .def_rw("n_nodes", &spec::TreeParams::n_nodes)
        .def_rw("depth", &spec::TreeParams::depth)
        .def_rw("branching", &spec::TreeParams::branching)
        .def_rw("n_expand", &spec::TreeParams::n_expand);

    nb::class_<spec::BeamParams>(m, "BeamParams")
        .def(nb::init<>())
        .def_rw("n_beams", &spec::BeamParams::n_beams)
        .def_rw("length", &spec::BeamParams::length);

    nb::class_<spec::PoolParams>(m, "PoolParams")
        .def(nb::init<>())
        .def_rw("enabled", &spec::PoolParams::enabled)
        .def_rw("n_branches", &spec::PoolParams::n_branches)
        .def_rw("phrase_len", &spec::PoolParams::phrase_len)
        .def_rw("max_nodes", &spec::PoolParams::max_nodes)
        .def_rw("harvest_prompt", &spec::PoolParams::harvest_prompt)
        .def_rw("harvest_generated", &spec::PoolParams::harvest_generated)
        .def_rw("harvest_verification", &spec::PoolParams::harvest_verification);

    nb::class_<spec::AutoParams>(m, "AutoParams")
        .def(nb::init<>())
        .def_rw("max_depth", &spec::AutoParams::max_depth)
        .def_rw("max_nodes", &spec::AutoParams::max_nodes)
        .def_rw("max_gamma", &spec::AutoParams::max_gamma)
        .def_rw("head_tree_nodes", &spec::AutoParams::head_tree_nodes)
        .def_rw("adapt_costs", &spec::AutoParams::adapt_costs)
        .def_rw("use_draft_model", &spec::AutoParams::use_draft_model)
        .def_rw("use_head", &spec::AutoParams::use_head)
        .def_rw("use_corpus", &spec::AutoParams::use_corpus)
        .def_rw("corpus_max_depth", &spec::AutoParams::corpus_max_depth)
        .def_rw("corpus_min_total", &spec::AutoParams::corpus_min_total)
        .def_rw("check_history", &spec::AutoParams::check_history);

    nb::class_<spec::FlashAttentionTiming>(m, "FlashAttentionTiming",
                                           "Decodes timed with flash attention off and on at one depth "
                                           "(Engine.time_flash_attention): medians in ms, paired ratios on / off.")
        .def("__init__", [](spec::FlashAttentionTiming* self, int32_t depth, double ratio, double batch_ratio,
                            double ms_off, double ms_on, double batch_ms_off, double batch_ms_on, int32_t window,
                            int32_t rounds) {
            new (self) spec::FlashAttentionTiming{depth, window, ms_off, ms_on, batch_ms_off, batch_ms_on, ratio,
                                                  batch_ratio, rounds};
        }, "depth"_a, "ratio"_a, "batch_ratio"_a, "ms_off"_a = 0.0, "ms_on"_a = 0.0, "batch_ms_off"_a = 0.0,
           "batch_ms_on"_a = 0.0, "window"_a = 0, "rounds"_a = 0)
        .def_ro("depth", &spec::FlashAttentionTiming::depth)
        .def_ro("window", &spec::FlashAttentionTiming::window)
        .def_ro("ms_off", &spec::FlashAttentionTiming::ms_off)
        .def_ro("ms_on", &spec::FlashAttentionTiming::ms_on)
        .def_ro("batch_ms_off", &spec::FlashAttentionTiming::batch_ms_off)
        .def_ro("batch_ms_on", &spec::FlashAttentionTiming::batch_ms_on)
        .def_ro("ratio", &spec::FlashAttentionTiming::ratio)
        .def_ro("batch_ratio", &spec::FlashAttentionTiming::batch_ratio)
        .def_ro("rounds", &spec::FlashAttentionTiming::rounds);
    nb::class_<spec::FlashAttentionDecision>(m, "FlashAttentionDecision",
                                             "The flash-attention choice from timings at two depths (spec/calibrate.h).")
        .def_ro("near", &spec::FlashAttentionDecision::near)
        .def_ro("far", &spec::FlashAttentionDecision::far)
        .def_ro("at_depth", &spec::FlashAttentionDecision::at_depth)
        .def_ro("plain_ratio", &spec::FlashAttentionDecision::plain_ratio)
        .def_ro("verify_ratio", &spec::FlashAttentionDecision::verify_ratio)
        .def_ro("ratio", &spec::FlashAttentionDecision::ratio)
        .def_ro("on", &spec::FlashAttentionDecision::on);
    m.attr("FLASH_ATTN_BATCH") = spec::kFlashAttnBatch;
    m.attr("FLASH_ATTN_REQUEST_DEPTH") = spec::kFlashAttnRequestDepth;
    m.attr("FLASH_ATTN_MARGIN") = spec::kFlashAttnMargin;
    m.def("flash_attention_depths", &spec::flash_attention_depths, "n_ctx"_a,
          "The two context depths the flash-attention timing runs at, within a window of n_ctx.");
    m.def("flash_attention_at_depth", &spec::flash_attention_at_depth, "n_ctx"_a,
          "The context depth the flash-attention choice is made for, within a window of n_ctx.");
    m.def("choose_flash_attention", &spec::choose_flash_attention, "near"_a, "far"_a, "at_depth"_a,
          "The flash-attention choice from timings at two depths, shallow first.");
    nb::class_<spec::CostCurve>(m, "CostCurve")
        .def(nb::init<>())
        .def("__init__", [](spec::CostCurve* self, std::vector<int32_t> n_tokens, std::vector<double> ms) {
            new (self) spec::CostCurve{std::move(n_tokens), std::move(ms)};
            spec::validate(*self);
        }, "n_tokens"_a, "ms"_a)
        .def_rw("n_tokens", &spec::CostCurve::n_tokens)
        .def_rw("ms", &spec::CostCurve::ms)
        .def("at", &spec::CostCurve::at, "k"_a)
        .def_prop_ro("empty", &spec::CostCurve::empty);

    nb::class_<spec::AcceptanceStats>(m, "AcceptanceStats")
        .def(nb::init<>())
        .def("estimate", &spec::AcceptanceStats::estimate, "kind"_a, "depth"_a)
        .def("record", &spec::AcceptanceStats::record, "kind"_a, "depth"_a, "accepted"_a)
        .def("record_outcome", [](spec::AcceptanceStats& a, const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& parents, const std::vector<uint8_t>& kinds,
                                  const std::vector<int32_t>& actual) {
            a.record_outcome(tokens, parents, kinds, actual.data(), int32_t(actual.size()));
        }, "tokens"_a, "parents"_a, "kinds"_a, "actual"_a)
        .def("model_acceptance", &spec::AcceptanceStats::model_acceptance)
        .def("clear", &spec::AcceptanceStats::clear);
    m.def("kind_lookup", &spec::kind_lookup, "match_len"_a);
    m.def("kind_pool", &spec::kind_pool, "match_len"_a);
    m.def("kind_model", &spec::kind_model, "probability"_a);
    m.def("kind_lookup_contested", &spec::kind_lookup_contested);
    m.def("kind_lookup_boundary", &spec::kind_lookup_boundary, "match_len"_a);
    m.def("kind_lookup_substituted", &spec::kind_lookup_substituted);
    m.def("kind_lookup_resync", &spec::kind_lookup_resync);
    m.def("kind_lookup_substituted_loose", &spec::kind_lookup_substituted_loose);
    m.def("kind_lookup_fence", &spec::kind_lookup_fence);
    m.def("kind_lookup_answer_start", &spec::kind_lookup_answer_start);
    m.def("kind_head_alternative", &spec::kind_head_alternative);
    m.def("kind_corpus", &spec::kind_corpus, "confidence"_a);
    m.def("fnv1a64", [](const nb::bytes& data) { return spec::fnv1a64(data.data(), data.size()); }, "data"_a,
          "FNV-1a 64 of bytes (spec/checksum.h: the checksum of pyspec's file formats).");
    m.attr("CORPUS_MIN_CONFIDENCE") = spec::kCorpusMinConfidence;

    nb::class_<spec::NgramTable>(m, "NgramTable", "A static n-gram table (spec/ngram_table.h).")
        .def_static("load", [](const std::string& path, int32_t n_vocab, const std::string& vocab_fingerprint) {
            return std::make_unique<spec::NgramTable>(spec::NgramTable::load(path, n_vocab, vocab_fingerprint));
        }, "path"_a, "n_vocab"_a, "vocab_fingerprint"_a)
        .def("predict", [](const spec::NgramTable& t, const std::vector<int32_t>& tokens,
                           uint32_t min_total) -> std::optional<std::tuple<int32_t, uint32_t, uint32_t>> {
            spec::NgramTable::Hit hit;
            if (!t.predict(tokens.data(), int32_t(tokens.size()), min_total, hit)) return std::nullopt;
            return std::make_tuple(hit.token, hit.count, hit.total);
        }, "tokens"_a, "min_total"_a, "(token, count, total) after tokens, as method auto looks it up; None when none.")
        .def_prop_ro("size", &spec::NgramTable::size)
        .def_prop_ro("path", &spec::NgramTable::path);
    m.def("ngram_key", [](const std::vector<int32_t>& context) {
        return spec::ngram_key(context.data(), int32_t(context.size()));
    }, "context"_a, "The n-gram table key of a context (spec/ngram_table.h), for tests and tools.");
    m.attr("NUM_KINDS") = spec::kNumKinds;
    m.attr("KIND_DEPTHS") = spec::kKindDepths;
    m.def("kind_name", [](int32_t kind) { return spec::kind_name(uint8_t(std::clamp(kind, 0, 255))); }, "kind"_a);

    nb::class_<spec::DraftPlan>(m, "DraftPlan")
        .def_ro("keep", &spec::DraftPlan::keep)
        .def_ro("expected_tokens", &spec::DraftPlan::expected_tokens)
        .def_ro("ms", &spec::DraftPlan::ms);
    m.def("plan_draft", &spec::plan_draft, "parents"_a, "kinds"_a, "stats"_a, "step_ms"_a, "sunk_ms"_a);
    nb::class_<spec::ChainPlan>(m, "ChainPlan")
        .def_ro("gamma", &spec::ChainPlan::gamma)
        .def_ro("expected_tokens", &spec::ChainPlan::expected_tokens)
        .def_ro("ms", &spec::ChainPlan::ms);
    using ChainPlanOne = spec::ChainPlan (*)(double, const std::vector<double>&, double, int32_t, double);
    using ChainPlanByDepth = spec::ChainPlan (*)(const std::vector<double>&, const std::vector<double>&, double,
                                                 int32_t, double);
    m.def("plan_chain", static_cast<ChainPlanOne>(&spec::plan_chain), "alpha"_a, "step_ms"_a, "draft_token_ms"_a,
          "gamma_max"_a, "fixed_ms"_a = 0.0);
    m.def("plan_chain", static_cast<ChainPlanByDepth>(&spec::plan_chain), "alpha"_a, "step_ms"_a, "draft_token_ms"_a,
          "gamma_max"_a, "fixed_ms"_a = 0.0);

    nb::class_<spec::CostModel>(m, "CostModel")
        .def(nb::init<>())
        .def("set_prior", &spec::CostModel::set_prior, "prior"_a)
        .def_prop_ro("prior", &spec::CostModel::prior)
        .def("at", &spec::CostModel::at, "k"_a)
        .def("table", nb::overload_cast<int32_t, bool>(&spec::CostModel::table, nb::const_), "k_max"_a,
             "corrected"_a = true)
        .def("observe", &spec::CostModel::observe, "k"_a, "ms"_a)
        .def("correction", &spec::CostModel::correction, "k"_a)
        .def("n_observed", nb::overload_cast<int32_t>(&spec::CostModel::n_observed, nb::const_), "k"_a)
        .def_prop_ro("n_observed_total", nb::overload_cast<>(&spec::CostModel::n_observed, nb::const_));

    // Replay of auto on known greedy outputs (spec/replay.h): [(sizes, accepted, first_kinds)] per
    // request.
    m.def("replay_auto", [](const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& requests,
                            const spec::CostCurve& curve, const spec::LookupParams& lookup,
                            const spec::PoolParams& pool, const spec::AutoParams& params, size_t pool_capacity,
                            std::optional<spec::CostCurve> actual, const spec::NgramTable* corpus) {
        std::vector<spec::ReplayRequest> reqs;
        reqs.reserve(requests.size());
        for (const auto& [prompt, output] : requests) reqs.push_back({prompt, output});
        spec::PhrasePoolParams settings;
        settings.capacity = pool_capacity;
        std::vector<std::tuple<std::vector<int32_t>, std::vector<int32_t>, std::vector<int32_t>>> out;
        {
            nb::gil_scoped_release release;
            for (auto& steps : spec::replay_auto(reqs, curve, lookup, pool, settings, params,
                                                 actual ? &*actual : nullptr, corpus)) {
                std::vector<int32_t> kinds(steps.first_kinds.begin(), steps.first_kinds.end());
                out.emplace_back(std::move(steps.sizes), std::move(steps.accepted), std::move(kinds));
            }
        }
        return out;
    }, "requests"_a, "curve"_a, "lookup"_a, "pool"_a, "params"_a, "pool_capacity"_a = size_t(65536),
       "actual"_a = nb::none(), "corpus"_a = nb::none());

    nb::class_<spec::LookupParams>(m, "LookupParams")
        .def(nb::init<>())
        .def_rw("ngram_max", &spec::LookupParams::ngram_max)
        .def_rw("ngram_min", &spec::LookupParams::ngram_min)
        .def_rw("stop_tokens", &spec::LookupParams::stop_tokens)
        .def_rw("blank_line_tokens", &spec::LookupParams::blank_line_tokens)
        .def_rw("unit_start_tokens", &spec::LookupParams::unit_start_tokens)
        .def_rw("unit_ends", &spec::LookupParams::unit_ends)
        .def_rw("fence_tokens", &spec::LookupParams::fence_tokens)
        .def_rw("fences", &spec::LookupParams::fences)
        .def_rw("substitutions", &spec::LookupParams::substitutions)
        .def_rw("resync", &spec::LookupParams::resync)
        .def_rw("loose_substitutions", &spec::LookupParams::loose_substitutions);

    nb::class_<spec::PenaltyParams>(m, "PenaltyParams",
                                    "Penalties and biases on the target's logits (spec/penalties.h).")
        .def(nb::init<>())
        .def_rw("presence_penalty", &spec::PenaltyParams::presence_penalty)
        .def_rw("frequency_penalty", &spec::PenaltyParams::frequency_penalty)
        .def_rw("repetition_penalty", &spec::PenaltyParams::repetition_penalty)
        .def_rw("logit_bias", &spec::PenaltyParams::logit_bias);

    nb::class_<spec::GenerateParams>(m, "GenerateParams")
        .def(nb::init<>())
        .def_rw("max_tokens", &spec::GenerateParams::max_tokens)
        .def_rw("sampling", &spec::GenerateParams::sampling)
        .def_rw("stop", &spec::GenerateParams::stop)
        .def_rw("method", &spec::GenerateParams::method)
        .def_rw("draft", &spec::GenerateParams::draft)
        .def_rw("n_draft", &spec::GenerateParams::n_draft)
        .def_rw("scheduler", &spec::GenerateParams::scheduler)
        .def_rw("tree", &spec::GenerateParams::tree)
        .def_rw("beam", &spec::GenerateParams::beam)
        .def_rw("lookup", &spec::GenerateParams::lookup)
        .def_rw("pool", &spec::GenerateParams::pool)
        .def_rw("acceptance", &spec::GenerateParams::acceptance)
        .def_rw("typical_epsilon", &spec::GenerateParams::typical_epsilon)
        .def_rw("typical_delta", &spec::GenerateParams::typical_delta)
        .def_rw("trace_top_k", &spec::GenerateParams::trace_top_k)
        .def_rw("return_logits", &spec::GenerateParams::return_logits)
        .def_rw("backend_argmax", &spec::GenerateParams::backend_argmax)
        .def_rw("logprobs", &spec::GenerateParams::logprobs)
        .def_rw("seed", &spec::GenerateParams::seed)
        .def_rw("grammar", &spec::GenerateParams::grammar)
        .def_rw("grammar_root", &spec::GenerateParams::grammar_root)
        .def_rw("grammar_drafts", &spec::GenerateParams::grammar_drafts)
        .def_rw("penalties", &spec::GenerateParams::penalties);

    nb::class_<spec::Stats>(m, "Stats")
        .def_ro("n_prompt_tokens", &spec::Stats::n_prompt_tokens)
        .def_ro("n_prompt_cached", &spec::Stats::n_prompt_cached)
        .def_ro("n_generated", &spec::Stats::n_generated)
        .def_ro("n_target_calls", &spec::Stats::n_target_calls)
        .def_ro("n_drafted", &spec::Stats::n_drafted)
        .def_ro("n_accepted", &spec::Stats::n_accepted)
        .def_ro("n_candidate_tokens", &spec::Stats::n_candidate_tokens)
        .def_ro("n_draft_decodes", &spec::Stats::n_draft_decodes)
        .def_ro("n_empty_drafts", &spec::Stats::n_empty_drafts)
        .def_ro("n_head_drafts", &spec::Stats::n_head_drafts)
        .def_ro("n_head_accepted", &spec::Stats::n_head_accepted)
        .def_ro("backend_argmax", &spec::Stats::backend_argmax)
        .def_ro("accept_histogram", &spec::Stats::accept_histogram)
        .def_ro("t_prefill_ms", &spec::Stats::t_prefill_ms)
        .def_ro("t_draft_ms", &spec::Stats::t_draft_ms)
        .def_ro("t_verify_ms", &spec::Stats::t_verify_ms)
        .def_ro("t_other_ms", &spec::Stats::t_other_ms)
        .def_ro("t_target_ms", &spec::Stats::t_target_ms)
        .def_ro("t_total_ms", &spec::Stats::t_total_ms)
        .def_prop_ro("acceptance_rate", &spec::Stats::acceptance_rate)
        .def_prop_ro("tokens_per_target_call", &spec::Stats::tokens_per_target_call)
        .def_prop_ro("mean_draft_size", &spec::Stats::mean_draft_size)
        .def_prop_ro("mean_accepted_depth", &spec::Stats::mean_accepted_depth)
        .def_prop_ro("compression_ratio", &spec::Stats::compression_ratio)
        .def_prop_ro("tokens_per_second", &spec::Stats::tokens_per_second);

    nb::class_<spec::StepTrace>(m, "StepTrace")
        .def_ro("position", &spec::StepTrace::position)
        .def_ro("draft_tokens", &spec::StepTrace::draft_tokens)
        .def_ro("n_accepted", &spec::StepTrace::n_accepted)
        .def_ro("target_token", &spec::StepTrace::target_token)
        .def_ro("rejected", &spec::StepTrace::rejected)
        .def_ro("top_ids", &spec::StepTrace::top_ids)
        .def_ro("top_probs", &spec::StepTrace::top_probs)
        .def_ro("rejected_prob", &spec::StepTrace::rejected_prob);

    nb::class_<spec::GenerateResult>(m, "GenerateResult")
        .def(nb::init<>())
        .def_ro("text", &spec::GenerateResult::text)
        .def_ro("prompt_tokens", &spec::GenerateResult::prompt_tokens)
        .def_ro("tokens", &spec::GenerateResult::tokens)
        .def_ro("finish_reason", &spec::GenerateResult::finish_reason)
        .def_ro("draft_version", &spec::GenerateResult::draft_version)
        .def_ro("head_version", &spec::GenerateResult::head_version)
        .def_ro("stats", &spec::GenerateResult::stats)
        .def_ro("trace", &spec::GenerateResult::trace)
        .def_prop_ro("n_tokens", [](const spec::GenerateResult& r) { return r.tokens.size(); })
        .def("since", [](const spec::GenerateResult& r, size_t first) {
            // Tokens [first, n) with their log-probabilities: (tokens, token_logprobs [m],
            // top ids [m, k], top logprobs [m, k]); empty arrays when none were asked for.
            first = std::min(first, r.tokens.size());
            const size_t m = r.tokens.size() - first;
            const size_t k = size_t(r.n_top_logprobs);
            const bool has = !r.token_logprobs.empty();
            std::vector<int32_t> tokens(r.tokens.begin() + long(first), r.tokens.end());
            std::vector<float> lp = has ? std::vector<float>(r.token_logprobs.begin() + long(first), r.token_logprobs.end())
                                        : std::vector<float>{};
            std::vector<int32_t> ids = has ? std::vector<int32_t>(r.top_logprob_ids.begin() + long(first * k),
                                                                  r.top_logprob_ids.end())
                                           : std::vector<int32_t>{};
            std::vector<float> top = has ? std::vector<float>(r.top_logprobs.begin() + long(first * k), r.top_logprobs.end())
                                         : std::vector<float>{};
            const size_t rows = has ? m : 0;
            return nb::make_tuple(tokens, to_numpy(std::move(lp), {rows}), to_numpy(std::move(ids), {rows, k}),
                                  to_numpy(std::move(top), {rows, k}));
        }, "first"_a = 0)
        .def_ro("step_ms", &spec::GenerateResult::step_ms)
        .def_ro("step_sizes", &spec::GenerateResult::step_sizes)
        .def("take_logits", [](spec::GenerateResult& r, size_t n_vocab) {
            const size_t n_rows = n_vocab ? r.logits.size() / n_vocab : 0;
            return to_numpy(std::move(r.logits), {n_rows, n_vocab});
        }, "n_vocab"_a, "Moves the return_logits rows out as a numpy array [n_tokens, n_vocab].");

    nb::class_<spec::Model>(m, "Model", "A loaded GGUF model and its context (from Engine.load_draft).")
        .def_prop_ro("path", &spec::Model::path)
        .def_prop_ro("n_vocab", &spec::Model::n_vocab);

    nb::class_<spec::DraftHead>(m, "DraftHead", "A loaded draft head (from Engine.load_head).")
        .def_prop_ro("path", &spec::DraftHead::path)
        .def_prop_ro("n_embd", &spec::DraftHead::n_embd)
        .def_prop_ro("n_kept", &spec::DraftHead::n_kept)
        .def_prop_ro("n_res_layers", &spec::DraftHead::n_res_layers)
        .def_prop_ro("vocab", &spec::DraftHead::vocab)
        .def_prop_ro("backend", &spec::DraftHead::backend_name)
        .def_prop_ro("kind", [](const spec::DraftHead& head) {
            return head.kind() == spec::DraftHead::Kind::Eagle ? "eagle" : "redrafter";
        }, "'redrafter' (recurrent head) or 'eagle' (EAGLE-class head without attention).")
        .def("row_of", &spec::DraftHead::row_of, "token"_a)
        .def("initial_state", [](const spec::DraftHead& head, ConstFloatArray hidden) {
            const size_t d = size_t(head.n_embd());
            if (hidden.ndim() != 2 || hidden.shape(1) != d || hidden.shape(0) == 0) {
                throw spec::InvalidArgumentError("expected hidden [n, n_embd], n >= 1");
            }
            const size_t n = hidden.shape(0);
            std::vector<float> state(n * d);
            head.initial_state(hidden.data(), state.data(), int32_t(n));
            return to_numpy(std::move(state), {n, d});
        }, "hidden"_a, "The state [n, n_embd] of rows before their first step: zeros, or the hidden states.")
        .def("step", [](spec::DraftHead& head, ConstFloatArray hidden, ConstFloatArray state,
                        const std::vector<int32_t>& rows) {
            const size_t n = rows.size(), d = size_t(head.n_embd());
            if (hidden.ndim() != 2 || state.ndim() != 2 || hidden.shape(0) != n || state.shape(0) != n ||
                hidden.shape(1) != d || state.shape(1) != d || n == 0) {
                throw spec::InvalidArgumentError("expected hidden and state [n, n_embd] and rows [n], n >= 1");
            }
            std::vector<float> new_state(state.data(), state.data() + n * d);
            std::vector<float> logits(n * size_t(head.n_kept()));
            {
                nb::gil_scoped_release release;
                head.step(hidden.data(), new_state.data(), rows.data(), int32_t(n), logits.data());
            }
            const size_t n_kept = size_t(head.n_kept());
            return std::make_pair(to_numpy(std::move(logits), {n, n_kept}), to_numpy(std::move(new_state), {n, d}));
        }, "hidden"_a, "state"_a, "rows"_a,
           "One head step for n rows: (logits [n, n_kept], new state [n, n_embd]).");

    nb::class_<spec::Engine::Learnt>(m, "Learnt",
                                     "What method auto had learnt at one moment (from Engine.learnt); opaque.")
        .def_prop_ro("n_observed_steps", [](const spec::Engine::Learnt& l) { return l.target_costs.n_observed(); },
                     "steps the target's cost corrections had seen");

    nb::class_<spec::Engine>(m, "Engine")
        .def("__init__", [](spec::Engine* self, const std::string& target, const std::string& draft, int32_t n_ctx,
                            int32_t n_batch, int32_t n_threads, int32_t n_gpu_layers, int32_t n_seq_max, bool use_extra_bufts, uint64_t seed,
                            bool reuse_prefix, std::optional<size_t> pool_capacity, bool repack_weights,
                            bool huge_pages, bool flash_attn, const std::vector<std::string>& rpc_servers) {
            spec::EngineParams params;
            params.model.rpc_servers = rpc_servers;
            params.model.n_ctx = n_ctx;
            params.model.n_batch = n_batch;
            params.model.n_threads = n_threads;
            params.model.n_gpu_layers = n_gpu_layers;
            params.model.n_seq_max = n_seq_max;
            params.model.use_extra_bufts = use_extra_bufts;
            params.model.repack_weights = repack_weights;
            params.model.huge_pages = huge_pages;
            params.model.flash_attn = flash_attn;
            params.model.reuse_prefix = reuse_prefix;
            params.seed = seed;
            if (pool_capacity) params.pool.capacity = *pool_capacity;  // else the engine's default
            new (self) spec::Engine(target, draft, params);
        }, "target"_a, "draft"_a, "n_ctx"_a, "n_batch"_a, "n_threads"_a, "n_gpu_layers"_a, "n_seq_max"_a, "use_extra_bufts"_a, "seed"_a,
           "reuse_prefix"_a = true, "pool_capacity"_a.none() = nb::none(), "repack_weights"_a = false, "huge_pages"_a = true,
           "flash_attn"_a = false, "rpc_servers"_a = std::vector<std::string>{}, nb::call_guard<nb::gil_scoped_release>())
        .def("generate", [](spec::Engine& engine, const std::vector<int32_t>& prompt, const spec::GenerateParams& params,
                            nb::object on_text, spec::GenerateResult* partial) {
            // Without on_text the callback still runs Python's signal handlers, so that Ctrl-C
            // (KeyboardInterrupt) stops a long generation between two tokens.
            const spec::TextCallback callback = [on_text](const std::string& piece, const spec::GenerateResult& so_far) {
                nb::gil_scoped_acquire gil;
                if (on_text.is_none()) {
                    if (PyErr_CheckSignals() != 0) throw nb::python_error();
                    return true;
                }
                // A reference valid during the call only: Python reads what it needs (since()).
                return nb::cast<bool>(on_text(piece, nb::cast(&so_far, nb::rv_policy::reference)));
            };
            nb::gil_scoped_release release;
            return engine.generate(prompt, params, callback, partial);
        }, "prompt_tokens"_a, "params"_a, "on_text"_a = nb::none(), "partial"_a.none() = nb::none(),
           "partial: a GenerateResult that receives the output so far when an error stops the generation.")
        .def("evaluate", [](spec::Engine& engine, const std::vector<int32_t>& tokens, bool use_draft, bool all_rows,
                            const std::string& draft_name, int32_t first_row) {
            std::vector<float> logits;
            size_t n_vocab;
            {
                nb::gil_scoped_release release;
                logits = engine.evaluate(tokens, use_draft, all_rows, draft_name, first_row);
                n_vocab = size_t((use_draft ? engine.draft(draft_name) : engine.target()).n_vocab());
            }
            const size_t n_rows = logits.size() / n_vocab;
            return to_numpy(std::move(logits), {n_rows, n_vocab});
        }, "tokens"_a, "use_draft"_a = false, "all_rows"_a = false, "draft_name"_a = "", "first_row"_a = 0)
        .def("evaluate_hidden", [](spec::Engine& engine, const std::vector<int32_t>& tokens) {
            std::vector<float> logits, hidden;
            {
                nb::gil_scoped_release release;
                logits = engine.evaluate_hidden(tokens, hidden);
            }
            const size_t n_rows = tokens.size();
            const size_t n_vocab = logits.size() / n_rows, n_hidden = hidden.size() / n_rows;
            return std::make_pair(to_numpy(std::move(logits), {n_rows, n_vocab}),
                                  to_numpy(std::move(hidden), {n_rows, n_hidden}));
        }, "tokens"_a, "Target logits [n, n_vocab] and hidden states [n, n_hidden] (final norm applied) of every row.")
        .def("evaluate_top_k", [](spec::Engine& engine, const std::vector<int32_t>& tokens, int32_t first_row, int32_t k) {
            std::vector<int32_t> ids;
            std::vector<float> probs, hidden;
            {
                nb::gil_scoped_release release;
                engine.evaluate_top_k(tokens, first_row, k, ids, probs, hidden);
            }
            const size_t n_rows = tokens.size() - size_t(first_row);
            const size_t n_hidden = n_rows ? hidden.size() / n_rows : 0;
            return std::make_tuple(to_numpy(std::move(ids), {n_rows, size_t(k)}),
                                   to_numpy(std::move(probs), {n_rows, size_t(k)}),
                                   to_numpy(std::move(hidden), {n_rows, n_hidden}));
        }, "tokens"_a, "first_row"_a, "k"_a,
           "The target's top-k ids and probabilities [n - first_row, k] and hidden states [n - first_row, n_hidden].")
        .def("cost_signature", [](spec::Engine& engine, bool use_draft, const std::string& draft_name) {
            return (use_draft ? engine.draft(draft_name) : engine.target()).cost_signature();
        }, "use_draft"_a, "draft_name"_a = "")
        // The target's tokenizer and chat templates, callable from any thread while a generation
        // runs or close() does; the GIL is released while they work (a long prompt does not stall
        // other Python threads), and Python objects are made after it is taken back.
        .def("tokenize", [](spec::Engine& e, const std::string& text, bool add_special, bool parse_special) {
            nb::gil_scoped_release release;
            return e.shared_target()->tokenize(text, add_special, parse_special);
        }, "text"_a, "add_special"_a, "parse_special"_a)
        .def("detokenize", [](spec::Engine& e, const std::vector<int32_t>& tokens, bool special) {
            std::string bytes;
            {
                nb::gil_scoped_release release;
                bytes = e.shared_target()->detokenize(tokens, special);
            }
            return nb::bytes(bytes.data(), bytes.size());
        }, "tokens"_a, "special"_a = false)
        .def("token_to_piece", [](spec::Engine& e, int32_t token, bool special) {
            const std::string bytes = e.shared_target()->token_to_piece(token, special);
            return nb::bytes(bytes.data(), bytes.size());
        }, "token"_a, "special"_a = false)
        .def("apply_chat_template", [](spec::Engine& e, const std::vector<std::pair<std::string, std::string>>& messages,
                                       bool add_assistant, const std::string& tmpl) {
            nb::gil_scoped_release release;
            return e.shared_target()->apply_chat_template(messages, add_assistant, tmpl);
        }, "messages"_a, "add_assistant"_a = true, "tmpl"_a = "")
        .def_prop_ro("chat_template", [](spec::Engine& e) { return e.shared_target()->chat_template(); })
        .def_prop_ro("special_tokens", [](spec::Engine& e) {
            const spec::Model::SpecialTokens t = e.shared_target()->special_tokens();
            nb::dict out;
            out["bos"] = t.bos;
            out["eos"] = t.eos;
            out["eot"] = t.eot;
            out["fim_prefix"] = t.fim_prefix;
            out["fim_suffix"] = t.fim_suffix;
            out["fim_middle"] = t.fim_middle;
            out["add_bos"] = t.add_bos;
            return out;
        }, "The target's special token ids (-1: none) and whether tokenize() adds bos.")
        .def("is_eog", [](spec::Engine& e, int32_t token) { return e.shared_target()->is_eog(token); })
        .def("control_tokens", [](spec::Engine& e) { return e.shared_target()->control_tokens(); })
        .def("layout_tokens", [](spec::Engine& e) {
            std::vector<int32_t> blank_line, unit_start, fence;
            e.shared_target()->layout_tokens(&blank_line, &unit_start, &fence);
            return std::make_tuple(blank_line, unit_start, fence);
        }, "(blank_line_tokens, unit_start_tokens, fence_tokens) of the target's vocabulary (LookupParams).")
        .def_prop_ro("n_vocab", [](spec::Engine& e) { return e.shared_target()->n_vocab(); })
        .def_prop_ro("n_ctx", [](spec::Engine& e) { return e.shared_target()->n_ctx(); })
        .def_prop_ro("n_repacked", [](spec::Engine& e) { return e.shared_target()->n_repacked(); })
        .def_prop_ro("has_draft", [](spec::Engine& e) { return e.has_draft(); })
        .def("has_draft_named", [](spec::Engine& e, const std::string& name) { return e.has_draft(name); }, "name"_a)
        .def("draft_names", &spec::Engine::draft_names)
        .def("draft_version", &spec::Engine::draft_version, "name"_a = "")
        .def("load_draft", &spec::Engine::load_draft, "path"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("swap_draft", &spec::Engine::swap_draft, "model"_a, "name"_a = "",
             nb::call_guard<nb::gil_scoped_release>())
        .def("reload_draft", &spec::Engine::reload_draft, "path"_a, "name"_a = "",
             nb::call_guard<nb::gil_scoped_release>())
        .def("remove_draft", &spec::Engine::remove_draft, "name"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("load_head", &spec::Engine::load_head, "path"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("swap_head", &spec::Engine::swap_head, "head"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("remove_head", &spec::Engine::remove_head, nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("has_head", &spec::Engine::has_head)
        .def_prop_ro("head_version", &spec::Engine::head_version)
        .def_prop_ro("head_path", &spec::Engine::head_path)
        .def("load_ngram", &spec::Engine::load_ngram, "path"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("swap_ngram", &spec::Engine::swap_ngram, "table"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("remove_ngram", &spec::Engine::remove_ngram, nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("ngram_path", &spec::Engine::ngram_path)
        .def_prop_ro("ngram_size", &spec::Engine::ngram_size)
        .def_prop_ro("vocab_fingerprint", [](spec::Engine& e) { return spec::vocab_fingerprint(*e.shared_target()); })
        .def_prop_ro("closed", &spec::Engine::closed)
        .def("describe", [](spec::Engine& e, bool use_draft, const std::string& draft_name) {
            spec::Model& model = use_draft ? e.draft(draft_name) : e.target();
            return std::make_tuple(model.description(), model.n_layer(), model.n_embd(), model.n_vocab());
        }, "use_draft"_a = false, "draft_name"_a = "")
        // The pool, usable from any thread while a generation runs or close() does.
        .def("pool_stats", [](spec::Engine& e) {
            const std::shared_ptr<spec::PhrasePool> pool = e.pool();
            const spec::PhrasePoolStats s = pool->stats();
            nb::dict d;
            d["size"] = s.size;
            d["capacity"] = pool->params().capacity;
            d["memory_bytes"] = pool->memory_bytes();
            d["n_inserted"] = s.n_inserted;
            d["n_refreshed"] = s.n_refreshed;
            d["n_merged"] = s.n_merged;
            d["n_evicted"] = s.n_evicted;
            d["n_loaded"] = s.n_loaded;
            d["n_lookups"] = s.n_lookups;
            d["n_hits"] = s.n_hits;
            d["n_uses"] = s.n_uses;
            d["n_phrases_accepted"] = s.n_phrases_accepted;
            d["n_tokens_accepted"] = s.n_tokens_accepted;
            d["n_proven"] = s.n_proven;
            nb::dict by_source;
            for (int32_t i = 0; i < spec::kPhraseSourceCount; ++i) {
                by_source[spec::phrase_source_name(spec::PhraseSource(i))] = s.n_inserted_by_source[i];
            }
            d["n_inserted_by_source"] = by_source;
            return d;
        })
        .def("save_pool", [](spec::Engine& e, const std::string& path) { e.pool()->save(path); }, "path"_a,
             nb::call_guard<nb::gil_scoped_release>())
        .def("load_pool", [](spec::Engine& e, const std::string& path) { e.pool()->load(path); }, "path"_a,
             nb::call_guard<nb::gil_scoped_release>())
        .def("clear_pool", [](spec::Engine& e) { e.pool()->clear(); })
        .def("measure_cost", [](spec::Engine& e, bool use_draft, const std::string& draft_name,
                                const std::vector<int32_t>& sizes, int32_t repeats, nb::object progress,
                                int32_t context) {
            const spec::CalibrationProgress callback = progress_callback(progress);
            nb::gil_scoped_release release;
            return use_draft ? e.measure_draft_cost(draft_name, sizes, repeats, callback, context)
                             : e.measure_target_cost(sizes, repeats, callback, context);
        }, "use_draft"_a, "draft_name"_a = "", "sizes"_a = std::vector<int32_t>{}, "repeats"_a = 3,
           "progress"_a = nb::none(), "context"_a = spec::kCalibrationContext,
           "Times decodes of k tokens on top of `context` cached tokens and installs the cost curve "
           "(method 'auto').")
        .def("time_flash_attention", [](spec::Engine& e, const std::vector<int32_t>& depths, int32_t n_decodes,
                                        int32_t rounds, int32_t batch, nb::object progress) {
            const spec::CalibrationProgress callback = progress_callback(progress);
            nb::gil_scoped_release release;
            return spec::time_flash_attention(e.target(), depths, n_decodes, rounds, batch, callback);
        }, "depths"_a, "n_decodes"_a = 2, "rounds"_a = 12, "batch"_a = 8, "progress"_a = nb::none(),
           "Times the target's decodes of one token and of `batch` tokens (a row each) on top of each of `depths` "
           "cached tokens with flash attention off and on, each setting in a temporary context of its own (the "
           "engine's cache is left alone) as wide as the engine's window up to 4,096 cells: a "
           "FlashAttentionTiming per depth (medians in ms, and the medians of the per-round paired ratios on / off).")
        .def("decide_flash_attention", [](spec::Engine& e, int32_t n_decodes, int32_t rounds, nb::object progress) {
            const spec::CalibrationProgress callback = progress_callback(progress);
            nb::gil_scoped_release release;
            return spec::decide_flash_attention(e.target(), n_decodes, rounds, callback);
        }, "n_decodes"_a = 2, "rounds"_a = 12, "progress"_a = nb::none(),
           "Times the target with flash attention off and on at flash_attention_depths(n_ctx) and chooses for "
           "flash_attention_at_depth(n_ctx) (the engine's own cache is left alone).")
        .def("time_decodes", [](spec::Engine& e, const std::vector<int32_t>& sizes, int32_t repeats, bool all_rows,
                                int32_t context, bool non_decreasing, nb::object progress) {
            const spec::CalibrationProgress callback = progress_callback(progress);
            nb::gil_scoped_release release;
            return spec::measure_cost_curve(e.target(), sizes, repeats, all_rows, callback, context, non_decreasing);
        }, "sizes"_a, "repeats"_a = 3, "all_rows"_a = true, "context"_a = spec::kCalibrationContext,
           "non_decreasing"_a = true, "progress"_a = nb::none(),
           "Times the target's decodes of k tokens as calibration does, with a logits row for every "
           "token (all_rows) or for the last one only; the medians as measured when non_decreasing "
           "is false (calibration makes them a running maximum); progress(done, total) after each decode; "
           "installs nothing.")
        .def("set_cost", [](spec::Engine& e, bool use_draft, const spec::CostCurve& curve, const std::string& draft_name) {
            if (use_draft) {
                e.set_draft_cost(curve, draft_name);
            } else {
                e.set_target_cost(curve);
            }
        }, "use_draft"_a, "curve"_a, "draft_name"_a = "")
        .def("cost", [](spec::Engine& e, bool use_draft, const std::string& draft_name) {
            return use_draft ? e.draft_cost(draft_name) : e.target_cost();
        }, "use_draft"_a = false, "draft_name"_a = "")
        .def("kv_state", [](spec::Engine& e, bool use_draft, const std::string& draft_name) {
            spec::Model& model = use_draft ? e.draft(draft_name) : e.target();
            std::vector<int32_t> pos_max;  // [n_seq_max] llama.cpp's highest position per sequence
            for (int32_t s = 0; s < model.params().n_seq_max; ++s) pos_max.push_back(model.kv_pos_max(s));
            return std::make_pair(model.cached_tokens(), pos_max);
        }, "use_draft"_a = false, "draft_name"_a = "",
           "(tokens the prefix cache holds in sequence 0, llama.cpp's highest position per sequence or -1)")
        .def("cost_model", [](spec::Engine& e) { return e.target_cost_model(); },
             "A copy of the target's cost model: its calibration prior and the corrections learnt from the "
             "steps decoded so far.")
        .def("learnt", &spec::Engine::learnt,
             "A copy of what method auto has learnt across requests: acceptance statistics, the target's cost "
             "corrections, the head's record.")
        .def("restore_learnt", &spec::Engine::restore_learnt, "state"_a,
             "Puts a copy from learnt() back (the head's part only if the same head is loaded).")
        .def("acceptance_counts", &spec::Engine::acceptance_counts,
             "Method auto's acceptance statistics as counts per statistics key (AcceptanceStats::counts).")
        .def("set_acceptance_counts", &spec::Engine::set_acceptance_counts, "counts"_a,
             "without_model"_a = std::vector<std::string>{},
             "Replaces auto's acceptance statistics by counts from acceptance_counts(); checks them all first. "
             "The keys in without_model lose their draft model's counts.")
        .def("system_info", [](spec::Engine&) { return spec::backend_description(); })
        .def("close", &spec::Engine::close, nb::call_guard<nb::gil_scoped_release>());
}
