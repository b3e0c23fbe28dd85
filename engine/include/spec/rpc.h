// llama.cpp's RPC backend: a target's layers on other machines, each running llama.cpp's
// rpc-server (ggml-rpc). Only libllama builds made with -DGGML_RPC=on have it.
#pragma once

#include <string>
#include <vector>

struct ggml_backend_device;

namespace spec {

// Whether the loaded libllama was built with the RPC backend.
bool rpc_supported();

// "host:port" checked for its shape as ggml-rpc reads it: a non-empty host name or IPv4 address
// without ':' and a port 1-65535. Throws InvalidArgumentError naming the endpoint otherwise.
void check_rpc_endpoint(const std::string& endpoint);

// The devices of the rpc-servers at `endpoints` ("host:port" each), in that order, ready for
// llama_model_params.devices. Before llama.cpp is handed an endpoint, the endpoint is checked and
// a TCP connection to it is tried (ggml-rpc aborts the process on a server it cannot reach):
// throws InvalidArgumentError for a malformed or repeated endpoint, ModelLoadError when this
// libllama has no RPC backend (how to build one is in the message) or a server does not answer
// within timeout_ms. The devices live as long as the process (llama.cpp keeps one per endpoint).
std::vector<ggml_backend_device*> rpc_devices(const std::vector<std::string>& endpoints, int timeout_ms = 5000);

}  // namespace spec
