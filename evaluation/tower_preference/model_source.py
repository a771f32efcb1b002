"""
What the Space's model field accepts: it serves models, not the server's file system.

- A Hub model id (`owner/name`): the repository's size is read through huggingface_hub's API first, and one larger
  than the download limit is refused before any byte of it is fetched; only its config, weights (safetensors) and
  tokenizer files are downloaded, at the revision that was measured.
- A folder under the model directory named at launch (`python app.py --model_dir DIR`, or TOWER_PREFERENCE_MODEL_DIR),
  given relative to it. Without one, no local folder is served.

Nothing else is opened: an absolute path, `..`, or a link out of the model directory gets the same message whether or
not it exists, so the field tells a visitor nothing about the server's files. Every message about a served model
names it as the visitor gave it (`visitor_message`), never by its place on the server.
"""

import fnmatch
import os
import re
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.constants import HF_HUB_CACHE
from huggingface_hub.utils import HFValidationError, validate_repo_id

MODEL_DIR_VARIABLE = "TOWER_PREFERENCE_MODEL_DIR"
MAX_DOWNLOAD_VARIABLE = "TOWER_PREFERENCE_MAX_DOWNLOAD_GB"
DEFAULT_MAX_DOWNLOAD_GB = 2.0  # a twotower model the Space can score on a CPU while the user waits is far smaller
DOWNLOADED_FILES = ("*.json", "*.safetensors", "*.txt", "*.model")  # config, weights, tokenizer: never code or pickles


class ModelSourceError(ValueError):
    """A model field the Space does not serve, or a Hub repository it will not download."""


def not_served_message() -> str:
    """The one refusal of anything but a Hub id or a folder under the model directory: it never names the path."""
    local = " or the name of a folder under the Space's model directory" if os.environ.get(MODEL_DIR_VARIABLE) else ""
    return (f"This Space serves Hub models and opens no other path: give a Hub model id (owner/name){local}.")


def max_download_bytes() -> float:
    return float(os.environ.get(MAX_DOWNLOAD_VARIABLE, DEFAULT_MAX_DOWNLOAD_GB)) * 1e9


def _served_folder(name: str) -> str | None:
    """`name` resolved under the model directory (links followed), if that is a folder inside it; else None."""
    model_dir = os.environ.get(MODEL_DIR_VARIABLE)
    if not model_dir or not name:
        return None
    root = Path(model_dir).resolve()
    folder = (root / name).resolve()
    return str(folder) if root in folder.parents and folder.is_dir() else None


def _is_hub_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def download_hub_model(repo_id: str) -> str:
    """The local snapshot of `repo_id`'s config, weights and tokenizer, after its size is checked against the limit."""
    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
    except Exception as error:  # noqa: BLE001 (not found, gated, offline: huggingface_hub's errors vary)
        message = f"The Hub model {repo_id!r} cannot be read ({type(error).__name__}); check the id."
        raise ModelSourceError(message) from error
    size = sum(sibling.size or 0 for sibling in info.siblings or []
               if any(fnmatch.fnmatch(sibling.rfilename, pattern) for pattern in DOWNLOADED_FILES))  # fmt: skip
    if size > max_download_bytes():
        raise ModelSourceError(
            f"The Hub model {repo_id!r} is {size / 1e9:.2f} GB; this Space downloads at most "
            f"{max_download_bytes() / 1e9:.2f} GB. Score a larger model with `python -m twotower.evaluation.scoring.score`."
        )
    return snapshot_download(repo_id, revision=info.sha, allow_patterns=list(DOWNLOADED_FILES))


def visitor_message(message: str, model_path: str, model_field: str) -> str:
    """
    A message about the model served from `model_path` as a visitor may read it: that folder (and any file in it)
    named as the visitor gave it, `model_field`, and any other path under the model directory or the Hub cache cut
    to its last part.
    """
    message = message.replace(str(Path(model_path).resolve()), model_field).replace(str(model_path), model_field)
    for root in {os.environ.get(MODEL_DIR_VARIABLE), HF_HUB_CACHE} - {None, ""}:
        for form in {str(Path(root)), str(Path(root).resolve())}:
            message = re.sub(re.escape(form.rstrip("/")) + r"(/[^\s'\"`),;]*)?", _last_part, message)
    return message


def _last_part(match: re.Match) -> str:
    return Path(match.group(0)).name


def served_model_path(model_field: str) -> str:
    """The local folder to load for the model field: a folder under the model directory, or a downloaded Hub model."""
    name = model_field.strip()
    folder = _served_folder(name)
    if folder is not None:
        return folder
    if _is_hub_id(name):
        return download_hub_model(name)
    raise ModelSourceError(not_served_message())
