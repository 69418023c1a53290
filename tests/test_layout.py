"""The tree of docs/architecture.md: every module of iris_core and iris_jax has its line there,
and every module it names exists."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"


def _layout_paths() -> list[str]:
    """The paths the tree block names, from its indentation (two spaces per level)."""
    text = PAGE.read_text()
    block = text[text.index("## The tree"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    paths, stack = [], []
    for line in block.splitlines():
        found = re.match(r"^( *)([\w.\-/]+)(\s|$)", line)
        if not found or len(found.group(1)) % 2:
            continue  # a continuation of the line above
        stack = stack[:len(found.group(1)) // 2] + [found.group(2).rstrip("/")]
        paths.append("/".join(stack))
    return paths


def test_every_module_has_its_line():
    listed = set(_layout_paths())
    text = PAGE.read_text()
    missing = [str(p.relative_to(ROOT)) for package in ("iris_core", "iris_jax")
               for p in sorted((ROOT / package).rglob("*.py"))
               if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in listed and f"({p.name})" not in text]
    assert not missing, f"add these to the tree of docs/architecture.md: {missing}"


def test_every_listed_module_exists():
    gone = [p for p in _layout_paths() if p.endswith(".py") and not (ROOT / p).exists()]
    assert not gone, f"docs/architecture.md's tree names modules that are not in the repository: {gone}"
