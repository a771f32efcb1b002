"""Upload a folder (a model repository or a Space) to the Hugging Face Hub with huggingface_hub.

The token comes from huggingface_hub's standard resolution (HF_TOKEN, then the cached `hf auth login`); this
module never reads, logs or prints it.
"""

import os

from huggingface_hub import HfApi, get_token


def check_hub_token() -> None:
    """Fail before training, not after it, when no token is available."""
    if get_token() is None:
        raise RuntimeError("--push_to_hub needs a Hugging Face token: run `hf auth login` or set HF_TOKEN.")


def push_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    repo_type: str = "model",
    private: bool = False,
    revision: str = "main",
    commit_message: str = "Upload two-tower model",
    space_sdk: str | None = None,
) -> str:
    """create_repo (+ create_branch for a revision other than main) + upload_folder; returns the commit URL."""
    check_hub_token()
    api = HfApi()
    api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True, space_sdk=space_sdk)
    if revision != "main":
        api.create_branch(repo_id, branch=revision, repo_type=repo_type, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), repo_type=repo_type, revision=revision, commit_message=commit_message
    )
    return commit.commit_url
