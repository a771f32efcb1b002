"""The package's stages import one way: training never imports evaluation (scoring, the study, publishing)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """The absolute module names a file imports (relative imports stay inside its own package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_training_imports_nothing_from_evaluation():
    importers = {
        str(path.relative_to(REPO)): sorted(name for name in imported_modules(path) if "twotower.evaluation" in name)
        for path in (REPO / "training").rglob("*.py")
    }
    assert {path: names for path, names in importers.items() if names} == {}


def test_evaluation_keeps_its_modules_in_rooms():
    top_level = sorted(path.name for path in (REPO / "evaluation").glob("*.py"))
    assert len(top_level) <= 6, top_level
    rooms = {path.parent.name for path in (REPO / "evaluation").glob("*/__init__.py")}
    assert {"scoring", "study", "publishing", "tower_preference"} <= rooms
