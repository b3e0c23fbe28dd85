// pyspec: speculative decoding on llama.cpp, as a C library.
//
// One engine holds a target model, optionally a draft model (named draft slots) and a draft
// head, a phrase pool shared by its requests, and what method "auto" has learnt. A generation
// handle holds one request's output and statistics.
//
// Conventions
//   - Every function that can fail returns a pyspec_status. PYSPEC_OK is 0; on any other value
//     pyspec_last_error() describes the failure (file, value, limit). No C++ exception crosses
//     this boundary and no function prints: llama.cpp's log is captured inside the library.
//   - Strings are UTF-8 and NUL-terminated. A NULL where a pointer is required is
//     PYSPEC_ERR_INVALID_ARGUMENT, never a crash.
//   - Out-parameters are written only on success unless stated otherwise.
//   - Who frees what: a pyspec_engine from pyspec_engine_load goes to pyspec_engine_free, a
//     pyspec_generation to pyspec_generation_free, a char * the library returns to
//     pyspec_string_free. Pointers read out of a generation stay valid until it is freed.
//
// Threads
//   Each function states its rule. In short: one generation at a time per engine (a second
//   caller waits); tokenizing, the chat template, the phrase pool and the queries may run on any
//   thread at any time, also while a generation runs; pyspec_engine_free must not overlap any
//   other call on that engine.
//
// Versions and ABI
//   PYSPEC_VERSION_MAJOR/MINOR/PATCH give the version of this header, pyspec_version() that of
//   the library in the process. Within one major version the ABI is stable: the structs below
//   keep their layout, functions keep their signatures and meaning, enum values keep their
//   numbers; a minor version only adds functions and enum values. The shared library's SONAME
//   carries the major version (libpyspec.so.1).
#ifndef PYSPEC_H
#define PYSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#  define PYSPEC_API __attribute__((visibility("default")))
#else
#  define PYSPEC_API
#endif

#define PYSPEC_VERSION_MAJOR 1
#define PYSPEC_VERSION_MINOR 2
#define PYSPEC_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

// ---- errors ------------------------------------------------------------------------------------

typedef enum pyspec_status {
    PYSPEC_OK = 0,
    PYSPEC_ERR_INVALID_ARGUMENT = 1,   // a NULL pointer, a value out of range, an unknown method
    PYSPEC_ERR_MODEL_LOAD = 2,         // a model file is missing, not GGUF, truncated, or refused
    PYSPEC_ERR_VOCAB_MISMATCH = 3,     // target and draft do not share a vocabulary
    PYSPEC_ERR_CONTEXT_OVERFLOW = 4,   // the prompt does not fit the context window
    PYSPEC_ERR_DECODE = 5,             // llama.cpp failed a decode
    PYSPEC_ERR_POOL_FILE = 6,          // a phrase pool file cannot be written or read back
    PYSPEC_ERR_HEAD_FILE = 7,          // a draft head file is missing or malformed
    PYSPEC_ERR_HEAD_MISMATCH = 8,      // a draft head was trained for another target
    PYSPEC_ERR_BUSY = 9,               // the engine is held by this same thread (a stream
                                       // callback called back into its engine)
    PYSPEC_ERR_BUFFER_TOO_SMALL = 10,  // a caller's buffer is too short; the size needed is returned
    PYSPEC_ERR_OUT_OF_MEMORY = 11,
    PYSPEC_ERR_INTERNAL = 12,          // anything else (a bug: please report the message)
} pyspec_status;

// The message of the last failed call on the calling thread ("" when none failed yet). Valid
// until the next pyspec call on this thread. Thread-local: any thread.
PYSPEC_API const char * pyspec_last_error(void);

// A constant name for a status ("ok", "invalid_argument", ...). Any thread.
PYSPEC_API const char * pyspec_status_name(pyspec_status status);

// ---- version -----------------------------------------------------------------------------------

// The library's version as "MAJOR.MINOR.PATCH". Any thread.
PYSPEC_API const char * pyspec_version(void);

// ---- handles -----------------------------------------------------------------------------------

typedef struct pyspec_engine pyspec_engine;          // models, pool, learnt statistics
typedef struct pyspec_generation pyspec_generation;  // one request's output and statistics

// ---- engine ------------------------------------------------------------------------------------

typedef struct pyspec_engine_params {
    int32_t n_ctx;           // context window in tokens, target and drafts (0: the model's own)
    int32_t n_batch;         // largest batch of one decode
    int32_t n_threads;       // CPU threads (0: all hardware threads)
    int32_t n_gpu_layers;    // layers offloaded when llama.cpp has a GPU backend
    uint64_t seed;           // the engine's sampling RNG
    int64_t pool_capacity;   // phrases the phrase pool keeps (0: the default)
    bool prefix_cache;       // reuse the KV of a prompt's prefix from the previous request
    bool flash_attn;         // llama.cpp's flash attention
    const char * head_path;  // a draft head file to load with the engine (NULL: none)
} pyspec_engine_params;

// The defaults: n_ctx 4096, n_batch 512, all threads, no GPU layers, seed 0, default pool,
// prefix cache on, flash attention off, no head. Any thread.
PYSPEC_API pyspec_engine_params pyspec_engine_default_params(void);

// Loads the target (and the draft when draft_path is not NULL or "") and creates their
// contexts. params NULL: the defaults. On success *out holds the engine; on failure *out is
// NULL and the status says why: PYSPEC_ERR_MODEL_LOAD (missing, not GGUF, truncated),
// PYSPEC_ERR_VOCAB_MISMATCH (the message names the first difference), PYSPEC_ERR_HEAD_FILE /
// PYSPEC_ERR_HEAD_MISMATCH for params->head_path, PYSPEC_ERR_INVALID_ARGUMENT. Any thread.
PYSPEC_API pyspec_status pyspec_engine_load(const char * target_path, const char * draft_path,
                                            const pyspec_engine_params * params, pyspec_engine ** out);

// pyspec_engine_load with the target's offloaded layers on llama.cpp rpc-servers (since 1.1).
// rpc_servers: "host:port[,host:port...]" (NULL or "": as pyspec_engine_load). The target's
// params->n_gpu_layers layers (-1: all; 0 is refused: it would put nothing there) go to the
// servers, split by their free memory; the draft and head stay on this machine. Errors as
// pyspec_engine_load's, plus PYSPEC_ERR_INVALID_ARGUMENT for a malformed or repeated endpoint and
// PYSPEC_ERR_MODEL_LOAD when this libllama lacks the RPC backend (built without -DGGML_RPC=on)
// or a server does not answer. A server speaking another RPC protocol version aborts the process
// inside llama.cpp: run rpc-servers built from the same llama.cpp. Any thread.
PYSPEC_API pyspec_status pyspec_engine_load_rpc(const char * target_path, const char * draft_path,
                                                const pyspec_engine_params * params, const char * rpc_servers,
                                                pyspec_engine ** out);

// Frees the engine and its models. NULL is a no-op. Must not overlap any other call on this
// engine (wait for generations on other threads to return first). Generations it produced stay
// valid.
PYSPEC_API void pyspec_engine_free(pyspec_engine * engine);

// Times this engine's target with llama.cpp's flash attention off and on and says which setting
// makes its steps cheaper on this machine, as the Python package's flash_attn="auto" decides
// (since 1.2): two temporary contexts on the loaded weights, as wide as the engine's window up
// to 4,096 cells; decodes of 1 token (a plain step) and of 8 tokens (a verification) at two
// context depths, the two settings alternating in paired rounds; *on where a plain step and a
// verification together (the geometric mean of their cost ratios on / off) are at least 2%
// cheaper at a typical request's depth (320 tokens, or half a smaller window). It takes seconds
// to a minute on a CPU (~14 s for a 135M model, ~50 s for a 1.5B one on 2 cores) and leaves the
// engine as loaded: to follow the choice, load again with params.flash_attn = *on, and keep the
// choice for this model file, window and machine rather than timing at every start. *ratio (may
// be NULL): that geometric mean. Waits for a generation on another thread; PYSPEC_ERR_BUSY from
// this engine's own stream callback; PYSPEC_ERR_MODEL_LOAD when llama.cpp cannot create the
// temporary contexts (memory), PYSPEC_ERR_DECODE when a timed decode fails.
PYSPEC_API pyspec_status pyspec_engine_decide_flash_attn(pyspec_engine * engine, bool * on, double * ratio);

// Queries, any thread at any time. 0 (or false) for a NULL engine.
PYSPEC_API int32_t pyspec_engine_n_vocab(const pyspec_engine * engine);
PYSPEC_API int32_t pyspec_engine_n_ctx(const pyspec_engine * engine);
// name NULL or "": the default slot (the draft given to pyspec_engine_load).
PYSPEC_API bool    pyspec_engine_has_draft(const pyspec_engine * engine, const char * name);
// Models slot `name` has received: 1 after the load, +1 per reload; 0 for a slot never filled.
PYSPEC_API int64_t pyspec_engine_draft_version(const pyspec_engine * engine, const char * name);
PYSPEC_API bool    pyspec_engine_has_head(const pyspec_engine * engine);
PYSPEC_API int64_t pyspec_engine_head_version(const pyspec_engine * engine);

// ---- methods -----------------------------------------------------------------------------------

// The drafting methods this library knows, by index 0 .. pyspec_method_count() - 1 ("auto",
// "none", "chain", "tree", "beam", "lookup", "ouroboros", ...); NULL outside that range. Any
// thread.
PYSPEC_API int32_t      pyspec_method_count(void);
PYSPEC_API const char * pyspec_method_name(int32_t index);

// ---- tokens and chat ---------------------------------------------------------------------------

// Tokenizes UTF-8 text with the target's vocabulary into tokens[0 .. n_max). *n_tokens receives
// the count; when it exceeds n_max the status is PYSPEC_ERR_BUFFER_TOO_SMALL and nothing useful
// is written (call again with n_max >= *n_tokens). add_special: BOS where the model wants one;
// parse_special: special-token text such as "<|im_start|>" becomes that token. Any thread.
PYSPEC_API pyspec_status pyspec_tokenize(const pyspec_engine * engine, const char * text, bool add_special,
                                         bool parse_special, int32_t * tokens, int32_t n_max, int32_t * n_tokens);

typedef struct pyspec_chat_message {
    const char * role;     // "system", "user", "assistant", ...
    const char * content;
} pyspec_chat_message;

// Formats messages[0 .. n_messages) with the target's built-in chat template; add_assistant
// opens the assistant's turn. *out receives a string to free with pyspec_string_free.
// PYSPEC_ERR_INVALID_ARGUMENT when the model has no template llama.cpp supports. Any thread.
PYSPEC_API pyspec_status pyspec_chat_template(const pyspec_engine * engine, const pyspec_chat_message * messages,
                                              size_t n_messages, bool add_assistant, char ** out);

// Frees a string returned by the library. NULL is a no-op. Any thread.
PYSPEC_API void pyspec_string_free(char * str);

// ---- generation --------------------------------------------------------------------------------

typedef struct pyspec_generate_params {
    int32_t max_tokens;           // tokens generated at most
    float temperature;            // 0: greedy (the target's argmax, token for token)
    int32_t top_k;                // <= 0: off
    float top_p;                  // (0, 1]
    float min_p;                  // [0, 1)
    const char * method;          // a name from pyspec_method_name; NULL: "auto"
    const char * draft;           // the draft slot that drafts; NULL or "": the default slot
    int32_t n_draft;              // longest chain per step (chain, lookup, ouroboros); 0: the method's default
    int32_t tree_nodes;           // method "tree": nodes verified per step
    int32_t tree_depth;           //   longest path
    int32_t tree_branching;       //   children considered per expanded candidate
    int32_t beam_count;           // method "beam": beams
    int32_t beam_length;          //   tokens per beam
    int32_t auto_max_depth;       // method "auto": longest lookup / pool path considered
    int32_t auto_max_nodes;       //   lookup + pool nodes considered
    int32_t auto_max_gamma;       //   longest draft-model chain considered
    bool auto_use_draft_model;    //   consider the draft model
    bool auto_use_head;           //   consider the draft head
    bool use_pool;                // methods lookup / ouroboros / auto propose phrase-pool phrases
    bool use_seed;                // reseed the engine's RNG with `seed` for this request
    uint64_t seed;
    const char * const * stop;    // [n_stop] stop strings (the output ends before the first match)
    int32_t n_stop;
} pyspec_generate_params;

// The defaults: 256 tokens, greedy, method "auto" and the engine's defaults for every knob.
// Any thread.
PYSPEC_API pyspec_generate_params pyspec_generate_default_params(void);

// Called with each newly safe piece of text (n_bytes bytes, NUL-terminated, valid during the
// call; a piece never splits a UTF-8 character). Return false to cancel: the generation then
// ends with finish reason "cancelled" and the engine stays usable. It runs on the generating
// thread and must not call a function of the same engine that waits for it (those return
// PYSPEC_ERR_BUSY); the tokenizer, chat template, pool and queries may be called.
typedef bool (*pyspec_stream_callback)(const char * piece, size_t n_bytes, void * user_data);

// Generates from a text prompt (tokenized with BOS and special-token parsing, as a chat
// template's output needs). params NULL: the defaults; callback NULL: no streaming.
// On success *out holds the generation. On a bad argument, a too-long prompt or a missing draft,
// nothing runs and *out is NULL. When llama.cpp fails after the generation started, the status
// says why and *out holds the output produced until then (finish reason "error"), to be freed
// as usual; the engine stays usable.
// Threads: any thread; generations on one engine run one at a time (a second caller waits), as
// do reloads and removals; PYSPEC_ERR_BUSY from inside this engine's own callback.
PYSPEC_API pyspec_status pyspec_generate(pyspec_engine * engine, const char * prompt,
                                         const pyspec_generate_params * params, pyspec_stream_callback callback,
                                         void * user_data, pyspec_generation ** out);

// pyspec_generate from token ids tokens[0 .. n_tokens) of the target's vocabulary.
PYSPEC_API pyspec_status pyspec_generate_tokens(pyspec_engine * engine, const int32_t * tokens, int32_t n_tokens,
                                                const pyspec_generate_params * params,
                                                pyspec_stream_callback callback, void * user_data,
                                                pyspec_generation ** out);

typedef struct pyspec_stats {
    int32_t n_prompt_tokens;
    int32_t n_prompt_cached;          // prompt tokens whose KV came from the prefix cache
    int32_t n_generated;              // tokens in the output
    int32_t n_target_calls;           // target decodes after the prefill (one per step)
    int32_t n_drafted;                // draft tokens proposed
    int32_t n_accepted;               // draft tokens accepted
    int32_t n_draft_decodes;          // draft-model decodes (0 for model-free drafting)
    double acceptance_rate;           // n_accepted / n_drafted (0 without drafts)
    double tokens_per_target_call;    // n_generated / n_target_calls
    double tokens_per_second;         // generated tokens per second, prefill excluded
    double t_prefill_ms;
    double t_draft_ms;
    double t_verify_ms;
    double t_total_ms;                // prefill + generation
} pyspec_stats;

// Reading a generation: any thread, as long as it is not freed meanwhile. A NULL generation
// gives "" / NULL / zeros.
// The generated text (n_bytes, when not NULL, receives its length).
PYSPEC_API const char * pyspec_generation_text(const pyspec_generation * generation, size_t * n_bytes);
// The generated tokens (*n_tokens receives their count).
PYSPEC_API const int32_t * pyspec_generation_tokens(const pyspec_generation * generation, int32_t * n_tokens);
// "stop" (end of generation token or stop string), "length", "cancelled" or "error".
PYSPEC_API const char * pyspec_generation_finish_reason(const pyspec_generation * generation);
PYSPEC_API pyspec_stats pyspec_generation_stats(const pyspec_generation * generation);
// The draft slot's and head's versions that drafted this output (0: none drafted).
PYSPEC_API int64_t pyspec_generation_draft_version(const pyspec_generation * generation);
PYSPEC_API int64_t pyspec_generation_head_version(const pyspec_generation * generation);
// NULL is a no-op. Not while another thread reads the generation.
PYSPEC_API void pyspec_generation_free(pyspec_generation * generation);

// ---- phrase pool -------------------------------------------------------------------------------

typedef struct pyspec_pool_stats {
    int64_t size;               // phrases stored
    int64_t capacity;
    int64_t n_inserted;
    int64_t n_evicted;
    int64_t n_lookups;
    int64_t n_hits;
    int64_t n_tokens_accepted;  // draft tokens from pool phrases the target accepted
} pyspec_pool_stats;

// The engine's phrase pool, shared by its requests. Any thread at any time, also during a
// generation. save writes a file load reads back (PYSPEC_ERR_POOL_FILE when it cannot: missing,
// corrupt, another vocabulary); load replaces the pool's contents by the file's.
PYSPEC_API pyspec_status pyspec_pool_save(pyspec_engine * engine, const char * path);
PYSPEC_API pyspec_status pyspec_pool_load(pyspec_engine * engine, const char * path);
PYSPEC_API pyspec_status pyspec_pool_clear(pyspec_engine * engine);
PYSPEC_API pyspec_status pyspec_pool_stats_get(const pyspec_engine * engine, pyspec_pool_stats * out);

// ---- hot reload --------------------------------------------------------------------------------

// Loads a draft model into slot `name` (NULL or "": the default slot), replacing its model. The
// file is read and checked without holding the engine, so generations keep running meanwhile;
// the swap then waits for the running generation to end. On any failure (PYSPEC_ERR_MODEL_LOAD,
// PYSPEC_ERR_VOCAB_MISMATCH) the old draft keeps serving. Any thread; PYSPEC_ERR_BUSY from
// inside this engine's callback.
PYSPEC_API pyspec_status pyspec_draft_reload(pyspec_engine * engine, const char * name, const char * path);
// Empties slot `name`; PYSPEC_ERR_INVALID_ARGUMENT when it is empty already. Threads as above.
PYSPEC_API pyspec_status pyspec_draft_remove(pyspec_engine * engine, const char * name);
// The draft head (method "redrafter", and "auto" when it has one): loaded and checked against
// the target (PYSPEC_ERR_HEAD_FILE, PYSPEC_ERR_HEAD_MISMATCH) while generations run, installed
// between them; on failure the old head keeps serving. Threads as pyspec_draft_reload.
PYSPEC_API pyspec_status pyspec_head_reload(pyspec_engine * engine, const char * path);
// Removes the head; PYSPEC_ERR_INVALID_ARGUMENT when the engine has none.
PYSPEC_API pyspec_status pyspec_head_remove(pyspec_engine * engine);

#ifdef __cplusplus
}
#endif

#endif  // PYSPEC_H
