"""The workflow files, found by looking: a task is one file in workflows/ with a module-level
`PRESETS` dict (preset name -> function returning its `WorkflowConfig`) and one preprocessing
preset; no list elsewhere names it.

    from workflows.catalog import workflow_modules, paper_tasks
    workflow_modules()   # {"gigaword": <module>, "multi30k_en_de": <module>, ...}
    paper_tasks()        # those with a `paper` preset: the paper's tasks
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def _declares_presets(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "PRESETS" for t in node.targets)
               for node in tree.body)


def workflow_modules() -> dict[str, ModuleType]:
    """Every workflow file of workflows/, imported, by name (sorted)."""
    names = sorted(p.stem for p in HERE.glob("*.py") if _declares_presets(p))
    return {n: importlib.import_module(f"workflows.{n}") for n in names}


def paper_tasks() -> dict[str, ModuleType]:
    """The workflows that reproduce a task of the paper (they have a `paper` preset)."""
    return {n: m for n, m in workflow_modules().items() if "paper" in m.PRESETS}
