"""The kept per-type tables as a dataset: the index and card that `load_dataset` reads, the Hub upload (mocked)."""

from unittest import mock

import pandas as pd
import pytest
from datasets import load_dataset
from huggingface_hub import HfApi
from test_study_factorial import FAMILIES, planted_study, study_of

from twotower.evaluation.study.dataset import RUN_INDEX_PARQUET, push_study_dataset, write_dataset_card
from twotower.evaluation.study.document import render_template
from twotower.training.utils.errors import TwoTowerUserError


@pytest.fixture
def kept_study(tmp_path):
    report_dir = tmp_path / "report"
    summaries = planted_study(report_dir / "runs", lambda c, e: 0.5, seeds=1)
    write_dataset_card(summaries, report_dir, study_of(), render_template)
    return report_dir, summaries


def test_every_kept_table_loads_by_run_and_split(kept_study):
    report_dir, summaries = kept_study
    cache = str(report_dir.parent / "datasets-cache")  # datasets reuses a cached table of a folder of the same name
    index = load_dataset(str(report_dir), "run_index", split="train", cache_dir=cache).to_pandas()
    assert len(index) == len(FAMILIES) * 2  # runs x points, one text
    assert index.groupby("family")[["cooperative", "separate_embeddings"]].first().to_dict("index") == {
        "causal": {"cooperative": True, "separate_embeddings": False},
        "causal_separate": {"cooperative": True, "separate_embeddings": True},
        "causal_control": {"cooperative": False, "separate_embeddings": False},
        "causal_control_separate": {"cooperative": False, "separate_embeddings": True}}
    for row in index.itertuples():
        table = load_dataset(str(report_dir), row.run, split=row.split, cache_dir=cache).to_pandas()
        pd.testing.assert_frame_equal(table, pd.read_parquet(report_dir / row.path))
    early = index[index["step"] == 3].iloc[0]
    assert early["split"] == "step_3.wiki" and "/trajectory/step-3/" in early["path"]


def test_the_upload_goes_through_upload_folder_as_a_dataset(kept_study, tmp_path, monkeypatch):
    report_dir, _ = kept_study
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    commit = mock.Mock(commit_url="https://huggingface.co/datasets/someone/study/commit/1")
    writer = {"name": "someone", "auth": {"accessToken": {"role": "write"}}}  # the Hub accepts the token
    with mock.patch.object(HfApi, "create_repo") as create_repo, \
            mock.patch.object(HfApi, "upload_folder", return_value=commit) as upload_folder, \
            mock.patch.object(HfApi, "whoami", return_value=writer), \
            mock.patch("twotower.training.hub.is_offline_mode", return_value=False):
        pushed = push_study_dataset(report_dir, "someone/study", tmp_path / "staged")
    assert create_repo.call_args.kwargs["repo_type"] == "dataset"
    assert upload_folder.call_args.kwargs | {"commit_message": None} == {
        "repo_id": "someone/study", "folder_path": str(tmp_path / "staged"), "repo_type": "dataset",
        "revision": "main", "commit_message": None}
    assert pushed["commit_url"] == commit.commit_url
    assert (tmp_path / "staged" / RUN_INDEX_PARQUET).is_file()
    with pytest.raises(TwoTowerUserError, match="user/name"):
        push_study_dataset(report_dir, "no-owner", tmp_path / "staged", dry_run=True)
    with pytest.raises(TwoTowerUserError, match="no dataset card"):
        push_study_dataset(tmp_path / "empty", "someone/study", tmp_path / "staged", dry_run=True)
