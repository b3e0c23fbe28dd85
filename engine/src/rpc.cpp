// llama.cpp's RPC backend, reached through ggml's backend registry (ggml-backend.h) so that the
// engine links no RPC symbol: a libllama without RPC loads and runs as before.

#include "spec/rpc.h"

#include <cerrno>
#include <cstring>
#include <set>

#include "ggml-backend.h"
#include "llama.h"
#include "spec/error.h"

#ifndef _WIN32
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

namespace spec {

namespace {

constexpr const char* kBuildHint =
    "rebuild llama-cpp-python with the RPC backend: CMAKE_ARGS=\"-DGGML_RPC=on\" pip install --force-reinstall "
    "--no-cache-dir --no-deps llama-cpp-python==0.3.36 (docs/install.md, \"Several machines (RPC)\")";

void split_endpoint(const std::string& endpoint, std::string& host, std::string& port) {
    const size_t colon = endpoint.find(':');
    host = endpoint.substr(0, colon);
    port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
}

#ifndef _WIN32
// A TCP connection to host:port within timeout_ms; "" when it was made, else why not.
std::string try_connect(const std::string& host, const std::string& port, int timeout_ms) {
    addrinfo hints{};
    hints.ai_family = AF_INET;  // ggml-rpc connects over IPv4
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
        return std::string("cannot resolve the host: ") + gai_strerror(rc);
    }
    std::string why = "no address";
    for (addrinfo* a = found; a; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            why = std::strerror(errno);
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            rc = poll(&p, 1, timeout_ms);
            if (rc == 0) {
                why = "no answer within " + std::to_string(timeout_ms) + " ms";
                rc = -1;
            } else if (rc > 0) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err != 0) why = std::strerror(err);
                rc = err == 0 ? 0 : -1;
            } else {
                why = std::strerror(errno);
            }
        } else if (rc != 0) {
            why = std::strerror(errno);
        }
        close(fd);
        if (rc == 0) {
            freeaddrinfo(found);
            return "";
        }
    }
    freeaddrinfo(found);
    return why;
}
#endif

}  // namespace

bool rpc_supported() { return llama_supports_rpc(); }

void check_rpc_endpoint(const std::string& endpoint) {
    std::string host, port;
    split_endpoint(endpoint, host, port);
    const bool port_digits = !port.empty() && port.size() <= 5 &&
                             port.find_first_not_of("0123456789") == std::string::npos;
    const long port_number = port_digits ? std::stol(port) : 0;
    if (host.empty() || endpoint.find(':') == std::string::npos || port_number < 1 || port_number > 65535) {
        throw InvalidArgumentError("RPC server '" + endpoint + "' is not host:port (a host name or IPv4 address, "
                                   "a port 1-65535), e.g. 127.0.0.1:50052");
    }
}

std::vector<ggml_backend_dev_t> rpc_devices(const std::vector<std::string>& endpoints, int timeout_ms) {
    std::set<std::string> seen;
    for (const std::string& endpoint : endpoints) {
        check_rpc_endpoint(endpoint);
        if (!seen.insert(endpoint).second) {
            throw InvalidArgumentError("RPC server '" + endpoint + "' is listed twice");
        }
    }
    if (endpoints.empty()) return {};
    ggml_backend_reg_t rpc = rpc_supported() ? ggml_backend_reg_by_name("RPC") : nullptr;
    using add_server_fn = ggml_backend_reg_t (*)(const char*);
    auto add_server = rpc ? reinterpret_cast<add_server_fn>(ggml_backend_reg_get_proc_address(
                                rpc, "ggml_backend_rpc_add_server"))
                          : nullptr;
    if (!add_server) {
        throw ModelLoadError("RPC servers were given, but this libllama was built without llama.cpp's RPC backend; " +
                             std::string(kBuildHint));
    }
    std::vector<ggml_backend_dev_t> devices;
    for (const std::string& endpoint : endpoints) {
#ifndef _WIN32
        std::string host, port;
        split_endpoint(endpoint, host, port);
        if (const std::string why = try_connect(host, port, timeout_ms); !why.empty()) {
            throw ModelLoadError("cannot reach the RPC server at " + endpoint + " (" + why +
                                 "); start llama.cpp's rpc-server there (pyspec rpc-server, or ggml-rpc-server -H "
                                 "HOST -p PORT)");
        }
#endif
        ggml_backend_reg_t server = add_server(endpoint.c_str());
        const size_t n = server ? ggml_backend_reg_dev_count(server) : 0;
        if (n == 0) {
            throw ModelLoadError("the RPC server at " + endpoint + " offers no device");
        }
        for (size_t i = 0; i < n; ++i) devices.push_back(ggml_backend_reg_dev_get(server, i));
    }
    return devices;
}

}  // namespace spec
