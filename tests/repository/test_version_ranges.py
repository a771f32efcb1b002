"""setup.py's ranges are the ones scripts/test_version_range.sh installs, and CI runs it."""

import importlib.util
from pathlib import Path

from modeling_twotower import modeling_twotower

REPO = Path(__file__).resolve().parents[2]


def version_range_script():
    spec = importlib.util.spec_from_file_location("version_range", REPO / "scripts" / "version_range.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_ranges_are_setup_pys_and_the_custom_code_checks_the_same_floor():
    version_range = version_range_script()
    ranges = version_range.declared_ranges()
    floors = version_range.requirements("floor")
    assert [floor.split("==")[0] for floor in floors] == list(version_range.RANGED_PACKAGES)
    assert version_range.requirements("newest") == list(ranges.values())
    # the Hub custom code refuses what setup.py refuses: a downloader's transformers below the tested floor
    assert f"transformers=={modeling_twotower.MIN_TRANSFORMERS_VERSION}" in floors
    space_requirements = (REPO / "evaluation" / "tower_preference" / "requirements.txt").read_text().split()
    assert ranges["transformers"] in space_requirements  # the Space runs a copy of the model code


def test_ci_runs_the_range_check_after_the_suite():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    suite = next(i for i, line in enumerate(ci) if "scripts/test.sh" in line)
    assert any("scripts/test_version_range.sh" in line for line in ci[suite + 1 :])
