"""The calls of a ``.mod`` file's blocks: which PROCEDUREs and FUNCTIONs a block reaches,
the cycles among them (recursion kingen does not follow), and the names an expression uses.
The call graph is walked without recursion: a chain of thousands of procedures is no deep
stack here.
"""

from __future__ import annotations

from kingen.outputs.interop.nmodl.parser import Assign, Bin, Call, CallStmt, Name, Neg, Reaction


def names_used(expr, env: dict, depth: int = 0) -> set[str]:
    """Every name ``expr`` uses, through the assignments of ``env``."""
    if depth > 50:
        return set()
    if isinstance(expr, Name):
        if expr.name in env:
            return names_used(env[expr.name], env, depth + 1)
        return {expr.name}
    if isinstance(expr, Call):
        return set().union(*[names_used(a, env, depth) for a in expr.args])
    if isinstance(expr, Bin):
        return names_used(expr.a, env, depth) | names_used(expr.b, env, depth)
    if isinstance(expr, Neg):
        return names_used(expr.a, env, depth)
    return set()


def calls(block) -> list[str]:
    """The names a block calls, as statements (``rates()``) or in expressions, in order."""
    out: list[str] = []

    def walk(expr) -> None:
        stack = [expr]
        while stack:  # not recursive: an expression may nest deeply
            e = stack.pop()
            if isinstance(e, Call):
                out.append(e.name)
                stack.extend(e.args)
            elif isinstance(e, Bin):
                stack += [e.a, e.b]
            elif isinstance(e, Neg):
                stack.append(e.a)

    for s in block.statements:
        if isinstance(s, CallStmt):
            out.append(s.name)
        elif isinstance(s, Assign):
            walk(s.expr)
        elif isinstance(s, Reaction):
            walk(s.kf)
            walk(s.kb)
    return out


def reachable(starts: list[str], graph: dict[str, list[str]]) -> set[str]:
    """The names ``graph`` reaches from ``starts`` (``starts`` included)."""
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(graph[n])
    return seen


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One cycle per group of blocks that call each other (a strongly connected component
    with a cycle), as the names along it from the block declared first; iterative, so a
    chain of thousands of procedures is no recursion here either."""
    order = {n: k for k, n in enumerate(graph)}
    out: list[list[str]] = []
    done: set[str] = set()
    for start in graph:
        if start in done:
            continue
        # depth-first search keeping the current path: an edge back into it is a cycle
        path, on_path, stack = [], set(), [(start, iter(graph[start]))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif nxt in on_path:
                cycle = path[path.index(nxt):]
                k = min(range(len(cycle)), key=lambda i: order[cycle[i]])
                cycle = cycle[k:] + cycle[:k]
                if cycle not in out:
                    out.append(cycle)
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append((nxt, iter(graph[nxt])))
    return out
