"""The state graph of a scheme: its transitions, its fundamental cycles, and the closed
classes that decide whether a resting state is unique.

:func:`find_cycles` builds the spanning tree from rates not declared ``derived`` first, so
that each derived rate closes a cycle of its own; :func:`closed_classes` finds the closed
communicating classes without recursion (a scheme of thousands of states is no deep stack).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transition:
    """A transition i → j with rate ``factor * params[param] * (c if agonist else 1)``."""

    source: int
    target: int
    factor: float
    param: int
    agonist: bool
    derived: bool = False
    expression: str = ""



@dataclass(frozen=True)
class Cycle:
    """A fundamental cycle: states in order, and the transitions around it both ways."""

    states: tuple[int, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    derived: int | None  # index of the derived transition closing this cycle, if any



def closed_classes(n_states: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    """The closed communicating classes of a directed graph (strongly connected components
    with no edge leaving them), found without recursion."""
    out_edges: list[list[int]] = [[] for _ in range(n_states)]
    in_edges: list[list[int]] = [[] for _ in range(n_states)]
    for a, b in edges:
        out_edges[a].append(b)
        in_edges[b].append(a)
    # Kosaraju: finishing order on the graph, then components on the reversed graph.
    seen = [False] * n_states
    order: list[int] = []
    for root in range(n_states):
        if seen[root]:
            continue
        seen[root] = True
        stack = [(root, 0)]
        while stack:
            node, k = stack.pop()
            if k < len(out_edges[node]):
                stack.append((node, k + 1))
                nxt = out_edges[node][k]
                if not seen[nxt]:
                    seen[nxt] = True
                    stack.append((nxt, 0))
            else:
                order.append(node)
    component = [-1] * n_states
    groups: list[list[int]] = []
    for root in reversed(order):
        if component[root] >= 0:
            continue
        component[root] = len(groups)
        members = [root]
        stack = [root]
        while stack:
            for prev in in_edges[stack.pop()]:
                if component[prev] < 0:
                    component[prev] = len(groups)
                    members.append(prev)
                    stack.append(prev)
        groups.append(members)
    leaving = {component[a] for a, b in edges if component[a] != component[b]}
    return [g for c, g in enumerate(groups) if c not in leaving]


def cycle_text(states: list[str], cycle: Cycle) -> str:
    """A cycle as text, e.g. ``C1-C2-C4-C3-C1``."""
    names = [states[i] for i in cycle.states]
    return "-".join(names + names[:1])


def find_cycles(n_states: int, transitions: list[Transition]) -> list[Cycle]:
    """The fundamental cycles of the state graph.

    The spanning tree is built from non-derived transitions first, so that each derived
    transition closes a cycle whose other edges are all non-derived.
    """
    pair_to_trans: dict[tuple[int, int], int] = {
        (t.source, t.target): m for m, t in enumerate(transitions)}
    edges: dict[frozenset, bool] = {}
    for t in transitions:
        key = frozenset((t.source, t.target))
        edges[key] = edges.get(key, False) or t.derived
    parent = list(range(n_states))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree: dict[int, list[int]] = {i: [] for i in range(n_states)}
    chords: list[tuple[int, int]] = []
    for derived_pass in (False, True):
        for key, has_derived in edges.items():
            if has_derived != derived_pass:
                continue
            a, b = sorted(key)
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[ra] = rb
                tree[a].append(b)
                tree[b].append(a)
            else:
                chords.append((a, b))

    def tree_path(a: int, b: int) -> list[int]:
        prev = {a: -1}
        queue = [a]
        for x in queue:
            if x == b:
                break
            for y in tree[x]:
                if y not in prev:
                    prev[y] = x
                    queue.append(y)
        path = [b]
        while path[-1] != a:
            path.append(prev[path[-1]])
        return path[::-1]

    cycles = []
    for a, b in chords:
        derived = None
        for src, dst in ((a, b), (b, a)):
            m = pair_to_trans.get((src, dst))
            if m is not None and transitions[m].derived:
                a, b = src, dst  # orient the cycle so the derived transition is forward
                derived = m
                break
        # cycle: a -> b, then the tree path b -> ... -> a
        loop = [a] + tree_path(b, a)[:-1]
        fwd, bwd = [], []
        for x, y in zip(loop, loop[1:] + loop[:1]):
            f = pair_to_trans.get((x, y))
            r = pair_to_trans.get((y, x))
            if f is not None:
                fwd.append(f)
            if r is not None:
                bwd.append(r)
        complete = len(fwd) == len(loop) and len(bwd) == len(loop)
        cycles.append(Cycle(tuple(loop), tuple(fwd), tuple(bwd) if complete else (),
                            derived))
    return cycles
