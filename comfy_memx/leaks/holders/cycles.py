"""Find and describe the reference cycle among the objects that reach a target.

Works on the ``(holder_id, held_id)`` edges a :class:`~comfy_memx.leaks.holders.search.Search` recorded, so it holds
nothing but integers until the final description, which it builds while the search still keeps the objects.
"""

from collections import deque

from comfy_memx.leaks.holders.labels import describe, render_steps


def strongly_connected(nodes, successors):
    """Tarjan's strongly connected components, iterative (no recursion limit); nodes are hashable ids."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(successors.get(root, ())))]
        while work:
            node, pending = work[-1]
            descended = False
            for nxt in pending:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(successors.get(nxt, ()))))
                    descended = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _shortest_cycle(start, successors, allowed):
    """Ids of the shortest path ``start -> ... -> start`` inside ``allowed``, or ``None``."""
    came_from = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in successors.get(node, ()):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start] + path[::-1][1:] + [start] if node != start else [start, start]
            if nxt in allowed and nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return None


def find_cycle(search):
    """``(cycle_ids, tail_ids)`` for the cycle nearest to the target, or ``None`` if the edges hold none.

    ``cycle_ids`` starts and ends at the same object; ``tail_ids`` leads from that object to the target.
    """
    successors = {}
    for holder_id, held_id in search.edges:
        successors.setdefault(holder_id, []).append(held_id)
    cyclic = []
    for component in strongly_connected(list(search.seen), successors):
        if len(component) > 1 or component[0] in successors.get(component[0], ()):
            cyclic.append(component)
    if not cyclic:
        return None
    level = search.level
    nearest = min(cyclic, key=lambda component: min(level.get(node, 1 << 30) for node in component))
    start = min(nearest, key=lambda node: level.get(node, 1 << 30))
    cycle_ids = _shortest_cycle(start, successors, set(nearest))
    tail_ids = [start]
    while tail_ids[-1] != search.target_id:
        tail_ids.append(search.child[tail_ids[-1]])
    return cycle_ids, tail_ids


def describe_cycle(search, cycle_ids, tail_ids):
    """``(members, edges, text)`` of a :class:`~comfy_memx.leaks.holders.reports.CycleReport`."""
    numbers = {search.target_id: 0}
    members = [describe(search.seen[search.target_id])]
    edges = []

    def number(obj_id):
        if obj_id not in numbers:
            numbers[obj_id] = len(members)
            members.append(describe(search.seen[obj_id]))
        return numbers[obj_id]

    def walk(ids):
        objs = [search.seen[obj_id] for obj_id in ids]
        words = []
        for source, label, dest in render_steps(objs):
            a, b = number(ids[source]), number(ids[dest])
            edges.append((a, label.strip(), b))
            if not words:
                words.append(f"{members[a]}#{a}")
            words.append(f"--{label.strip().removeprefix('-> ')}--> {members[b]}#{b}")
        objs.clear()
        return " ".join(words)

    number(cycle_ids[0])
    text = walk(cycle_ids) + " (cycle)"
    if len(tail_ids) > 1:
        text += "; " + walk(tail_ids) + " (target)"
    return members, edges, text
