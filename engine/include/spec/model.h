// A loaded GGUF model and its context: everything the engine does with llama.cpp goes through
// here. Owns its llama handles (RAII); not copyable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_batch;
struct llama_sampler;

namespace spec {

struct ModelParams {
    int32_t n_ctx = 4096;       // context window in tokens (0: the model's training context)
    int32_t n_batch = 512;      // largest batch given to one decode (prompt chunks are this size);
                                // llama.cpp caps it at n_ctx: Model::params() holds the capped value
    int32_t n_seq_max = 1;      // sequences in the (unified) KV cache; trees need more than one.
                                // At most the (capped) n_batch: llama.cpp keeps an output row each
    int32_t n_threads = 0;      // 0: hardware concurrency
    int32_t n_gpu_layers = 0;   // layers offloaded to a GPU backend when llama.cpp has one
                                // (or to the RPC servers); -1: all of them
    // llama.cpp rpc-servers ("host:port") that hold the offloaded layers (n_gpu_layers of them,
    // split by the servers' free memory), before any local GPU. Empty: this machine only.
    // Needs a libllama built with -DGGML_RPC=on (spec/rpc.h).
    std::vector<std::string> rpc_servers;
    bool use_mmap = true;
    // llama.cpp's extra CPU buffer types (weight repacking, AMX). Faster one-token decoding, but
    // batched and one-token logits then differ more (docs/numerics.md), and ggml's AMX path
    // faults on some virtual machines: the Python layer turns it off where AMX is present.
    bool use_extra_bufts = true;
    // With use_extra_bufts off on a CPU-only model: still repack the matmul weights ggml repacks on
    // x86 (Q4_0, Q4_K, ... into its CPU_REPACK buffer type), without the AMX buffer type.
    bool repack_weights = false;
    // Ask Linux for transparent huge pages on the buffers llama.cpp allocates for this model and
    // its context (model.cpp): fewer TLB misses when a decode streams the weights.
    bool huge_pages = true;
    // llama.cpp's flash attention. On the tiny f32 test models it widens the batched-vs-one-token
    // logit difference (6.5e-3 vs 9.4e-4 without); on the Q4_K_M target it does not (fewer argmax
    // flips, all near-ties: docs/numerics.md), but on the CPU it is slower at long contexts: off
    // unless asked for (Engine(flash_attn=True), --flash-attn).
    bool flash_attn = false;
    // Prefix cache: prefill_prompt keeps the cached tokens of sequence 0 that start the new
    // prompt and evaluates only the rest (false: every prefill starts from an empty cache).
    bool reuse_prefix = true;
};

// One entry of a batch: a token at a position, in one or more sequences, optionally producing a
// logits row.
struct BatchToken {
    int32_t token;
    int32_t pos;
    std::vector<int32_t> seq_ids;  // default: {0}
    bool output;
};

// Names of llama.cpp's built-in chat templates (what Model::apply_chat_template's tmpl accepts
// besides template text), e.g. "chatml", "llama3".
std::vector<std::string> chat_builtin_templates();

class Model {
public:
    // Loads `path` and creates a context. Throws ModelLoadError (missing file, not GGUF, truncated,
    // rejected by llama.cpp: the message quotes llama.cpp's reason) or InvalidArgumentError (a
    // negative size, more sequences than the batch has rows).
    Model(const std::string& path, const ModelParams& params);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const std::string& path() const { return path_; }
    const ModelParams& params() const { return params_; }
    int32_t n_vocab() const { return n_vocab_; }
    const llama_vocab* vocab() const { return vocab_; }
    int32_t n_ctx() const;
    // Weight tensors placed in ggml's CPU_REPACK buffer type by ModelParams::repack_weights (0: none).
    int32_t n_repacked() const { return n_repacked_; }
    int32_t n_layer() const;
    int32_t n_embd() const;
    std::string description() const;
    // What the time of a decode depends on besides the machine and the context settings:
    // llama.cpp's description (architecture, size class, file type), tensor bytes, parameter
    // count, layers, width and vocabulary. Two files with the same signature hold tensors of the
    // same types and shapes (e.g. a fine-tuned draft written in its source's quantization), so
    // a cost curve measured for one holds for the other.
    std::string cost_signature() const;

    // Tokenize UTF-8 text. add_special: BOS if the model wants one; parse_special: turn special
    // token text such as "<|im_start|>" into the special token.
    std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const;
    // The bytes of one token (special tokens rendered as text when `special`). May be a partial
    // UTF-8 sequence: callers that stream must hold back incomplete sequences.
    // Throws InvalidArgumentError for a token outside [0, n_vocab) (also is_eog, token_text).
    std::string token_to_piece(int32_t token, bool special = false) const;
    std::string detokenize(const std::vector<int32_t>& tokens, bool special = false) const;
    bool is_eog(int32_t token) const;
    // Every control or end-of-generation token of the vocabulary (chat-template delimiters,
    // end of text), increasing.
    std::vector<int32_t> control_tokens() const;
    // The tokens whose text holds a blank line ("\n\n"), those whose text starts with a
    // character other than whitespace and, when fence is given, those whose text begins with a
    // code fence ("```") (LookupParams::blank_line_tokens / unit_start_tokens / fence_tokens),
    // each increasing; control tokens are in none. One pass over the vocabulary's pieces.
    void layout_tokens(std::vector<int32_t>* blank_line, std::vector<int32_t>* unit_start,
                       std::vector<int32_t>* fence = nullptr) const;
    std::string token_text(int32_t token) const;  // the vocabulary entry as stored in the GGUF

    // Formats a conversation with llama.cpp's built-in chat templates (llama_chat_apply_template).
    // messages: (role, content) pairs. tmpl: a built-in template's name (llama_chat_builtin_templates)
    // or template text that llama.cpp recognises; "" = the model's own. Throws InvalidArgumentError
    // when the model has no template or llama.cpp does not support it.
    std::string apply_chat_template(const std::vector<std::pair<std::string, std::string>>& messages,
                                    bool add_assistant, const std::string& tmpl = "") const;
    // The model's tokenizer.chat_template metadata (Jinja text); "" when the file has none.
    std::string chat_template() const;

    // Special token ids of the vocabulary; -1 where the vocabulary has none.
    struct SpecialTokens {
        int32_t bos = -1, eos = -1, eot = -1;
        int32_t fim_prefix = -1, fim_suffix = -1, fim_middle = -1;  // fill-in-the-middle markers
        bool add_bos = false;  // tokenize(..., add_special=true) puts bos first
    };
    SpecialTokens special_tokens() const;

    // Runs one decode. Rows of logits are produced for the tokens with output=true, in batch order;
    // read them with logits(i) (i = index among the output rows). Throws ContextOverflowError when
    // the KV cache has no room, DecodeError otherwise. Batches larger than n_batch are an error.
    void decode(const std::vector<BatchToken>& batch);
    // The same for the first n entries of `batch` ([n]): a caller that refills one buffer of
    // entries every step keeps the entries past n (and their sequence-id vectors) for later.
    void decode(const BatchToken* batch, int32_t n);
    // Convenience: tokens at consecutive positions from `pos0` in sequence 0; only the last
    // produces logits unless all_logits.
    void decode_seq(const int32_t* tokens, int32_t n_tokens, int32_t pos0, bool all_logits);

    // Leaves exactly the prompt's tokens but the last in sequence 0 of the KV cache, and nothing
    // in any other sequence: the last token starts the first step, with its logits. With
    // params().reuse_prefix the longest common prefix of the prompt and the tokens sequence 0
    // already holds (cached_tokens()) is kept and only the rest is decoded (chunks of n_batch,
    // no logits); otherwise the cache is cleared first. Returns the number of decode calls;
    // prefill_reused() tells how many tokens were kept.
    int32_t prefill_prompt(const std::vector<int32_t>& prompt);
    int32_t prefill_reused() const { return n_prefill_reused_; }

    // Logits row of the i-th output of the last successful decode (a failed decode leaves none).
    // Valid until the next decode. Throws InvalidArgumentError for i outside [0, n_outputs()),
    // or when the last decode ran with backend argmax on (no logits reached the host).
    // returns: [n_vocab] float32
    const float* logits(int32_t i) const;
    int32_t n_outputs() const { return n_outputs_; }

    // Backend argmax (llama.cpp's backend sampling: a greedy sampler on every sequence). While
    // on, each decode takes the argmax of every output row inside the model's graph, on the
    // device that computed the logits, and llama.cpp copies no logits row to the host: read the
    // tokens with argmax_token(i); logits(i) throws. For greedy decoding that needs nothing else
    // of a row (no logprobs, trace, grammar, penalties): the same tokens, without moving
    // [n_outputs, n_vocab] floats off a GPU and scanning them on the host. Switching costs
    // llama.cpp a new graph reservation, so callers leave it as it is between requests that
    // agree. Returns false, and stays off, where llama.cpp cannot run the sampler on the
    // model's output device.
    bool set_backend_argmax(bool on);
    bool backend_argmax() const { return backend_argmax_; }
    // Whether llama.cpp computes the output layer (the logits) on a GPU of this machine, where
    // backend argmax saves copying the rows to the host. llama.cpp offloads the output layer with
    // n_gpu_layers -1 or greater than the layer count. False with RPC servers, whose backend this
    // process cannot tell: on CPU rpc-servers over loopback backend argmax measured 1-4% slower a
    // step, as it does on the local CPU, where the sampler's graph nodes cost more than the
    // host's argmax of rows already in host memory (docs/cost-curves.md).
    bool output_on_gpu() const;
    // The argmax of the i-th output row of the last decode, taken on the backend. Throws
    // InvalidArgumentError when the last decode ran with backend argmax off or i is out of range.
    int32_t argmax_token(int32_t i) const;

    // Hidden states. While on, every decode also keeps the last-layer hidden state of each output
    // row: the final norm applied, so that logits(i) = output matrix x hidden(i) (+ the output
    // bias, where the model has one). llama.cpp then makes every token of a batch an output row
    // (prompt chunks too, which then pay for the vocabulary projection), so turn it on only
    // around the decodes that need it.
    void set_hidden_output(bool on);
    bool hidden_output() const { return hidden_output_; }
    int32_t n_hidden() const;  // the hidden state's width (llama_model_n_embd_out)
    // Hidden state of the i-th output of the last decode (same rows as logits). Valid until the
    // next decode. Throws InvalidArgumentError when hidden output was off for the last decode.
    // returns: [n_hidden] float32
    const float* hidden(int32_t i) const;

    // KV cache: drop positions [p0, p1) of a sequence (p1 < 0: to the end); copy; keep one.
    // kv_remove throws DecodeError where llama.cpp cannot drop them (see drops_positions).
    void kv_remove(int32_t seq_id, int32_t p0, int32_t p1 = -1);
    // False for models whose memory is a recurrent state (llama.cpp's recurrent and hybrid
    // models): they cannot drop the last positions, so neither roll back a rejected draft nor
    // reuse part of a cached prompt (prefill_prompt then starts from an empty cache).
    bool drops_positions() const;
    void kv_copy(int32_t seq_src, int32_t seq_dst, int32_t p0 = -1, int32_t p1 = -1);
    void kv_keep(int32_t seq_id);
    void kv_clear();
    int32_t kv_pos_max(int32_t seq_id) const;  // -1 when empty
    // Drops every sequence but 0 (tree branches); a no-op when none holds cells.
    void kv_drop_side_sequences();

    // The tokens sequence 0 holds at positions 0, 1, ... up to its first gap: what the next
    // prefill_prompt may reuse. Empty after a failed decode (the cache content is then unknown
    // and the next prefill starts from an empty cache).
    std::vector<int32_t> cached_tokens() const;

    llama_model* raw_model() const { return model_; }
    llama_context* raw_context() const { return ctx_; }

private:
    void check_token(int32_t token) const;

    std::string path_;
    ModelParams params_;
    llama_model* model_ = nullptr;
    llama_context* ctx_ = nullptr;
    const llama_vocab* vocab_ = nullptr;
    int32_t n_vocab_ = 0;
    int32_t n_repacked_ = 0;
    int32_t n_outputs_ = 0;
    std::vector<int32_t> output_index_;  // output row i -> batch index
    bool hidden_output_ = false;         // llama_set_embeddings, as last set
    bool last_decode_hidden_ = false;    // the last decode kept hidden states
    bool backend_argmax_ = false;        // greedy samplers set on every sequence
    bool last_decode_argmax_ = false;    // the last decode took its rows' argmax on the backend
    // One greedy sampler chain per sequence, kept alive while the context may use them.
    std::vector<llama_sampler*> argmax_samplers_;  // [n_seq_max]

    // What every KV sequence holds, by position (kv_tokens_[seq][pos], -1: no cell), updated by
    // each cache operation above, so that the prefix cache knows sequence 0 exactly.
    // [n_seq_max][up to the highest position]
    std::vector<std::vector<int32_t>> kv_tokens_;
    bool kv_known_ = true;  // false after a failed decode, until the cache is cleared
    int32_t n_prefill_reused_ = 0;
    void kv_record_remove(int32_t seq_id, int32_t p0, int32_t p1);
    std::unique_ptr<llama_batch> batch_;  // reused by decode(): n_batch tokens, n_seq_max ids each
};

// Throws VocabMismatchError naming the first difference (vocab type, size, a special token, or the
// first token whose text differs) when a draft cannot propose tokens for the target.
void check_vocab_compatible(const Model& target, const Model& draft);

// llama.cpp's description of the compute backends and CPU features in this process
// (llama_print_system_info): part of the key under which cost curves are cached.
std::string backend_description();

}  // namespace spec
