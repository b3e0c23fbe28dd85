#include "spec/log.h"

#include <deque>
#include <mutex>

#include "llama.h"
#include "spec/text_stream.h"

namespace spec {
namespace {

constexpr size_t kMaxLines = 2000;     // drainable buffer bound: oldest lines are dropped
constexpr size_t kMaxRecentErrors = 8;

std::mutex g_mutex;  // guards g_lines
std::deque<LogLine> g_lines;
// llama.cpp logs on the thread that does the work (a model load, a decode), so the pieces of a
// line and the reasons for a failure are kept per thread: a load on one thread never takes or
// clears another thread's reasons.
thread_local std::deque<std::string> t_recent_errors;
thread_local std::string t_partial;  // llama.cpp emits lines in pieces; join until '\n'
thread_local int t_partial_level = 2;

void on_log(ggml_log_level level, const char* text, void* /*user_data*/) {
    if (level != GGML_LOG_LEVEL_CONT && t_partial.empty()) t_partial_level = int(level);
    t_partial += text ? text : "";
    size_t nl;
    while ((nl = t_partial.find('\n')) != std::string::npos) {
        // Lines may quote bytes of a corrupt file (a key name): keep them valid UTF-8 text.
        std::string line = utf8_sanitize(t_partial.substr(0, nl));
        t_partial.erase(0, nl + 1);
        if (line.empty()) continue;
        if (t_partial_level >= GGML_LOG_LEVEL_WARN) {
            t_recent_errors.push_back(line);
            if (t_recent_errors.size() > kMaxRecentErrors) t_recent_errors.pop_front();
        }
        std::lock_guard<std::mutex> lock(g_mutex);
        g_lines.push_back({t_partial_level, std::move(line)});
        if (g_lines.size() > kMaxLines) g_lines.pop_front();
    }
}

}  // namespace

void log_capture_install() {
    static std::once_flag once;
    std::call_once(once, [] { llama_backend_init(); });
    // Checked on every model load, not once: another user of libllama in the process (importing
    // llama_cpp does this) may have installed its own callback since. Set only when it differs:
    // llama.cpp reads the callback without a lock while other threads decode.
    static std::mutex install_mutex;
    std::lock_guard<std::mutex> lock(install_mutex);
    ggml_log_callback current = nullptr;
    void* user_data = nullptr;
    llama_log_get(&current, &user_data);
    if (current != on_log) llama_log_set(on_log, nullptr);
}

std::vector<LogLine> log_drain() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<LogLine> out(g_lines.begin(), g_lines.end());
    g_lines.clear();
    return out;
}

std::string log_take_recent_errors() {
    std::string out;
    for (const auto& line : t_recent_errors) {
        if (!out.empty()) out += "\n";
        out += line;
    }
    t_recent_errors.clear();
    return out;
}

}  // namespace spec
