// llama.cpp's log, captured. The engine installs one llama_log_set callback that keeps recent
// lines in a bounded, thread-safe buffer; the Python layer drains it into `logging`. Nothing is
// written to stdout or stderr by the engine.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace spec {

// Levels as ggml numbers them: 1 debug, 2 info, 3 warn, 4 error (0/5: none/continuation).
struct LogLine {
    int level;
    std::string text;
};

// (Re)installs the capture callback and initialises the llama backend once. Model loads call it.
void log_capture_install();

// Returns and clears the buffered lines, oldest first.
std::vector<LogLine> log_drain();

// The most recent warning/error lines llama.cpp logged on the calling thread (kept apart from
// the drainable buffer so that an exception message can quote why llama.cpp refused a file),
// newline-joined; clears them. Other threads' lines are neither returned nor cleared.
std::string log_take_recent_errors();

}  // namespace spec
