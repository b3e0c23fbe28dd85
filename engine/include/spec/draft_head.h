// A ReDrafter draft head: a small recurrent network that drafts from the target's last-layer
// hidden state (spec/model.h, Model::hidden), loaded from a head GGUF (architecture
// "redrafter_head", written by pyspec.head) and run with ggml on a backend of this process (the
// GPU when the target offloads layers to one, else the CPU).
//
// One step for each of n rows (beams), d = n_embd, V' = n_kept:
//     s' = silu(W e(token) + U s + b)                         state [d]
//     h  = [x, s'];  h <- h + silu(R_k h + c_k)  (k layers)    [2d]
//     logits = O (P h + p)   (shared output)   or   O' h       [V'], column c = token vocab()[c]
// where x is the target's hidden state of the row that chose the last committed token and e()
// the target's token embedding of the kept tokens (plus one row for any other token). The state
// starts at s = 0, so the first step reads only the last committed token.
//
// An EAGLE-class head without attention (architecture "eagle_head", pyspec.head.eagle with
// attention=False) has the same interface; its state is the feature it predicts:
//     z  = W_in [g, e(token)]                                   g: the state, [d]
//     h  = z + W_down (silu(W_gate n) * W_up n),  n = rmsnorm(z) * w_ff
//     g' = rmsnorm(h) * w_out;  logits = O g'                   [V']
// and it starts at g = x, the target's hidden state (initial_state), not at zero.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace spec {

class Model;

constexpr uint32_t kHeadFormatVersion = 1;

struct HeadParams {
    int32_t n_threads = 0;     // CPU backend threads (0: hardware concurrency)
    bool use_gpu = false;      // run on the first GPU device when llama.cpp has one
};

class DraftHead {
public:
    // Loads `path` and checks that it was trained for `target`. Throws HeadFileError (missing,
    // not GGUF, not a head, another format version, a missing or misshapen key or tensor,
    // truncated) or HeadMismatchError (trained for another target: name, architecture, layers,
    // width, vocabulary size or token texts differ; the message names the first difference).
    DraftHead(const std::string& path, const Model& target, const HeadParams& params);
    ~DraftHead();
    DraftHead(const DraftHead&) = delete;
    DraftHead& operator=(const DraftHead&) = delete;

    enum class Kind { Redrafter, Eagle };

    const std::string& path() const { return path_; }
    Kind kind() const { return kind_; }
    int32_t n_embd() const { return n_embd_; }
    int32_t n_kept() const { return int32_t(vocab_.size()); }
    int32_t n_res_layers() const { return n_res_; }  // 0 for an EAGLE-class head
    // [n_kept] target token id of each logits column
    const std::vector<int32_t>& vocab() const { return vocab_; }
    // The embedding row of a target token: its column for kept tokens, n_kept for any other.
    int32_t row_of(int32_t token) const;
    std::string backend_name() const;

    // The state of n rows before their first step: zeros (ReDrafter) or the hidden states
    // themselves (EAGLE: the feature the first step continues from). hidden, state: [n, n_embd].
    void initial_state(const float* hidden, float* state, int32_t n) const;

    // One draft step for n rows at once (n >= 1).
    // hidden: [n, n_embd] the target hidden state each row drafts from
    // state:  [n, n_embd] the rows' recurrent state, updated in place (initial_state before the
    //         first step)
    // rows:   [n] embedding row of each row's previous token (row_of), in [0, n_kept]:
    //         InvalidArgumentError otherwise
    // logits: [n, n_kept] written
    void step(const float* hidden, float* state, const int32_t* rows, int32_t n, float* logits);

private:
    struct Impl;
    std::string path_;
    Kind kind_ = Kind::Redrafter;
    int32_t n_embd_ = 0;
    int32_t n_res_ = 0;
    std::vector<int32_t> vocab_;
    std::vector<int32_t> row_of_;  // [target n_vocab]
    std::unique_ptr<Impl> impl_;
};

// FNV-1a 64 over every token text of the model followed by a zero byte, as 16 hex digits: the
// vocabulary fingerprint a head file records for its target.
std::string vocab_fingerprint(const Model& model);

}  // namespace spec
