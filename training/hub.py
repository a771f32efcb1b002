"""Upload a saved model folder to the Hugging Face Hub with huggingface_hub (create_repo + upload_folder).

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
    folder: str | os.PathLike, repo_id: str, private: bool = False, commit_message: str = "Upload two-tower model"
) -> str:
    """Create the model repository if needed and upload `folder` to it; returns the repository URL."""
    api = HfApi()
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message, repo_type="model")
    return str(repo_url)
