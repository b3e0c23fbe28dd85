// Token trees: batch layout (positions, sequence-id sets), ReDrafter's prefix_match, beam
// compression, greedy tree verification, validation. Hand-made trees, no model.
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "check.h"
#include "spec/drafter.h"
#include "spec/tree.h"
#include "spec/verify.h"

using namespace spec;
using Ids = std::vector<int32_t>;
using IdSets = std::vector<std::vector<int32_t>>;

// Heap allocations made by this executable (global operator new replaced below).
long g_allocations = 0;

// The sequence ids of every node of a layout, as lists.
IdSets node_ids(const TreeBatchLayout& layout) {
    IdSets ids;
    for (int32_t i = 0; i < layout.n_nodes(); ++i) {
        ids.emplace_back(layout.node_seq_ids(i), layout.node_seq_ids(i) + layout.n_node_seq_ids(i));
    }
    return ids;
}

void* operator new(std::size_t n) {
    ++g_allocations;
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

void test_chain_layout() {
    // A chain is one path: every node in sequence 0, no leaf sequences.
    const TreeBatchLayout layout = layout_tree(chain_parents(4));
    CHECK((layout.depth == Ids{0, 1, 2, 3}));
    CHECK((node_ids(layout) == IdSets{{0}, {0}, {0}, {0}}));
    CHECK((layout.root_seq_ids == Ids{0}));
    CHECK(layout.n_leaves == 0);
    CHECK(layout_tree({}).n_leaves == 0);
}

void test_tree_layout() {
    // root -> 0 -> 2 -> 5
    //           0 -> 3
    //      -> 1 -> 4
    // Leaves in node order: 3, 4, 5 -> sequences 1, 2, 3.
    const Ids parents = {-1, -1, 0, 0, 1, 2};
    const TreeBatchLayout layout = layout_tree(parents);
    CHECK((layout.depth == Ids{0, 0, 1, 1, 1, 2}));
    CHECK(layout.n_leaves == 3);
    const IdSets ids = node_ids(layout);
    CHECK((ids == IdSets{{1, 3}, {2}, {3}, {1}, {2}, {3}}));
    CHECK((layout.root_seq_ids == Ids{0, 1, 2, 3}));
    CHECK((layout.leaf_seq == Ids{1, 2, 3, 1, 2, 3}));
    // Every node's first sequence is a leaf below it whose path contains exactly the node's
    // ancestors at smaller depths: node 5 (seq 3) sees 2 and 0, never 3 or 1.
    for (size_t i = 0; i < parents.size(); ++i) {
        const int32_t seq = layout.leaf_seq[i];
        for (int32_t a = parents[i]; a >= 0; a = parents[size_t(a)]) {
            bool has = false;
            for (int32_t s : ids[size_t(a)]) has = has || s == seq;
            CHECK(has);
        }
    }
    for (int32_t s : ids[3]) CHECK(s != 3);
    for (int32_t s : ids[1]) CHECK(s != 3);
}

void test_star_layout() {
    // Root with three children: three leaves at depth 0, each its own sequence.
    const TreeBatchLayout layout = layout_tree({-1, -1, -1});
    CHECK((layout.depth == Ids{0, 0, 0}));
    CHECK((node_ids(layout) == IdSets{{1}, {2}, {3}}));
    CHECK((layout.root_seq_ids == Ids{0, 1, 2, 3}));
}

void test_layout_in_place_stops_allocating() {
    // The decoder lays out a draft every step into one layout: once it has held the largest
    // tree, laying out that tree, a chain, an empty draft or a smaller tree allocates nothing, and
    // gives what a fresh layout of the same parents gives.
    const Ids tree = {-1, -1, 0, 0, 1, 2, 5, 5, -1, 8};
    const Ids chain = chain_parents(6), none, small = {-1, 0, 0};
    TreeBatchLayout layout;
    layout_tree(tree, layout);
    const long before = g_allocations;
    for (int i = 0; i < 100; ++i) {
        for (const Ids* parents : {&tree, &chain, &none, &small, &tree}) layout_tree(*parents, layout);
    }
    CHECK(g_allocations == before);
    for (const Ids* parents : {&tree, &chain, &none, &small}) {
        layout_tree(*parents, layout);
        const TreeBatchLayout fresh = layout_tree(*parents);
        CHECK(node_ids(layout) == node_ids(fresh));
        CHECK((layout.depth == fresh.depth) && (layout.root_seq_ids == fresh.root_seq_ids));
        CHECK((layout.leaf_seq == fresh.leaf_seq) && layout.n_leaves == fresh.n_leaves);
    }
}

void test_validation() {
    CHECK(throws_invalid([] { validate_tree({-1, 1}); }, "tree node 1 has parent 1"));
    CHECK(throws_invalid([] { validate_tree({0}); }, "tree node 0 has parent 0"));
    CHECK(throws_invalid([] { validate_tree({-1, -2}); }, "parent -2"));
    CHECK(throws_invalid([] { layout_tree(std::vector<int32_t>(size_t(kMaxTreeSeqs), -1)); }, "at most 63 leaves"));
    CHECK(layout_tree(std::vector<int32_t>(size_t(kMaxTreeSeqs - 1), -1)).n_leaves == kMaxTreeSeqs - 1);
    CHECK(layout_tree(chain_parents(200)).depth.back() == 199);  // long chains need no leaf sequences
    CHECK(throws_invalid([] { prefix_match({1, 2, 3}, 2, 2); }, "n_beams * length"));
    CHECK(throws_invalid([] { verify_tree_greedy({1, 2}, {-1, -1}, {0, 0}); }, "need n + 1"));
}

void test_prefix_match_paper_example() {
    // ReDrafter, Listing 1: beams 91 92 93 95 / 91 92 94 96 / 91 92 93 97.
    const Ids beams = {91, 92, 93, 95, 91, 92, 94, 96, 91, 92, 93, 97};
    CHECK((prefix_match(beams, 3, 4) == Ids{0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 2}));
    const BeamTree tree = beams_to_tree(beams, 3, 4);
    // 12 tokens -> 7 nodes: 91 92 93 95 | 94 96 | 97.
    CHECK((tree.tokens == Ids{91, 92, 93, 95, 94, 96, 97}));
    CHECK((tree.parents == Ids{-1, 0, 1, 2, 1, 4, 2}));
    CHECK((tree.node_of == Ids{0, 1, 2, 3, 0, 1, 4, 5, 0, 1, 2, 6}));
}

void test_prefix_match_extremes() {
    // No shared prefix: every token is its own node, K chains under the root.
    const Ids distinct = {1, 2, 3, 4, 5, 6};
    CHECK((prefix_match(distinct, 3, 2) == Ids{0, 0, 1, 1, 2, 2}));
    const BeamTree a = beams_to_tree(distinct, 3, 2);
    CHECK((a.tokens == distinct));
    CHECK((a.parents == Ids{-1, 0, -1, 2, -1, 4}));
    // Fully shared: identical beams collapse into one chain.
    const Ids same = {7, 8, 9, 7, 8, 9};
    CHECK((prefix_match(same, 2, 3) == Ids{0, 0, 0, 0, 0, 0}));
    const BeamTree b = beams_to_tree(same, 2, 3);
    CHECK((b.tokens == Ids{7, 8, 9}));
    CHECK((b.parents == Ids{-1, 0, 1}));
    // A later equal token after a different prefix is not shared: 1 2 / 3 2.
    const BeamTree c = beams_to_tree({1, 2, 3, 2}, 2, 2);
    CHECK((c.tokens == Ids{1, 2, 3, 2}));
    CHECK((c.parents == Ids{-1, 0, -1, 2}));
    // Empty input.
    CHECK(beams_to_tree({}, 0, 0).tokens.empty());
}

void test_verify_tree_greedy() {
    // Tree of test_tree_layout with tokens; row r = 0 root, r = i + 1 node i.
    const Ids parents = {-1, -1, 0, 0, 1, 2};
    const Ids tokens = {10, 11, 12, 13, 14, 15};
    // Target wants 11 at the root, then 14, then 99: path 1 -> 4 (a leaf): bonus 99.
    Ids argmax = {11, 0, 14, 0, 0, 99, 0};
    TreeVerdict v = verify_tree_greedy(tokens, parents, argmax);
    CHECK((v.path == Ids{1, 4}));
    CHECK(v.next_token == 99);
    CHECK(v.is_bonus);
    // Root wants 10, node 0 wants 13 (the second child), node 3 is a leaf: bonus from row 4.
    argmax = {10, 13, 0, 0, 42, 0, 0};
    v = verify_tree_greedy(tokens, parents, argmax);
    CHECK((v.path == Ids{0, 3}));
    CHECK(v.next_token == 42);
    // Root wants something no child has: nothing accepted, the target's token, not a bonus.
    argmax = {77, 0, 0, 0, 0, 0, 0};
    v = verify_tree_greedy(tokens, parents, argmax);
    CHECK(v.path.empty());
    CHECK(v.next_token == 77);
    CHECK(!v.is_bonus);
    // Rejected below an accepted node: path 0 -> 2, then node 2's child 15 rejected for 5.
    argmax = {10, 12, 0, 5, 0, 0, 0};
    v = verify_tree_greedy(tokens, parents, argmax);
    CHECK((v.path == Ids{0, 2}));
    CHECK(v.next_token == 5);
    CHECK(!v.is_bonus);
}

void test_verify_tree_deterministic_rejection_extremes() {
    // One-hot candidates against one-hot targets: the outcome is certain.
    const int32_t V = 4;
    std::vector<float> p = {
        0, 1, 0, 0,  // root: token 1
        0, 0, 0, 1,  // node 0 (token 0): never reached
        0, 0, 1, 0,  // node 1 (token 1): token 2
    };
    std::vector<float> residual;
    Rng rng(3);
    for (int trial = 0; trial < 50; ++trial) {
        const TreeVerdict v = verify_tree_rejection({0, 1}, {-1, -1}, p.data(), nullptr, V, rng, residual);
        CHECK((v.path == Ids{1}));
        CHECK(v.next_token == 2);
        CHECK(v.is_bonus);
    }
}

// The decoder checks every draft before verification reads it: the arrays must agree in length
// (a drafter that fills probability rows for fewer tokens than it proposes would make verification
// read past the buffer).
void test_check_draft() {
    const int32_t V = 4;
    Draft good;
    good.tokens = {1, 2, 3};
    check_draft(good, V);  // a chain without probability rows: deterministic
    good.parents = {-1, 0, 0};
    good.kinds = {0, 0, 0};
    good.probs.assign(3 * V, 0.25f);
    check_draft(good, V);
    Draft short_probs = good;
    short_probs.probs.resize(2 * V);
    CHECK(throws_invalid([&] { check_draft(short_probs, V); }, "8 probability values, expected 3 rows of 4"));
    Draft long_probs = good;
    long_probs.probs.resize(3 * V + 1);
    CHECK(throws_invalid([&] { check_draft(long_probs, V); }, "13 probability values"));
    Draft parents = good;
    parents.parents.pop_back();
    CHECK(throws_invalid([&] { check_draft(parents, V); }, "2 parents"));
    Draft kinds = good;
    kinds.kinds.push_back(0);
    CHECK(throws_invalid([&] { check_draft(kinds, V); }, "4 node kinds"));
    Draft token = good;
    token.tokens[1] = V;
    CHECK(throws_invalid([&] { check_draft(token, V); }, "draft token 1 is 4, outside the vocabulary [0, 4)"));
    CHECK(throws_invalid([&] { check_draft(good, 0); }, "n_vocab must be > 0"));
}

int main() {
    test_chain_layout();
    test_tree_layout();
    test_star_layout();
    test_layout_in_place_stops_allocating();
    test_validation();
    test_prefix_match_paper_example();
    test_prefix_match_extremes();
    test_verify_tree_greedy();
    test_verify_tree_deterministic_rejection_extremes();
    test_check_draft();
    std::printf("test_tree: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
