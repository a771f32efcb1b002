"""Upload a folder (a model repository or a Space) to the Hugging Face Hub with huggingface_hub.

The token comes from huggingface_hub's standard resolution (HF_TOKEN, then the cached `hf auth login`); this
module never reads, logs or prints it.
"""

import os
from pathlib import Path
import sys

from huggingface_hub import HfApi, get_token, is_offline_mode
from huggingface_hub.errors import HfHubHTTPError

from .utils.errors import TwoTowerUserError

TOKENS_PAGE = "https://huggingface.co/settings/tokens"


class HubTokenError(TwoTowerUserError, RuntimeError):
    """No usable Hugging Face token (a RuntimeError too, as callers have long caught it)."""


def check_hub_token() -> None:
    """
    Fail before training, not after it: a token must exist and, online, the Hub must accept it (`whoami`) with
    write access. Offline (HF_HUB_OFFLINE=1) the Hub cannot be asked: only the token's presence is checked.
    """
    token = get_token()
    if token is None:
        raise HubTokenError("--push_to_hub needs a Hugging Face token: run `hf auth login` or set HF_TOKEN.")
    if is_offline_mode():
        print("note: HF_HUB_OFFLINE is set, so the Hugging Face token was not checked with the Hub.", file=sys.stderr)
        return
    try:
        identity = HfApi().whoami(token=token)
    except HfHubHTTPError as error:
        if error.response is not None and error.response.status_code == 401:
            raise HubTokenError(
                f"The Hub rejects the Hugging Face token (invalid or expired): create one at {TOKENS_PAGE}, then run "
                "`hf auth login` or set HF_TOKEN."
            ) from error
        raise HubTokenError(f"The Hub could not check the Hugging Face token ({error}); try again later.") from error
    except Exception as error:  # the network: DNS, connection, timeout (huggingface_hub's HTTP client's own types)
        raise HubTokenError(
            f"Could not reach the Hub to check the Hugging Face token ({type(error).__name__}: {error}); check the "
            "network, or set HF_HUB_OFFLINE=1 to skip the check (the upload still needs the network)."
        ) from error
    if identity.get("auth", {}).get("accessToken", {}).get("role") == "read":
        raise HubTokenError(
            f"The Hugging Face token of {identity.get('name', 'this account')} is read-only; uploading needs a token "
            f"with write access ({TOKENS_PAGE})."
        )


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
    return upload_parts(
        repo_id, [{"folder_path": str(folder)}], repo_type=repo_type, private=private, revision=revision,
        commit_message=commit_message, space_sdk=space_sdk,
    )  # fmt: skip


def upload_parts(
    repo_id: str,
    parts: list[dict],
    *,
    repo_type: str = "model",
    private: bool = False,
    revision: str = "main",
    commit_message: str = "Upload two-tower model",
    space_sdk: str | None = None,
) -> str:
    """
    create_repo (+ create_branch for a revision other than main), then one upload_folder per part, each a dict of
    upload_folder's `folder_path` and optional `path_in_repo` and `allow_patterns`: files go up from where they are,
    with no staged copy. Returns the last commit's URL.
    """
    check_hub_token()
    api = HfApi()
    api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True, space_sdk=space_sdk)
    if revision != "main":
        api.create_branch(repo_id, branch=revision, repo_type=repo_type, exist_ok=True)
    for part in parts:
        commit = api.upload_folder(
            repo_id=repo_id, repo_type=repo_type, revision=revision, commit_message=commit_message, **part
        )
    return commit.commit_url


def describe_folder(folder: Path) -> str:
    """One line per file (path in the repository and size), and the total: what an upload would send."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    lines = [f"{path.stat().st_size:>12,}  {path.relative_to(folder).as_posix()}" for path in files]
    lines.append(f"{sum(path.stat().st_size for path in files):>12,}  bytes in {len(files)} files")
    return "\n".join(lines)
