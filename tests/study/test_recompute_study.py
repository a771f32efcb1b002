"""The committed study folders recompute with the plain-numpy script (scripts/recompute_study.py): every figure the
documents' verdicts read, from the kept Parquet tables alone, equals the document's."""

import json
from pathlib import Path

import pytest

from recomputed import assert_arms_recomputed, assert_factorial_recomputed, assert_pooled_z_recomputed, recomputed

STUDY_DIR = Path(__file__).resolve().parents[2] / "docs" / "study"


def the_2x2_agrees(script, factorial):
    assert assert_factorial_recomputed(script, factorial) > 250
    assert_pooled_z_recomputed(script, factorial)


def the_experiment_agrees(script, experiment):
    # 4 points x (9 endpoints x 3 figures + 2 arms' cross-seed r)
    assert assert_arms_recomputed(script, experiment) == 4 * (9 * 3 + 2)


@pytest.mark.slow
@pytest.mark.parametrize("folder, section, agrees", [
    ("causes", "factorial", the_2x2_agrees), ("gradient", "joint_gradient", the_experiment_agrees),
])
def test_a_pre_registered_study_recomputes_from_its_kept_tables(folder, section, agrees):
    report_dir = STUDY_DIR / folder
    document = json.loads((report_dir / "study.json").read_text())[section]
    script = recomputed(report_dir)
    assert len(script["runs"]) == 16 * 2 * 2  # runs x points x texts
    agrees(script, document)
