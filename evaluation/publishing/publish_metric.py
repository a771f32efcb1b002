"""
Publish the tower preference metric as an `evaluate` Space on the Hugging Face Hub, so that anyone can
`evaluate.load("user/tower_preference")`.

The Space folder is evaluation/tower_preference as it ships: the metric script (named like the folder), its
numerical core, the README.md card with the Space's YAML header, app.py (the gradio widget), the token view's
template and requirements.txt, plus a copy of the model code (modeling_twotower/), with which app.py runs the models
it is given, so that it never runs a model repository's own code. It is staged into OUTPUT_DIR/tower_preference, then
uploaded with huggingface_hub (create_repo with the gradio SDK, upload_folder; the token comes from HF_TOKEN or
`hf auth login`).

    python -m twotower.evaluation.publishing.publish_metric --output_dir outputs/hub --repo_id user/tower_preference --dry-run
    python -m twotower.evaluation.publishing.publish_metric --output_dir outputs/hub --repo_id user/tower_preference
"""

import argparse
import os
import shutil
from pathlib import Path

import modeling_twotower
from twotower.training.utils.atomic import disk_full_error, fresh_staging_folder, is_disk_full, replace_folder
from twotower.training.utils.cli import run
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.hub import push_to_hub
from .publish import describe_folder

METRIC_NAME = "tower_preference"
METRIC_DIR = Path(__file__).resolve().parents[1] / METRIC_NAME
# the metric script, the numerical modules it imports, the Space's app and its card, template and requirements
SPACE_FILES = (*sorted(path.name for path in METRIC_DIR.glob("*.py") if path.name != "__init__.py"), "README.md",
               "requirements.txt", "token_view.html.j2")
MODEL_CODE_DIR = Path(modeling_twotower.__file__).resolve().parent  # staged as the Space's modeling_twotower/
SPACE_SDK = "gradio"


def stage_metric_space(output_dir: str | os.PathLike) -> Path:
    """Copy the metric's Space files into OUTPUT_DIR/tower_preference (atomically) and return that folder.

    The folder keeps the metric's name because `evaluate.load(folder)` looks for the script named like it.
    """
    missing = [name for name in SPACE_FILES if not (METRIC_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{METRIC_DIR} lacks {missing}; publish from a complete twotower checkout.")
    final = Path(output_dir).resolve() / METRIC_NAME
    if final == METRIC_DIR:
        raise TwoTowerUserError(
            f"--output_dir {str(output_dir)!r} would replace the metric's own folder; stage elsewhere."
        )
    tmp = fresh_staging_folder(final)
    try:
        for name in SPACE_FILES:
            shutil.copyfile(METRIC_DIR / name, tmp / name)
        shutil.copytree(MODEL_CODE_DIR, tmp / MODEL_CODE_DIR.name, ignore=shutil.ignore_patterns("__pycache__"))
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(error):
            raise disk_full_error(final, tmp) from error
        raise
    replace_folder(tmp, final)
    return final


def publish_metric(
    output_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str = "main",
    commit_message: str = "Upload the tower preference metric",
    dry_run: bool = False,
) -> dict:
    """Stage the Space, then upload it unless `dry_run`; returns {"folder", "files", "commit_url"}."""
    if repo_id.count("/") != 1 or repo_id.split("/")[1] != METRIC_NAME:
        raise TwoTowerUserError(
            f"--repo_id {repo_id!r} must be `user/{METRIC_NAME}`: evaluate.load finds the script by the Space's name."
        )
    folder = stage_metric_space(output_dir)
    commit_url = None
    if not dry_run:
        commit_url = push_to_hub(
            folder, repo_id, repo_type="space", space_sdk=SPACE_SDK,
            private=private, revision=revision, commit_message=commit_message,
        )  # fmt: skip
    return {"folder": str(folder), "files": describe_folder(folder), "commit_url": commit_url}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help=f"the Space is staged into OUTPUT_DIR/{METRIC_NAME}")
    parser.add_argument("--repo_id", required=True, help=f"user/{METRIC_NAME}, the Space to create or update")
    parser.add_argument("--private", action="store_true", help="create the Space as private")
    parser.add_argument("--revision", default="main", help="branch to upload to (created if missing)")
    parser.add_argument("--commit_message", default="Upload the tower preference metric")
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help="stage and list only")
    args = parser.parse_args(argv)
    result = publish_metric(
        args.output_dir, args.repo_id,
        private=args.private, revision=args.revision, commit_message=args.commit_message, dry_run=args.dry_run,
    )  # fmt: skip
    print(f"Staged {result['folder']}:\n{result['files']}")
    if args.dry_run:
        print(f"Dry run: nothing uploaded (would upload to the Space {args.repo_id}@{args.revision}).")
    else:
        print(f"Uploaded to {result['commit_url']}")
    return result


if __name__ == "__main__":
    run(main)
