// Token trees: validation, depths, batch layout (leaf sequences), beam compression.
#include "spec/tree.h"

#include <algorithm>
#include <string>

#include "spec/error.h"

namespace spec {

void validate_tree(const std::vector<int32_t>& parents) {
    for (size_t i = 0; i < parents.size(); ++i) {
        if (parents[i] < -1 || parents[i] >= int32_t(i)) {
            throw InvalidArgumentError("tree node " + std::to_string(i) + " has parent " + std::to_string(parents[i]) +
                                       "; parents must be -1 (the root) or an earlier node");
        }
    }
}

std::vector<int32_t> chain_parents(int32_t n) {
    std::vector<int32_t> parents(size_t(std::max(n, 0)));
    for (int32_t i = 0; i < n; ++i) parents[size_t(i)] = i - 1;
    return parents;
}

std::vector<int32_t> tree_depths(const std::vector<int32_t>& parents) {
    std::vector<int32_t> depth(parents.size());
    for (size_t i = 0; i < parents.size(); ++i) depth[i] = parents[i] < 0 ? 0 : depth[size_t(parents[i])] + 1;
    return depth;
}

TreeBatchLayout layout_tree(const std::vector<int32_t>& parents) {
    TreeBatchLayout layout;
    layout_tree(parents, layout);
    return layout;
}

void layout_tree(const std::vector<int32_t>& parents, TreeBatchLayout& layout) {
    validate_tree(parents);
    const size_t n = parents.size();
    // Every vector is refilled in place: a layout reused step after step stops allocating once
    // it has held a tree of this size (the decoder lays out a draft every step).
    layout.n_leaves = 0;
    layout.depth.resize(n);
    for (size_t i = 0; i < n; ++i) layout.depth[i] = parents[i] < 0 ? 0 : layout.depth[size_t(parents[i])] + 1;
    layout.leaf_seq.assign(n, 0);
    layout.root_seq_ids.assign(1, 0);
    layout.seq_begin.resize(n + 1);

    std::vector<int32_t>& children = layout.scratch;
    children.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
        if (parents[i] >= 0) ++children[size_t(parents[i])];
    }
    int32_t n_leaves = 0;
    for (size_t i = 0; i < n; ++i) n_leaves += children[i] ? 0 : 1;
    if (n_leaves <= 1) {
        // A chain: one path, the committed sequence itself.
        layout.seq_ids.assign(n, 0);
        for (size_t i = 0; i <= n; ++i) layout.seq_begin[i] = int32_t(i);
        return;
    }

    // Leaves get 1..n_leaves in node order; each leaf's sequence id goes up the path to the root.
    // Walking leaves in increasing order makes every node's first id its lowest leaf.
    if (n_leaves + 1 > kMaxTreeSeqs) {
        throw InvalidArgumentError("a draft tree has at most " + std::to_string(kMaxTreeSeqs - 1) + " leaves, got " +
                                   std::to_string(n_leaves));
    }
    layout.n_leaves = n_leaves;
    // A node's sequences are its leaves': count them, lay the counts end to end, then fill. The
    // leaf_seq vector counts first (leaves below each node), then what each node has received.
    std::vector<int32_t>& count = layout.leaf_seq;
    for (size_t i = 0; i < n; ++i) {
        if (children[i]) continue;
        for (int32_t node = int32_t(i); node >= 0; node = parents[size_t(node)]) ++count[size_t(node)];
    }
    layout.seq_begin[0] = 0;
    for (size_t i = 0; i < n; ++i) layout.seq_begin[i + 1] = layout.seq_begin[i] + count[i];
    layout.seq_ids.resize(size_t(layout.seq_begin[n]));
    std::fill(count.begin(), count.end(), 0);
    int32_t seq = 0;
    for (size_t i = 0; i < n; ++i) {
        if (children[i]) continue;
        ++seq;
        for (int32_t node = int32_t(i); node >= 0; node = parents[size_t(node)]) {
            layout.seq_ids[size_t(layout.seq_begin[size_t(node)] + count[size_t(node)]++)] = seq;
        }
        layout.root_seq_ids.push_back(seq);
    }
    // Leaves were walked in increasing order, so every node's first id is its lowest leaf.
    for (size_t i = 0; i < n; ++i) layout.leaf_seq[i] = layout.seq_ids[size_t(layout.seq_begin[i])];
}

std::vector<int32_t> select_tree_nodes(const std::vector<int32_t>& candidate_parent, const std::vector<double>& score,
                                       int32_t n, std::vector<int32_t>& node_parent) {
    const size_t n_candidates = candidate_parent.size();
    std::vector<int32_t> order(n_candidates);
    for (size_t c = 0; c < n_candidates; ++c) order[c] = int32_t(c);
    std::stable_sort(order.begin(), order.end(), [&score](int32_t x, int32_t y) { return score[size_t(x)] > score[size_t(y)]; });
    std::vector<int32_t> node_of(n_candidates, -1), kept;
    node_parent.clear();
    for (int32_t c : order) {
        if (int32_t(kept.size()) >= n) break;
        const int32_t parent = candidate_parent[size_t(c)];
        const int32_t parent_node = parent < 0 ? -1 : node_of[size_t(parent)];
        if (parent >= 0 && parent_node < 0) continue;  // its parent was not kept (a tie)
        node_of[size_t(c)] = int32_t(kept.size());
        kept.push_back(c);
        node_parent.push_back(parent_node);
    }
    return kept;
}

std::vector<int32_t> prefix_match(const std::vector<int32_t>& beams, int32_t n_beams, int32_t length) {
    if (n_beams < 0 || length < 0 || beams.size() != size_t(n_beams) * size_t(length)) {
        throw InvalidArgumentError("prefix_match: beams must hold n_beams * length = " +
                                   std::to_string(int64_t(n_beams) * length) + " tokens, got " +
                                   std::to_string(beams.size()));
    }
    const size_t K = size_t(n_beams), L = size_t(length);
    // count[i][k][j]: how many of the first j + 1 tokens of beams i and k are equal (cumulative
    // sum of the equality tensor along the length). The prefixes match iff count == j + 1.
    std::vector<int32_t> count(K * K * L);
    for (size_t i = 0; i < K; ++i) {
        for (size_t k = 0; k < K; ++k) {
            int32_t running = 0;
            for (size_t j = 0; j < L; ++j) {
                running += beams[i * L + j] == beams[k * L + j] ? 1 : 0;
                count[(i * K + k) * L + j] = running;
            }
        }
    }
    // First k with a full match (k = i always matches, so there is one).
    std::vector<int32_t> match(K * L);
    for (size_t i = 0; i < K; ++i) {
        for (size_t j = 0; j < L; ++j) {
            size_t k = 0;
            while (count[(i * K + k) * L + j] != int32_t(j + 1)) ++k;
            match[i * L + j] = int32_t(k);
        }
    }
    return match;
}

BeamTree beams_to_tree(const std::vector<int32_t>& beams, int32_t n_beams, int32_t length) {
    const std::vector<int32_t> match = prefix_match(beams, n_beams, length);
    const size_t L = size_t(length);
    BeamTree tree;
    tree.node_of.assign(beams.size(), -1);
    for (size_t i = 0; i < size_t(n_beams); ++i) {
        for (size_t j = 0; j < L; ++j) {
            const size_t k = size_t(match[i * L + j]);
            if (k < i) {
                // Shared with an earlier beam, which already made the node.
                tree.node_of[i * L + j] = tree.node_of[k * L + j];
                continue;
            }
            tree.node_of[i * L + j] = int32_t(tree.tokens.size());
            tree.tokens.push_back(beams[i * L + j]);
            tree.parents.push_back(j == 0 ? -1 : tree.node_of[i * L + j - 1]);
        }
    }
    return tree;
}

int32_t add_chain(std::vector<int32_t>& tokens, std::vector<int32_t>& parents, int32_t parent,
                  const int32_t* chain, int32_t n_chain, int32_t max_nodes) {
    int32_t node = parent;
    for (int32_t i = 0; i < n_chain; ++i) {
        int32_t next = -1;
        for (size_t c = size_t(node + 1); c < tokens.size(); ++c) {  // children come after their parent
            if (parents[c] == node && tokens[c] == chain[i]) {
                next = int32_t(c);
                break;
            }
        }
        if (next < 0) {
            if (int32_t(tokens.size()) >= max_nodes) break;
            next = int32_t(tokens.size());
            tokens.push_back(chain[i]);
            parents.push_back(node);
        }
        node = next;
    }
    return node;
}

std::vector<int32_t> accepted_path(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                   const std::vector<int32_t>& committed, int32_t n_accepted) {
    if (n_accepted < 0 || size_t(n_accepted) + 1 > committed.size() || size_t(n_accepted) > tokens.size()) {
        throw InvalidArgumentError("accepted_path: " + std::to_string(n_accepted) + " accepted tokens do not fit");
    }
    const size_t first = committed.size() - 1 - size_t(n_accepted);
    std::vector<int32_t> path;
    int32_t node = -1;
    for (int32_t j = 0; j < n_accepted; ++j) {
        const int32_t want = committed[first + size_t(j)];
        int32_t next = -1;
        for (size_t c = 0; c < tokens.size(); ++c) {
            const int32_t parent = parents.empty() ? int32_t(c) - 1 : parents[c];
            if (parent == node && tokens[c] == want) {
                next = int32_t(c);
                break;
            }
        }
        if (next < 0) throw InvalidArgumentError("the accepted tokens are not a path of the last draft");
        path.push_back(next);
        node = next;
    }
    return path;
}

}  // namespace spec
