"""The package's stages import one way: training, then the metric, scoring, the study and publishing last; training
never imports evaluation. Inside training, each room imports only the rooms before it."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"training": "twotower.training", "evaluation": "twotower.evaluation"}  # folder -> installed name


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join([PACKAGES[parts[0]], *parts[1:]])


def imported_modules(path: Path) -> set[str]:
    """The modules a file imports, relative imports resolved to their absolute names."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.update([module] if node.module else [f"{module}.{alias.name}" for alias in node.names])
    return names


def forbidden_imports(folder: str, forbidden: tuple[str, ...]) -> dict:
    found = {}
    for path in (REPO / folder).rglob("*.py"):
        names = sorted(name for name in imported_modules(path) if name.startswith(forbidden))
        if names:
            found[str(path.relative_to(REPO))] = names
    return found


@pytest.mark.parametrize("folder, forbidden", [
    ("training", ("twotower.evaluation",)),
    ("evaluation/tower_preference", ("twotower.evaluation.scoring", "twotower.evaluation.study",
                                     "twotower.evaluation.publishing")),
    ("evaluation/scoring", ("twotower.evaluation.study", "twotower.evaluation.publishing")),
    ("evaluation/study", ("twotower.evaluation.publishing",)),
])
def test_a_stage_imports_no_later_stage(folder, forbidden):
    assert forbidden_imports(folder, forbidden) == {}


def test_relative_imports_resolve_to_the_installed_names():
    assert "twotower.evaluation.scoring.report" in imported_modules(REPO / "evaluation/study/document.py")
    assert "twotower.evaluation.tower_preference.preference_measure" in imported_modules(
        REPO / "evaluation/scoring/ablation.py")


def test_evaluation_keeps_its_modules_in_rooms():
    top_level = sorted(path.name for path in (REPO / "evaluation").glob("*.py"))
    assert len(top_level) <= 6, top_level
    rooms = {path.parent.name for path in (REPO / "evaluation").glob("*/__init__.py")}
    assert {"scoring", "study", "publishing", "tower_preference"} <= rooms


# training's rooms, each importing only the rooms before it (and itself); "top" is arguments.py, hub.py and
# loading.py, beside the entry point train.py, which may import every room
TRAINING_ROOMS = ("utils", "data", "top", "checkpoints", "feature_cache", "optim", "phases", "launch", "run")


def training_room(module: str) -> str:
    """The room of a `twotower.training` module: its subpackage, "top" for a module beside train.py, or "train"."""
    parts = module.split(".")[2:]
    if len(parts) > 1 or (REPO / "training" / parts[0]).is_dir():
        return parts[0]
    return "train" if parts[0] == "train" else "top"


def test_training_keeps_its_modules_in_rooms_that_import_the_rooms_before_them():
    rooms = {path.parent.name for path in (REPO / "training").glob("*/__init__.py")}
    assert rooms == set(TRAINING_ROOMS) - {"top"}  # a new room takes its place in TRAINING_ROOMS
    top_level = sorted(path.name for path in (REPO / "training").glob("*.py"))
    assert top_level == ["__init__.py", "arguments.py", "hub.py", "loading.py", "train.py"]
    backward = {}
    for path in (REPO / "training").rglob("*.py"):
        room = training_room(module_name(path))
        if room == "train":
            continue
        allowed = TRAINING_ROOMS[: TRAINING_ROOMS.index(room) + 1]
        imported = {training_room(name) for name in imported_modules(path) if name.startswith("twotower.training.")}
        if imported - set(allowed):
            backward[str(path.relative_to(REPO))] = sorted(imported - set(allowed))
    assert backward == {}
