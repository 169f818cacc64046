"""Names and order of the nodes of an ONNX graph: single definition of every tensor name, a stable
topological order, and which nodes an output needs.

ONNX graphs are in SSA form (ONNX IR spec, "Graphs": every value name is defined once, by a graph
input, an initializer or one node output) and their nodes are topologically sorted; onnxruntime
rejects a name defined twice but runs nodes listed out of order, and so does this frontend.
A subgraph (``If`` branches, ``Loop`` / ``Scan`` bodies) may read names of its enclosing graphs; those
reads count as inputs of the node that owns the subgraph.
"""
from __future__ import annotations

import heapq
from collections import ChainMap
from typing import Any

import onnx

from ..errors import ParseError


def node_label(node, idx: int) -> str:
    """How messages name a node: its name, else ``OpType_index`` (its index in its graph's node list)."""
    return node.name or f"{node.op_type}_{idx}"


def _describe(node, idx: int) -> str:
    return f"node '{node_label(node, idx)}' ({node.op_type})"


def subgraphs_of(node) -> list:
    """The graphs held by the node's attributes (``GRAPH`` and ``GRAPHS``)."""
    graphs = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            graphs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(a.graphs)
    return graphs


def subgraph_refs(node) -> set:
    """Names a node's subgraphs read from the enclosing scopes."""
    refs = set()
    for g in subgraphs_of(node):
        local = {i.name for i in g.input} | {t.name for t in g.initializer}
        for n in g.node:
            local |= set(n.output)
        for n in g.node:
            refs |= {x for x in n.input if x and x not in local}
            refs |= {x for x in subgraph_refs(n) if x not in local}
    return refs


def check_definitions(g, outer: ChainMap | None = None, owner: str = "", exempt: frozenset = frozenset()) -> None:
    """Check that graph ``g`` and its subgraphs define every tensor name once.

    A node output may not repeat an earlier node output, a graph input or an initializer of its graph,
    nor a name defined in an enclosing graph (``outer``), except the outputs of the nodes that own
    the subgraph (``exempt``; onnxruntime accepts those).  Subgraph inputs and initializers may
    shadow outer names (the subgraph then reads its own).

    Raises ParseError naming the node, the tensor and the earlier definer.
    """
    outer = ChainMap() if outer is None else outer
    where = f" in subgraph '{g.name}' of {owner}" if owner else ""
    local: dict[str, str] = {}
    for vi in g.input:
        local.setdefault(vi.name, f"graph input '{vi.name}'")
    for t in g.initializer:
        local.setdefault(t.name, f"initializer '{t.name}'")
    for idx, n in enumerate(g.node):
        for o in n.output:
            if not o:
                continue
            earlier = local.get(o)
            if earlier is None and o in outer and o not in exempt:
                earlier = f"{outer[o]} of an enclosing graph"
            if earlier is not None:
                raise ParseError(f"{_describe(n, idx)}{where}: output '{o}' is already defined by {earlier} "
                                 f"(every tensor name must be defined once: the graph is not in SSA form)")
            local[o] = _describe(n, idx)
    scope = outer.new_child(local)
    for idx, n in enumerate(g.node):
        for sub in subgraphs_of(n):
            check_definitions(sub, scope, _describe(n, idx), exempt | {o for o in n.output if o})


def check_acyclic(g, where: str = "") -> None:
    """Raise ParseError when graph ``g`` or one of its subgraphs has a cycle (names a node on it)."""
    where = where or f"graph '{g.name}'"
    topological_order(g.node, where)
    for idx, n in enumerate(g.node):
        for sub in subgraphs_of(n):
            check_acyclic(sub, f"subgraph '{sub.name}' of {_describe(n, idx)}")


def _dependencies(nodes) -> list[list[int]]:
    """For each node, the indices of the nodes whose outputs it reads (its subgraphs' reads included)."""
    producer = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = i
    deps = []
    for n in nodes:
        names = {x for x in n.input if x}
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            names |= subgraph_refs(n)
        deps.append(sorted({producer[x] for x in names if x in producer}))
    return deps


def topological_order(nodes, where: str = "the graph") -> list[tuple[int, Any]]:
    """The nodes in a stable topological order, as ``(index in nodes, node)`` pairs.

    Among the nodes whose inputs are all computed, the one listed first comes first, so a sorted
    list keeps its order.  ``where`` names the graph in the error.

    Raises ParseError when the nodes have a cycle, naming the nodes on one.
    """
    nodes = list(nodes)
    deps = _dependencies(nodes)
    if all(j < i for i, d in enumerate(deps) for j in d):
        return list(enumerate(nodes))
    users: list[list[int]] = [[] for _ in nodes]
    pending = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i, k in enumerate(pending) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        cycle = _cycle(deps, pending)
        path = " -> ".join(_describe(nodes[i], i) for i in cycle + cycle[:1])
        raise ParseError(f"{where} has a cycle: {path} (each node reads an output of the one before it)")
    return [(i, nodes[i]) for i in order]


def _cycle(deps, pending) -> list[int]:
    """Node indices on one cycle, in data-flow order, among the nodes never ready (``pending > 0``):
    each of those reads an output of another such node, so following those reads comes back."""
    cur = min(i for i, k in enumerate(pending) if k > 0)
    seen: dict[int, int] = {}
    path: list[int] = []
    while cur not in seen:
        seen[cur] = len(path)
        path.append(cur)
        cur = next(j for j in deps[cur] if pending[j] > 0)
    return list(reversed(path[seen[cur]:]))


def sort_graph(g) -> None:
    """Reorder the nodes of ``g`` and of its subgraphs in place into the order :func:`topological_order`
    gives (for a copy handed to onnx shape inference, which reads nodes in list order)."""
    order = topological_order(g.node, f"graph '{g.name}'")
    if any(i != k for k, (i, _) in enumerate(order)):
        nodes = []
        for _, n in order:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            nodes.append(c)
        del g.node[:]
        g.node.extend(nodes)
    for n in g.node:
        for sub in subgraphs_of(n):
            sort_graph(sub)


def needed_nodes(g, outputs) -> set:
    """Indices (in ``g.node``) of the nodes needed to compute ``outputs`` (backward reachability,
    subgraph reads included)."""
    producer: dict[str, int] = {}
    for k, n in enumerate(g.node):
        for o in n.output:
            producer[o] = k
    need, stack = set(), list(outputs)
    while stack:
        i = producer.get(stack.pop())
        if i is None or i in need:
            continue
        need.add(i)
        n = g.node[i]
        stack.extend(x for x in n.input if x)
        stack.extend(subgraph_refs(n))
    return need


def used_names(g, needed) -> set:
    """Names the ``needed`` nodes (indices in ``g.node``) read, their subgraphs' outer reads included."""
    used = set()
    for i, n in enumerate(g.node):
        if i in needed:
            used |= set(n.input) | subgraph_refs(n)
    return used
