"""
Write an offline lm-evaluation-harness task for WikiText-2 from local files, so that a saved two-tower model
is evaluated through the harness's `hf` model type without the Hub:

    python -m twotower.evaluation.lm_eval_wikitext --wikitext_dir ../shared/data/wikitext-2 --output_dir lm_eval_tasks
    lm_eval --model hf --model_args pretrained=outputs/tiny/probe/model,trust_remote_code=True \
        --tasks wikitext2_local --include_path lm_eval_tasks --device cpu
"""

import argparse
import json
import re
import shutil
from pathlib import Path

import yaml

from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.cli import CommandParser, run
from twotower.training.utils.errors import TwoTowerUserError

TASK_NAME = "wikitext2_local"
HOOKS_FILE = Path(__file__).resolve().parent / "lm_eval_task" / "utils.py"
# An article starts at a level-1 heading such as " = Valkyria Chronicles III = " (not " = = Gameplay = = ").
ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


def split_articles(text: str) -> list[str]:
    """WikiText-2's lines grouped into one document per article, the unit the harness's wikitext task scores."""
    articles, current = [], []
    for line in text.splitlines(keepends=True):
        if ARTICLE_HEADING.match(line.rstrip("\n")) and any(l.strip() for l in current):
            articles.append("".join(current))
            current = []
        current.append(line)
    if any(l.strip() for l in current):
        articles.append("".join(current))
    return articles


def write_wikitext_task(wikitext_dir: str, output_dir: str, split: str = "test", max_documents: int | None = None):
    """Write `{TASK_NAME}.yaml`, its documents (JSON lines) and hooks into output_dir; returns the YAML path."""
    source = Path(wikitext_dir) / f"{split}.txt"
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found; pass the folder holding WikiText-2's {split}.txt.")
    articles = split_articles(source.read_text(encoding="utf-8"))[:max_documents]
    if not articles:
        raise TwoTowerUserError(f"{source} holds no article; is it WikiText-2?")
    output = Path(output_dir).resolve()
    output.mkdir(parents=True, exist_ok=True)
    documents = output / f"{TASK_NAME}_{split}.jsonl"
    write_text_atomically(documents, "".join(json.dumps({"page": article}) + "\n" for article in articles))
    shutil.copyfile(HOOKS_FILE, output / "utils.py")
    task = {
        "task": TASK_NAME,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(documents)}},
        "output_type": "loglikelihood_rolling",
        "test_split": "test",
        "doc_to_text": "",
        "doc_to_target": "{{page}}",
        "process_results": "!function utils.process_results",
        "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
        "metadata": {"version": 1.0, "source": str(source)},
    }
    # `!function` is the harness's own YAML tag; safe_dump would quote it as a string.
    task_yaml = yaml.safe_dump(task, sort_keys=False)
    task_yaml = task_yaml.replace("'!function utils.process_results'", "!function utils.process_results")
    path = output / f"{TASK_NAME}.yaml"
    write_text_atomically(path, task_yaml)
    return path


def main():
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wikitext_dir", required=True, help="folder with WikiText-2's train/valid/test.txt")
    parser.add_argument("--output_dir", required=True, help="where the task folder is written (--include_path)")
    parser.add_argument("--split", default="test", choices=["train", "valid", "test"])
    parser.add_argument("--max_documents", type=int, default=None, help="score only the first N articles")
    args = parser.parse_args()
    path = write_wikitext_task(args.wikitext_dir, args.output_dir, args.split, args.max_documents)
    print(f"Wrote {path}; run lm_eval with --tasks {TASK_NAME} --include_path {path.parent}")


if __name__ == "__main__":
    run(lambda argv: main())  # main reads sys.argv, which run leaves without --debug
