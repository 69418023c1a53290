"""The packages' imports go down only: iris_core never imports iris_jax, iris_jax's
subpackages import only the layers below them, and no modules of either package import each
other in a circle (function-local imports included); an import inside a function is kept only
for a lazy load, each with its reason; a GPU vendor's modules are reached only through its
record in iris_core.platform."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent

# iris_jax's layers, bottom first: a module may import its own layer's modules and lower layers'
LAYERS = [
    ("iris_jax.compat", "iris_jax.config", "iris_jax.reference"),  # leaves: versions, settings, references
    ("iris_jax._runtime",),  # ranks, heaps, execution models, heap arrays, workspaces, the fault watch
    ("iris_jax.calls", "iris_jax.tracing"),  # a Triton kernel as a JAX primitive, to its launch
    ("iris_jax.sync",),  # barriers and the entry points that raise faults
    ("iris_jax.collectives",),  # lax's collectives on iris
    ("iris_jax.ops", "iris_jax.pallas"),  # fused GEMM + collective ops; Pallas kernels with a context
]



def _modules(package: str) -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module: str, path: pathlib.Path) -> set[str]:
    """Every module `module` imports at run time (TYPE_CHECKING blocks left out)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names |= {f"{base}.{a.name}" for a in node.names}  # a name resolves to its module below
    return names


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        targets = {resolve(n) for n in _imports(module, path) if n.startswith(package)}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _layer(module: str) -> int:
    for k, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return k
    return len(LAYERS)  # iris_jax itself, the public API, sits on top


def test_iris_core_never_imports_jax_or_iris_jax():
    for module, path in _modules("iris_core").items():
        imported = _imports(module, path)
        assert not {n for n in imported if n.split(".")[0] in ("iris_jax", "jax", "jaxlib", "jax_triton")}, module


def test_every_iris_jax_module_has_a_layer():
    unplaced = [m for m in _graph("iris_jax") if m != "iris_jax" and _layer(m) == len(LAYERS)]
    assert not unplaced, f"give these a layer in LAYERS: {unplaced}"


def test_iris_jax_imports_go_down_only():
    graph = _graph("iris_jax")
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if _layer(t) > _layer(m))
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_iris_jax_has_no_cycles():
    """No module of iris_jax imports one that imports it back (function-local imports counted);
    a package counts as its __init__ module."""
    cycles = _components(_graph("iris_jax"))
    assert not cycles, cycles


def test_iris_core_has_no_cycles():
    """No module of iris_core imports one that imports it back (function-local imports counted)."""
    cycles = _components(_graph("iris_core"))
    assert not cycles, cycles


# imports of the packages' own modules inside a function: each a lazy load (a module that only
# one execution model or an optional feature needs, loaded when it is used), with a comment on
# its line or the line above that says why (`lazy: ...`); every other import sits at the top
MAX_LAZY_IMPORTS = 10


def _function_local_imports() -> list[tuple[str, int, str, bool]]:
    """(file, line, the import, whether a `lazy:` comment explains it) for each import of an
    iris_core or iris_jax module inside a function of either package."""
    found = []
    for package in ("iris_core", "iris_jax"):
        for _, path in _modules(package).items():
            text = path.read_text()
            lines = text.splitlines()
            seen = set()
            for fn in ast.walk(ast.parse(text)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if id(node) in seen or not isinstance(node, (ast.Import, ast.ImportFrom)):
                        continue
                    seen.add(id(node))
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    if not (getattr(node, "level", 0) or any(n.split(".")[0] in ("iris_core", "iris_jax")
                                                             for n in names)):
                        continue
                    said = " ".join(lines[max(node.lineno - 2, 0):node.end_lineno])
                    found.append((str(path.relative_to(ROOT)), node.lineno, ast.unparse(node), "lazy:" in said))
    return found


def test_function_local_imports_are_few_and_explained():
    found = _function_local_imports()
    unexplained = [f"{f}:{line}: {text}" for f, line, text, explained in found if not explained]
    assert not unexplained, ("move these imports to the top of the module, or say why they are lazy in a "
                             "`# lazy: ...` comment:\n" + "\n".join(unexplained))
    assert len(found) <= MAX_LAZY_IMPORTS, (
        f"{len(found)} function-local imports of iris's own modules (at most {MAX_LAZY_IMPORTS}): move some to "
        "the top of their module:\n" + "\n".join(f"{f}:{line}: {text}" for f, line, text, _ in found))


# a platform's own modules, reached only through its record in iris_core.platform (and by each
# other: the CUDA heap maps memory through the VMM module)
VENDOR_MODULES = {"iris_core.heap.cuda", "iris_core.heap.vmm", "iris_core.device.nvidia", "iris_core.sim.intrinsics"}


def test_vendor_modules_only_through_the_platform_record():
    importers = sorted(f"{m} -> {name}" for package in ("iris_core", "iris_jax")
                       for m, path in _modules(package).items() if m not in VENDOR_MODULES
                       for name in _imports(m, path) if any(name == v or name.startswith(v + ".") for v in VENDOR_MODULES))
    assert not importers, "reach these through iris_core.platform (GPU, SIMULATOR):\n" + "\n".join(importers)


# -- version branches live in the compat modules ------------------------------------------------
COMPAT_MODULES = {"iris_core.compat", "iris_jax.compat", "iris_jax.pallas._compat"}
# a release of JAX, jaxlib, jax-triton or Triton, as the code names one where something moved
RELEASE = re.compile(r"\b(jax(lib)?|jax-triton|jax_triton|[Tt]riton)\s+\d+\.\d+")
VERSION_NAMES = {"__version__", "version_info", "JAXLIB_VERSION", "JAX_TRITON_VERSION", "TRITON_VERSION"}
# what a branch on a release looks like besides a comparison of versions: an attribute looked up
# with a fallback (not iris's own markers, `_iris...`), a failed import or attribute swallowed, a
# class compared by name
PROBES = re.compile(r"\bhasattr\(|\bgetattr\([^(),]*,(?!\s*[\"']_iris)[^()]*,|except\s*\(?\s*(ImportError|"
                    r"AttributeError|ModuleNotFoundError)|\btype\([^)]*\)\.__name__\s*==")


def _version_branches(path: pathlib.Path) -> list[str]:
    """Places in `path` that branch on a release: (1) a comparison or test that reads a version
    (`jax.__version__`, compat's JAXLIB_VERSION, ...); (2) a function whose text (docstring,
    comments) names a release and that probes for what the release has (hasattr, getattr with a
    fallback, an ImportError or AttributeError caught, a class name compared), or a branch whose
    line names a release."""
    text = path.read_text()
    tree = ast.parse(text)
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Compare, ast.If, ast.IfExp)):
            names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None) for n in ast.walk(node)}
            if names & VERSION_NAMES:
                found.append(f"{path.name}:{node.lineno}: compares a version")
        if isinstance(node, (ast.If, ast.IfExp)) and RELEASE.search(lines[node.lineno - 1]):
            found.append(f"{path.name}:{node.lineno}: branches where a release is named")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            source = "\n".join(lines[node.lineno - 1:node.end_lineno])
            if RELEASE.search(source) and PROBES.search(source):
                found.append(f"{path.name}:{node.lineno}: {node.name} names a release and probes for it")
    return found


def test_version_branches_only_in_the_compat_modules():
    """Every branch on a JAX, jaxlib, jax-triton or Triton release lives in its layer's compat
    module (iris_core.compat: Triton; iris_jax.compat: JAX and jax-triton; iris_jax.pallas._compat:
    Pallas), which says which release moved what."""
    found = [place for package in ("iris_core", "iris_jax") for m, path in _modules(package).items()
             if m not in COMPAT_MODULES for place in _version_branches(path)]
    assert not found, "move these into the layer's compat module:\n" + "\n".join(found)


def test_the_version_branch_check_sees_one():
    """The check above finds the usual forms of a version branch."""
    sample = ROOT / "tests" / "_version_branch_sample.py"
    try:
        sample.write_text('import jax\n\nOLD = jax.__version__ < "0.11"\n\n\n'
                          'def vma(aval):\n    """jax 0.10 calls it manual_axis_type."""\n'
                          '    return getattr(aval, "vma", None)\n')
        assert len(_version_branches(sample)) == 2
    finally:
        sample.unlink()
