"""The documentation's Python code blocks run, on the simulator (4 ranks).

Every ```python block of README.md and docs/ runs: the blocks of one page in order, as one
script (a later block may use what an earlier one defined), every page in one process that
starts the simulator once. A block that cannot run on the simulator is marked on the line
before it with `<!-- docs-test: skip REASON -->` (e.g. `skip needs GPUs`) and is reported as a
skipped test with that reason.
"""

from __future__ import annotations

import json
import pathlib
import re
import tempfile

import pytest

from tests.jax.helpers import run_python

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s+(.*?)\s*-->\s*$")

# Runs each page's script with fresh globals (as __main__, so that the simulator can pickle its
# kernels by value); a page's runtime settings do not reach the next page.
_DRIVER = """
import json, runpy, sys, traceback
results = {}
for name, path in json.loads(sys.argv[1]):
    try:
        runpy.run_path(path, run_name="__main__")
        results[name] = None
    except BaseException:  # noqa: BLE001 - reported per page
        results[name] = traceback.format_exc()
    if "iris_jax" in sys.modules:
        sys.modules["iris_jax"].shutdown()
print("DOCS-RESULTS " + json.dumps(results))
"""


def code_blocks(page: pathlib.Path) -> list[tuple[int, str, str | None]]:
    """(line, code, skip reason or None) of each Python block of `page`."""
    text = page.read_text()
    blocks = []
    for found in _FENCE.finditer(text):
        if found.group(1) not in ("python", "py"):
            continue
        before = text[:found.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        blocks.append((text.count("\n", 0, found.start()) + 1, found.group(2), skip.group(1) if skip else None))
    return blocks


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


RUNNABLE = [p for p in PAGES if any(skip is None for _, _, skip in code_blocks(p))]
SKIPPED = [(p, line, reason) for p in PAGES for line, _, reason in code_blocks(p) if reason]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Runs every page's blocks in one process; {page: None or its traceback}."""
    folder = tmp_path_factory.mktemp("docs")
    scripts = []
    for page in RUNNABLE:
        code = "\n\n".join(f"# {_name(page)}, line {line}\n{block}" for line, block, skip in code_blocks(page)
                           if skip is None)
        path = folder / (re.sub(r"\W", "_", _name(page)) + ".py")
        path.write_text(code)
        scripts.append((_name(page), str(path)))
    result = run_python(["-c", _DRIVER, json.dumps(scripts)], timeout=900,
                        XLA_FLAGS="--xla_force_host_platform_device_count=4", IRIS_SIM_CHECKED="1")
    line = [x for x in result.stdout.splitlines() if x.startswith("DOCS-RESULTS ")]
    assert result.returncode == 0 and line, result.stdout[-5000:]
    return json.loads(line[-1][len("DOCS-RESULTS "):])


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_code_blocks_run(page, results):
    assert results[_name(page)] is None, f"a code block of {_name(page)} failed:\n{results[_name(page)]}"


if SKIPPED:  # (no empty parameter set when every block runs)
    @pytest.mark.parametrize("page,line,reason", SKIPPED, ids=[f"{_name(p)}:{n}" for p, n, _ in SKIPPED])
    def test_marked_blocks_are_skipped(page, line, reason):
        pytest.skip(f"{_name(page)}, line {line}: {reason}")


def test_the_collector_finds_the_blocks():
    assert RUNNABLE, "no Python code block found in README.md or docs/"
    assert ROOT / "README.md" in RUNNABLE
    with tempfile.TemporaryDirectory() as folder:
        page = pathlib.Path(folder) / "page.md"
        page.write_text("a\n```python\nx = 1\n```\n<!-- docs-test: skip needs GPUs -->\n```python\ny\n```\n"
                        "```bash\nls\n```\n")
        assert code_blocks(page) == [(2, "x = 1\n", None), (6, "y\n", "needs GPUs")]


# -- docstrings ---------------------------------------------------------------------------------
def _docstring(obj) -> str | None:
    """The docstring of a function, Triton kernel, method wrapper, property or class."""
    for attribute in ("fn", "__func__", "fget"):  # Triton's JITFunction / interpreter, static and class methods
        inner = getattr(obj, attribute, None)
        if inner is not None and inner is not obj and callable(inner):
            return _docstring(inner)
    doc = getattr(obj, "__doc__", None)
    return None if isinstance(obj, type) and doc in (object.__doc__, type.__doc__) else doc


def _members(cls):
    """The public methods and properties a class defines itself (for a Triton aggregate, not the
    `type` property Triton adds)."""
    for name, member in vars(cls).items():
        if name.startswith("_") or (name == "type" and getattr(cls, "__triton_aggregate__", False)):
            continue
        if callable(member) or isinstance(member, (staticmethod, classmethod, property)):
            yield name, member


def _public_names():
    """(qualified name, object) of every public function, class and method of iris_jax and of the
    device API (their __all__; a module listed there contributes its own __all__, or the functions
    and classes it defines)."""
    import types

    import iris_core.device
    import iris_jax

    seen, found = set(), []

    def visit(prefix, module, names):
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                inner = getattr(obj, "__all__", None) or [
                    n for n, v in vars(obj).items()
                    if not n.startswith("_") and getattr(v, "__module__", None) == obj.__name__]
                visit(f"{prefix}.{name}", obj, inner)
            elif (callable(obj) or isinstance(obj, type)) and id(obj) not in seen:
                seen.add(id(obj))
                found.append((f"{prefix}.{name}", obj))
                if isinstance(obj, type):
                    found.extend((f"{prefix}.{name}.{n}", m) for n, m in _members(obj))

    visit("iris_jax", iris_jax, iris_jax.__all__)
    visit("iris_core.device", iris_core.device, iris_core.device.__all__)
    return found


def test_every_public_name_has_a_docstring():
    """Every public function, class and method of iris_jax and of the device API has a docstring
    whose first line is its summary (Google style: Args / Returns / Raises follow where they apply;
    mkdocs build --strict checks that they parse)."""
    names = _public_names()
    assert len(names) > 100, len(names)  # (151 on 2026-12-03)
    missing = [name for name, obj in names if not (_docstring(obj) or "").strip()]
    assert not missing, f"add a docstring to: {missing}"
    no_summary = [name for name, obj in names if not _docstring(obj).split("\n")[0].strip()]
    assert not no_summary, f"start these docstrings with a summary line (after the quotes): {no_summary}"


def test_the_readme_is_a_front_page_and_no_lab_notebook_outside_benchmarks():
    """README.md stays a front page; session and run numbers belong in benchmarks/ only."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    notebook = re.compile(r"\b([Ss]essions? \d+|[Rr]un \d+(?![\dx])|[Rr]uns \d+-\d+)")  # "session 8 run 47"
    files = [*PAGES, ROOT / "pyproject.toml", ROOT / ".ci" / "run"] + [
        p for folder in ("iris_core", "iris_jax", "tests", "examples", "scripts")
        for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".sh", ".md", ".txt")]
    found = [f"{_name(p)}: {m.group(0)}" for p in files if p != pathlib.Path(__file__).resolve()
             for m in notebook.finditer(p.read_text())]
    assert not found, f"name the date, machine and command instead (benchmarks/RESULTS.md has them): {found}"
