"""What scripts/recompute_study.py prints (`--json`) against a study document's JSON: shared by the tests that run it
on the micro 2x2 and on the committed study folders."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

RECOMPUTE = Path(__file__).resolve().parents[2] / "scripts" / "recompute_study.py"
# the script's per-run endpoints -> the study's (evaluation/study/factorial.py)
ENDPOINTS = {"value": "cross_fitted_r", "part_of_speech_z": "part_of_speech_z",
             "part_of_speech_z_frequency_adjusted": "part_of_speech_z_frequency_adjusted",
             "noise_only_z": "noise_only_z", "z_over_noise": "z_over_noise",
             "variance_share": "part_of_speech_variance_share"}
THRESHOLDS = ("0.6", "0.7", "0.9", "0.95")


def recomputed(report_dir) -> dict:
    output = subprocess.run([sys.executable, str(RECOMPUTE), str(report_dir), "--json"], capture_output=True,
                            text=True, check=True).stdout
    return json.loads(output)


def assert_close(mine: dict, theirs: dict):
    assert mine["value"] == pytest.approx(theirs["value"], abs=1e-8)
    assert (mine["ci"] is None) == (theirs["ci"] is None)
    if mine["ci"] is not None:
        assert mine["ci"] == pytest.approx(theirs["ci"], abs=1e-8)


def assert_factorial_recomputed(script: dict, factorial: dict) -> int:
    """Every figure of the 2x2 the script gives equals the document's; returns how many were compared."""
    compared = 0
    for run in script["runs"]:
        # from the kept float32 sums against the scoring's float64 ones: within 2e-7 (evaluation/scoring/type_sums.py)
        assert run["value"] == pytest.approx(run["cross_fitted_r"], abs=1e-6)
    documents = {(p["text"], p["step"]): p for p in factorial["points"]}
    for point in script["points"]:
        document = documents[(point["text"], point["step"])]
        for mine, theirs in ENDPOINTS.items():
            if mine not in point:
                assert theirs not in document["endpoints"]
                continue
            endpoint = document["endpoints"][theirs]
            for cell, figure in point[mine]["cells"].items():
                assert_close(figure, endpoint["cells"][cell])
                compared += 1
            for effect, figure in (point[mine]["effects"] or {}).items():
                assert_close(figure, endpoint["effects"][effect])
                assert figure["p"] == pytest.approx(endpoint["effects"][effect]["p"], abs=1e-8)
                compared += 1
        for threshold in THRESHOLDS:
            if f"z_over_noise_at_{threshold}" in point:
                by_threshold = document["endpoints"]["z_over_noise"]["cells_by_threshold"][threshold]
                for cell, figure in point[f"z_over_noise_at_{threshold}"]["cells"].items():
                    assert_close(figure, by_threshold[cell])
                    compared += 1
        for cell, figure in point["cross_seed"].items():
            document_cell = document["cross_seed"]["cells"].get(cell)
            if figure["r"] is not None:
                assert figure["r"] == pytest.approx(document_cell["r"], abs=1e-10)
                assert sorted(figure["pair_r"].values()) == pytest.approx(sorted(document_cell["pair_r"]), abs=1e-10)
                compared += 1
        for cell, signs in point["signs"].items():
            oriented = document["endpoints"]["part_of_speech_z"]["signs"][cell]["d_nats"]
            assert list(signs.values()) == pytest.approx([oriented[seed] for seed in signs], abs=1e-10)
            compared += 1
    return compared


def assert_pooled_z_recomputed(script: dict, factorial: dict):
    """The verdict's pooled figures (both cooperative cells' seeds): the mean z, with the trend removed, over noise."""
    for text, figures in factorial["verdict"]["part_of_speech"].items():
        point = next(p for p in script["points"] if p["text"] == text and p["step"] == factorial["final_step"])
        assert_close(point["cooperative_means"]["part_of_speech_z"], figures["cooperative_z"])
        assert_close(point["cooperative_means"]["part_of_speech_z_frequency_adjusted"],
                     figures["cooperative_z_frequency_adjusted"])
        if figures.get("against_noise"):
            assert_close(point["cooperative_means"]["z_over_noise"], figures["against_noise"]["cooperative_z_over_noise"])


def assert_arms_recomputed(script: dict, experiment: dict) -> int:
    """Every figure of the joint-gradient experiment the script gives equals the document's (each endpoint's arms and
    paired difference with its sign-flip p, the cross-seed r per arm and its pairs); returns how many were compared."""
    compared = 0
    for run in script["runs"]:
        assert run["value"] == pytest.approx(run["cross_fitted_r"], abs=1e-6)
    documents = {(p["text"], p["step"]): p for p in experiment["points"]}
    mine_of = {theirs: mine for mine, theirs in ENDPOINTS.items()}
    for point in script["points"]:
        document = documents[(point["text"], point["step"])]
        # every endpoint the document reads (the script gives more: the trend-removed z, the variance share)
        for theirs, endpoint in document["endpoints"].items():
            mine = mine_of.get(theirs, theirs)
            figures = point["arms"][mine]
            # the ablation agreement: the scoring's float64 sums against the kept float32 ones
            tolerance = 1e-6 if mine == "ablation_agreement" else 1e-8
            for arm, figure in figures["arms"].items():
                assert figure["value"] == pytest.approx(endpoint["arms"][arm]["value"], abs=tolerance)
                assert figure["ci"] == pytest.approx(endpoint["arms"][arm]["ci"], abs=tolerance)
                compared += 1
            difference = endpoint["difference"]
            assert figures["difference"]["value"] == pytest.approx(difference["value"], abs=tolerance)
            assert figures["difference"]["ci"] == pytest.approx(difference["ci"], abs=tolerance)
            assert figures["difference"]["p"] == pytest.approx(difference["p"], abs=1e-12)
            compared += 1
        for arm, figure in point["arms"]["cross_seed"].items():
            rule = document["recurrence"]["arms"][arm]["pair_rule"]
            assert figure["r"] == pytest.approx(rule["r"], abs=1e-10)
            assert sorted(figure["pair_r"].values()) == pytest.approx(sorted(rule["pair_r"]), abs=1e-10)
            compared += 1
    return compared
