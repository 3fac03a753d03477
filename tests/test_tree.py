"""Candidate trees (engine/tree.py): their shape, and the acceptance rules that keep one path."""

import numpy as np
import pytest

from localspec.engine.tree import ROOT, DraftTree, accept_greedy_tree, accept_sampled_tree, place, with_alternates


def test_branches_sharing_a_prefix_share_its_nodes():
    tree = DraftTree.of_branches([[5, 6, 7], [5, 8, 9], [4]])
    assert tree.tokens == (5, 6, 7, 8, 9, 4)
    assert tree.parents == (ROOT, 0, 1, 0, 3, ROOT)
    assert tree.children(ROOT) == [0, 5] and tree.children(0) == [1, 3]
    assert tree.path(4) == [0, 3, 4] and tree.ancestors(4) == [0, 3] and tree.depth(4) == 3
    assert tree.branches() == [[5, 6, 7], [5, 8, 9], [4]]
    assert not tree.is_chain() and DraftTree.of_branches([[1, 2, 3]]).is_chain()
    with pytest.raises(ValueError):
        DraftTree((1, 2), (ROOT, 1))  # a node its own parent


def test_greedy_keeps_the_branch_the_target_agrees_with_and_adds_its_token():
    tree = DraftTree.of_branches([[5, 6, 7], [5, 8, 9]])
    wanted = {(): 5, (5,): 8, (5, 8): 9, (5, 8, 9): 1}  # the target's greedy answer after each drafted path
    rows = []

    def choice(row, path_tokens):
        rows.append(row)
        return wanted[tuple(path_tokens)]

    assert accept_greedy_tree(tree, choice) == ([0, 3, 4], 1)
    assert rows == [0, 1, 4, 5]  # each node's own verify row: node i is row i + 1
    assert accept_greedy_tree(tree, lambda row, path: 3) == ([], 3)  # no branch: the target's token alone


def _two_tokens(tree_of, p1, p2, trials, seed):
    """How often each pair of first two answer tokens comes out of a round on the tree `tree_of(rng)`
    (then plain sampling, if the round kept fewer than two)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((len(p1), len(p1)))
    draw = lambda probs: int(rng.choice(len(probs), p=probs / probs.sum()))  # noqa: E731

    def probs(_row, path_tokens):
        return p1 if not path_tokens else p2[path_tokens[0]]

    for _ in range(trials):
        tree = tree_of(rng)
        path, token = accept_sampled_tree(tree, probs, rng.random, draw)
        out = [tree.tokens[n] for n in path] + [token]
        if len(out) < 2:
            out.append(draw(p2[out[0]]))
        counts[out[0], out[1]] += 1
    return counts / trials


P1 = np.array([0.45, 0.25, 0.2, 0.1])
P2 = np.array([[0.7, 0.1, 0.1, 0.1], [0.05, 0.05, 0.45, 0.45], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.2, 0.8]])
JOINT = P1[:, None] * P2


def test_lookup_siblings_keep_the_target_distribution():
    """Copies (no distribution) at both depths, including a token the target never picks there."""
    tree = DraftTree.of_branches([[2, 3], [1, 0], [1, 2], [3, 0]])
    freq = _two_tokens(lambda rng: tree, P1, P2, 40_000, seed=3)
    assert 0.5 * np.abs(freq - JOINT).sum() < 0.015


def test_a_models_sample_beside_a_copy_keeps_the_target_distribution():
    """The first child a copy's token, the second a draft model's sample from a wrong q (drawn anew
    each round), each with a child of its own."""
    q1 = np.array([0.1, 0.1, 0.1, 0.7])
    q2 = np.array([0.4, 0.3, 0.2, 0.1])

    def tree_of(rng):
        x = int(rng.choice(4, p=q1))  # at times the copy's own token: still a candidate of its own
        y = int(rng.choice(4, p=q2))
        return DraftTree((0, 2, x, y), (ROOT, 0, ROOT, 2), (None, None, q1, q2))

    freq = _two_tokens(tree_of, P1, P2, 40_000, seed=4)
    assert 0.5 * np.abs(freq - JOINT).sum() < 0.015


def test_greedy_and_a_chain_agree_with_the_chain_rule():
    """A chain as a tree keeps what accept_greedy keeps."""
    from localspec.engine.sampling import accept_greedy

    draft = [4, 5, 6]
    choices = [4, 5, 9, 2]
    tree = DraftTree.of_branches([draft])
    path, token = accept_greedy_tree(tree, lambda row, _path: choices[row])
    assert (len(path), token) == accept_greedy(draft, choices)


def test_a_models_sample_folded_into_a_copys_node_would_bias_the_answer():
    """Why a model's sample stays a candidate of its own (engine/tree.py): dropped where the copy holds
    the same token, the samples left are drawn from q short of it, and the first token's distribution
    moves far past the sampling noise of the rule kept."""
    q1 = np.array([0.6, 0.1, 0.1, 0.2])
    q2 = np.array([0.4, 0.3, 0.2, 0.1])

    def tree_of(rng, fold):
        x = int(rng.choice(4, p=q1))
        y = int(rng.choice(4, p=q2))
        if fold and x == 0:
            return DraftTree((0, 2, y), (ROOT, 0, 0), (None, None, q2))
        return DraftTree((0, 2, x, y), (ROOT, 0, ROOT, 2), (None, None, q1, q2))

    folded = _two_tokens(lambda rng: tree_of(rng, True), P1, P2, 30_000, seed=5)
    kept_apart = _two_tokens(lambda rng: tree_of(rng, False), P1, P2, 30_000, seed=5)
    assert 0.5 * np.abs(folded.sum(axis=1) - P1).sum() > 0.03
    assert 0.5 * np.abs(kept_apart.sum(axis=1) - P1).sum() < 0.015


def test_a_chain_with_alternates_puts_each_beside_its_depth_and_one_after():
    q = np.eye(4)[[0, 1, 2, 3]]  # a row per depth, chain's three and the one after
    tree = with_alternates([5, 6, 7], [8, None, 9, 10], q)
    assert tree.branches() == [[8], [5, 6, 9], [5, 6, 7, 10]]
    assert [tree.depth(n) for n in range(len(tree))] == [1, 2, 3, 1, 3, 4]
    assert [int(np.argmax(row)) for row in tree.q] == [0, 1, 2, 0, 2, 3]  # a leaf shares its depth's q
    assert tree.branch_through(1) == [5, 6, 7, 10] and tree.branch_through(4) == [5, 6, 9]
    with pytest.raises(ValueError):
        with_alternates([5], [1, 2, 3])


def test_placement_gives_the_chain_the_main_sequence_and_each_other_branch_a_spare():
    tree = with_alternates([5, 6, 7], [8, None, 9, 10])
    placed = place(tree, 0, [3, 4, 5])
    # the chain and the leaf after it are the first branch: main; [8] and [5, 6, 9] the spares, in order
    assert placed.sequences == (0, 3, 4)
    assert placed.holders == ((0, 4), (0, 4), (0,), (3,), (4,), (0,))
    assert placed.keeper([0, 1, 2, 5], 0) == 0 and placed.keeper([0, 1, 4], 0) == 4 and placed.keeper([], 0) == 0
    with pytest.raises(ValueError):
        place(tree, 0, [3])  # three branches, one spare


def test_second_candidates_go_where_the_chain_is_likeliest_to_need_them():
    from localspec.engine.drafters.model import with_leaves

    # (candidate, its worth where its depth is reached, the chain's confidence there)
    seconds = [(10, 0.05, 0.95), (11, 0.4, 0.5), (12, 0.3, 0.6), (13, 0.35, 0.0)]
    tree = with_leaves([1, 2, 3], seconds, 2, None)
    # reach x worth: 0.05, 0.95*0.4 = 0.38, 0.475*0.3 = 0.14, 0.285*0.35 = 0.10
    assert tree.branches() == [[1, 2, 3], [1, 11], [1, 2, 12]]


def test_free_positions_climb_the_staircase_only_as_far_as_it_is_flat():
    from localspec.engine.adaptive import CostModel, free_positions

    cpu = CostModel({1: 1.0, 2: 1.8, 4: 2.8, 8: 7.75, 12: 8.57, 16: 8.57})
    assert free_positions(cpu, 4) == 4 and free_positions(cpu, 8) == 8
    assert free_positions(cpu, 12) == 16 and free_positions(cpu, 8, slack=0.25) == 16
    gpu = CostModel({n: 1.0 + 0.002 * n for n in (1, 2, 4, 8, 16, 32, 64)})
    assert free_positions(gpu, 5) == 32
