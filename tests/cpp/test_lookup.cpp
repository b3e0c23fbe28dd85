// Unit tests for the prompt-lookup drafter on hand-made token sequences: which match wins
// (longest n-gram, then most recent), the continuation through the proposal for repeating
// patterns, ngram_min, the incremental index against a naive scan, counters and validation.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "spec/drafter.h"
#include "check.h"
#include "spec/error.h"
#include "spec/rng.h"
#include "spec/sampling.h"
#include "spec/schedule.h"

namespace {

using Tokens = std::vector<int32_t>;

std::unique_ptr<spec::Drafter> make_drafter(int32_t ngram_max, int32_t ngram_min) {
    spec::LookupParams params;
    params.ngram_max = ngram_max;
    params.ngram_min = ngram_min;
    return spec::make_prompt_lookup_drafter(params);
}

Tokens draft(spec::Drafter& drafter, const Tokens& committed, int32_t n_draft_max) {
    spec::SamplingParams sampling;
    spec::Rng rng(0);
    spec::DraftRequest request{&committed, n_draft_max, &sampling, &rng};
    spec::Draft out;
    drafter.draft(request, out);
    CHECK(out.probs.empty());  // deterministic proposals only
    return out.tokens;
}

// The whole proposal (tokens and node kinds) for `committed`, from a drafter that has begun it.
spec::Draft draft_with_kinds(spec::Drafter& drafter, const Tokens& committed, int32_t n_draft_max) {
    spec::SamplingParams sampling;
    spec::Rng rng(0);
    spec::DraftRequest request{&committed, n_draft_max, &sampling, &rng};
    spec::Draft out;
    drafter.draft(request, out);
    return out;
}

// The proposal for `committed` from a fresh drafter whose request starts with `committed`.
Tokens lookup(const Tokens& committed, int32_t n_draft_max, int32_t ngram_max = 3, int32_t ngram_min = 1) {
    auto drafter = make_drafter(ngram_max, ngram_min);
    drafter->begin(committed);
    return draft(*drafter, committed, n_draft_max);
}

// The specification, by brute force: scan earlier n-gram occurrences from the most recent, for
// n from ngram_max down, and read the continuation through the proposal itself.
Tokens naive_lookup(const Tokens& seq, int32_t n_draft_max, int32_t ngram_max, int32_t ngram_min) {
    const int32_t n_tokens = int32_t(seq.size());
    for (int32_t n = std::min(ngram_max, n_tokens); n >= ngram_min; --n) {
        for (int32_t last = n_tokens - 2; last >= n - 1; --last) {
            if (!std::equal(seq.end() - n, seq.end(), seq.begin() + (last - n + 1))) continue;
            Tokens virtual_seq = seq;
            Tokens out;
            for (int32_t i = 0; i < n_draft_max; ++i) {
                out.push_back(virtual_seq[size_t(last + 1 + i)]);
                virtual_seq.push_back(out.back());
            }
            return out;
        }
    }
    return {};
}

void test_no_match_proposes_nothing() {
    CHECK(lookup({1, 2, 3, 4}, 4).empty());
    CHECK(lookup({7}, 4).empty());
    auto drafter = make_drafter(3, 1);
    drafter->begin({1, 2, 3});
    CHECK(draft(*drafter, {1, 2, 3}, 4).empty());
    CHECK(drafter->stats().n_draft_calls == 1);
    CHECK(drafter->stats().n_proposed == 0);
}

void test_proposes_what_followed() {
    // Suffix [1 2] occurred at 0..1, followed by 3 9 and then the suffix itself.
    CHECK((lookup({1, 2, 3, 9, 1, 2}, 4) == Tokens{3, 9, 1, 2}));
    CHECK((lookup({1, 2, 3, 9, 1, 2}, 2) == Tokens{3, 9}));
    CHECK(lookup({1, 2, 3, 9, 1, 2}, 0).empty());
}

void test_longest_match_wins_over_recent() {
    // [1 2] -> 7 (long, older) against [2] -> 6 (short, more recent).
    const Tokens seq = {5, 1, 2, 7, 8, 2, 6, 1, 2};
    CHECK((lookup(seq, 1, 3) == Tokens{7}));
    CHECK((lookup(seq, 1, 1) == Tokens{6}));
}

void test_most_recent_among_equal_lengths() {
    // [1 2] occurred followed by 3 and, later, by 4: the later one wins. Its continuation reaches
    // the end of the sequence and goes on through the proposal (period 3: 4 1 2).
    CHECK((lookup({1, 2, 3, 1, 2, 4, 1, 2}, 5) == Tokens{4, 1, 2, 4, 1}));
}

void test_repeating_pattern_continues() {
    CHECK((lookup({7, 7, 7}, 4) == Tokens{7, 7, 7, 7}));
    CHECK((lookup({3, 1, 4, 3, 1}, 6) == Tokens{4, 3, 1, 4, 3, 1}));
}

void test_ngram_min() {
    // Only a one-token match exists: [9] -> 5.
    const Tokens seq = {9, 5, 1, 9};
    CHECK((lookup(seq, 2, 3, 1) == Tokens{5, 1}));
    CHECK(lookup(seq, 2, 3, 2).empty());
    // ngram_min = ngram_max: only that length counts.
    CHECK((lookup({1, 2, 3, 8, 2, 3}, 1, 2, 2) == Tokens{8}));
    CHECK(lookup({1, 2, 3, 8, 4, 3}, 1, 2, 2).empty());
}

void test_incremental_index_matches_naive_scan() {
    // A small vocabulary makes matches of every length frequent. The sequence grows the way the
    // decoder grows it (a few tokens per step); every proposal must equal the brute-force one.
    spec::Rng rng(42);
    for (int32_t ngram_max : {1, 2, 3, 5}) {
        for (int32_t ngram_min : {1, 2}) {
            if (ngram_min > ngram_max) continue;
            Tokens full(600);
            for (auto& t : full) t = int32_t(rng.next_u64() % 4);
            spec::LookupParams params;  // the specification is plain lookup, without substitutions
            params.ngram_max = ngram_max;
            params.ngram_min = ngram_min;
            params.substitutions = false;
            auto drafter = spec::make_prompt_lookup_drafter(params);
            Tokens committed(full.begin(), full.begin() + 20);
            drafter->begin(committed);
            int mismatches = 0, n_nonempty = 0;
            while (committed.size() < full.size()) {
                const int32_t n_draft_max = 1 + int32_t(rng.next_u64() % 8);
                const Tokens got = draft(*drafter, committed, n_draft_max);
                if (got != naive_lookup(committed, n_draft_max, ngram_max, ngram_min)) ++mismatches;
                if (!got.empty()) ++n_nonempty;
                const size_t n_new = std::min(full.size() - committed.size(), size_t(1 + rng.next_u64() % 5));
                committed.insert(committed.end(), full.begin() + std::ptrdiff_t(committed.size()),
                                 full.begin() + std::ptrdiff_t(committed.size() + n_new));
                drafter->accept(committed, int32_t(n_new) - 1);
            }
            CHECK(mismatches == 0);
            CHECK(n_nonempty > 100);
        }
    }
}

void test_begin_forgets_the_previous_request() {
    auto drafter = make_drafter(3, 1);
    drafter->begin({1, 2, 3, 4, 1, 2});
    CHECK((draft(*drafter, {1, 2, 3, 4, 1, 2}, 2) == Tokens{3, 4}));
    drafter->begin({5, 1, 2});
    CHECK(draft(*drafter, {5, 1, 2}, 2).empty());
}

void test_counters() {
    auto drafter = make_drafter(3, 1);
    Tokens committed = {1, 2, 3, 1, 2};
    drafter->begin(committed);
    CHECK(draft(*drafter, committed, 3).size() == 3);  // 3 1 2
    committed.insert(committed.end(), {3, 1, 5});      // two accepted, then the target's 5
    drafter->accept(committed, 2);
    CHECK(draft(*drafter, committed, 3).empty());      // [1 5], [5]: never seen before
    drafter->accept(committed, 0);
    const spec::DrafterStats s = drafter->stats();
    CHECK(s.n_draft_calls == 2);
    CHECK(s.n_proposed == 3);
    CHECK(s.n_accepted == 2);
    CHECK(s.n_model_decodes == 0);
}

void test_unit_boundaries_have_their_own_kind() {
    // 50 stands for a blank-line token, 60 and 61 for tokens at the left margin, 70 for an
    // indented one. The source: 1 2 3 50 60 (a unit ends before 60) 4 50 70 (a blank line inside
    // a unit) 5; the request repeats 1 2, so the copy runs 3 50 60 4 50 70 5.
    spec::LookupParams params;
    params.ngram_max = 3;
    params.blank_line_tokens = {50};
    params.unit_start_tokens = {61, 60};  // any order
    auto drafter = spec::make_prompt_lookup_drafter(params);
    const Tokens seq = {1, 2, 3, 50, 60, 4, 50, 70, 5, 9, 1, 2};
    drafter->begin(seq);
    spec::Draft out = draft_with_kinds(*drafter, seq, 7);
    CHECK((out.tokens == Tokens{3, 50, 60, 4, 50, 70, 5}));
    CHECK(out.kinds.size() == 7);
    CHECK(out.kinds[1] == spec::kind_lookup_boundary(3));  // 50 before 60: the end of a unit
    CHECK(out.kinds[0] == spec::kind_lookup(2) && out.kinds[2] == spec::kind_lookup(4));
    CHECK(out.kinds[4] == spec::kind_lookup(6));  // 50 before 70: a blank line inside a unit
    // Past the sequence's end the proposal's own next node decides: the sequence ends in the
    // blank-line token, and the copy of the period [50 61] proposes 61 after it.
    const Tokens periodic = {50, 61, 50};
    drafter->begin(periodic);
    out = draft_with_kinds(*drafter, periodic, 3);
    CHECK((out.tokens == Tokens{61, 50, 61}));
    CHECK(out.kinds[1] == spec::kind_lookup_boundary(2));
    // Without the token lists (their default) every node keeps its match kind.
    auto plain = make_drafter(3, 1);
    plain->begin(seq);
    out = draft_with_kinds(*plain, seq, 7);
    CHECK(out.kinds.size() == 7);
    for (size_t i = 0; i < out.kinds.size(); ++i) CHECK(out.kinds[i] == spec::kind_lookup(2 + int32_t(i)));
}

void test_stop_tokens_end_the_continuation() {
    // 90 stands for a chat template's delimiter: [1 2] is followed by 3 4 and then the delimiter,
    // so the copy stops after 4, and 4 (the quote's last token) gets the end-of-quote kind.
    spec::LookupParams params;
    params.ngram_max = 3;
    params.stop_tokens = {95, 90};  // any order
    auto drafter = spec::make_prompt_lookup_drafter(params);
    const Tokens seq = {1, 2, 3, 4, 90, 91, 1, 2};
    drafter->begin(seq);
    spec::SamplingParams sampling;
    spec::Rng rng(0);
    spec::DraftRequest request{&seq, 8, &sampling, &rng};
    spec::Draft out;
    drafter->draft(request, out);
    CHECK((out.tokens == Tokens{3, 4}));
    CHECK(out.kinds.size() == 2 && out.kinds[0] == spec::kind_lookup(2) && out.kinds[1] == spec::kind_lookup_end());
    // A continuation that reaches n_draft_max first keeps the match kinds.
    spec::DraftRequest short_request{&seq, 1, &sampling, &rng};
    drafter->draft(short_request, out);
    CHECK((out.tokens == Tokens{3}) && out.kinds[0] == spec::kind_lookup(2));
    // A stop token right after the match: nothing to propose.
    const Tokens at_stop = {1, 2, 95, 7, 1, 2};
    drafter->begin(at_stop);
    spec::DraftRequest stop_request{&at_stop, 8, &sampling, &rng};
    drafter->draft(stop_request, out);
    CHECK(out.tokens.empty());
    // Without stop tokens the same copy runs through the delimiter.
    CHECK((lookup(seq, 4) == Tokens{3, 4, 90, 91}));
}

void test_short_matches_in_the_output_have_their_own_kind() {
    // Prompt [5 1 2 3 6 1 2]: the suffix [1 2] matches inside the prompt -> match kinds by
    // effective length. Output [7 8 9 7 8]: [7 8] matches inside the output -> the output kind of
    // its root length, at every depth.
    auto drafter = spec::make_prompt_lookup_drafter(spec::LookupParams{});
    spec::SamplingParams sampling;
    spec::Rng rng(0);
    spec::Draft out;
    const Tokens prompt = {5, 1, 2, 3, 6, 1, 2};
    drafter->begin(prompt);
    spec::DraftRequest in_prompt{&prompt, 2, &sampling, &rng};
    drafter->draft(in_prompt, out);
    CHECK((out.tokens == Tokens{3, 6}) && out.kinds[0] == spec::kind_lookup(2) && out.kinds[1] == spec::kind_lookup(3));
    const Tokens head = {5, 4};
    const Tokens seq = {5, 4, 7, 8, 9, 7, 8};
    drafter->begin(head);
    spec::DraftRequest in_output{&seq, 3, &sampling, &rng};
    drafter->draft(in_output, out);
    CHECK((out.tokens == Tokens{9, 7, 8}));
    CHECK(out.kinds.size() == 3 && out.kinds[0] == spec::kind_lookup_output(2) &&
          out.kinds[2] == spec::kind_lookup_output(2));
}

spec::Draft draft_of(const Tokens& seq, int32_t n_draft_max, int32_t ngram_max) {
    spec::LookupParams params;
    params.ngram_max = ngram_max;
    auto drafter = spec::make_prompt_lookup_drafter(params);
    drafter->begin(seq);
    spec::SamplingParams sampling;
    spec::Rng rng(0);
    spec::DraftRequest request{&seq, n_draft_max, &sampling, &rng};
    spec::Draft out;
    drafter->draft(request, out);
    return out;
}

void test_contested_nodes() {
    // The key [9 1 2] occurs twice; the most recent occurrence goes on 3 7 8, the earlier 3 4 5:
    // node 0 (3) agrees, node 1 (7) is a guess between 7 and 4, and past it the earlier
    // occurrence no longer agrees with the path, so node 2 is an ordinary copy node again.
    const Tokens seq = {9, 1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 9, 1, 2};
    spec::Draft out = draft_of(seq, 4, 3);
    CHECK((out.tokens == Tokens{3, 7, 8, 9}));
    CHECK(out.kinds.size() == 4);
    CHECK(out.kinds[0] == spec::kind_lookup(3));
    CHECK(out.kinds[1] == spec::kind_lookup_contested());
    CHECK(out.kinds[2] == spec::kind_lookup(5) && out.kinds[3] == spec::kind_lookup(6));
    // Three occurrences: a rival that agrees longer contests a later node.
    const Tokens three = {9, 1, 2, 3, 4, 6, 9, 1, 2, 3, 7, 8, 9, 1, 2, 3, 4, 5, 9, 1, 2};
    out = draft_of(three, 4, 3);
    CHECK((out.tokens == Tokens{3, 4, 5, 9}));
    CHECK(out.kinds[0] == spec::kind_lookup(3) && out.kinds[1] == spec::kind_lookup_contested() &&
          out.kinds[2] == spec::kind_lookup_contested() && out.kinds[3] == spec::kind_lookup(6));
    // A repeating pattern: every occurrence agrees, the ones read past the known tokens are not
    // followed, and nothing is contested.
    const Tokens period = {5, 1, 2, 5, 1, 2, 5, 1, 2};
    out = draft_of(period, 6, 2);
    CHECK((out.tokens == Tokens{5, 1, 2, 5, 1, 2}));
    for (const uint8_t kind : out.kinds) CHECK(kind != spec::kind_lookup_contested());
    // One occurrence: nothing to contest.
    out = draft_of({1, 2, 3, 4, 1, 2}, 2, 3);
    CHECK(out.kinds[0] == spec::kind_lookup(2) && out.kinds[1] == spec::kind_lookup(3));
}

// A source of runs of eight tokens (seven distinct ones, then `before`'s token of the run: three
// runs by default), each followed by the stretch `old`, then four more tokens; the output copies
// it with `old` replaced by `replacement` everywhere. Returns the source and the output.
std::pair<Tokens, Tokens> renamed_copy(const Tokens& old, const Tokens& replacement, const Tokens& before = {90, 90, 90}) {
    Tokens source = {50}, output;
    const int32_t n_runs = int32_t(before.size());
    for (int32_t run = 0; run < n_runs; ++run) {
        for (int32_t i = 1; i <= 8; ++i) {
            const int32_t token = i < 8 ? run * 8 + i : before[size_t(run)];
            source.push_back(token);
            output.push_back(token);
        }
        source.insert(source.end(), old.begin(), old.end());
        output.insert(output.end(), replacement.begin(), replacement.end());
    }
    for (int32_t i = n_runs * 8 + 1; i <= n_runs * 8 + 4; ++i) {
        source.push_back(i);
        output.push_back(i);
    }
    source.push_back(51);
    return {source, output};
}

void test_substitutions_follow_the_outputs_replacement() {
    for (const auto& [old, replacement] : std::vector<std::pair<Tokens, Tokens>>{
             {{100}, {200}}, {{100}, {200, 201}}, {{100, 101}, {200}}, {{100, 101}, {200, 201, 202}}}) {
        const auto [source, output] = renamed_copy(old, replacement);
        const int32_t n_new = int32_t(replacement.size());
        auto drafter = spec::make_prompt_lookup_drafter(spec::LookupParams{});
        drafter->begin(source);
        Tokens committed = source;
        // The output commits one token a step up to the second run: its first replacement breaks
        // an 8-token copy, and three copied tokens after it settle the substitution.
        for (int32_t t = 0; t < 8 + n_new + 8; ++t) {
            const spec::Draft out = draft_with_kinds(*drafter, committed, 64);
            if (t == 8) {  // the copy proposes the old stretch: nothing learnt yet
                CHECK(!out.tokens.empty() && out.tokens[0] == old[0]);
                CHECK(out.kinds[0] == spec::kind_lookup(8));
            }
            committed.push_back(output[size_t(t)]);
        }
        // The second run copied: the next copy proposes the replacement, then the source again.
        spec::Draft out = draft_with_kinds(*drafter, committed, 64);
        CHECK(out.tokens.size() >= size_t(n_new + 8));
        CHECK(std::equal(replacement.begin(), replacement.end(), out.tokens.begin()));
        for (int32_t i = 0; i < n_new; ++i) CHECK(out.kinds[size_t(i)] == spec::kind_lookup_substituted());
        CHECK(out.tokens[size_t(n_new)] == 17 && out.kinds[size_t(n_new)] == spec::kind_lookup(8 + n_new));
        // The proposal reads as the rest of the output: the third run's stretch is replaced too.
        const size_t done = committed.size() - source.size();
        CHECK(out.tokens.size() >= output.size() - done);
        CHECK(std::equal(output.begin() + std::ptrdiff_t(done), output.end(), out.tokens.begin()));
        // The output follows the replacement and two more tokens: the suffix no longer matches the
        // source across the replacement, but the copy resumes where it was, its run counted on.
        committed.insert(committed.end(), out.tokens.begin(), out.tokens.begin() + n_new + 2);
        drafter->accept(committed, n_new + 1);
        out = draft_with_kinds(*drafter, committed, 4);
        CHECK((out.tokens == Tokens{19, 20, 21, 22}));
        CHECK(out.kinds[0] == spec::kind_lookup(8 + n_new + 2));
    }
}

// Commits output[from, to) one token a step, drafting before each as the decoder does.
void commit_steps(spec::Drafter& drafter, Tokens& committed, const Tokens& output, size_t from, size_t to) {
    for (size_t t = from; t < to; ++t) {
        draft_with_kinds(drafter, committed, 64);
        committed.push_back(output[t]);
    }
}

// A drafter whose request's prompt is `source` and that has committed output[0, n) one token a
// step, drafting before each; committed: the sequence so far.
std::unique_ptr<spec::Drafter> drafter_after(const Tokens& source, const Tokens& output, size_t n, Tokens& committed,
                                             const spec::LookupParams& params = {}) {
    auto drafter = spec::make_prompt_lookup_drafter(params);
    drafter->begin(source);
    committed = source;
    commit_steps(*drafter, committed, output, 0, n);
    return drafter;
}

void test_a_rejected_substitution_is_forgotten() {
    // The output replaces the first stretch, then keeps the second: the substitution proposed
    // there fails, and the third run's copy proposes the source's own stretch again.
    const auto [source, renamed] = renamed_copy({100}, {200});
    Tokens output = renamed;
    output[17] = 100;  // the second run's stretch, kept
    Tokens committed;
    const auto drafter = drafter_after(source, output, 17, committed);
    spec::Draft out = draft_with_kinds(*drafter, committed, 64);
    CHECK(!out.tokens.empty() && out.tokens[0] == 200 && out.kinds[0] == spec::kind_lookup_substituted());
    committed.push_back(100);  // the target keeps the source's token
    commit_steps(*drafter, committed, output, 18, 26);
    out = draft_with_kinds(*drafter, committed, 64);
    CHECK(!out.tokens.empty() && out.tokens[0] == 100 && out.kinds[0] != spec::kind_lookup_substituted());
}

void test_substitutions_keep_their_context() {
    // The third run's stretch follows another token (91) than the one the substitution was learnt
    // after (90): without loose substitutions its copy proposes the source's own stretch.
    const auto [source, renamed] = renamed_copy({100}, {200}, {90, 90, 91});
    Tokens output = renamed;
    output[26] = 100;  // the answer keeps it there too
    spec::LookupParams params;
    params.loose_substitutions = false;
    Tokens committed;
    const auto drafter = drafter_after(source, output, 17, committed, params);
    spec::Draft out = draft_with_kinds(*drafter, committed, 64);  // the second run: after 90
    CHECK(!out.tokens.empty() && out.tokens[0] == 200 && out.kinds[0] == spec::kind_lookup_substituted());
    // The proposal goes on into the third run and leaves its stretch, after 91, as it is.
    CHECK(out.tokens.size() > 9 && out.tokens[8] == 91 && out.tokens[9] == 100);
    CHECK(out.kinds[9] != spec::kind_lookup_substituted() && out.kinds[9] != spec::kind_lookup_substituted_loose());
}

void test_loose_substitutions() {
    // Five runs, the third and fourth after 91: the substitution learnt after 90 applies after 91
    // as a loose one (a kind of its own); once the output kept the old stretch after 91, a later
    // copy leaves it there, while after 90 (the fifth run) it still proposes the replacement.
    const auto [source, renamed] = renamed_copy({100}, {200}, {90, 90, 91, 91, 90});
    Tokens output = renamed;
    output[26] = 100;  // the third run keeps it
    output[35] = 100;  // and so does the fourth
    Tokens committed;
    const auto drafter = drafter_after(source, output, 17, committed);
    spec::Draft out = draft_with_kinds(*drafter, committed, 64);  // the second run: after 90
    CHECK(!out.tokens.empty() && out.tokens[0] == 200 && out.kinds[0] == spec::kind_lookup_substituted());
    CHECK(out.tokens.size() > 9 && out.tokens[8] == 91 && out.tokens[9] == 200);
    CHECK(out.kinds[9] == spec::kind_lookup_substituted_loose());
    // The output follows up to the third run's stretch and keeps it.
    committed.insert(committed.end(), out.tokens.begin(), out.tokens.begin() + 9);
    drafter->accept(committed, 9);
    commit_steps(*drafter, committed, output, 26, 29);
    out = draft_with_kinds(*drafter, committed, 64);  // copies on into the fourth run, after 91
    CHECK(out.tokens.size() > 15 && out.tokens[5] == 91 && out.tokens[6] == 100);
    CHECK(out.kinds[6] != spec::kind_lookup_substituted_loose() && out.kinds[6] != spec::kind_lookup_substituted());
    CHECK(out.tokens[14] == 90 && out.tokens[15] == 200 && out.kinds[15] == spec::kind_lookup_substituted());
}

void test_a_substitution_is_learnt_before_it_settles() {
    // The output replaces the first run's stretch and copies on: one copied token after the
    // replacement, the copy resumes in the source (resync) and the second run's stretch is
    // proposed replaced already, provisionally (three tokens settle it).
    for (const Tokens& replacement : {Tokens{200}, Tokens{200, 201}}) {
        const auto [source, output] = renamed_copy({100}, replacement);
        const int32_t n_new = int32_t(replacement.size());
        auto drafter = spec::make_prompt_lookup_drafter(spec::LookupParams{});
        drafter->begin(source);
        Tokens committed = source;
        commit_steps(*drafter, committed, output, 0, size_t(8 + n_new + 1));
        const spec::Draft out = draft_with_kinds(*drafter, committed, 64);
        CHECK(out.tokens.size() >= size_t(7 + n_new));
        CHECK((Tokens(out.tokens.begin(), out.tokens.begin() + 7) == Tokens{10, 11, 12, 13, 14, 15, 90}));
        CHECK(std::equal(replacement.begin(), replacement.end(), out.tokens.begin() + 7));
        CHECK(out.kinds[7] == spec::kind_lookup_substituted());
    }
    // The output goes on otherwise (200, 9, 77, 10, ...: the first run's 100 and 9 became
    // 200 9 77): settling learns that and forgets the provisional 100 -> 200, so the third run's
    // 100, whose 9 follows no more, is proposed as it is.
    const auto [source, renamed] = renamed_copy({100}, {200});
    Tokens output(renamed.begin(), renamed.begin() + 10);  // 1..7 90 200 9
    output.push_back(77);
    output.insert(output.end(), renamed.begin() + 10, renamed.begin() + 16);  // 10..15
    output.push_back(90);
    auto drafter = spec::make_prompt_lookup_drafter(spec::LookupParams{});
    drafter->begin(source);
    Tokens committed = source;
    commit_steps(*drafter, committed, output, 0, output.size());
    const spec::Draft out = draft_with_kinds(*drafter, committed, 64);
    CHECK(!out.tokens.empty() && out.tokens[0] == 100);
    CHECK(out.kinds[0] != spec::kind_lookup_substituted() && out.kinds[0] != spec::kind_lookup_substituted_loose());
}

void test_a_replacement_before_the_first_copy_is_learnt() {
    // The answer renames the prompt's 100 (after 60) to 200 before anything was copied, then
    // copies 1 2 3: the copy learns the replacement where output and source agree before it, and
    // proposes it where the source has 100 after 60 again.
    const Tokens source = {50, 60, 100, 1, 2, 3, 4, 5, 6, 7, 8, 61, 62, 63, 60, 100, 9, 10, 11, 51};
    for (const bool on : {true, false}) {
        spec::LookupParams params;
        params.substitutions = on;
        auto drafter = spec::make_prompt_lookup_drafter(params);
        drafter->begin(source);
        Tokens committed = source;
        commit_steps(*drafter, committed, {60, 200, 1, 2, 3}, 0, 5);
        const spec::Draft out = draft_with_kinds(*drafter, committed, 64);
        CHECK(out.tokens.size() > 11);
        CHECK((Tokens(out.tokens.begin(), out.tokens.begin() + 10) == Tokens{4, 5, 6, 7, 8, 61, 62, 63, 60, on ? 200 : 100}));
        CHECK(out.tokens[10] == 9);
        CHECK((out.kinds[9] == spec::kind_lookup_substituted()) == on);
    }
}

void test_substitutions_off() {
    // LookupParams::substitutions false: the replacement is never learnt.
    const auto [source, output] = renamed_copy({100}, {200});
    spec::LookupParams params;
    params.substitutions = false;
    Tokens committed;
    const auto drafter = drafter_after(source, output, 17, committed, params);
    const spec::Draft out = draft_with_kinds(*drafter, committed, 64);
    CHECK(!out.tokens.empty() && out.tokens[0] == 100 && out.kinds[0] == spec::kind_lookup(8));
}

void test_code_fences() {
    // 80 stands for a fence token (```), 60 for a language tag at the left margin (python), 50 for
    // a newline, 70 for an indented token. The prompt mentions a fence in its prose (80 70), then
    // opens a code block (80 60 50) holding 1 2 3 4, and closes it (80 50).
    spec::LookupParams params;
    params.ngram_max = 4;
    params.fence_tokens = {80};
    params.unit_start_tokens = {61, 60, 1};  // any order
    const Tokens prompt = {5, 80, 70, 6, 80, 60, 50, 1, 2, 3, 4, 80, 50, 7};
    auto drafter = spec::make_prompt_lookup_drafter(params);
    drafter->begin(prompt);
    // Before the answer's first token: the code block from its opening fence, the first
    // kAnswerStartDepth nodes of their own kind, then copy kinds by how far the copy has run.
    spec::Draft out = draft_with_kinds(*drafter, prompt, 9);
    CHECK((out.tokens == Tokens{80, 60, 50, 1, 2, 3, 4, 80, 50}));
    CHECK(out.kinds.size() == 9);
    for (int32_t i = 0; i < 9; ++i) {
        const uint8_t kind = i < spec::kAnswerStartDepth ? spec::kind_lookup_answer_start() : spec::kind_lookup(i);
        CHECK(out.kinds[size_t(i)] == kind);
    }
    // With two code blocks, the last one (in a conversation, the latest message's).
    const Tokens two_blocks = {80, 61, 50, 8, 80, 50, 80, 60, 50, 1, 2, 80, 50};
    auto second = spec::make_prompt_lookup_drafter(params);
    second->begin(two_blocks);
    CHECK((draft_with_kinds(*second, two_blocks, 4).tokens == Tokens{80, 60, 50, 1}));
    // A prompt that ends inside an open block (no fence after the opening one) asks for its
    // continuation: no proposal before the answer starts. A stop token after the block (the end
    // of a chat message, 90 here) closes it too: a closing fence can be split across tokens.
    const Tokens open_block = {5, 80, 70, 6, 80, 60, 50, 1, 2};
    second->begin(open_block);
    CHECK(draft_with_kinds(*second, open_block, 4).tokens.empty());
    spec::LookupParams with_stops = params;
    with_stops.stop_tokens = {90};
    const Tokens in_message = {5, 80, 60, 50, 1, 2, 3, 90, 6};
    auto third = spec::make_prompt_lookup_drafter(with_stops);
    third->begin(in_message);
    CHECK((draft_with_kinds(*third, in_message, 4).tokens == Tokens{80, 60, 50, 1}));
    third->begin(open_block);
    CHECK(draft_with_kinds(*third, open_block, 4).tokens.empty());
    // Once the answer has begun, copies are found by their keys again: after 80 the most recent
    // occurrence of 80 (the closing fence), with no fence kind (the key's fence is not followed
    // by its tag yet); the key's other occurrences went on with 70 and 60: contested.
    Tokens committed = prompt;
    committed.push_back(80);
    out = draft_with_kinds(*drafter, committed, 2);
    CHECK((out.tokens == Tokens{50, 7}) && out.kinds[0] == spec::kind_lookup_contested() &&
          out.kinds[1] == spec::kind_lookup(2));
    // The fence and its tag alone: the newline after the tag is still to come, no fence kind.
    committed.push_back(60);
    out = draft_with_kinds(*drafter, committed, 2);
    CHECK((out.tokens == Tokens{50, 1}) && out.kinds[0] == spec::kind_lookup(2) &&
          out.kinds[1] == spec::kind_lookup(3));
    committed.pop_back();
    // A key that holds the opening fence, its tag and the newline: the first kFenceDepth nodes of
    // the copy are fence nodes, the rest copy kinds by the effective match length.
    committed.insert(committed.end(), {60, 50});
    out = draft_with_kinds(*drafter, committed, spec::kFenceDepth + 2);
    CHECK(out.tokens.size() == size_t(spec::kFenceDepth + 2));
    CHECK((Tokens(out.tokens.begin(), out.tokens.begin() + 4) == Tokens{1, 2, 3, 4}));
    for (int32_t i = 0; i < spec::kFenceDepth + 2; ++i) {
        CHECK(out.kinds[size_t(i)] == (i < spec::kFenceDepth ? spec::kind_lookup_fence() : spec::kind_lookup(3 + i)));
    }
    // A fence followed by an indented token (the prose's 80 70, a closing 80 50) opens no block:
    // a key holding only such a fence keeps the copy kinds, and a prompt with no opening fence
    // gives no proposal before the answer starts.
    const Tokens no_block = {5, 80, 70, 6, 7, 80, 70};
    drafter->begin(no_block);
    out = draft_with_kinds(*drafter, no_block, 2);
    CHECK((out.tokens == Tokens{6, 7}) && out.kinds[0] == spec::kind_lookup(2) && out.kinds[1] == spec::kind_lookup(3));
    // A key as long as kFenceMaxMatch: its own length tells, no fence kind.
    const Tokens long_key = {9, 10, 11, 12, 13, 80, 60, 50, 1, 2, 0, 9, 10, 11, 12, 13, 80, 60, 50};
    drafter->begin(Tokens(long_key.begin(), long_key.begin() + 11));
    out = draft_with_kinds(*drafter, long_key, 2);
    CHECK((out.tokens == Tokens{1, 2}) && out.kinds[0] == spec::kind_lookup(8) && out.kinds[1] == spec::kind_lookup(9));
    // Without fence tokens (their default, or LookupParams::fences off in the engine) neither: no
    // proposal before the answer (its last token, 7, occurs nowhere before), copy kinds after.
    auto plain = make_drafter(4, 1);
    plain->begin(prompt);
    CHECK(draft_with_kinds(*plain, prompt, 4).tokens.empty());
    committed = prompt;
    committed.insert(committed.end(), {80, 60, 50});
    plain->begin(prompt);
    out = draft_with_kinds(*plain, committed, 3);
    CHECK((out.tokens == Tokens{1, 2, 3}) && out.kinds[0] == spec::kind_lookup(3));
}

void test_validation() {
    CHECK(throws_invalid([] { make_drafter(3, 0); }, "ngram_min=0"));
    CHECK(throws_invalid([] { make_drafter(2, 3); }, "1 <= ngram_min <= ngram_max <= 16"));
    CHECK(throws_invalid([] { make_drafter(17, 1); }, "ngram_max=17"));
    CHECK(make_drafter(16, 16) != nullptr);
    CHECK(make_drafter(3, 1)->name() == "prompt-lookup");
}

}  // namespace

int main() {
    test_no_match_proposes_nothing();
    test_proposes_what_followed();
    test_longest_match_wins_over_recent();
    test_most_recent_among_equal_lengths();
    test_repeating_pattern_continues();
    test_ngram_min();
    test_incremental_index_matches_naive_scan();
    test_begin_forgets_the_previous_request();
    test_counters();
    test_stop_tokens_end_the_continuation();
    test_unit_boundaries_have_their_own_kind();
    test_short_matches_in_the_output_have_their_own_kind();
    test_contested_nodes();
    test_substitutions_follow_the_outputs_replacement();
    test_a_rejected_substitution_is_forgotten();
    test_substitutions_keep_their_context();
    test_loose_substitutions();
    test_a_substitution_is_learnt_before_it_settles();
    test_a_replacement_before_the_first_copy_is_learnt();
    test_substitutions_off();
    test_code_fences();
    test_validation();
    std::printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
