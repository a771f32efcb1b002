"""What leaves the machine: files with the user's umask, tokenizers without loading flags, Hub folders without
local paths, and a token the Hub has accepted before training starts. huggingface_hub is mocked: no network."""

import json
import os
import stat
from types import SimpleNamespace
from unittest import mock

import huggingface_hub
import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from twotower.training import hub
from twotower.training.arguments import TwoTowerTrainingConfig
from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.errors import TwoTowerUserError
from twotower.evaluation.publishing.model_folder import local_paths, portable, short_path
from twotower.training.data.tokenizer import LOADING_FLAGS, load_tokenizer
from twotower.training.train import training_function

FAKE_TOKEN = "hf_fakeTokenThatMustNeverBePrinted123"


@pytest.fixture
def umask():
    """Set a umask for one test, then put the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_get_the_users_umask_not_0600(umask, tmp_path, mask, mode):
    umask(mask)
    path = write_text_atomically(tmp_path / "training_config.yaml", "seed: 1\n")
    assert stat.S_IMODE(path.stat().st_mode) == mode  # mkstemp's temporary file alone would be 0600
    assert path.read_text() == "seed: 1\n" and list(tmp_path.iterdir()) == [path]


def test_a_loaded_tokenizer_saves_without_loading_flags(gpt2_tokenizer_dir, tmp_path):
    tokenizer = load_tokenizer(str(gpt2_tokenizer_dir))
    tokenizer.model_max_length = 128  # what training sets before the final save: the model's positions
    tokenizer.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert not set(LOADING_FLAGS) & set(saved) and saved["model_max_length"] == 128
    reloaded = load_tokenizer(str(tmp_path / "saved"))  # the round trip keeps them out
    reloaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "tokenizer_config.json").read_text()) == saved
    assert len(reloaded) == len(tokenizer) == 50257


# (value, what portable makes of it): absolute paths cut to their last two parts, also inside text; the rest kept
PORTABLE_CASES = {
    "train_file": ("/home/me/data/wikitext-2/train.txt", "wikitext-2/train.txt"),
    "output_dir": ("~/runs/tiny", "runs/tiny"),
    "relative": ("../shared/data/valid.txt", "../shared/data/valid.txt"),
    "records": ([{"pretrained_model": "/scratch/me/outputs/tiny/model"}], [{"pretrained_model": "tiny/model"}]),
    "description": ("the blocks held out of local text /home/me/data/train.txt, 40 blocks",
                    "the blocks held out of local text data/train.txt, 40 blocks"),
    "markdown": ("Model: `/home/me/outputs/tiny-probe/model` (2 towers), 3/7 of https://huggingface.co/a/b",
                 "Model: `tiny-probe/model` (2 towers), 3/7 of https://huggingface.co/a/b"),
    "rate": ("1.5 tokens/s", "1.5 tokens/s"), "steps": (5, 5), "none": (None, None),
}  # fmt: skip


def test_portable_cuts_absolute_paths_and_leaves_the_rest():
    value = {key: given for key, (given, _) in PORTABLE_CASES.items()}
    assert portable(value) == {key: expected for key, (_, expected) in PORTABLE_CASES.items()}
    # local_paths finds exactly the paths portable cuts: each one, cut, is where the text changed
    paths = local_paths(value)
    assert paths == {"/home/me/data/wikitext-2/train.txt", "~/runs/tiny", "/scratch/me/outputs/tiny/model",
                     "/home/me/data/train.txt", "/home/me/outputs/tiny-probe/model"}  # fmt: skip
    text = json.dumps(value)
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, short_path(path))
    assert json.loads(text) == portable(value)


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub believes it is online (the suite runs with HF_HUB_OFFLINE=1), with a fake token."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)


def http_error(status):
    return HfHubHTTPError(f"{status} error", response=SimpleNamespace(status_code=status, headers={}, request=None))


def write_token(role):
    return {"name": "someone", "auth": {"accessToken": {"role": role}}}


def test_the_token_is_checked_with_the_hub_when_online(online, capsys):
    with mock.patch.object(HfApi, "whoami", return_value=write_token("write")) as whoami:
        hub.check_hub_token()
    whoami.assert_called_once_with(token=FAKE_TOKEN)
    cases = [
        (dict(side_effect=http_error(401)), "rejects the Hugging Face token \\(invalid or expired\\)"),
        (dict(return_value=write_token("read")), "token of someone is read-only"),
        (dict(side_effect=ConnectionError("Name or service not known")), "Could not reach the Hub.*check the network"),
        (dict(side_effect=http_error(500)), "The Hub could not check the Hugging Face token"),
    ]
    for behaviour, message in cases:
        with mock.patch.object(HfApi, "whoami", **behaviour), pytest.raises(TwoTowerUserError, match=message):
            hub.check_hub_token()
    assert FAKE_TOKEN not in "".join(capsys.readouterr())


def test_offline_the_token_is_not_sent_and_the_upload_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    with mock.patch.object(HfApi, "whoami") as whoami, \
            pytest.raises(TwoTowerUserError, match="HF_HUB_OFFLINE is set, which forbids any request to it"):
        hub.check_hub_token()
    whoami.assert_not_called()
    assert FAKE_TOKEN not in "".join(capsys.readouterr())


def test_a_rejected_token_stops_training_before_it_starts(online, tmp_path):
    config = TwoTowerTrainingConfig(
        output_dir=str(tmp_path / "run"), train_file=str(tmp_path / "never-read.txt"), push_to_hub=True,
        hub_model_id="someone/tiny-twotower", cpu=True, report_to="none",
    )
    with mock.patch.object(HfApi, "whoami", side_effect=http_error(401)), pytest.raises(TwoTowerUserError):
        training_function(config)
    assert not (tmp_path / "run").exists()
