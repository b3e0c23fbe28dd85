#include "spec/log.h"

#include <deque>
#include <mutex>

#include "llama.h"

namespace spec {
namespace {

constexpr size_t kMaxLines = 2000;     // drainable buffer bound: oldest lines are dropped
constexpr size_t kMaxRecentErrors = 8;

std::mutex g_mutex;
std::deque<LogLine> g_lines;
std::deque<std::string> g_recent_errors;
std::string g_partial;      // llama.cpp emits lines in pieces; join until '\n'
int g_partial_level = 2;

void on_log(ggml_log_level level, const char* text, void* /*user_data*/) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (level != GGML_LOG_LEVEL_CONT && g_partial.empty()) g_partial_level = int(level);
    g_partial += text ? text : "";
    size_t nl;
    while ((nl = g_partial.find('\n')) != std::string::npos) {
        std::string line = g_partial.substr(0, nl);
        g_partial.erase(0, nl + 1);
        if (line.empty()) continue;
        if (g_partial_level >= GGML_LOG_LEVEL_WARN) {
            g_recent_errors.push_back(line);
            if (g_recent_errors.size() > kMaxRecentErrors) g_recent_errors.pop_front();
        }
        g_lines.push_back({g_partial_level, std::move(line)});
        if (g_lines.size() > kMaxLines) g_lines.pop_front();
    }
}

}  // namespace

void log_capture_install() {
    static std::once_flag once;
    std::call_once(once, [] { llama_backend_init(); });
    // Set on every model load, not once: another user of libllama in the process (importing
    // llama_cpp does this) may have installed its own callback since.
    llama_log_set(on_log, nullptr);
}

std::vector<LogLine> log_drain() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<LogLine> out(g_lines.begin(), g_lines.end());
    g_lines.clear();
    return out;
}

std::string log_take_recent_errors() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::string out;
    for (const auto& line : g_recent_errors) {
        if (!out.empty()) out += "\n";
        out += line;
    }
    g_recent_errors.clear();
    return out;
}

}  // namespace spec
