#include "spec/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>

#include "llama.h"

#include "spec/error.h"
#include "spec/model.h"

namespace spec {

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size();
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

}  // namespace

std::vector<int32_t> default_calibration_sizes() { return {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}; }

CostCurve measure_cost_curve(Model& model, const std::vector<int32_t>& sizes, int32_t repeats, bool all_rows,
                             const CalibrationProgress& progress, int32_t context, bool non_decreasing) {
    CostCurve shape{sizes, std::vector<double>(sizes.size(), 1.0)};
    validate(shape);
    if (repeats < 1) throw InvalidArgumentError("calibration repeats must be >= 1, got " + std::to_string(repeats));
    const int32_t k_max = sizes.back();
    if (k_max > model.params().n_batch) {
        throw InvalidArgumentError("calibration size " + std::to_string(k_max) + " exceeds n_batch=" +
                                   std::to_string(model.params().n_batch));
    }
    if (context < 1) throw InvalidArgumentError("calibration context must be >= 1, got " + std::to_string(context));
    const int32_t n_context = std::min(context, model.n_ctx() - k_max - 1);
    if (n_context < 1) throw InvalidArgumentError("calibration size " + std::to_string(k_max) + " does not fit the context");

    // Ordinary token ids (any valid ids will do: the cost does not depend on which).
    std::vector<int32_t> tokens(size_t(n_context + k_max));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((1000 + 37 * i) % size_t(model.n_vocab()));
    // The context: tokens[0, n_context) in the cache (prefill_prompt leaves out its last token).
    model.prefill_prompt(std::vector<int32_t>(tokens.begin(), tokens.begin() + n_context + 1));
    auto time_decode = [&](int32_t k) {
        const auto t0 = std::chrono::steady_clock::now();
        model.decode_seq(tokens.data() + n_context, k, n_context, all_rows);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        model.kv_remove(0, n_context, -1);
        return ms;
    };
    time_decode(k_max);  // warm-up: first-use allocations, caches

    std::vector<std::vector<double>> times(sizes.size());
    const int32_t total = repeats * int32_t(sizes.size());
    int32_t done = 0;
    for (int32_t r = 0; r < repeats; ++r) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            times[i].push_back(time_decode(sizes[i]));
            if (progress) progress(++done, total);
        }
    }
    model.kv_clear();
    CostCurve curve{sizes, {}};
    for (const auto& t : times) curve.ms.push_back(median(t));
    return non_decreasing ? monotone(curve) : curve;
}

namespace {

struct ContextFree {
    void operator()(llama_context* ctx) const { llama_free(ctx); }
};

}  // namespace

std::vector<FlashAttentionTiming> time_flash_attention(Model& model, const std::vector<int32_t>& depths,
                                                       int32_t n_decodes, int32_t rounds, int32_t batch,
                                                       const CalibrationProgress& progress) {
    if (depths.empty() || depths.front() < 1 || !std::is_sorted(depths.begin(), depths.end()) ||
        std::adjacent_find(depths.begin(), depths.end()) != depths.end()) {
        std::string got;
        for (int32_t d : depths) got += (got.empty() ? "" : ", ") + std::to_string(d);
        throw InvalidArgumentError("flash attention timing needs depths >= 1 in ascending order, got [" + got + "]");
    }
    if (n_decodes < 1 || rounds < 1 || batch < 1) {
        throw InvalidArgumentError("flash attention timing needs n_decodes, rounds and batch >= 1, got " +
                                   std::to_string(n_decodes) + ", " + std::to_string(rounds) + ", " +
                                   std::to_string(batch));
    }
    const ModelParams& params = model.params();
    const int32_t n_threads = params.n_threads > 0 ? params.n_threads
                                                   : std::max(1, int32_t(std::thread::hardware_concurrency()));
    const int32_t deepest = depths.back();
    const int32_t n_batch = std::max(batch, std::min(params.n_batch, deepest));
    // The window the engine decodes in, up to kFlashAttnTimingWindow cells: without flash
    // attention a decode costs more in a wide window than in one just deep enough for the timing
    // (SmolLM2-135M's plain steps 8% at 4,096 cells against 384; llama.cpp keeps V transposed
    // there, one row per channel as long as the window), with it the window made no difference
    // (docs/cost-curves.md, "Flash attention, decided by measurement").
    const int32_t n_ctx = std::max(deepest + std::max(n_decodes, batch) + 1,
                                   std::min(model.n_ctx(), kFlashAttnTimingWindow));
    std::unique_ptr<llama_context, ContextFree> ctx[2];
    for (int on = 0; on < 2; ++on) {
        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx = uint32_t(n_ctx);
        cparams.n_batch = uint32_t(n_batch);
        cparams.n_ubatch = uint32_t(n_batch);
        cparams.n_seq_max = 1;
        cparams.n_threads = n_threads;
        cparams.n_threads_batch = n_threads;
        cparams.flash_attn_type = on ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cparams.no_perf = true;
        ctx[on].reset(llama_init_from_model(model.raw_model(), cparams));
        if (!ctx[on]) {
            throw ModelLoadError("llama.cpp could not create a context with flash attention " +
                                 std::string(on ? "on" : "off") + " for " + model.path() + " (" +
                                 std::to_string(n_ctx) + " tokens)");
        }
    }
    // Ordinary token ids (the cost does not depend on which), positions 0 .. n_ctx - 2.
    std::vector<int32_t> tokens(size_t(n_ctx - 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((1000 + 37 * i) % size_t(model.n_vocab()));
    llama_batch lb = llama_batch_init(n_batch, 0, 1);
    struct BatchFree {
        llama_batch* b;
        ~BatchFree() { llama_batch_free(*b); }
    } batch_free{&lb};
    auto decode = [&](llama_context* c, int32_t first, int32_t n, bool all_rows) {
        lb.n_tokens = n;
        for (int32_t i = 0; i < n; ++i) {
            lb.token[i] = tokens[size_t(first + i)];
            lb.pos[i] = first + i;
            lb.n_seq_id[i] = 1;
            lb.seq_id[i][0] = 0;
            lb.logits[i] = all_rows || i == n - 1;
        }
        const int32_t rc = llama_decode(c, lb);
        if (rc != 0) throw DecodeError("llama_decode failed (" + std::to_string(rc) + ") while timing flash attention");
        llama_synchronize(c);
    };
    // Mean ms of n_decodes decodes of n tokens on top of `depth`, each removed after it.
    auto timed = [&](llama_context* c, int32_t depth, int32_t n, std::vector<double>& all) {
        double sum = 0.0;
        for (int32_t i = 0; i < n_decodes; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            decode(c, depth, n, true);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            all.push_back(ms);
            sum += ms;
            llama_memory_seq_rm(llama_get_memory(c), 0, depth, -1);
        }
        return sum / n_decodes;
    };
    const int32_t total = int32_t(depths.size()) * (2 + 2 * rounds);
    int32_t done = 0;
    int32_t filled = 0;  // tokens in both contexts' caches
    std::vector<FlashAttentionTiming> out;
    for (int32_t depth : depths) {
        for (auto& c : ctx) {
            for (int32_t at = filled; at < depth; at += n_batch) decode(c.get(), at, std::min(n_batch, depth - at), false);
            decode(c.get(), depth, batch, true);  // warm-up: first-use allocations, this depth's cells
            llama_memory_seq_rm(llama_get_memory(c.get()), 0, depth, -1);
            if (progress) progress(++done, total);
        }
        filled = depth;
        std::vector<double> one[2], many[2], one_ratio, many_ratio;
        for (int32_t r = 0; r < rounds; ++r) {
            double one_mean[2], many_mean[2];
            for (int k = 0; k < 2; ++k) {
                const int on = (r + k) % 2;
                one_mean[on] = timed(ctx[on].get(), depth, 1, one[on]);
                many_mean[on] = timed(ctx[on].get(), depth, batch, many[on]);
                if (progress) progress(++done, total);
            }
            one_ratio.push_back(one_mean[1] / one_mean[0]);
            many_ratio.push_back(many_mean[1] / many_mean[0]);
        }
        out.push_back(FlashAttentionTiming{depth, n_ctx, median(one[0]), median(one[1]), median(many[0]),
                                           median(many[1]), median(one_ratio), median(many_ratio), rounds});
    }
    return out;
}

std::pair<int32_t, int32_t> flash_attention_depths(int32_t n_ctx) {
    const int32_t far = std::max(2, std::min(1024, n_ctx / 2));
    return {std::max(1, std::min(256, far / 4)), far};
}

int32_t flash_attention_at_depth(int32_t n_ctx) { return std::max(1, std::min(kFlashAttnRequestDepth, n_ctx / 2)); }

FlashAttentionDecision choose_flash_attention(const FlashAttentionTiming& near, const FlashAttentionTiming& far,
                                              int32_t at_depth) {
    auto at = [&](double v0, double v1) {
        const double slope = far.depth != near.depth ? (v1 - v0) / double(far.depth - near.depth) : 0.0;
        return std::max(1e-9, v0 + slope * double(at_depth - near.depth));
    };
    FlashAttentionDecision d{near, far, at_depth};
    d.plain_ratio = at(near.ratio, far.ratio);
    d.verify_ratio = at(near.batch_ratio, far.batch_ratio);
    d.ratio = std::sqrt(d.plain_ratio * d.verify_ratio);
    d.on = d.ratio < 1.0 - kFlashAttnMargin;
    return d;
}

FlashAttentionDecision decide_flash_attention(Model& model, int32_t n_decodes, int32_t rounds,
                                              const CalibrationProgress& progress) {
    const auto [near, far] = flash_attention_depths(model.n_ctx());
    const auto t = time_flash_attention(model, {near, far}, n_decodes, rounds, kFlashAttnBatch, progress);
    return choose_flash_attention(t[0], t[1], flash_attention_at_depth(model.n_ctx()));
}

}  // namespace spec
