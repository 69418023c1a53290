"""MkDocs hook: the benchmark plots live in benchmarks/ (where the scripts write them); the site
serves them as img/NAME.png without a second copy in docs/."""

from pathlib import Path

from mkdocs.structure.files import File

PLOTS = Path(__file__).resolve().parent.parent / "benchmarks"


def on_files(files, config):
    for png in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"img/{png.name}", abs_src_path=str(png)))
    return files
