"""TEDS (PubTabNet): the tree edit distance against an independent recursive reference, and the
LaTeX table tree (spanning cells, placeholders, non-table text)."""

import functools
import random

import pytest
from mmrl.rewards.teds import Node, latex_table_tree, rename_cost, teds, tree_edit_distance


def as_forest(node: Node) -> tuple:
    return ((node.tag, node.colspan, node.rowspan, tuple(node.content), as_forest_children(node)),)


def as_forest_children(node: Node) -> tuple:
    return tuple(t for c in node.children for t in as_forest(c))


def label_cost(a: tuple, b: tuple) -> float:
    return rename_cost(Node(a[0], a[1], a[2], list(a[3])), Node(b[0], b[1], b[2], list(b[3])))


def size(forest: tuple) -> int:
    return sum(1 + size(t[4]) for t in forest)


@functools.lru_cache(maxsize=None)
def forest_distance(f: tuple, g: tuple) -> float:
    """The textbook recursion on the rightmost roots (Tai 1979 / Zhang-Shasha's definition):
    delete v (its children take its place), insert w, or match v with w."""
    if not f or not g:
        return float(size(f) + size(g))
    v, w = f[-1], g[-1]
    return min(forest_distance(f[:-1] + v[4], g) + 1,
               forest_distance(f, g[:-1] + w[4]) + 1,
               forest_distance(v[4], w[4]) + forest_distance(f[:-1], g[:-1]) + label_cost(v, w))


def random_table(rng: random.Random) -> Node:
    rows = [Node("tr", children=[Node(rng.choice(["td", "td", "th"]), rng.choice([1, 2]), rng.choice([1, 1, 2]),
                                      list(rng.choice(["", "a", "ab", "ba", "abc"])))
                                 for _ in range(rng.randint(0, 3))]) for _ in range(rng.randint(1, 3))]
    return Node("table", children=rows if rng.random() < 0.7 else [Node("tbody", children=rows)])


def test_tree_edit_distance_against_recursive_reference():
    rng = random.Random(0)
    for _ in range(150):
        a, b = random_table(rng), random_table(rng)
        assert tree_edit_distance(a, b) == pytest.approx(forest_distance(as_forest(a), as_forest(b)))


ROW = r"\begin{tabular}{cccc} a & b & c & d \\ \end{tabular}"
TWO_ROWS = r"\begin{tabular}{cc}\hline a & b \\ c & d \\ \hline \end{tabular}"


def test_row_split_costs_three_edits():
    a, b = latex_table_tree(ROW), latex_table_tree(TWO_ROWS)
    assert (a.size(), b.size()) == (6, 7)
    # delete the row node (its 4 cells move up), insert two row nodes over a b and c d
    assert tree_edit_distance(a, b) == 3.0 == forest_distance(as_forest(a), as_forest(b))
    # normalised by the larger count of nodes below the table node (PubTabNet's original code): 6
    assert teds(ROW, TWO_ROWS) == pytest.approx(1 - 3 / 6)


def test_spanning_cells_and_placeholders():
    code = (r"\begin{tabular}{|c|c|c|}\toprule \multicolumn{2}{c}{Head} & \multirow{2}{*}{M} \\ \cmidrule(lr){1-2}"
            r" x & y & \\ \multicolumn{3}{l}{\textbf{all}} \\ \bottomrule \end{tabular}")
    tree = latex_table_tree(code)
    cells = [[(td.colspan, td.rowspan, "".join(td.content)) for td in tr.children] for tr in tree.children]
    assert cells == [[(2, 1, "Head"), (1, 2, "M")], [(1, 1, "x"), (1, 1, "y")], [(3, 1, r"\textbf{all}")]]
    # the same table with the span written as plain cells differs by renames and an insertion
    plain = code.replace(r"\multicolumn{2}{c}{Head}", "Head &")
    assert 0 < teds(plain, code) < 1


def test_identical_and_non_tables():
    assert teds(TWO_ROWS, TWO_ROWS) == 1.0
    assert teds("just some text", TWO_ROWS) == 0.0
    assert teds(TWO_ROWS, "x = 1") == 0.0
    # escaped ampersand and a cell content edit: 1 of 2 characters
    one = r"\begin{tabular}{c} a\&b \\ \end{tabular}"
    assert latex_table_tree(one).children[0].children[0].content == list(r"a\&b")
    assert teds(r"\begin{tabular}{c} ab \end{tabular}", r"\begin{tabular}{c} ac \end{tabular}") == pytest.approx(
        1 - (1 / 2) / 2)


def test_structure_only_ignores_content():
    a = r"\begin{tabular}{cc} a & b \end{tabular}"
    b = r"\begin{tabular}{cc} x & y \end{tabular}"
    assert teds(a, b, structure_only=True) == 1.0 and teds(a, b) == pytest.approx(1 - 2 / 3)
