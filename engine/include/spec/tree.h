// Token trees: the shape of a multi-candidate draft, its layout in one llama_batch, and the
// compression of beam-search results into a tree. Pure functions over index arrays, no model.
//
// A tree of n nodes is given by `parents` ([n]): parents[i] is the node that token i follows, or
// -1 when it follows the root (the last committed token, not itself a node). Parents come first
// (parents[i] < i), and siblings are in the order the drafter proposes them, which is the order
// verification tries them in. A chain is the tree with parents[i] = i - 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spec {

// Sequences one target call can address: 1 for the committed sequence plus one per leaf of the
// tree. llama.cpp allows up to 256 (LLAMA_MAX_SEQ); 64 keeps the per-cell bookkeeping small and
// is far above the trees worth verifying on a CPU. The tree drafters build at most kMaxTreeNodes
// nodes (each decoded draft node takes a sequence of the draft model too); a chain, one leaf,
// may be longer.
constexpr int32_t kMaxTreeSeqs = 64;
constexpr int32_t kMaxTreeNodes = kMaxTreeSeqs - 1;

// Throws InvalidArgumentError naming the first bad entry unless every parents[i] is in [-1, i).
void validate_tree(const std::vector<int32_t>& parents);

// parents of a chain of n nodes: {-1, 0, 1, ..., n-2}.
std::vector<int32_t> chain_parents(int32_t n);

// Depth of each node: 0 for a child of the root.
// returns: [n]
std::vector<int32_t> tree_depths(const std::vector<int32_t>& parents);

// How the root and the nodes go into one batch on top of the committed sequence (sequence 0).
// Each leaf gets its own sequence id 1..n_leaves; a node belongs to the sequences of the leaves
// below it, so a query at a node sees exactly its ancestors (llama.cpp masks a query by its first
// sequence id, listed first here: the lowest leaf below the node). The root belongs to sequence 0
// and every leaf sequence. A chain (one leaf) needs no extra sequence: everything is sequence 0.
// Before the batch is decoded every leaf sequence must also hold the committed tokens (copy
// sequence 0 into it).
struct TreeBatchLayout {
    std::vector<int32_t> depth;         // [n] node i goes at position n_past + 1 + depth[i]
    // The sequence ids of node i, lowest leaf first, are seq_ids[seq_begin[i] .. seq_begin[i + 1]):
    // one flat buffer for all nodes, so a layout refilled every step stops allocating.
    std::vector<int32_t> seq_ids;       // [sum over nodes of their sequence counts]
    std::vector<int32_t> seq_begin;     // [n + 1]
    std::vector<int32_t> root_seq_ids;  // sequence ids of the root
    std::vector<int32_t> leaf_seq;      // [n] the first sequence id of node i
    int32_t n_leaves = 0;               // leaf sequences used (0 for a chain)
    std::vector<int32_t> scratch;       // [n] layout_tree's: children, then a fill cursor, per node

    int32_t n_nodes() const { return int32_t(depth.size()); }
    const int32_t* node_seq_ids(int32_t i) const { return seq_ids.data() + seq_begin[std::size_t(i)]; }
    int32_t n_node_seq_ids(int32_t i) const { return seq_begin[std::size_t(i) + 1] - seq_begin[std::size_t(i)]; }
};

// Throws InvalidArgumentError for a malformed tree or more than kMaxTreeSeqs - 1 leaves.
TreeBatchLayout layout_tree(const std::vector<int32_t>& parents);
// The same into `layout`, reusing its vectors: no allocation once it has held a tree of this
// size and shape (what the decoder does every step).
void layout_tree(const std::vector<int32_t>& parents, TreeBatchLayout& layout);

// ReDrafter's get_prefix_match: for beams [n_beams, length] (row-major), match[i][j] is the
// smallest beam index k whose first j + 1 tokens equal beam i's first j + 1 tokens (so k <= i,
// and k == i means beam i's prefix of length j + 1 is new). Computed with whole-array operations
// as in the paper: an equality tensor, a cumulative sum along the length, and the first index
// whose count of matches equals j + 1; no trie walk.
// beams: [n_beams * length], returns: [n_beams * length]
std::vector<int32_t> prefix_match(const std::vector<int32_t>& beams, int32_t n_beams, int32_t length);

// Beams compressed into a tree: one node per distinct prefix, in beam-major order.
struct BeamTree {
    std::vector<int32_t> tokens;   // [n_nodes]
    std::vector<int32_t> parents;  // [n_nodes]
    std::vector<int32_t> node_of;  // [n_beams * length] the node holding beams[i][j]
};

// Builds the tree from prefix_match: beams[i][j] is a new node iff match[i][j] == i, and its
// parent is the node of beams[i][j - 1]. The compression ratio is n_beams * length / n_nodes.
// beams: [n_beams * length]
BeamTree beams_to_tree(const std::vector<int32_t>& beams, int32_t n_beams, int32_t length);

// Adds a chain of candidate tokens below node `parent` (-1: the root) of the tree (tokens,
// parents), reusing nodes where the tree already has the same token below the same parent
// (shared prefixes), and creating at most max_nodes nodes in all. Returns the deepest node of the
// chain that is in the tree (`parent` when not even its first token fits).
// chain: [n_chain]
int32_t add_chain(std::vector<int32_t>& tokens, std::vector<int32_t>& parents, int32_t parent,
                  const int32_t* chain, int32_t n_chain, int32_t max_nodes);

// EAGLE-2's selection from a grown candidate tree: the n candidates of highest score, best first
// (ties: the earlier candidate), a candidate after its parent and only when its parent was kept.
// A score that never rises along a path (a product of probabilities) keeps every parent ahead of
// its children. candidate_parent: [c] a candidate index or -1 (the root); score: [c].
// Returns the kept candidates in tree order; node_parent: [kept] the tree node of each one's
// parent (-1: the root).
std::vector<int32_t> select_tree_nodes(const std::vector<int32_t>& candidate_parent, const std::vector<double>& score,
                                       int32_t n, std::vector<int32_t>& node_parent);

// The nodes of a tree (tokens, parents; parents empty: a chain) that the accepted tokens walk
// through: the n_accepted tokens before the last of `committed`, root first. Throws
// InvalidArgumentError when they are not a path of the tree.
std::vector<int32_t> accepted_path(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                   const std::vector<int32_t>& committed, int32_t n_accepted);

}  // namespace spec
