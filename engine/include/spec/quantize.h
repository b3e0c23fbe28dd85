// Writing a GGUF model in another tensor type with llama.cpp's own quantizer
// (llama_model_quantize): how a trained draft, exported in float32, goes back to the
// quantization it was loaded from (K-quants included), or to any type llama.cpp writes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spec {

struct QuantizeParams {
    // llama_ftype (LLAMA_FTYPE_MOSTLY_Q5_0 = 8, ...): the output's general.file_type and the
    // mix llama.cpp picks for every tensor not named in tensor_types.
    int32_t file_type = 7;
    // Exact tensor name -> ggml_type (GGML_TYPE_Q5_0 = 6, ...): overrides the mix, e.g. to keep
    // each tensor of a source file in its own type. Types llama.cpp cannot use for a tensor's
    // row size fall back as its quantizer decides. Only for quantized file types (the override
    // applies where the mix would quantize).
    std::vector<std::pair<std::string, int32_t>> tensor_types;
    int32_t n_threads = 0;  // 0: hardware concurrency
};

// Writes `out` = the model at `in` with its tensors converted as `params` says (1-D tensors
// such as norms stay as they are). `in` should hold F32 or F16 tensors: requantizing quantized
// tensors loses precision twice and is refused. Throws InvalidArgumentError for an unknown
// file or tensor type, ModelLoadError when llama.cpp cannot read `in` or write `out` (the
// message quotes llama.cpp's reason).
void quantize_model(const std::string& in, const std::string& out, const QuantizeParams& params);

}  // namespace spec
