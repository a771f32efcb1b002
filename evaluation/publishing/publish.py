r"""
Publish a trained two-tower model on the Hugging Face Hub: stage a repository folder, then upload it.

The staged folder holds the safetensors weights, config.json with `auto_map`, the modeling code files, the
tokenizer, the generation config, the resolved training config(s), the scoring report (under `evaluation/`), and
a README.md model card rendered from the repository's top-level `model_card.md` template (installed with the
package; pass --template to use another). The upload goes through huggingface_hub (create_repo, create_branch,
upload_folder); the token comes from its standard resolution (HF_TOKEN, then `hf auth login`) and is never printed.

Stage and list what would be uploaded:
    python -m twotower.evaluation.publishing.publish --model_dir outputs/tiny/probe/model \
        --report_dir outputs/tiny/report --repo_id user/twotower-tiny --output_dir outputs/hub/twotower-tiny \
        --hardware "2 CPU cores" --dry-run

Upload (to a private repository, on a branch):
    python -m twotower.evaluation.publishing.publish --model_dir outputs/tiny/probe/model \
        --report_dir outputs/tiny/report --repo_id user/twotower-tiny --output_dir outputs/hub/twotower-tiny \
        --private --revision v0.1
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

from modeling_twotower import TwoTowerForCausalLM

from twotower.training.arguments import RESOLVED_CONFIG_NAME
from twotower.training.utils.atomic import staged_folder
from twotower.training.utils.cli import CommandParser, run
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.hub import check_hub_target, check_repo_id, describe_folder, push_to_hub
from .hub_command import add_upload_options, print_outcome, upload_options
from .model_card import DEFAULT_LICENSE, PRETRAIN_CONFIG_NAME, REPORT_DIR_IN_REPO, read_report, render_model_card
from .model_folder import find_pretrain_config, local_paths, model_config_file, portable, read_json, read_yaml
from .model_folder import short_path
from twotower.training.data.tokenizer import LOADING_FLAGS

REPORT_SUFFIXES = (".json", ".png", ".md", ".csv", ".parquet", ".html")
# The code save_pretrained copies into a model folder: the modeling module and the modules it imports
PACKAGE_CODE_DIR = Path(sys.modules[TwoTowerForCausalLM.__module__].__file__).parent
# Switches of a staged training config that bind it to its own run, cleared so that `--recipe` on the staged copy
# starts a new run: resuming from the author's checkpoints, and uploading to the author's repository.
RERUN_CLEARED = {"resume_from_checkpoint": None, "push_to_hub": False}


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def check_model_code(model_dir: Path) -> None:
    """
    Refuse a model folder whose .py files are not this package's own: the Hub runs them on every machine that loads
    the model with trust_remote_code, so an edited or an extra file would run there too.
    """
    code = sorted(path.name for path in model_dir.glob("*.py"))
    foreign = [name for name in code if not (PACKAGE_CODE_DIR / name).is_file()]
    changed = [
        name for name in code
        if name not in foreign and (model_dir / name).read_bytes() != (PACKAGE_CODE_DIR / name).read_bytes()
    ]
    problems = []
    if changed:
        problems.append(f"{_listing(changed)} {'differs' if len(changed) == 1 else 'differ'} from it")
    if foreign:
        problems.append(f"{_listing(foreign)} {'is' if len(foreign) == 1 else 'are'} not in it")
    if not problems:
        return
    raise TwoTowerUserError(
        f"{model_dir} holds model code that is not this package's ({PACKAGE_CODE_DIR}): {', '.join(problems)}. "
        f"Publish a model folder this package saved, or load this one and save_pretrained it again with this package."
    )


def stage_model_repo(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    repo_id: str,
    report_dir: str | os.PathLike | None = None,
    **card_options,
) -> Path:
    """
    Write the Hub repository folder of a saved model into output_dir (atomically) and return it: the model
    folder's files, the joint phase's training config, the report under `evaluation/`, and README.md (the
    model card; `card_options` are render_model_card's keyword arguments).
    """
    model_dir, output_dir = Path(model_dir).resolve(), Path(output_dir).resolve()
    if output_dir == model_dir or model_dir.is_relative_to(output_dir):
        raise TwoTowerUserError(
            f"--output_dir {str(output_dir)!r} would replace the model folder; stage somewhere else."
        )
    check_model_code(model_dir)
    card = render_model_card(model_dir, repo_id, report_dir, **card_options)

    max_length = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["max_position_embeddings"]
    with staged_folder(output_dir) as tmp:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and path.name != "README.md" and not path.name.startswith("."):
                stage_file(path, tmp / path.name, max_length)
        pretrain_config = find_pretrain_config(read_yaml(model_dir / RESOLVED_CONFIG_NAME))
        if pretrain_config is not None:
            stage_file(pretrain_config, tmp / PRETRAIN_CONFIG_NAME, max_length)
        if report_dir is not None:
            (tmp / REPORT_DIR_IN_REPO).mkdir()
            report_paths = local_paths(read_report(report_dir))
            for path in sorted(Path(report_dir).iterdir()):
                if path.is_file() and path.suffix in REPORT_SUFFIXES:
                    stage_file(path, tmp / REPORT_DIR_IN_REPO / path.name, max_length, report_paths)
        card.save(tmp / "README.md")
    return output_dir


def stage_file(source: Path, target: Path, max_length: int, report_paths: set[str] | None = None) -> None:
    """
    Copy one file into a staged repository, as it may leave the machine: training configs with their local paths
    cut short (see `portable`) and their RERUN_CLEARED switches cleared; a report's JSON and markdown with their local
    paths cut short, and its token view with the report's own (`report_paths`, local_paths of preference.json: HTML
    holds other slashes); tokenizer_config.json without loading flags and with the model's positions as its
    model_max_length. Everything else (weights, code, vocabularies, tables) byte for byte: their strings are tokens,
    not paths.
    """
    report = report_paths is not None
    if source.suffix == ".yaml":
        config = portable(read_yaml(source))
        config |= {key: value for key, value in RERUN_CLEARED.items() if key in config}
        target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    elif source.name == "tokenizer_config.json":
        config = {key: value for key, value in read_json(source).items() if key not in LOADING_FLAGS}
        target.write_text(json.dumps({**config, "model_max_length": max_length}, indent=2) + "\n", encoding="utf-8")
    elif report and source.suffix == ".json":
        target.write_text(json.dumps(portable(read_json(source)), indent=2) + "\n", encoding="utf-8")
    elif report and source.suffix == ".md":
        target.write_text(portable(source.read_text(encoding="utf-8")), encoding="utf-8")
    elif report and source.suffix == ".html":
        page = source.read_text(encoding="utf-8")
        for path in sorted(report_paths, key=len, reverse=True):  # a longer path first: a shorter may begin it
            page = page.replace(path, short_path(path))
        target.write_text(page, encoding="utf-8")
    else:
        shutil.copyfile(source, target)


def publish_model(
    model_dir: str | os.PathLike,
    repo_id: str,
    output_dir: str | os.PathLike,
    report_dir: str | os.PathLike | None = None,
    *,
    private: bool = False,
    revision: str = "main",
    commit_message: str = "Upload two-tower model",
    dry_run: bool = False,
    **card_options,
) -> dict:
    """Stage the model repository, then upload it unless `dry_run`; returns {"folder", "files", "commit_url"}."""
    check_repo_id(repo_id, "--repo_id")
    model_config_file(Path(model_dir))  # a folder that is no model is named first
    if not dry_run:  # before staging: an upload that cannot happen is refused first
        check_hub_target(repo_id, "--repo_id", "pass --dry-run to stage it without uploading")
    folder = stage_model_repo(model_dir, output_dir, repo_id, report_dir, revision=revision, **card_options)
    files = describe_folder(folder)
    commit_url = None
    if not dry_run:
        commit_url = push_to_hub(folder, repo_id, private=private, revision=revision, commit_message=commit_message)
    return {"folder": str(folder), "files": files, "commit_url": commit_url}


def main(argv: list[str] | None = None) -> dict:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="the `model` folder a training run saved")
    parser.add_argument("--repo_id", required=True, help="user/name of the Hub model repository")
    parser.add_argument("--output_dir", required=True, help="where the repository folder is staged")
    parser.add_argument("--report_dir", help="output folder of `python -m twotower.evaluation.scoring.score`")
    parser.add_argument("--license", help=f"a Hub license id (default: {DEFAULT_LICENSE}; the card says which)")
    parser.add_argument("--language", default="en")
    parser.add_argument("--dataset_id", help="Hub id of the training dataset; default: the training config's")
    parser.add_argument("--hardware", help='what it was trained on, for the card, e.g. "8x A100 80GB"')
    parser.add_argument("--template", help="model card template (jinja2); default: the package's model_card.md")
    add_upload_options(parser, "repository", "Upload two-tower model")
    args = parser.parse_args(argv)
    result = publish_model(
        args.model_dir, args.repo_id, args.output_dir, args.report_dir, **upload_options(args),
        license=args.license, language=args.language, dataset_id=args.dataset_id, hardware=args.hardware,
        template_path=args.template,
    )  # fmt: skip
    print_outcome(result, args, args.repo_id)
    return result


if __name__ == "__main__":
    run(main)
