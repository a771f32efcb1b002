r"""
Publish the tower preference metric as an `evaluate` Space on the Hugging Face Hub, so that anyone can
`evaluate.load("user/tower_preference")`.

The Space folder is evaluation/tower_preference as it ships: the metric script (named like the folder), its
numerical core, the README.md card with the Space's YAML header, app.py (the gradio widget), the token view's
template and requirements.txt, plus a copy of the model code (modeling_twotower/), with which app.py runs the models
it is given, so that it never runs a model repository's own code. The files are uploaded from where they are with
huggingface_hub (create_repo with the gradio SDK, then upload_folder with allow_patterns, the model code under
path_in_repo modeling_twotower; the token comes from HF_TOKEN or `hf auth login`). A dry run stages the Space into
OUTPUT_DIR/tower_preference instead, to inspect or to `evaluate.load`.

    python -m twotower.evaluation.publishing.publish_metric --repo_id user/tower_preference --dry-run \
        --output_dir outputs/hub
    python -m twotower.evaluation.publishing.publish_metric --repo_id user/tower_preference
"""

import argparse
import os
import shutil
from pathlib import Path

import modeling_twotower
from twotower.training.hub import check_hub_target, check_repo_id, describe_folder, upload_parts
from twotower.training.utils.atomic import staged_folder
from twotower.training.utils.cli import CommandParser, run
from twotower.training.utils.errors import TwoTowerUserError
from .hub_command import add_upload_options, print_outcome, upload_options


METRIC_NAME = "tower_preference"
METRIC_DIR = Path(__file__).resolve().parents[1] / METRIC_NAME
# the metric script, the numerical modules it imports, the Space's app and its card, template and requirements
SPACE_FILES = (*sorted(path.name for path in METRIC_DIR.glob("*.py") if path.name != "__init__.py"), "README.md",
               "requirements.txt", "token_view.html.j2")
MODEL_CODE_DIR = Path(modeling_twotower.__file__).resolve().parent  # the Space's modeling_twotower/
SPACE_SDK = "gradio"
# what the Space holds, as upload_folder's parts: the model code first, so that the app never starts without it
SPACE_PARTS = [
    {"folder_path": str(MODEL_CODE_DIR), "path_in_repo": MODEL_CODE_DIR.name, "allow_patterns": ["*.py"]},
    {"folder_path": str(METRIC_DIR), "allow_patterns": list(SPACE_FILES)},
]


def stage_metric_space(output_dir: str | os.PathLike) -> Path:
    """Copy the metric's Space files into OUTPUT_DIR/tower_preference (atomically) and return that folder.

    The folder keeps the metric's name because `evaluate.load(folder)` looks for the script named like it.
    """
    check_space_files()
    final = Path(output_dir).resolve() / METRIC_NAME
    if final == METRIC_DIR:
        raise TwoTowerUserError(
            f"--output_dir {str(output_dir)!r} would replace the metric's own folder; stage elsewhere."
        )
    with staged_folder(final) as tmp:
        for name in SPACE_FILES:
            shutil.copyfile(METRIC_DIR / name, tmp / name)
        shutil.copytree(MODEL_CODE_DIR, tmp / MODEL_CODE_DIR.name, ignore=shutil.ignore_patterns("__pycache__"))
    return final


def check_space_files() -> None:
    missing = [name for name in SPACE_FILES if not (METRIC_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{METRIC_DIR} lacks {missing}; publish from a complete twotower checkout.")


def describe_space() -> str:
    """What an upload sends: one line per file (path in the Space and size), and the total."""
    files = [(f"{MODEL_CODE_DIR.name}/{path.name}", path) for path in sorted(MODEL_CODE_DIR.glob("*.py"))]
    files += [(name, METRIC_DIR / name) for name in sorted(SPACE_FILES)]
    lines = [f"{path.stat().st_size:>12,}  {name}" for name, path in sorted(files)]
    lines.append(f"{sum(path.stat().st_size for _, path in files):>12,}  bytes in {len(files)} files")
    return "\n".join(lines)


def publish_metric(
    output_dir: str | os.PathLike | None,
    repo_id: str,
    *,
    private: bool = False,
    revision: str = "main",
    commit_message: str = "Upload the tower preference metric",
    dry_run: bool = False,
) -> dict:
    """Upload the Space's files from where they are, or with `dry_run` stage them into OUTPUT_DIR/tower_preference
    and upload nothing; returns {"folder" (the staged one, None without a dry run), "files", "commit_url"}."""
    check_repo_id(repo_id, "--repo_id")
    if repo_id.split("/")[1] != METRIC_NAME:
        raise TwoTowerUserError(
            f"--repo_id {repo_id!r} must be `user/{METRIC_NAME}`: evaluate.load finds the script by the Space's name."
        )
    if dry_run:
        if output_dir is None:
            raise TwoTowerUserError("--dry-run stages the Space for inspection: pass --output_dir too.")
        folder = stage_metric_space(output_dir)
        return {"folder": str(folder), "files": describe_folder(folder), "commit_url": None}
    check_hub_target(repo_id, "--repo_id", "pass --dry-run --output_dir DIR to stage it without uploading")
    check_space_files()
    commit_url = upload_parts(
        repo_id, SPACE_PARTS, repo_type="space", space_sdk=SPACE_SDK,
        private=private, revision=revision, commit_message=commit_message,
    )  # fmt: skip
    return {"folder": None, "files": describe_space(), "commit_url": commit_url}


def main(argv: list[str] | None = None) -> dict:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", help=f"with --dry-run: the Space is staged into OUTPUT_DIR/{METRIC_NAME}")
    parser.add_argument("--repo_id", required=True, help=f"user/{METRIC_NAME}, the Space to create or update")
    add_upload_options(parser, "Space", "Upload the tower preference metric")
    args = parser.parse_args(argv)
    result = publish_metric(args.output_dir, args.repo_id, **upload_options(args))
    print_outcome(result, args, f"the Space {args.repo_id}")
    return result


if __name__ == "__main__":
    run(main)
