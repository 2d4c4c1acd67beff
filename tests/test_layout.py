"""The package layout as a specification: imports flow workflows -> {preprocessing, convs2s};
the model, its convolution and the search import only torch and torch-free project modules;
settings modules import neither torch nor Ray; library modules carry no command line.

    .venv/bin/python -m pytest tests/test_layout.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STDLIB_OK = {"__future__", "math", "contextlib", "dataclasses", "collections", "typing"}


def _imports(path: Path) -> set[str]:
    """Top-level package names (and project modules, dotted) a file imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    """The package's modules, its subpackages' included (preprocessing/demo/...)."""
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package, forbidden", [
    ("preprocessing", ("convs2s", "workflows")),
    ("convs2s", ("preprocessing", "workflows")),
])
def test_imports_flow_one_way(package, forbidden):
    for path in _modules(package):
        bad = {n for n in _imports(path) if n.split(".")[0] in forbidden}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


@pytest.mark.parametrize("name", ["model", "layers", "conv", "search", "loss"])
def test_model_and_search_import_only_torch(name):
    allowed_project = {"convs2s.config", "convs2s.layers", "convs2s.conv", "convs2s.loss"}
    for mod in _imports(REPO / "convs2s" / f"{name}.py"):
        top = mod.split(".")[0]
        assert top == "torch" or top in STDLIB_OK or mod in allowed_project, \
            f"convs2s/{name}.py imports {mod}"


@pytest.mark.parametrize("path", ["convs2s/config.py", "convs2s/train_job.py",
                                  "preprocessing/config.py", "workflows/workflow_config.py"])
def test_settings_modules_are_light(path):
    heavy = {"torch", "ray", "sentencepiece", "mlflow", "pyarrow"}
    bad = {n for n in _imports(REPO / path) if n.split(".")[0] in heavy}
    assert not bad, f"{path} imports {sorted(bad)}"


def test_library_modules_carry_no_command_line():
    entries = {"convs2s/cli.py", "convs2s/__main__.py", "preprocessing/__main__.py",
               "preprocessing/demo/__main__.py", "workflows/evaluation.py"}
    for package in ("convs2s", "preprocessing"):
        for path in _modules(package):
            rel = str(path.relative_to(REPO))
            if rel in entries:
                continue
            assert 'if __name__ == "__main__"' not in path.read_text(), rel


def test_the_command_line_dispatches_and_loads_each_command_lazily():
    """`python -m convs2s` names its commands; importing the command-line module (what
    `convs2s-translate --help` does) loads neither torch, matplotlib nor the scorers."""
    import subprocess
    import sys

    bare = subprocess.run([sys.executable, "-m", "convs2s"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert bare.returncode == 2
    assert "usage: python -m convs2s {translate,average,score,attention,import-fairseq,export-fairseq}" in bare.stderr
    help_ = subprocess.run([sys.executable, "-m", "convs2s", "average", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=True)
    assert help_.stdout.startswith("usage: python -m convs2s average")
    code = ("import sys, convs2s.cli\nprint(sorted(m for m in ('torch', 'matplotlib', "
            "'sacrebleu', 'rouge_score') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
