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


# ---------------------------------------------------------------- the layers

ENTRY_POINTS = {"transformer_lab.chat", "transformer_lab.train", "transformer_lab.export",
                "transformer_lab.serve.__main__"}


def layer_table():
    """[(layer, its package)] in docs/architecture.md's order: a layer may import the ones
    above it. The package is "transformer_lab" for the core's `transformer_lab/*.py`."""
    rows = []
    for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[1].startswith("`transformer_lab/"):
            where = cells[1].strip("`").removesuffix("*.py").rstrip("/")
            rows.append((cells[0], where.replace("/", ".")))
    return rows


def package_of(module):
    """The package a module sits in (its own name for a package's __init__)."""
    known = modules()
    return module if known[module][1] else module.rpartition(".")[0]


def imported_names():
    """(module, source module, name) for every `from source import name` in the package."""
    known = modules()
    for name, (path, is_package) in known.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
                for alias in node.names:
                    yield name, source, alias.name


def test_the_layer_table_covers_the_package():
    table = layer_table()
    assert [layer for layer, _ in table][:3] == ["lecture core", "pretrained", "training"]
    packages = {where for _, where in table}
    assert {package_of(m) for m in modules()} <= packages


def test_no_module_imports_a_later_layer():
    """docs/architecture.md's rule: each layer imports only the layers above it in the table
    (the package's __init__ re-exports for lecture scripts; the entry points call a cli)."""
    rank = {where: i for i, (_, where) in enumerate(layer_table())}
    wrong = [f"{m} -> {t}" for m, targets in sorted(import_graph().items())
             if m != "transformer_lab" and m not in ENTRY_POINTS
             for t in sorted(targets) if rank[package_of(t)] > rank[package_of(m)]]
    assert wrong == [], "imports from a later layer: " + "; ".join(wrong)


def test_no_private_name_is_imported_from_another_package():
    known = modules()
    wrong = sorted(f"{m}: {name} from {source}" for m, source, name in imported_names()
                   if name.startswith("_") and not name.startswith("__")
                   and package_of(source if source in known else m) != package_of(m))
    assert wrong == [], "private names taken from another package: " + "; ".join(wrong)
