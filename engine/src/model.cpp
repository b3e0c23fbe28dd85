#include "spec/model.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <unordered_map>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ggml-backend.h"
#include "gguf.h"
#include "llama.h"
#include "spec/error.h"
#include "spec/log.h"
#include "spec/rpc.h"

namespace spec {
namespace {

// A token text for an error message: printable ASCII as is, other bytes as \xNN, at most 40 bytes.
std::string quoted_token(std::string_view text) {
    static const char* const hex = "0123456789abcdef";
    std::string out = "\"";
    for (const char c : text.substr(0, 40)) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte >= 0x20 && byte < 0x7f && c != '\\' && c != '"') {
            out += c;
        } else {
            out += "\\x";
            out += hex[byte >> 4];
            out += hex[byte & 0xf];
        }
    }
    return out + (text.size() > 40 ? "\"..." : "\"");
}

// llama.cpp maps each token text to its id and aborts the process (GGML_ASSERT in llama-vocab.cpp)
// when two entries of tokenizer.ggml.tokens have the same text, instead of failing the load. Read
// the metadata alone (no tensor data) and refuse such a vocabulary first. Texts are compared as
// llama.cpp sees them: gguf_get_arr_str's C string, so up to a first NUL byte.
// A file whose metadata gguf.h cannot parse is left to llama.cpp, whose loader reports the reason.
void check_unique_token_texts(const std::string& path) {
    const gguf_init_params metadata_only{/*no_alloc=*/true, /*ctx=*/nullptr};
    const std::unique_ptr<gguf_context, decltype(&gguf_free)> file(
        gguf_init_from_file(path.c_str(), metadata_only), &gguf_free);
    if (!file) return;
    const int64_t key = gguf_find_key(file.get(), "tokenizer.ggml.tokens");
    if (key < 0 || gguf_get_kv_type(file.get(), key) != GGUF_TYPE_ARRAY ||
        gguf_get_arr_type(file.get(), key) != GGUF_TYPE_STRING) {
        return;  // llama.cpp refuses a missing or mistyped token list with an error of its own
    }
    const size_t n_tokens = gguf_get_arr_n(file.get(), key);
    std::unordered_map<std::string_view, size_t> first_id;  // views into the gguf_context's strings
    first_id.reserve(n_tokens);
    for (size_t id = 0; id < n_tokens; ++id) {
        const std::string_view text = gguf_get_arr_str(file.get(), key, id);
        const auto [it, inserted] = first_id.emplace(text, id);
        if (!inserted) {
            throw ModelLoadError("vocabulary has two tokens with the same text: tokens " + std::to_string(it->second) +
                                 " and " + std::to_string(id) + " are both " + quoted_token(text) +
                                 " (tokenizer.ggml.tokens in " + path + ")");
        }
    }
}

// ggml's weight repacking alone, without its AMX buffer type. Where the CPU has AMX, the Python
// layer turns llama.cpp's extra buffer types off (their AMX kernels fault on the development
// machines, README Notes) and repacking went with them, although repacked weights make batched
// matmuls, so verification, much cheaper on x86. This puts the matmul weights that ggml repacks on
// x86 into its CPU_REPACK buffer type by name. The rule mirrors ggml_repack_get_optimal_repack_type
// at the pinned llama.cpp (ggml-cpu/repack.cpp): Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K with
// AVX-512, rows a multiple of 8; a tensor it would refuse must not be sent there (ggml would
// dereference a null repack routine). Only the attention and feed-forward projections of the
// repeating blocks and the output matrix: tensors read by matmuls alone (token_embd is also read
// row by row and stays where it is). Empty when the CPU backend offers no CPU_REPACK.
struct RepackOverrides {
    std::vector<std::string> patterns;                     // one regex per block, owning the strings
    std::vector<llama_model_tensor_buft_override> list;    // null-terminated, as llama.cpp reads it
    int32_t n_tensors = 0;
};

ggml_backend_buffer_type_t cpu_repack_buffer_type(bool* avx2, bool* avx512) {
    *avx2 = *avx512 = false;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) return nullptr;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    if (auto get_features = reinterpret_cast<ggml_backend_get_features_t>(
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"))) {
        for (const ggml_backend_feature* f = get_features(reg); f && f->name; ++f) {
            if (std::strcmp(f->value, "1") != 0) continue;
            if (std::strcmp(f->name, "AVX2") == 0) *avx2 = true;
            if (std::strcmp(f->name, "AVX512") == 0) *avx512 = true;
        }
    }
    auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (!get_extra) return nullptr;
    for (ggml_backend_buffer_type_t* b = get_extra(cpu); b && *b; ++b) {
        if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    }
    return nullptr;
}

bool x86_repacks(const ggml_tensor* t, bool avx2, bool avx512) {
    if (ggml_n_dims(t) != 2 || t->ne[1] % 8 != 0) return false;
    switch (t->type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_K: case GGML_TYPE_IQ4_NL: case GGML_TYPE_MXFP4: return avx2;
        case GGML_TYPE_Q2_K: return avx512;
        default: return false;
    }
}

RepackOverrides repack_overrides(const std::string& path) {
    RepackOverrides out;
    bool avx2 = false, avx512 = false;
    ggml_backend_buffer_type_t repack = cpu_repack_buffer_type(&avx2, &avx512);
    if (!repack || !avx2) return out;
    ggml_context* meta = nullptr;
    const gguf_init_params params{/*no_alloc=*/true, /*ctx=*/&meta};
    const std::unique_ptr<gguf_context, decltype(&gguf_free)> file(gguf_init_from_file(path.c_str(), params), &gguf_free);
    if (!file || !meta) return out;
    static const char* const kProjections[] = {"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output",
                                               "ffn_gate", "ffn_up", "ffn_down"};
    std::map<int, std::vector<std::string>> by_block;  // block -> its repackable projections
    bool output = false;
    for (ggml_tensor* t = ggml_get_first_tensor(meta); t; t = ggml_get_next_tensor(meta, t)) {
        if (!x86_repacks(t, avx2, avx512)) continue;
        const std::string name = ggml_get_name(t);
        if (name == "output.weight") {
            output = true;
            ++out.n_tensors;
            continue;
        }
        int block = -1;
        char projection[32] = {0};
        if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight", &block, projection) != 2) continue;
        if (name != "blk." + std::to_string(block) + "." + projection + ".weight") continue;
        for (const char* p : kProjections) {
            if (std::strcmp(p, projection) == 0) {
                by_block[block].push_back(projection);
                ++out.n_tensors;
            }
        }
    }
    ggml_free(meta);
    for (const auto& [block, names] : by_block) {
        std::string pattern = "^blk\\." + std::to_string(block) + "\\.(";
        for (size_t i = 0; i < names.size(); ++i) pattern += (i ? "|" : "") + names[i];
        out.patterns.push_back(pattern + ")\\.weight$");
    }
    if (output) out.patterns.push_back("^output\\.weight$");
    for (const std::string& p : out.patterns) out.list.push_back({p.c_str(), repack});
    out.list.push_back({nullptr, nullptr});
    return out;
}

// Transparent huge pages for the buffers llama.cpp allocates for a model and its context
// (repacked weights, KV cache, compute and output buffers). Where the kernel's THP mode is
// "madvise" (the development machines), anonymous memory gets huge pages only where asked, and
// they take 7% off a one-token decode of the 1.5B target (docs/cost-curves.md, the Xeon AMX
// table) and 5.5% off SmolLM2-135M's (docs/results-speed.md, "Huge pages"). The engine asks
// for them on the anonymous mappings of 2 MiB or more that appear during a load (a
// diff of /proc/self/maps): the weights' buffers at every progress callback of the load, once
// allocated and before they are written (advised memory is then faulted in as huge pages), the
// context's buffers after its creation, advised and collapsed (MADV_COLLAPSE) one 2 MiB range at
// a time. Best effort, failures ignored; a no-op off Linux.
using Mapping = std::pair<uintptr_t, uintptr_t>;  // [start, end)

std::vector<Mapping> anonymous_mappings() {
    std::vector<Mapping> out;
#if defined(__linux__)
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long start = 0, end = 0, inode = 0;
        char perms[8] = {0};
        int path_at = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %lu %n", &start, &end, perms, &inode, &path_at) < 4) continue;
        const bool unnamed = path_at <= 0 || size_t(path_at) >= line.size();
        if (inode == 0 && unnamed && perms[0] == 'r' && perms[1] == 'w' && end - start >= (2u << 20)) {
            out.emplace_back(uintptr_t(start), uintptr_t(end));
        }
    }
#endif
    return out;
}

void advise_huge_pages(const std::vector<Mapping>& before, bool collapse) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
#if defined(MADV_COLLAPSE)
    constexpr int kCollapse = MADV_COLLAPSE;
#else
    constexpr int kCollapse = 25;  // MADV_COLLAPSE (Linux >= 6.1; EINVAL before)
#endif
    for (const Mapping& m : anonymous_mappings()) {
        if (std::find(before.begin(), before.end(), m) != before.end()) continue;
        const uintptr_t start = (m.first + kHuge - 1) & ~(kHuge - 1);
        const uintptr_t end = m.second & ~(kHuge - 1);
        if (end <= start) continue;
        void* addr = reinterpret_cast<void*>(start);
        if (madvise(addr, end - start, MADV_HUGEPAGE) != 0 || !collapse) continue;
        // One 2 MiB range at a time: asked for a whole context's buffers at once, the kernel
        // answers EINVAL and leaves most of them in 4 KiB pages.
        for (uintptr_t at = start; at < end; at += kHuge) madvise(reinterpret_cast<void*>(at), kHuge, kCollapse);
    }
#else
    (void)before;
    (void)collapse;
#endif
}

struct HugePageAdvice {
    std::vector<Mapping> before;  // mappings not to advise: older than the load, or advised already
};

// Every progress callback, not only the first: llama.cpp allocates some weight buffers (the
// repacked ones among them) after its first callback and writes each tensor after a later one.
bool advise_on_progress(float /*progress*/, void* user_data) {
    auto* advice = static_cast<HugePageAdvice*>(user_data);
    std::vector<Mapping> now = anonymous_mappings();
    if (now != advice->before) {
        advise_huge_pages(advice->before, /*collapse=*/false);
        advice->before = std::move(now);
    }
    return true;
}

// Cheap checks before handing the file to llama.cpp, so the common mistakes get a plain message.
void check_gguf_file(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw ModelLoadError("model file not found or unreadable: " + path);
    char magic[4] = {0, 0, 0, 0};
    file.read(magic, 4);
    if (file.gcount() < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        throw ModelLoadError("not a GGUF file (bad magic): " + path);
    }
    check_unique_token_texts(path);
}

// The largest context window accepted, checked before llama.cpp sees it. llama.cpp does not bound
// n_ctx: it sizes its KV cache's per-cell bookkeeping for n_ctx cells (a 24 GiB std::vector for
// 2^31 - 1, measured), so a huge value was refused only when that allocation happened to fail, and
// where it fails by aborting (ASan) it ended the process. A fixed cap rather than a multiple of the
// model's trained context: it is checked before any file is read and keeps every setting that
// works today valid whatever a model's metadata says. 2^24 = 16,777,216 tokens is above the trained
// context of any model this engine targets (Qwen2.5-Coder: 32,768; the tiny test models: 2,048)
// and keeps that bookkeeping near 200 MiB. The KV cache itself is allocated through ggml, which
// reports a failed allocation as an error (ModelLoadError), not an abort.
constexpr int64_t kMaxContextTokens = int64_t(1) << 24;

std::string with_reason(const std::string& message) {
    const std::string reason = log_take_recent_errors();
    return reason.empty() ? message : message + "\nllama.cpp: " + reason;
}

}  // namespace

Model::Model(const std::string& path, const ModelParams& params) : path_(path), params_(params) {
    if (params.n_ctx < 0) throw InvalidArgumentError("n_ctx must be >= 0, got " + std::to_string(params.n_ctx));
    if (params.n_ctx > kMaxContextTokens) {
        throw InvalidArgumentError("n_ctx=" + std::to_string(params.n_ctx) + " exceeds the largest context window, " +
                                   std::to_string(kMaxContextTokens) + " tokens");
    }
    if (params.n_batch < 1) throw InvalidArgumentError("n_batch must be >= 1, got " + std::to_string(params.n_batch));
    if (params.n_seq_max < 1) throw InvalidArgumentError("n_seq_max must be >= 1");
    if (params.n_threads < 0) throw InvalidArgumentError("n_threads must be >= 0, got " + std::to_string(params.n_threads));
    log_capture_install();
    check_gguf_file(path);
    log_take_recent_errors();  // forget older warnings: only this load's reasons are quoted

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = params.n_gpu_layers;
    std::vector<ggml_backend_dev_t> devices;  // outlives the load; null-terminated
    if (!params.rpc_servers.empty()) {
        if (params.n_gpu_layers == 0) {
            throw InvalidArgumentError("RPC servers were given with n_gpu_layers=0, which puts no layer on them: "
                                       "pass -1 (all layers) or how many");
        }
        // The servers first (as llama.cpp orders them: fewer transfers), then this machine's GPUs.
        devices = rpc_devices(params.rpc_servers);
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t device = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(device) == GGML_BACKEND_DEVICE_TYPE_GPU) devices.push_back(device);
        }
        devices.push_back(nullptr);
        mparams.devices = devices.data();
    }
    mparams.load_mode = params.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    mparams.use_extra_bufts = params.use_extra_bufts;
    RepackOverrides repack;  // outlives the load: llama.cpp reads the patterns while loading
    if (params.repack_weights && !params.use_extra_bufts && params.n_gpu_layers == 0) {
        repack = repack_overrides(path);
        if (repack.n_tensors > 0) mparams.tensor_buft_overrides = repack.list.data();
    }
    n_repacked_ = repack.n_tensors;
    HugePageAdvice advice;  // outlives the load: llama.cpp calls back while loading
    if (params.huge_pages) {
        advice.before = anonymous_mappings();
        mparams.progress_callback = advise_on_progress;
        mparams.progress_callback_user_data = &advice;
    }
    model_ = llama_model_load_from_file(path.c_str(), mparams);
    if (!model_) throw ModelLoadError(with_reason("llama.cpp could not load model: " + path));
    // The destructor does not run when the constructor throws: until it returns, this frees the
    // model and the context (an error below, or std::bad_alloc anywhere after the load).
    struct FreeOnThrow {
        Model* self;
        ~FreeOnThrow() {
            if (!self) return;
            if (self->ctx_) llama_free(self->ctx_);
            if (self->model_) llama_model_free(self->model_);
            self->ctx_ = nullptr;
            self->model_ = nullptr;
        }
    } free_on_throw{this};
    // llama.cpp caps a causal model's batch at the context and reserves one output row per
    // sequence; more sequences than batch rows make it abort the process, not return an error.
    const int64_t n_ctx_asked = params.n_ctx > 0 ? params.n_ctx : llama_model_n_ctx_train(model_);
    if (n_ctx_asked > kMaxContextTokens) {  // n_ctx=0 takes the trained context from the file's metadata
        throw InvalidArgumentError("n_ctx=0 takes the model's trained context, " + std::to_string(n_ctx_asked) +
                                   " tokens, which exceeds the largest context window, " +
                                   std::to_string(kMaxContextTokens) + " tokens: pass a smaller n_ctx");
    }
    const int64_t n_batch_rows = std::min<int64_t>(params.n_batch, n_ctx_asked);
    const int64_t n_seq_limit = std::min<int64_t>(n_batch_rows, int64_t(llama_max_parallel_sequences()));
    if (params.n_seq_max > n_seq_limit) {
        throw InvalidArgumentError("n_seq_max=" + std::to_string(params.n_seq_max) + " exceeds the " +
                                   std::to_string(n_seq_limit) + " sequences this context can hold (one output row " +
                                   "each: n_batch=" + std::to_string(params.n_batch) + ", n_ctx=" +
                                   std::to_string(n_ctx_asked) + ", at most " +
                                   std::to_string(llama_max_parallel_sequences()) + ")");
    }

    const int32_t n_threads = params.n_threads > 0
        ? params.n_threads
        : std::max(1, int32_t(std::thread::hardware_concurrency()));
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = uint32_t(params.n_ctx);
    cparams.n_batch = uint32_t(params.n_batch);
    cparams.n_ubatch = uint32_t(params.n_batch);
    cparams.n_seq_max = uint32_t(params.n_seq_max);
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.kv_unified = true;
    // Backend argmax (set_backend_argmax) takes every output row a sequence has in a step (a
    // chain verifies 1 + n_draft rows of sequence 0); llama.cpp's default allows one.
    cparams.n_outputs_max_per_seq = 0;  // 0: as many as the batch has output rows
    cparams.flash_attn_type = params.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.no_perf = true;
    const std::vector<Mapping> anonymous_mappings_before_context =
        params.huge_pages ? anonymous_mappings() : std::vector<Mapping>{};
    ctx_ = llama_init_from_model(model_, cparams);
    if (!ctx_) {
        throw ModelLoadError(with_reason("llama.cpp could not create a context for " + path +
                                         " (n_ctx=" + std::to_string(params.n_ctx) + ")"));
    }
    vocab_ = llama_model_get_vocab(model_);
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    kv_tokens_.assign(size_t(params.n_seq_max), {});
    params_.n_batch = int32_t(llama_n_batch(ctx_));  // the batch llama.cpp accepts (capped by n_ctx)
    if (params.huge_pages) advise_huge_pages(anonymous_mappings_before_context, /*collapse=*/true);
    free_on_throw.self = nullptr;
}

Model::~Model() {
    if (batch_) llama_batch_free(*batch_);
    if (ctx_) llama_free(ctx_);
    for (llama_sampler* sampler : argmax_samplers_) llama_sampler_free(sampler);  // after the context
    if (model_) llama_model_free(model_);
}

int32_t Model::n_ctx() const { return int32_t(llama_n_ctx(ctx_)); }
int32_t Model::n_layer() const { return llama_model_n_layer(model_); }
int32_t Model::n_embd() const { return llama_model_n_embd(model_); }

std::string Model::description() const {
    char buf[256];
    llama_model_desc(model_, buf, sizeof(buf));
    return buf;
}

std::string Model::cost_signature() const {
    return description() + "|bytes=" + std::to_string(llama_model_size(model_)) +
           "|params=" + std::to_string(llama_model_n_params(model_)) + "|layers=" + std::to_string(n_layer()) +
           "|embd=" + std::to_string(n_embd()) + "|vocab=" + std::to_string(n_vocab_);
}

std::vector<int32_t> Model::tokenize(const std::string& text, bool add_special, bool parse_special) const {
    // llama_tokenize takes the text's length and the buffer's as int32.
    if (text.size() > size_t(INT32_MAX)) {
        throw InvalidArgumentError("text of " + std::to_string(text.size()) + " bytes exceeds the " +
                                   std::to_string(INT32_MAX) + " bytes llama.cpp tokenizes at once: split it");
    }
    std::vector<int32_t> tokens(std::min<size_t>(text.size() + 8, size_t(INT32_MAX)));
    int32_t n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), tokens.data(),
                               int32_t(tokens.size()), add_special, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) throw InvalidArgumentError("text too long to tokenize");
        tokens.resize(size_t(-n));
        n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), tokens.data(),
                           int32_t(tokens.size()), add_special, parse_special);
    }
    tokens.resize(size_t(std::max(n, 0)));
    return tokens;
}

void Model::check_token(int32_t token) const {
    if (token < 0 || token >= n_vocab_) {
        throw InvalidArgumentError("token " + std::to_string(token) + " outside the vocabulary [0, " +
                                   std::to_string(n_vocab_) + ")");
    }
}

std::string Model::token_to_piece(int32_t token, bool special) const {
    check_token(token);
    char buf[128];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, special);
    if (n >= 0) return std::string(buf, size_t(n));
    std::string out(size_t(-n), '\0');
    n = llama_token_to_piece(vocab_, token, out.data(), int32_t(out.size()), 0, special);
    out.resize(size_t(std::max(n, 0)));
    return out;
}

std::string Model::detokenize(const std::vector<int32_t>& tokens, bool special) const {
    std::string out;
    for (int32_t t : tokens) out += token_to_piece(t, special);
    return out;
}

bool Model::is_eog(int32_t token) const {
    check_token(token);
    return llama_vocab_is_eog(vocab_, token);
}

std::vector<int32_t> Model::control_tokens() const {
    std::vector<int32_t> out;
    for (int32_t t = 0; t < n_vocab_; ++t) {
        if (llama_vocab_is_control(vocab_, t) || llama_vocab_is_eog(vocab_, t)) out.push_back(t);
    }
    return out;
}

void Model::layout_tokens(std::vector<int32_t>* blank_line, std::vector<int32_t>* unit_start,
                          std::vector<int32_t>* fence) const {
    blank_line->clear();
    unit_start->clear();
    if (fence) fence->clear();
    for (int32_t t = 0; t < n_vocab_; ++t) {
        if (llama_vocab_is_control(vocab_, t) || llama_vocab_is_eog(vocab_, t)) continue;
        const std::string piece = token_to_piece(t, false);
        if (piece.empty()) continue;
        if (piece.find("\n\n") != std::string::npos) blank_line->push_back(t);
        const char c = piece[0];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') unit_start->push_back(t);
        if (fence && piece.rfind("```", 0) == 0) fence->push_back(t);
    }
}

std::string Model::token_text(int32_t token) const {
    check_token(token);
    const char* text = llama_vocab_get_text(vocab_, token);
    return text ? text : "";
}

std::vector<std::string> chat_builtin_templates() {
    const int32_t n = llama_chat_builtin_templates(nullptr, 0);
    std::vector<const char*> names(size_t(std::max(n, 0)));
    llama_chat_builtin_templates(names.data(), names.size());
    return std::vector<std::string>(names.begin(), names.end());
}

std::string Model::chat_template() const {
    const char* tmpl = llama_model_chat_template(model_, nullptr);
    return tmpl ? tmpl : "";
}

Model::SpecialTokens Model::special_tokens() const {
    SpecialTokens out;
    out.bos = llama_vocab_bos(vocab_);
    out.eos = llama_vocab_eos(vocab_);
    out.eot = llama_vocab_eot(vocab_);
    out.fim_prefix = llama_vocab_fim_pre(vocab_);
    out.fim_suffix = llama_vocab_fim_suf(vocab_);
    out.fim_middle = llama_vocab_fim_mid(vocab_);
    out.add_bos = llama_vocab_get_add_bos(vocab_);
    return out;
}

std::string Model::apply_chat_template(
        const std::vector<std::pair<std::string, std::string>>& messages, bool add_assistant,
        const std::string& name) const {
    const char* tmpl = name.empty() ? llama_model_chat_template(model_, nullptr) : name.c_str();
    if (!tmpl) throw InvalidArgumentError("model has no chat template: " + path_);
    std::vector<llama_chat_message> chat;
    size_t total = 0;
    for (const auto& [role, content] : messages) {
        chat.push_back({role.c_str(), content.c_str()});
        total += role.size() + content.size();
    }
    // llama_chat_apply_template takes the buffer's length and returns the result's as int32; the
    // buffer starts at twice the messages' size.
    constexpr size_t kMaxBytes = size_t(INT32_MAX) / 2 - 256;
    if (total > kMaxBytes) {
        throw InvalidArgumentError("messages of " + std::to_string(total) + " bytes exceed the " +
                                   std::to_string(kMaxBytes) + " bytes llama.cpp formats at once (int32 lengths)");
    }
    std::vector<char> buf(2 * total + 256);
    int32_t n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(),
                                          int32_t(buf.size()));
    if (n > int32_t(buf.size())) {
        buf.resize(size_t(n));
        n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(),
                                      int32_t(buf.size()));
    }
    if (n < 0) {
        throw InvalidArgumentError(name.empty() ? "llama.cpp does not support this model's chat template: " + path_
                                                : "llama.cpp has no built-in chat template named '" + name + "'");
    }
    return std::string(buf.data(), size_t(n));
}

void Model::decode(const std::vector<BatchToken>& batch) { decode(batch.data(), int32_t(batch.size())); }

void Model::decode(const BatchToken* batch, int32_t n) {
    if (n <= 0) return;
    if (n > params_.n_batch) {
        throw InvalidArgumentError("batch of " + std::to_string(n) + " tokens exceeds n_batch=" +
                                   std::to_string(params_.n_batch));
    }
    // One llama_batch for the model's lifetime (n_batch tokens, n_seq_max sequences per token),
    // not an allocation per decode.
    if (!batch_) {
        batch_ = std::make_unique<llama_batch>(llama_batch_init(params_.n_batch, 0, std::max(params_.n_seq_max, 1)));
    }
    llama_batch& b = *batch_;
    output_index_.clear();
    for (int32_t i = 0; i < n; ++i) {
        const BatchToken& t = batch[size_t(i)];
        b.token[i] = t.token;
        b.pos[i] = t.pos;
        if (t.seq_ids.empty()) {
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
        } else {
            if (int32_t(t.seq_ids.size()) > std::max(params_.n_seq_max, 1)) {
                throw InvalidArgumentError("a batch token in " + std::to_string(t.seq_ids.size()) +
                                           " sequences exceeds n_seq_max=" + std::to_string(params_.n_seq_max));
            }
            b.n_seq_id[i] = int32_t(t.seq_ids.size());
            for (size_t s = 0; s < t.seq_ids.size(); ++s) b.seq_id[i][s] = t.seq_ids[s];
        }
        b.logits[i] = t.output ? 1 : 0;
        if (t.output) output_index_.push_back(i);
    }
    b.n_tokens = n;
    const int32_t rc = llama_decode(ctx_, b);
    // On asynchronous backends (CUDA, RPC) llama_decode returns before the graph has run, and
    // the wait would fall into whichever call reads the rows first. Waiting here keeps the time
    // of a decode in the decode: the cost curves, t_target_ms and auto's step timings then
    // measure what a call costs. The rows are read next anyway, so nothing overlaps less.
    if (rc == 0) llama_synchronize(ctx_);
    // Rows exist only after a successful decode; a failed one leaves none to read.
    n_outputs_ = rc == 0 ? int32_t(output_index_.size()) : 0;
    if (rc != 0) output_index_.clear();
    last_decode_hidden_ = hidden_output_ && rc == 0;
    last_decode_argmax_ = backend_argmax_ && rc == 0;
    if (rc == 0) {
        for (int32_t i = 0; i < n; ++i) {
            const BatchToken& t = batch[size_t(i)];
            for (size_t s = 0; s < std::max<size_t>(1, t.seq_ids.size()); ++s) {
                const int32_t seq = t.seq_ids.empty() ? 0 : t.seq_ids[s];
                std::vector<int32_t>& held = kv_tokens_.at(size_t(seq));
                if (int32_t(held.size()) <= t.pos) held.resize(size_t(t.pos) + 1, -1);
                held[size_t(t.pos)] = t.token;
            }
        }
    } else {
        kv_known_ = false;  // llama.cpp may have kept part of the batch
    }
    if (rc == 1) {
        throw ContextOverflowError(with_reason("no room in the KV cache for " + std::to_string(n) +
                                               " tokens (n_ctx=" + std::to_string(n_ctx()) + ")"));
    }
    if (rc != 0) throw DecodeError(with_reason("llama_decode failed with code " + std::to_string(rc)));
}

void Model::decode_seq(const int32_t* tokens, int32_t n_tokens, int32_t pos0, bool all_logits) {
    std::vector<BatchToken> batch;
    batch.reserve(size_t(n_tokens));
    for (int32_t i = 0; i < n_tokens; ++i) {
        batch.push_back({tokens[i], pos0 + i, {}, all_logits || i == n_tokens - 1});
    }
    decode(batch);
}

int32_t Model::prefill_prompt(const std::vector<int32_t>& prompt) {
    const int32_t n_prefill = int32_t(prompt.size()) - 1;
    // Cached tokens that start the prompt stay; the last prompt token is always evaluated anew
    // (its logits start step one).
    int32_t n_keep = 0;
    if (params_.reuse_prefix && kv_known_ && drops_positions()) {
        const std::vector<int32_t>& held = kv_tokens_[0];
        while (n_keep < n_prefill && n_keep < int32_t(held.size()) && held[size_t(n_keep)] == prompt[size_t(n_keep)]) {
            ++n_keep;
        }
    }
    if (n_keep == 0) {
        kv_clear();
    } else {
        kv_drop_side_sequences();
        kv_remove(0, n_keep, -1);
    }
    n_prefill_reused_ = n_keep;
    int32_t n_decodes = 0;
    for (int32_t i = n_keep; i < n_prefill; i += params_.n_batch, ++n_decodes) {
        decode_seq(prompt.data() + i, std::min(params_.n_batch, n_prefill - i), i, false);
    }
    return n_decodes;
}

const float* Model::logits(int32_t i) const {
    if (last_decode_argmax_) {
        throw InvalidArgumentError("no logits rows: the last decode took their argmax on the backend "
                                   "(set_backend_argmax(false) keeps them)");
    }
    if (i < 0 || i >= n_outputs_) {
        throw InvalidArgumentError("logits row " + std::to_string(i) + " out of range [0, " +
                                   std::to_string(n_outputs_) + ")");
    }
    const float* row = llama_get_logits_ith(ctx_, output_index_[size_t(i)]);
    if (!row) throw DecodeError(with_reason("llama.cpp has no logits for output row " + std::to_string(i)));
    return row;
}

bool Model::set_backend_argmax(bool on) {
    if (on == backend_argmax_) return true;
    const int32_t n_seq = std::max(params_.n_seq_max, 1);
    if (!on) {
        for (int32_t s = 0; s < n_seq; ++s) llama_set_sampler(ctx_, s, nullptr);
        backend_argmax_ = false;
        return true;
    }
    // A chain is initialised for the backend once (llama.cpp asserts on a second time): new
    // chains each time it is switched on. The context holds none of the old ones by now.
    for (llama_sampler* sampler : argmax_samplers_) llama_sampler_free(sampler);
    argmax_samplers_.clear();
    for (int32_t s = 0; s < n_seq; ++s) {
        llama_sampler* chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        argmax_samplers_.push_back(chain);
    }
    for (int32_t s = 0; s < n_seq; ++s) {
        if (!llama_set_sampler(ctx_, s, argmax_samplers_[size_t(s)])) {
            for (int32_t u = 0; u <= s; ++u) llama_set_sampler(ctx_, u, nullptr);
            return false;
        }
    }
    backend_argmax_ = true;
    return true;
}

bool Model::output_on_gpu() const {
    if (params_.n_gpu_layers == 0 || !params_.rpc_servers.empty()) return false;
    if (params_.n_gpu_layers > 0 && params_.n_gpu_layers <= n_layer()) return false;  // the output layer stays
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        if (ggml_backend_dev_type(ggml_backend_dev_get(i)) == GGML_BACKEND_DEVICE_TYPE_GPU) return true;
    }
    return false;
}

int32_t Model::argmax_token(int32_t i) const {
    if (!last_decode_argmax_) {
        throw InvalidArgumentError("no backend argmax: the last decode ran with backend argmax off");
    }
    if (i < 0 || i >= n_outputs_) {
        throw InvalidArgumentError("argmax row " + std::to_string(i) + " out of range [0, " +
                                   std::to_string(n_outputs_) + ")");
    }
    const llama_token token = llama_get_sampled_token_ith(ctx_, output_index_[size_t(i)]);
    if (token == LLAMA_TOKEN_NULL) {
        throw DecodeError(with_reason("llama.cpp has no backend argmax for output row " + std::to_string(i)));
    }
    return token;
}

void Model::set_hidden_output(bool on) {
    if (on == hidden_output_) return;
    llama_set_embeddings(ctx_, on);
    hidden_output_ = on;
}

int32_t Model::n_hidden() const { return llama_model_n_embd_out(model_); }

const float* Model::hidden(int32_t i) const {
    if (!last_decode_hidden_) {
        throw InvalidArgumentError("no hidden states: the last decode ran with hidden output off");
    }
    if (i < 0 || i >= n_outputs_) {
        throw InvalidArgumentError("hidden row " + std::to_string(i) + " out of range [0, " +
                                   std::to_string(n_outputs_) + ")");
    }
    const float* row = llama_get_embeddings_ith(ctx_, output_index_[size_t(i)]);
    if (!row) throw DecodeError(with_reason("llama.cpp returned no hidden state for row " + std::to_string(i)));
    return row;
}

void Model::kv_remove(int32_t seq_id, int32_t p0, int32_t p1) {
    if (!llama_memory_seq_rm(llama_get_memory(ctx_), seq_id, p0, p1)) {
        throw DecodeError("llama.cpp cannot drop positions [" + std::to_string(p0) + ", " +
                          (p1 < 0 ? std::string("end") : std::to_string(p1)) + ") of sequence " +
                          std::to_string(seq_id) + " of " + path_ + ": its memory keeps a recurrent state");
    }
    kv_record_remove(seq_id, p0, p1);
}

bool Model::drops_positions() const {
    return !llama_model_is_recurrent(model_) && !llama_model_is_hybrid(model_);
}

void Model::kv_copy(int32_t seq_src, int32_t seq_dst, int32_t p0, int32_t p1) {
    llama_memory_seq_cp(llama_get_memory(ctx_), seq_src, seq_dst, p0, p1);
    const std::vector<int32_t>& src = kv_tokens_.at(size_t(seq_src));
    std::vector<int32_t>& dst = kv_tokens_.at(size_t(seq_dst));
    const int32_t end = std::min<int32_t>(int32_t(src.size()), p1 < 0 ? INT32_MAX : p1);
    for (int32_t pos = std::max(p0, 0); pos < end; ++pos) {
        if (src[size_t(pos)] < 0) continue;
        if (int32_t(dst.size()) <= pos) dst.resize(size_t(pos) + 1, -1);
        dst[size_t(pos)] = src[size_t(pos)];
    }
}

void Model::kv_keep(int32_t seq_id) {
    llama_memory_seq_keep(llama_get_memory(ctx_), seq_id);
    for (size_t s = 0; s < kv_tokens_.size(); ++s) {
        if (int32_t(s) != seq_id) kv_tokens_[s].clear();
    }
}

void Model::kv_clear() {
    llama_memory_clear(llama_get_memory(ctx_), true);
    for (auto& held : kv_tokens_) held.clear();
    kv_known_ = true;
}

int32_t Model::kv_pos_max(int32_t seq_id) const {
    return llama_memory_seq_pos_max(llama_get_memory(ctx_), seq_id);
}

void Model::kv_drop_side_sequences() {
    bool any = !kv_known_;
    for (size_t s = 1; s < kv_tokens_.size() && !any; ++s) any = !kv_tokens_[s].empty();
    if (any) kv_keep(0);
}

std::vector<int32_t> Model::cached_tokens() const {
    if (!kv_known_) return {};
    const std::vector<int32_t>& held = kv_tokens_[0];
    const auto gap = std::find(held.begin(), held.end(), -1);
    return std::vector<int32_t>(held.begin(), gap);
}

void Model::kv_record_remove(int32_t seq_id, int32_t p0, int32_t p1) {
    for (size_t s = 0; s < kv_tokens_.size(); ++s) {
        if (seq_id >= 0 && int32_t(s) != seq_id) continue;
        std::vector<int32_t>& held = kv_tokens_[s];
        const int32_t begin = std::max(p0, 0);
        const int32_t end = std::min<int32_t>(int32_t(held.size()), p1 < 0 ? INT32_MAX : p1);
        for (int32_t pos = begin; pos < end; ++pos) held[size_t(pos)] = -1;
        while (!held.empty() && held.back() < 0) held.pop_back();
    }
}

void check_vocab_compatible(const Model& target, const Model& draft) {
    const llama_vocab* tv = llama_model_get_vocab(target.raw_model());
    const llama_vocab* dv = llama_model_get_vocab(draft.raw_model());
    const std::string where = " (target " + target.path() + ", draft " + draft.path() + ")";
    if (llama_vocab_type(tv) != llama_vocab_type(dv)) {
        throw VocabMismatchError("vocabulary types differ: target " + std::to_string(llama_vocab_type(tv)) +
                                 ", draft " + std::to_string(llama_vocab_type(dv)) + where);
    }
    if (target.n_vocab() != draft.n_vocab()) {
        throw VocabMismatchError("vocabulary sizes differ: target " + std::to_string(target.n_vocab()) +
                                 ", draft " + std::to_string(draft.n_vocab()) + where);
    }
    const struct { const char* name; llama_token (*get)(const llama_vocab*); } specials[] = {
        {"bos", llama_vocab_bos}, {"eos", llama_vocab_eos}, {"eot", llama_vocab_eot},
    };
    for (const auto& s : specials) {
        if (s.get(tv) != s.get(dv)) {
            throw VocabMismatchError(std::string("special token ") + s.name + " differs: target " +
                                     std::to_string(s.get(tv)) + ", draft " + std::to_string(s.get(dv)) + where);
        }
    }
    if (llama_vocab_get_add_bos(tv) != llama_vocab_get_add_bos(dv)) {
        throw VocabMismatchError("add_bos differs between target and draft" + where);
    }
    for (int32_t t = 0; t < target.n_vocab(); ++t) {
        const char* a = llama_vocab_get_text(tv, t);
        const char* b = llama_vocab_get_text(dv, t);
        if (std::strcmp(a ? a : "", b ? b : "") != 0) {
            throw VocabMismatchError("token " + std::to_string(t) + " differs: target '" + (a ? a : "") +
                                     "', draft '" + (b ? b : "") + "'" + where);
        }
    }
}

std::string backend_description() {
    log_capture_install();  // initialises the backends
    return llama_print_system_info();
}

}  // namespace spec
