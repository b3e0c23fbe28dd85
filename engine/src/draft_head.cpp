// The draft head's weights (a head GGUF read with gguf.h) and its step as a ggml graph on a
// ggml backend (spec/draft_head.h). Only the headers libllama installs are used: ggml.h,
// ggml-alloc.h, ggml-backend.h, gguf.h.
#include "spec/draft_head.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <thread>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "spec/error.h"
#include "spec/log.h"
#include "spec/model.h"

namespace spec {
namespace {

constexpr const char* kRedrafterArch = "redrafter_head";
constexpr const char* kEagleArch = "eagle_head";
// Graph nodes of one step: inputs, the RNN (or the EAGLE layer), per ResNet layer 4, output map
// and projection.
constexpr size_t kGraphTensorsBase = 40;
constexpr size_t kGraphTensorsPerLayer = 4;

// Typed access to the head file's metadata; every failure names the file and the key.
class HeadKeys {
public:
    HeadKeys(const gguf_context* ctx, const std::string& path) : ctx_(ctx), path_(path) {}

    int64_t find(const std::string& name, gguf_type type) const {
        const int64_t id = gguf_find_key(ctx_, name.c_str());
        if (id < 0) throw HeadFileError(path_ + ": key " + name + " missing");
        if (gguf_get_kv_type(ctx_, id) != type) {
            throw HeadFileError(path_ + ": key " + name + " has type " + gguf_type_name(gguf_get_kv_type(ctx_, id)) +
                                ", expected " + gguf_type_name(type));
        }
        return id;
    }
    uint32_t u32(const std::string& name) const { return gguf_get_val_u32(ctx_, find(name, GGUF_TYPE_UINT32)); }
    bool boolean(const std::string& name) const { return gguf_get_val_bool(ctx_, find(name, GGUF_TYPE_BOOL)); }
    std::string str(const std::string& name) const { return gguf_get_val_str(ctx_, find(name, GGUF_TYPE_STRING)); }

private:
    const gguf_context* ctx_;
    const std::string& path_;
};

std::string model_meta(const Model& model, const char* name) {
    char buf[512];
    const int32_t n = llama_model_meta_val_str(model.raw_model(), name, buf, sizeof(buf));
    return n < 0 ? std::string() : std::string(buf, size_t(std::min<int32_t>(n, int32_t(sizeof(buf)) - 1)));
}

ggml_backend_dev_t pick_device(bool use_gpu) {
    if (use_gpu) {
        if (ggml_backend_dev_t gpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU)) return gpu;
    }
    return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
}

}  // namespace

struct DraftHead::Impl {
    gguf_context* file = nullptr;
    ggml_context* weights = nullptr;  // the file's tensors (metadata here, data in `buffer`)
    ggml_backend_t backend = nullptr;
    ggml_backend_buffer_t buffer = nullptr;
    ggml_gallocr_t allocr = nullptr;
    ggml_tensor* embd = nullptr;       // [d, V' + 1]
    ggml_tensor* rnn_w = nullptr;      // [d, d]
    ggml_tensor* rnn_u = nullptr;      // [d, d]
    ggml_tensor* rnn_b = nullptr;      // [d]
    std::vector<ggml_tensor*> res_w;   // [2d, 2d] each
    std::vector<ggml_tensor*> res_b;   // [2d] each
    ggml_tensor* out_proj = nullptr;   // shared output: [2d, d]
    ggml_tensor* out_proj_b = nullptr; // shared output: [d]
    ggml_tensor* output = nullptr;     // [k, V'] (null: shared and tied, the embedding rows)
    bool share_output = true;
    // EAGLE-class head (ggml order)
    ggml_tensor* w_in = nullptr;       // [2d, d]
    ggml_tensor* ff_norm = nullptr;    // [d]
    ggml_tensor* w_gate = nullptr;     // [d, n_ff]
    ggml_tensor* w_up = nullptr;       // [d, n_ff]
    ggml_tensor* w_down = nullptr;     // [n_ff, d]
    ggml_tensor* out_norm = nullptr;   // [d]
    float norm_eps = 1e-6f;
    std::vector<uint8_t> graph_meta;   // ggml_context memory for one step's graph (no data)

    ~Impl() {
        if (allocr) ggml_gallocr_free(allocr);
        if (buffer) ggml_backend_buffer_free(buffer);
        if (backend) ggml_backend_free(backend);
        if (weights) ggml_free(weights);
        if (file) gguf_free(file);
    }
};

DraftHead::DraftHead(const std::string& path, const Model& target, const HeadParams& params)
    : path_(path), impl_(std::make_unique<Impl>()) {
    {
        std::ifstream probe(path, std::ios::binary);
        if (!probe) throw HeadFileError("head file not found or unreadable: " + path);
        char magic[4] = {0, 0, 0, 0};
        probe.read(magic, 4);
        if (probe.gcount() < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
            throw HeadFileError("not a GGUF file (bad magic): " + path);
        }
    }
    log_capture_install();
    Impl& im = *impl_;
    gguf_init_params init{true, &im.weights};
    im.file = gguf_init_from_file(path.c_str(), init);
    if (!im.file) throw HeadFileError("not a readable GGUF file: " + path);

    const HeadKeys keys(im.file, path);
    const std::string arch = keys.str("general.architecture");
    if (arch != kRedrafterArch && arch != kEagleArch) {
        throw HeadFileError(path + ": architecture '" + arch + "', not a draft head ('" + kRedrafterArch + "' or '" +
                            kEagleArch + "')");
    }
    kind_ = arch == kEagleArch ? Kind::Eagle : Kind::Redrafter;
    const auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
    const uint32_t version = keys.u32(key("format_version"));
    if (version != kHeadFormatVersion) {
        throw HeadFileError(path + ": head format version " + std::to_string(version) + ", this engine reads " +
                            std::to_string(kHeadFormatVersion));
    }
    n_embd_ = int32_t(keys.u32(key("embedding_length")));
    const int32_t n_kept = int32_t(keys.u32(key("kept_vocab_size")));
    const bool tied = keys.boolean(key("output_tied"));
    int64_t n_ff = 0;
    if (kind_ == Kind::Redrafter) {
        n_res_ = int32_t(keys.u32(key("block_count")));
        im.share_output = keys.boolean(key("share_output"));
    } else {
        n_ff = int64_t(keys.u32(key("feed_forward_length")));
        im.norm_eps = gguf_get_val_f32(im.file, keys.find(key("norm_epsilon"), GGUF_TYPE_FLOAT32));
    }

    // The target it was trained for: the first difference is the error.
    const auto mismatch = [&](const std::string& what, const std::string& head, const std::string& model) {
        throw HeadMismatchError(path + " was trained for another target: " + what + " '" + head + "', target " +
                                target.path() + " has '" + model + "'");
    };
    const std::string name = keys.str(key("target.name"));
    if (name != model_meta(target, "general.name")) mismatch("name", name, model_meta(target, "general.name"));
    const std::string target_arch = keys.str(key("target.architecture"));
    if (target_arch != model_meta(target, "general.architecture")) {
        mismatch("architecture", target_arch, model_meta(target, "general.architecture"));
    }
    const uint32_t n_layer = keys.u32(key("target.block_count"));
    if (int32_t(n_layer) != target.n_layer()) mismatch("layers", std::to_string(n_layer), std::to_string(target.n_layer()));
    if (n_embd_ != target.n_hidden()) mismatch("hidden width", std::to_string(n_embd_), std::to_string(target.n_hidden()));
    const uint32_t n_vocab = keys.u32(key("target.vocab_size"));
    if (int32_t(n_vocab) != target.n_vocab()) {
        mismatch("vocabulary size", std::to_string(n_vocab), std::to_string(target.n_vocab()));
    }
    const std::string hash = keys.str(key("target.vocab_hash"));
    if (hash != vocab_fingerprint(target)) mismatch("vocabulary fingerprint", hash, vocab_fingerprint(target));

    // Tensors and their shapes (ggml order: ne0 = row length).
    const int64_t d = n_embd_, d2 = 2 * int64_t(n_embd_), V = n_kept;
    const auto tensor = [&](const std::string& tname, int64_t ne0, int64_t ne1) {
        ggml_tensor* t = ggml_get_tensor(im.weights, tname.c_str());
        if (!t) throw HeadFileError(path + ": tensor " + tname + " missing");
        if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
            throw HeadFileError(path + ": tensor " + tname + " is [" + std::to_string(t->ne[0]) + ", " +
                                std::to_string(t->ne[1]) + "], expected [" + std::to_string(ne0) + ", " +
                                std::to_string(ne1) + "]");
        }
        return t;
    };
    ggml_tensor* vocab_tensor = tensor("head.vocab", V, 1);
    if (vocab_tensor->type != GGML_TYPE_I32) throw HeadFileError(path + ": tensor head.vocab must be I32");
    im.embd = tensor("head.token_embd.weight", d, V + 1);
    if (kind_ == Kind::Eagle) {
        im.w_in = tensor("head.w_in.weight", d2, d);
        im.ff_norm = tensor("head.ff_norm.weight", d, 1);
        im.w_gate = tensor("head.w_gate.weight", d, n_ff);
        im.w_up = tensor("head.w_up.weight", d, n_ff);
        im.w_down = tensor("head.w_down.weight", n_ff, d);
        im.out_norm = tensor("head.out_norm.weight", d, 1);
        if (!tied) im.output = tensor("head.output.weight", d, V);
    } else {
        im.rnn_w = tensor("head.rnn_w.weight", d, d);
        im.rnn_u = tensor("head.rnn_u.weight", d, d);
        im.rnn_b = tensor("head.rnn_u.bias", d, 1);
        for (int32_t k = 0; k < n_res_; ++k) {
            im.res_w.push_back(tensor("head.res." + std::to_string(k) + ".weight", d2, d2));
            im.res_b.push_back(tensor("head.res." + std::to_string(k) + ".bias", d2, 1));
        }
        if (im.share_output) {
            im.out_proj = tensor("head.out_proj.weight", d2, d);
            im.out_proj_b = tensor("head.out_proj.bias", d, 1);
            if (!tied) im.output = tensor("head.output.weight", d, V);
        } else {
            im.output = tensor("head.output.weight", d2, V);
        }
    }
    for (ggml_tensor* t : {im.rnn_b, im.out_proj_b, im.ff_norm, im.out_norm}) {
        if (t && t->type != GGML_TYPE_F32) {
            throw HeadFileError(path + ": vector " + ggml_get_name(t) + " must be F32");
        }
    }
    for (ggml_tensor* t : im.res_b) {
        if (t->type != GGML_TYPE_F32) throw HeadFileError(path + ": bias " + ggml_get_name(t) + " must be F32");
    }
    // Matrices go through ggml_get_rows and ggml_mul_mat, which take float and quantized types;
    // an integer or f64 matrix would reach a kernel ggml does not have and abort the process.
    std::vector<ggml_tensor*> matrices = {im.embd,   im.rnn_w,  im.rnn_u, im.out_proj, im.output,
                                          im.w_in,   im.w_gate, im.w_up,  im.w_down};
    matrices.insert(matrices.end(), im.res_w.begin(), im.res_w.end());
    for (ggml_tensor* t : matrices) {
        if (!t) continue;
        const bool float_type = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16;
        if (!float_type && !ggml_is_quantized(t->type)) {
            throw HeadFileError(path + ": tensor " + ggml_get_name(t) + " has type " + ggml_type_name(t->type) +
                                ", expected f32, f16, bf16 or a quantized type");
        }
    }

    // Backend, weights buffer, and the data from the file.
    ggml_backend_dev_t device = pick_device(params.use_gpu);
    if (!device) throw HeadFileError("no ggml device to run the head " + path + " on");
    im.backend = ggml_backend_dev_init(device, nullptr);
    if (!im.backend) throw HeadFileError(std::string("could not start the ggml backend ") + ggml_backend_dev_name(device));
    if (ggml_backend_dev_type(device) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        auto set_threads = reinterpret_cast<ggml_backend_set_n_threads_t>(
            ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(device), "ggml_backend_set_n_threads"));
        const int32_t n_threads = params.n_threads > 0 ? params.n_threads
                                                       : std::max(1, int32_t(std::thread::hardware_concurrency()));
        if (set_threads) set_threads(im.backend, n_threads);
    }
    im.buffer = ggml_backend_alloc_ctx_tensors(im.weights, im.backend);
    if (!im.buffer) throw HeadFileError("could not allocate the weights of " + path);
    std::ifstream file(path, std::ios::binary | std::ios::ate);
    const uint64_t file_size = uint64_t(file.tellg());
    const size_t data_offset = gguf_get_data_offset(im.file);
    std::vector<char> bytes;
    for (int64_t i = 0; i < gguf_get_n_tensors(im.file); ++i) {
        ggml_tensor* t = ggml_get_tensor(im.weights, gguf_get_tensor_name(im.file, i));
        const uint64_t offset = data_offset + gguf_get_tensor_offset(im.file, i);
        const size_t size = ggml_nbytes(t);
        if (offset + size > file_size) throw HeadFileError(path + ": truncated (tensor " + ggml_get_name(t) + ")");
        bytes.resize(size);
        file.seekg(std::streamoff(offset));
        file.read(bytes.data(), std::streamsize(size));
        if (!file) throw HeadFileError(path + ": read error at tensor " + std::string(ggml_get_name(t)));
        ggml_backend_tensor_set(t, bytes.data(), 0, size);
        if (t == vocab_tensor) {
            vocab_.resize(size_t(V));
            std::memcpy(vocab_.data(), bytes.data(), size);
        }
    }
    row_of_.assign(size_t(target.n_vocab()), n_kept);
    for (int32_t c = 0; c < n_kept; ++c) {
        const int32_t token = vocab_[size_t(c)];
        if (token < 0 || token >= target.n_vocab() || row_of_[size_t(token)] != n_kept) {
            throw HeadFileError(path + ": head.vocab entry " + std::to_string(c) + " (" + std::to_string(token) +
                                ") is outside the vocabulary or repeated");
        }
        row_of_[size_t(token)] = c;
    }
    im.allocr = ggml_gallocr_new(ggml_backend_get_default_buffer_type(im.backend));
    im.graph_meta.resize(ggml_tensor_overhead() * (kGraphTensorsBase + kGraphTensorsPerLayer * size_t(n_res_)) +
                         ggml_graph_overhead());
}

DraftHead::~DraftHead() = default;

int32_t DraftHead::row_of(int32_t token) const {
    return token >= 0 && token < int32_t(row_of_.size()) ? row_of_[size_t(token)] : n_kept();
}

void DraftHead::initial_state(const float* hidden, float* state, int32_t n) const {
    const size_t size = size_t(std::max(n, 0)) * size_t(n_embd_);
    if (kind_ == Kind::Eagle) {
        std::copy_n(hidden, size, state);
    } else {
        std::fill_n(state, size, 0.0f);
    }
}

std::string DraftHead::backend_name() const { return ggml_backend_name(impl_->backend); }

void DraftHead::step(const float* hidden, float* state, const int32_t* rows, int32_t n, float* logits) {
    if (n < 1) throw InvalidArgumentError("head step needs at least one row");
    Impl& im = *impl_;
    const int64_t d = n_embd_, V = n_kept();
    for (int32_t i = 0; i < n; ++i) {  // ggml_get_rows asserts (ends the process) outside the table
        if (rows[i] < 0 || rows[i] > V) {
            throw InvalidArgumentError("head step: row " + std::to_string(rows[i]) + " outside the embedding rows [0, " +
                                       std::to_string(V) + "] (row_of(token))");
        }
    }
    ggml_init_params init{im.graph_meta.size(), im.graph_meta.data(), true};
    ggml_context* ctx = ggml_init(init);
    if (!ctx) throw DecodeError("head: ggml_init failed");
    struct Free {
        ggml_context* c;
        ~Free() { ggml_free(c); }
    } free_ctx{ctx};

    ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n);
    ggml_tensor* s = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n);
    ggml_tensor* r = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    for (ggml_tensor* t : {x, s, r}) ggml_set_input(t);
    ggml_tensor* e = ggml_get_rows(ctx, im.embd, r);  // [d, n]
    ggml_tensor* s_new = nullptr;
    ggml_tensor* h = nullptr;
    ggml_tensor* output = im.output;
    if (kind_ == Kind::Eagle) {
        // x is not read: the state holds the feature, x itself before the first step.
        ggml_tensor* z = ggml_mul_mat(ctx, im.w_in, ggml_concat(ctx, s, e, 0));     // [d, n]
        ggml_tensor* m = ggml_mul(ctx, ggml_rms_norm(ctx, z, im.norm_eps), im.ff_norm);
        ggml_tensor* gated = ggml_mul(ctx, ggml_silu(ctx, ggml_mul_mat(ctx, im.w_gate, m)), ggml_mul_mat(ctx, im.w_up, m));
        ggml_tensor* a = ggml_add(ctx, z, ggml_mul_mat(ctx, im.w_down, gated));
        s_new = ggml_mul(ctx, ggml_rms_norm(ctx, a, im.norm_eps), im.out_norm);     // the next feature
        h = s_new;
        if (!output) output = ggml_view_2d(ctx, im.embd, d, V, im.embd->nb[1], 0);
    } else {
        ggml_tensor* a = ggml_add(ctx, ggml_add(ctx, ggml_mul_mat(ctx, im.rnn_w, e), ggml_mul_mat(ctx, im.rnn_u, s)),
                                  im.rnn_b);
        s_new = ggml_silu(ctx, a);
        h = ggml_concat(ctx, x, s_new, 0);  // [2d, n]
        for (size_t k = 0; k < im.res_w.size(); ++k) {
            h = ggml_add(ctx, h, ggml_silu(ctx, ggml_add(ctx, ggml_mul_mat(ctx, im.res_w[k], h), im.res_b[k])));
        }
        if (im.share_output) {
            h = ggml_add(ctx, ggml_mul_mat(ctx, im.out_proj, h), im.out_proj_b);  // [d, n]
            if (!output) output = ggml_view_2d(ctx, im.embd, d, V, im.embd->nb[1], 0);
        }
    }
    ggml_tensor* out = ggml_mul_mat(ctx, output, h);  // [V', n]
    ggml_set_output(s_new);
    ggml_set_output(out);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, s_new);
    ggml_build_forward_expand(graph, out);
    if (!ggml_gallocr_alloc_graph(im.allocr, graph)) throw DecodeError("head: could not allocate the step's graph");
    // x takes no part in an EAGLE step: the allocator leaves an unused input without memory.
    if (x->buffer) ggml_backend_tensor_set(x, hidden, 0, ggml_nbytes(x));
    ggml_backend_tensor_set(s, state, 0, ggml_nbytes(s));
    ggml_backend_tensor_set(r, rows, 0, ggml_nbytes(r));
    if (ggml_backend_graph_compute(im.backend, graph) != GGML_STATUS_SUCCESS) {
        throw DecodeError("head: graph compute failed on " + backend_name());
    }
    ggml_backend_tensor_get(s_new, state, 0, ggml_nbytes(s_new));
    ggml_backend_tensor_get(out, logits, 0, ggml_nbytes(out));
}

std::string vocab_fingerprint(const Model& model) {
    const llama_vocab* vocab = llama_model_get_vocab(model.raw_model());
    uint64_t h = 0xCBF29CE484222325ull;
    const auto mix = [&h](unsigned char byte) { h = (h ^ byte) * 0x100000001B3ull; };
    for (int32_t t = 0; t < model.n_vocab(); ++t) {
        const char* text = llama_vocab_get_text(vocab, t);
        for (const char* p = text ? text : ""; *p; ++p) mix(static_cast<unsigned char>(*p));
        mix(0);
    }
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

}  // namespace spec
