"""Upload a folder (a model repository or a Space) to the Hugging Face Hub with huggingface_hub.

Every upload's target is checked before any work, with the same rules for a model, the metric's Space and the
study's dataset (`check_hub_target`): the repository id as the Hub accepts it, the offline mode (which forbids the
upload), and the token. The token comes from huggingface_hub's standard resolution (HF_TOKEN, then the cached
`hf auth login`); this module never reads, logs or prints it.
"""

import os
from pathlib import Path

from huggingface_hub import HfApi, get_token, is_offline_mode
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id

from .utils.errors import TwoTowerUserError

TOKENS_PAGE = "https://huggingface.co/settings/tokens"


class HubTokenError(TwoTowerUserError, RuntimeError):
    """No usable Hugging Face token (a RuntimeError too, as callers have long caught it)."""


def check_repo_id(repo_id, option: str) -> None:
    """`repo_id` as the Hub accepts a repository id, `owner/name` (huggingface_hub's validate_repo_id, with the owner
    required: without one the upload would go to whichever account the token belongs to)."""
    problem = None
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        problem = "it must be `user/name` (or `organization/name`), one slash"
    else:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as error:
            problem = " ".join(str(error).split())
    if problem is not None:
        raise TwoTowerUserError(
            f"{option} is {repo_id!r}; pass `user/name` (letters, digits, '-', '_' and '.'), a repository id the Hub "
            f"accepts: {problem}."
        )


def check_hub_target(repo_id, option: str, offline_fix: str) -> None:
    """
    Before any work, what an upload to `repo_id` needs: a repository id the Hub accepts, the Hub not switched off
    (HF_HUB_OFFLINE=1 forbids every request; `offline_fix` says how to do without the upload), and a token the Hub
    accepts with write access (`check_hub_token`).
    """
    check_repo_id(repo_id, option)
    check_hub_token(option, offline_fix)


def check_hub_token(option: str = "--push_to_hub", offline_fix: str = "upload once online") -> None:
    """
    Fail before the work, not after it: a token must exist, the Hub must not be switched off (HF_HUB_OFFLINE), and
    it must accept the token (`whoami`) with write access.
    """
    token = get_token()
    if token is None:
        raise HubTokenError(f"{option} needs a Hugging Face token: run `hf auth login` or set HF_TOKEN.")
    if is_offline_mode():
        raise HubTokenError(
            f"{option} uploads to the Hub, but HF_HUB_OFFLINE is set, which forbids any request to it: unset "
            f"HF_HUB_OFFLINE to upload, or {offline_fix}."
        )
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
            "network and run again (the upload needs it)."
        ) from error
    if identity.get("auth", {}).get("accessToken", {}).get("role") == "read":
        raise HubTokenError(
            f"The Hugging Face token of {identity.get('name', 'this account')} is read-only; uploading needs a token "
            f"with write access ({TOKENS_PAGE})."
        )


def push_to_hub(folder: str | os.PathLike, repo_id: str, **upload_options) -> str:
    """`upload_parts` of one part, the whole `folder` (`upload_options`: its keywords); returns the commit URL."""
    return upload_parts(repo_id, [{"folder_path": str(folder)}], **upload_options)


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
