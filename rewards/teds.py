"""TEDS (Zhong et al. 2020, PubTabNet): tree-edit-distance similarity of two tables,
1 - TED(T1, T2) / max(|T1|, |T2|).

TED is the ordered tree edit distance (Zhang & Shasha 1989; the same optimum APTED computes)
with PubTabNet's costs: inserting or deleting a node costs 1; renaming costs 1 when the tags,
colspans or rowspans differ, else for two ``td`` cells the normalised Levenshtein distance of
their contents (character lists), else 0. |T| counts the nodes below the ``table`` root, as the
original PubTabNet code does (``len(table.xpath(".//*"))``; later versions of that package count
the root too). ``structure_only`` leaves cell contents empty.

A LaTeX ``tabular`` (also ``tabular*``, ``tabularx``) becomes the tree table -> tr -> td: rows
split at ``\\\\``, cells at unescaped ``&`` (both outside braces), rules (``\\hline``,
``\\toprule``, ``\\cline``, ...) dropped; ``\\multicolumn{n}{..}{x}`` is a td with colspan n,
``\\multirow{n}{..}{x}`` one with rowspan n, and the empty cells a multirow covers in the rows
below are dropped (HTML has no cell there). Text without a tabular scores 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rapidfuzz.distance import Levenshtein


@dataclass
class Node:
    tag: str
    colspan: int | None = None
    rowspan: int | None = None
    content: list[str] = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)

    def size(self) -> int:
        return 1 + sum(c.size() for c in self.children)


def rename_cost(a: Node, b: Node) -> float:
    """PubTabNet's rename cost."""
    if a.tag != b.tag or a.colspan != b.colspan or a.rowspan != b.rowspan:
        return 1.0
    if a.tag == "td" and a.content != b.content:
        return Levenshtein.distance(a.content, b.content) / max(len(a.content), len(b.content))
    return 0.0


def _postorder(root: Node) -> tuple[list[Node], list[int]]:
    """Nodes in post-order and, for each, the post-order index of its leftmost leaf."""
    nodes: list[Node] = []
    leftmost: list[int] = []

    def walk(node: Node) -> int:
        first = None
        for child in node.children:
            lm = walk(child)
            first = lm if first is None else first
        nodes.append(node)
        leftmost.append(len(nodes) - 1 if first is None else first)
        return leftmost[-1]

    walk(root)
    return nodes, leftmost


def tree_edit_distance(t1: Node, t2: Node, rename=rename_cost, insert_cost: float = 1.0,
                       delete_cost: float = 1.0) -> float:
    """Zhang-Shasha ordered tree edit distance (unit insert / delete, `rename(a, b)`)."""
    n1, l1 = _postorder(t1)
    n2, l2 = _postorder(t2)
    renames = [[rename(a, b) for b in n2] for a in n1]  # each pair once (the loops below revisit them)

    def keyroots(left: list[int]) -> list[int]:
        """The highest node of each leftmost-leaf path (the root and every non-first child)."""
        return sorted({v: i for i, v in enumerate(left)}.values())

    td = [[0.0] * len(n2) for _ in n1]
    for i in keyroots(l1):
        for j in keyroots(l2):
            li, lj = l1[i], l2[j]
            rows, cols = i - li + 2, j - lj + 2
            fd = [[0.0] * cols for _ in range(rows)]
            for x in range(1, rows):
                fd[x][0] = fd[x - 1][0] + delete_cost
            for y in range(1, cols):
                fd[0][y] = fd[0][y - 1] + insert_cost
            for x in range(1, rows):
                a = li + x - 1
                for y in range(1, cols):
                    b = lj + y - 1
                    if l1[a] == li and l2[b] == lj:
                        fd[x][y] = min(fd[x - 1][y] + delete_cost, fd[x][y - 1] + insert_cost,
                                       fd[x - 1][y - 1] + renames[a][b])
                        td[a][b] = fd[x][y]
                    else:
                        fd[x][y] = min(fd[x - 1][y] + delete_cost, fd[x][y - 1] + insert_cost,
                                       fd[l1[a] - li][l2[b] - lj] + td[a][b])
    return td[-1][-1]


def teds_trees(t1: Node, t2: Node) -> float:
    """1 - TED / max(nodes below the root); 0.0 when either table has no nodes."""
    n = max(t1.size(), t2.size()) - 1
    if t1.size() == 1 or t2.size() == 1:
        return 0.0
    return 1.0 - tree_edit_distance(t1, t2) / n


# -- LaTeX tabular -> tree -----------------------------------------------------------------------

_BEGIN = re.compile(r"\\begin\{(tabular\*?|tabularx)\}")
_RULES = re.compile(r"\\(?:hline|toprule|midrule|bottomrule|hdashline)\b|\\(?:cline|cmidrule)(?:\([lr]*\))?\{[^}]*\}")


def _group(text: str, start: int) -> tuple[str, int]:
    """The content of the brace group opening at text[start] and the index after it."""
    if start >= len(text) or text[start] != "{":
        raise ValueError("no brace group")
    depth = 0
    for k in range(start, len(text)):
        if text[k] == "{" and (k == 0 or text[k - 1] != "\\"):
            depth += 1
        elif text[k] == "}" and text[k - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1:k], k + 1
    raise ValueError("unbalanced braces")


def _split_top(text: str, sep: str) -> list[str]:
    """Split at `sep` outside braces, not where it is escaped (``\\&``)."""
    parts, depth, last, k = [], 0, 0, 0
    while k < len(text):
        ch = text[k]
        if ch == "\\" and not text.startswith(sep, k):
            k += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, k):
            parts.append(text[last:k])
            k += len(sep)
            last = k
            continue
        k += 1
    parts.append(text[last:])
    return parts


def tabular_body(code: str) -> str | None:
    """The body of the first tabular environment (column spec removed), or None."""
    m = _BEGIN.search(code)
    if not m:
        return None
    env = m.group(1)
    try:
        k = m.end()
        if env != "tabular":  # tabular* and tabularx take a width first
            _, k = _group(code, k)
        if k < len(code) and code[k] == "[":  # position argument
            k = code.index("]", k) + 1
        _, k = _group(code, k)
    except ValueError:
        return None
    end = code.find(f"\\end{{{env}}}", k)
    return None if end < 0 else code[k:end]


def _spanning(cell: str) -> tuple[str, int, int]:
    """(content, colspan, rowspan) of a cell, \\multicolumn / \\multirow unwrapped."""
    colspan = rowspan = 1
    for _ in range(2):
        m = re.match(r"\\(multicolumn|multirow)\s*(?=\{)", cell)
        if not m:
            break
        try:
            n, k = _group(cell, m.end())
            if m.group(1) == "multirow" and cell[k:k + 1] == "[":
                k = cell.index("]", k) + 1
            _, k = _group(cell, k)
            content, k = _group(cell, k)
            span = int(n.strip())
        except ValueError:
            break
        if m.group(1) == "multicolumn":
            colspan = span
        else:
            rowspan = span
        cell = (content + cell[k:]).strip()
    return cell, colspan, rowspan


def latex_table_tree(code: str, structure_only: bool = False) -> Node | None:
    """The table -> tr -> td tree of the first tabular in `code`, or None when there is none."""
    body = tabular_body(code)
    if body is None:
        return None
    body = _RULES.sub(" ", re.sub(r"(?<!\\)%.*", "", body))
    rows = [re.sub(r"^\s*\[[^\]]*\]", "", r) for r in _split_top(body, "\\\\")]  # \\[2pt]
    table = Node("table")
    covered: dict[int, int] = {}  # column -> rows still covered by a multirow from above
    for row in rows:
        if not row.strip():
            continue
        tr, col = Node("tr"), 0
        for raw in _split_top(row, "&"):
            content, colspan, rowspan = _spanning(raw.strip())
            if covered.get(col, 0) > 0 and not content:
                col += colspan
                continue
            chars = [] if structure_only else list(" ".join(content.split()))
            tr.children.append(Node("td", colspan, rowspan, chars))
            if rowspan > 1:
                for c in range(col, col + colspan):
                    covered[c] = rowspan  # decremented below for this row too
            col += colspan
        covered = {c: n - 1 for c, n in covered.items() if n > 1}
        table.children.append(tr)
    return table


def teds(candidate: str, reference: str, structure_only: bool = False) -> float:
    """TEDS of two LaTeX tables; 0.0 when either has no tabular or no rows."""
    a, b = latex_table_tree(candidate, structure_only), latex_table_tree(reference, structure_only)
    if a is None or b is None:
        return 0.0
    return teds_trees(a, b)
