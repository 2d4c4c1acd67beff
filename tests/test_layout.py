"""The package layout as a specification: imports flow workflows -> {preprocessing, convs2s}
-> storage;
convs2s/ is in parts (model, io, inference, train, tracking, serving, metrics) that import
downwards only; no import cycle anywhere; the model, its convolution and the search import only
torch and torch-free project modules; settings modules import neither torch nor Ray; library
modules carry no command line; no module is over a few hundred lines.

    .venv/bin/python -m pytest tests/test_layout.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STDLIB_OK = {"__future__", "math", "contextlib", "dataclasses", "collections", "typing", "types"}


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
    ("storage", ("convs2s", "preprocessing", "workflows")),  # the layer under both
])
def test_imports_flow_one_way(package, forbidden):
    for path in _modules(package):
        bad = {n for n in _imports(path) if n.split(".")[0] in forbidden}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


# What each part of convs2s/ may import of the others (its __init__ docstring says the same):
# the architecture's layers, bottom up. cli/ and __main__.py sit on top and may import any.
LAYERS = {
    "convs2s.config": {"convs2s.precision"},  # (the precision table's names: its choices)
    "convs2s.console": set(),
    "convs2s.precision": set(),
    "convs2s.metrics": set(),
    "convs2s.tracking": set(),
    "convs2s.model": {"convs2s.config"},
    "convs2s.io": {"convs2s.config", "convs2s.model"},
    "convs2s.inference": {"convs2s.config", "convs2s.precision", "convs2s.model", "convs2s.io"},
    "convs2s.train": {"convs2s.config", "convs2s.console", "convs2s.precision", "convs2s.model",
                      "convs2s.io", "convs2s.tracking"},
    "convs2s.serving": {"convs2s.config", "convs2s.console", "convs2s.precision",
                        "convs2s.io", "convs2s.inference", "convs2s.tracking"},
}
CLI = {str(p.relative_to(REPO)) for p in (REPO / "convs2s" / "cli").glob("*.py")}  # (the commands)
TOP = CLI | {"convs2s/__main__.py", "convs2s/__init__.py"}


def _part(module: str) -> str | None:
    """The LAYERS key a dotted project module belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in LAYERS else None


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_every_module_of_convs2s_belongs_to_one_part():
    for path in _modules("convs2s"):
        rel = str(path.relative_to(REPO))
        assert rel in TOP or _part(_module_name(path)) is not None, \
            f"{rel}: put it in one of {sorted(LAYERS)} (tests/test_layout.py LAYERS)"


def test_the_parts_of_convs2s_import_downwards_only():
    for path in _modules("convs2s"):
        rel = str(path.relative_to(REPO))
        if rel in TOP:
            continue
        own = _part(_module_name(path))
        for mod in _imports(path):
            other = _part(mod) if mod.startswith("convs2s.") else None
            if mod.startswith("convs2s.") and other is None:
                raise AssertionError(f"{rel} imports {mod}: only cli/ imports the command line")
            assert other is None or other == own or other in LAYERS[own], \
                f"{rel} ({own}) imports {mod} ({other}): allowed {sorted(LAYERS[own])}"


@pytest.mark.parametrize("path", ["convs2s/model/network.py", "convs2s/model/layers.py",
                                  "convs2s/model/conv.py", "convs2s/model/loss.py",
                                  "convs2s/model/fused.py", "convs2s/inference/search.py"])
def test_model_and_search_import_only_torch(path):
    for mod in _imports(REPO / path):
        top = mod.split(".")[0]
        assert top == "torch" or top in STDLIB_OK or mod == "convs2s.config" \
            or mod.startswith("convs2s.model."), f"{path} imports {mod}"


def _project_graph() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, anywhere in it (function-level
    imports too: a cycle through a lazy import is still a cycle). `from pkg import name`
    counts as importing pkg.name where that is a module."""
    paths = [p for pkg in ("convs2s", "preprocessing", "workflows", "benchmarks")
             for p in _modules(pkg)]
    modules = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module if node.level == 0 else \
                    ".".join(name.split(".")[:-node.level] + [node.module])
                subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
                deps.update(subs or ({base} & modules.keys()))
        graph[name] = deps - {name}
    return graph


def test_no_import_cycles_anywhere_in_the_project():
    graph = _project_graph()
    # Tarjan's strongly connected components: a component of more than one module is a cycle.
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            # a package's __init__ re-exporting its own submodule is not a cycle of design
            if len(comp) > 1 and not _package_reexport(comp):
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _package_reexport(comp: list[str]) -> bool:
    return len(comp) == 2 and (comp[0].startswith(comp[1] + ".")
                               or comp[1].startswith(comp[0] + "."))


@pytest.mark.parametrize("path", ["convs2s/config.py", "convs2s/train/job.py",
                                  "preprocessing/config.py", "workflows/workflow_config.py"])
def test_settings_modules_are_light(path):
    heavy = {"torch", "ray", "sentencepiece", "mlflow", "pyarrow"}
    bad = {n for n in _imports(REPO / path) if n.split(".")[0] in heavy}
    assert not bad, f"{path} imports {sorted(bad)}"


def test_library_modules_carry_no_command_line():
    entries = CLI | {"convs2s/__main__.py", "preprocessing/__main__.py",
                     "preprocessing/demo/__main__.py", "workflows/evaluation.py"}
    for package in ("convs2s", "preprocessing"):
        for path in _modules(package):
            rel = str(path.relative_to(REPO))
            if rel in entries:
                continue
            assert 'if __name__ == "__main__"' not in path.read_text(), rel


# A module holds one concept and reads in one sitting (docs/design.md): one past this is split
# by concept, not by layer. The model, in the paper's order, stays within the model file's own.
MAX_MODULE_LINES = 700
MAX_MODEL_LINES = 500


def test_every_module_is_a_few_hundred_lines():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for package in ("convs2s", "preprocessing", "workflows", "storage")
             for p in _modules(package)}
    over = {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split by concept): {over}"
    assert sizes["convs2s/model/network.py"] <= MAX_MODEL_LINES


def test_the_command_line_dispatches_and_loads_each_command_lazily():
    """`python -m convs2s` names its commands; importing the command-line module (what
    `convs2s-translate --help` does) loads neither torch, matplotlib nor the scorers."""
    import subprocess
    import sys

    bare = subprocess.run([sys.executable, "-m", "convs2s"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert bare.returncode == 2
    assert ("usage: python -m convs2s {translate,serve,train,average,score,attention,"
            "import-fairseq,"
            "export-fairseq}") in bare.stderr
    help_ = subprocess.run([sys.executable, "-m", "convs2s", "average", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=True)
    assert help_.stdout.startswith("usage: python -m convs2s average")
    code = ("import sys, convs2s.cli\nprint(sorted(m for m in ('torch', 'matplotlib', "
            "'sacrebleu', 'rouge_score', 'ray', 'mlflow') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_the_evaluation_types_load_without_ray():
    """`workflows.evaluation`'s TestSet / EvalJob and the job body import without Ray: Ray
    is imported where jobs are scheduled (`evaluate_all`)."""
    import subprocess
    import sys

    code = "import sys, workflows.evaluation\nprint('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr
