"""The package's imports, read from the source (ast): no module of transformer_lab may
import, directly or through others, one that imports it back. Imports inside functions
count too: a lazy import only hides a cycle from Python, not from a reader."""
import ast

from tests.helpers.paths import ROOT

PACKAGE = ROOT / "transformer_lab"


def modules():
    """module name -> (its file, whether it is a package's __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph():
    """module -> the set of transformer_lab modules it imports."""
    known = modules()
    graph = {}
    for name, (path, is_package) in known.items():
        here = name if is_package else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = (f"{base}.{node.module}" if node.module else base) if node.level \
                    else node.module
                for alias in node.names:  # `from pkg import mod` imports the module mod
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in known else source)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def find_cycle(graph):
    """One import cycle as a list of modules (the first repeated at the end), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_is_read():
    graph = import_graph()
    assert "transformer_lab.products" in graph["transformer_lab.model"]
    assert "transformer_lab.products" in graph["transformer_lab.mla"]
    assert "transformer_lab.pretrained.quants" in graph["transformer_lab.pretrained.gguf"]


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
