"""The tower preference summary's keys are declared once (summary.py): what the maths writes is what is
declared, with the declared types, and every reader in the package names a declared key."""

import ast
import importlib.util
import types
import typing
from pathlib import Path

import numpy as np
import pytest

from twotower.evaluation.study.driver import SUMMARY_FIELDS, text_figures
from twotower.evaluation.tower_preference.replica_preference import compute_preference
from twotower.evaluation.tower_preference.summary import (
    OCCURRENCE_SUMMARY_KEYS,
    REPLICA_SUMMARY_KEYS,
    SUMMARY_KEY_DESCRIPTIONS,
    OccurrenceSummary,
    ReplicaSummary,
    summary_keys,
)


REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("evaluation", "training", "benchmarks", "modeling_twotower")
# variables that hold a preference summary, besides `preference_summary` and `<report>["summary"]` anywhere
SUMMARY_VARIABLES = {"evaluation/scoring/score.py": "summary", "evaluation/scoring/report.py": "summary",
                     "evaluation/publishing/model_card.py": "summary"}
# run.json's figures of one scored text (study.text_figures), read as `scores` by the study's modules
SCORES_READERS = ("evaluation/study/document.py", "evaluation/study/verdicts.py", "evaluation/study/long_run.py")


def planted_inputs(num_probes):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(0, 30, 3000)
    gold_logprobs = -np.abs(rng.normal(2.0, 1.0, (num_probes, 3000)))
    gold_logprobs[: num_probes // 2, token_ids < 10] -= 1.0  # types 0-9 prefer the second tower
    return token_ids, gold_logprobs


def occurrence_summary():
    return compute_preference(*planted_inputs(2), min_count=5).summary


def replica_summary():
    return compute_preference(*planted_inputs(8), min_count=5, probe_towers=[0] * 4 + [1] * 4).summary


def runtime_types(annotation):
    """The runtime classes a value of `annotation` may have (list[int] -> list, X | None -> X and NoneType)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(kind for arg in typing.get_args(annotation) for kind in runtime_types(arg))
    if typing.get_origin(annotation) is typing.Literal:
        return tuple({type(value) for value in typing.get_args(annotation)})
    kind = typing.get_origin(annotation) or annotation
    return (int, float) if kind is float else (kind,)


@pytest.mark.parametrize(
    "summary, declaration", [(occurrence_summary, OccurrenceSummary), (replica_summary, ReplicaSummary)]
)
def test_the_maths_writes_exactly_the_declared_keys_with_their_types(summary, declaration):
    written = summary()
    hints = typing.get_type_hints(declaration)
    assert list(written) == list(hints) if declaration is OccurrenceSummary else set(written) == set(hints)
    for key, value in written.items():
        assert isinstance(value, runtime_types(hints[key])), (key, value, hints[key])
    assert written["num_significant"] >= 1 and written["type_share_preferring"][1] > 0  # the planted preference


def test_occurrence_keys_are_the_replica_keys_first():
    assert REPLICA_SUMMARY_KEYS[: len(OCCURRENCE_SUMMARY_KEYS)] == OCCURRENCE_SUMMARY_KEYS
    assert set(REPLICA_SUMMARY_KEYS) - set(OCCURRENCE_SUMMARY_KEYS) >= {"reliability", "same_tower_floor_nats"}


def test_a_selection_of_an_undeclared_key_fails_at_import_time():
    assert summary_keys("reliability", "paired") == ("reliability", "paired")
    with pytest.raises(KeyError, match=r"\['reliablity'\] are not tower preference summary keys"):
        summary_keys("reliability", "reliablity")


def string_keys_read(tree, holds):
    """The string keys read from an expression `holds` accepts: x["key"] and x.get("key", ...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and holds(node.value):
            yield node.slice.value, node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and holds(node.func.value)):
            yield node.args[0].value, node.lineno


def named(*names):
    return lambda node: isinstance(node, ast.Name) and node.id in names


def is_report_summary(node):
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "summary"


def scored_text_figures():
    report = {
        "summary": dict(replica_summary()),
        "perplexity": {"joint": 10.0},
        "data": {"num_blocks": 1, "num_predictions": 3000},
        "model": {"path": "model"},
    }
    return text_figures(report, seconds=None)


def test_every_reader_in_the_package_names_a_declared_key():
    undeclared = []
    text_figure_keys = set(scored_text_figures())
    for directory in PACKAGE_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            tree = ast.parse(path.read_text())
            readers = [(named("preference_summary", SUMMARY_VARIABLES.get(relative, "preference_summary")),
                        set(REPLICA_SUMMARY_KEYS)), (is_report_summary, set(REPLICA_SUMMARY_KEYS))]
            if relative in SCORES_READERS:
                readers.append((named("scores"), text_figure_keys))
            undeclared += [f"{relative}:{line} {key!r}" for holds, declared in readers
                           for key, line in string_keys_read(tree, holds) if key not in declared]
    assert undeclared == []


def test_the_readers_checked_do_read_summaries():
    """The scan above sees the readers it is meant to: score.py's summary line, the study's tables."""
    score = ast.parse((REPO / "evaluation/scoring/score.py").read_text())
    assert {"reliability", "same_tower_floor_nats"} <= {key for key, _ in string_keys_read(score, named("summary"))}
    study_report = ast.parse((REPO / "evaluation/study/document.py").read_text())
    assert "two_tower_difference_nats" in {key for key, _ in string_keys_read(study_report, named("scores"))}
    assert set(SUMMARY_FIELDS) <= set(scored_text_figures())


def test_every_key_has_one_description_in_declaration_order():
    assert tuple(SUMMARY_KEY_DESCRIPTIONS) == REPLICA_SUMMARY_KEYS
    assert all(description.strip() for description in SUMMARY_KEY_DESCRIPTIONS.values())


def test_the_metric_returns_each_key_with_its_description():
    from twotower.evaluation.tower_preference.tower_preference import _KWARGS_DESCRIPTION

    returns = " ".join(_KWARGS_DESCRIPTION.split("Returns:")[1].split("Examples:")[0].split())
    for key, description in SUMMARY_KEY_DESCRIPTIONS.items():
        assert f"{key}: {' '.join(description.split())}" in returns, key


def test_the_card_and_the_guide_describe_the_keys_as_summary_py_does(tmp_path):
    spec = importlib.util.spec_from_file_location("summary_keys_docs", REPO / "scripts" / "summary_keys_docs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0, "run python scripts/summary_keys_docs.py"
    # and the check sees a stale description
    card = (REPO / "evaluation/tower_preference/README.md").read_text()
    stale = card.replace(SUMMARY_KEY_DESCRIPTIONS["reliability_ci"], "an old description")
    assert script.with_block(stale, script.BLOCKS["evaluation/tower_preference/README.md"], "card") == card
