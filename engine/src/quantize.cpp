#include "spec/quantize.h"

#include <cstring>
#include <fstream>

#include "llama.h"
#include "spec/error.h"
#include "spec/log.h"

namespace spec {
namespace {

// An anchored regular expression that matches exactly `name` (llama.cpp matches tensor
// overrides with std::regex_search).
std::string exact_pattern(const std::string& name) {
    std::string pattern = "^";
    for (const char c : name) {
        if (std::strchr(".^$|()[]{}*+?\\", c)) pattern += '\\';
        pattern += c;
    }
    return pattern + "$";
}

}  // namespace

void quantize_model(const std::string& in, const std::string& out, const QuantizeParams& params) {
    const char* file_type_name = llama_ftype_name(static_cast<llama_ftype>(params.file_type));
    if (params.file_type < 0 || params.file_type >= LLAMA_FTYPE_GUESSED || std::strncmp(file_type_name, "unknown", 7) == 0) {
        throw InvalidArgumentError("unknown llama.cpp file type " + std::to_string(params.file_type));
    }
    if (params.n_threads < 0) throw InvalidArgumentError("n_threads must be >= 0, got " + std::to_string(params.n_threads));
    std::vector<std::string> patterns;
    patterns.reserve(params.tensor_types.size());
    std::vector<llama_model_tensor_override> overrides;
    for (const auto& [name, type] : params.tensor_types) {
        if (type < 0 || type >= GGML_TYPE_COUNT) {
            throw InvalidArgumentError("tensor " + name + ": unknown ggml type " + std::to_string(type));
        }
        patterns.push_back(exact_pattern(name));
    }
    for (size_t i = 0; i < patterns.size(); ++i) {
        overrides.push_back({patterns[i].c_str(), static_cast<ggml_type>(params.tensor_types[i].second)});
    }
    overrides.push_back({nullptr, GGML_TYPE_COUNT});
    if (!std::ifstream(in, std::ios::binary)) throw ModelLoadError("model file not found or unreadable: " + in);

    log_capture_install();
    log_take_recent_errors();
    llama_model_quantize_params qparams = llama_model_quantize_default_params();
    qparams.nthread = params.n_threads;
    qparams.ftype = static_cast<llama_ftype>(params.file_type);
    qparams.allow_requantize = false;
    qparams.tt_overrides = params.tensor_types.empty() ? nullptr : overrides.data();
    if (llama_model_quantize(in.c_str(), out.c_str(), &qparams) != 0) {
        const std::string reason = log_take_recent_errors();
        throw ModelLoadError("llama.cpp could not quantize " + in + " to " + out + " (" + file_type_name + ")" +
                             (reason.empty() ? "" : "\nllama.cpp: " + reason));
    }
    log_take_recent_errors();  // the per-tensor override notices are not errors
}

}  // namespace spec
