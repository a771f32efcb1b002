"""
The study's kept per-type tables as a dataset: an index of every kept scored point (run_index.parquet) and a dataset
card (README.md) whose YAML names the Parquet files as configurations, so that `datasets.load_dataset` on the report
folder (or on its Hub copy) finds them:

    load_dataset("docs/study/causes", "run_index")                     # one row per run, point and text
    load_dataset("docs/study/causes", "causal-t2-s0", split="step_4000.wikitext_2_test")  # its per-type sums

Each run is a configuration, each of its points and texts a split (`step_S.TEXT`, the text's name with every
character other than a letter, digit or underscore as "_"). The full per-token tables that the folder's runs no
longer keep (full_tables.py) are the configuration `full_tables`, one split per run and text (`RUN.TEXT`, spelled
so). `stage_dataset` copies what a Hub dataset repository holds (the card, the index, each run's type sums or type
totals and run.json, the runs' tokenizers, the full per-token tables from the git revision that holds them, the
document) into a folder, and `push_study_dataset` uploads it with huggingface_hub as the model publishing does. A
folder whose run tables are archived out of the working tree (full_tables.py: each listed with the revision that
holds it) keeps its index and card whole, and its Hub copy holds every table, read from that revision.
"""

import dataclasses
import io
import re
import shutil
from pathlib import Path

import pandas as pd

from twotower.training.arguments import load_config
from twotower.training.hub import check_repo_id, describe_folder, push_to_hub
from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.errors import TwoTowerUserError

from ..scoring.report_files import TYPE_SUMS_PARQUET
from .full_tables import (
    FULL_TABLES_JSON, archived_run_tables, full_table_bytes, full_tables_note, per_token_tables, read_full_tables,
)
from .kept_tables import KEPT_TOKENIZER, KEPT_TOKENIZERS_DIR, TYPE_TOTALS_PARQUET, kept_tokenizer_file
from .parts_of_speech import TYPE_TAGS_DIR, type_tags_path

RUN_INDEX_PARQUET = "run_index.parquet"
DATASET_CARD = "README.md"
CARD_TEMPLATE = "study_dataset_card.md.j2"
# beside the tables: the document and the scored texts' part-of-speech tags
STAGED_FILES = ("STUDY.md", "study.json", "*.png", f"{TYPE_TAGS_DIR}/*.parquet", f"{KEPT_TOKENIZERS_DIR}/*.json.gz")


def split_name(step: int, text: str) -> str:
    return f"step_{step}.{re.sub(r'[^A-Za-z0-9_]', '_', text)}"


def full_table_split(path: str) -> str:
    """The split of a full per-token table (runs/RUN/scores/TEXT/...): RUN.TEXT, spelled as split_name spells."""
    run, text = Path(path).parts[1], Path(path).parts[3]
    return ".".join(re.sub(r"[^A-Za-z0-9_]", "_", name) for name in (run, text))


def family_options(study, family: str) -> dict:
    """The options that tell a family's cells or arms apart (recipe, study, family): cooperative and
    separate_embeddings (the 2x2), tower_heads and joint_gradient (the joint-gradient experiment)."""
    spec = study.families[family]
    options = {**dataclasses.asdict(load_config(spec.pretrain_recipe)), **study.pretrain, **spec.overrides}
    return {"cooperative": options.get("cooperative") is not False,
            "separate_embeddings": bool(options.get("separate_embeddings")),
            "tower_heads": bool(options.get("tower_heads")),
            "joint_gradient": options.get("joint_gradient") is not False}


def run_index(summaries, runs_dir: Path, study) -> pd.DataFrame:
    """One row per run, trajectory point and text whose type sums are kept: what a recomputation needs to know of
    the run (family, seed, its factors, towers, the eligibility threshold, its tokenizer's file) and the cross-fitted
    r its scoring wrote."""
    rows = []
    archived = {entry["path"] for entry in archived_run_tables(runs_dir.parent)}
    for summary in summaries:
        run = summary["run"]
        last = summary["trajectory"][-1]["step"]
        for point in summary["trajectory"]:
            point_dir = Path() if point["step"] == last else Path("trajectory", f"step-{point['step']}")
            for text, scores in point["scores"].items():
                path = Path("runs", run["name"]) / point_dir / "scores" / text / TYPE_SUMS_PARQUET
                if not (runs_dir.parent / path).is_file() and path.as_posix() not in archived:
                    continue
                cross_fit = scores.get("cross_fit") or {}
                tokenizer_file = kept_tokenizer_file(runs_dir / run["name"], summary)
                tokenizer = tokenizer_file.relative_to(runs_dir.parent).as_posix() if tokenizer_file.is_file() else None
                tags = type_tags_path(runs_dir.parent, text, tokenizer_file) if tokenizer else None
                tags = tags.relative_to(runs_dir.parent).as_posix() if tags and tags.is_file() else None
                rows.append({"run": run["name"], "family": run["family"], "seed": run["seed"],
                             **family_options(study, run["family"]), "num_towers": run["num_towers"],
                             "replicas_per_tower": max(scores["replicas_per_tower"]), "step": point["step"],
                             "multiple": point["step"] / summary["trajectory"][0]["step"], "text": text,
                             "split": split_name(point["step"], text), "min_count": cross_fit.get("min_count"),
                             "cross_fitted_r": cross_fit.get("cross_fitted_r"), "path": path.as_posix(),
                             "tokenizer_path": tokenizer, "type_tags_path": tags})
    return pd.DataFrame(rows)


def run_table_bytes(report_dir: Path, path: str) -> bytes:
    """A kept run table's bytes: from the working tree, or, archived, from the revision that holds it."""
    entry = next((entry for entry in archived_run_tables(report_dir) if entry["path"] == path), None)
    return (Path(report_dir) / path).read_bytes() if entry is None else full_table_bytes(report_dir, entry)


def write_dataset_card(summaries, report_dir: Path, study, render_template) -> Path | None:
    """The index and the card in the report folder, where any run keeps type sums or the folder lists full per-token
    tables (full_tables.json); None (nothing written) else."""
    index = run_index(summaries, report_dir / "runs", study)
    full_tables = [{"split": full_table_split(entry["path"]), "path": entry["path"]}
                   for entry in per_token_tables(report_dir)]
    if index.empty and not full_tables:
        return None
    configs, columns = {}, []
    if not index.empty:
        index.to_parquet(report_dir / RUN_INDEX_PARQUET, index=False)
        configs = {run: rows[["split", "path"]].to_dict("records") for run, rows in index.groupby("run", sort=False)}
        columns = list(pd.read_parquet(io.BytesIO(run_table_bytes(report_dir, index["path"][0]))).columns)
    tags = sorted(index["type_tags_path"].dropna().unique()) if not index.empty else []
    if tags:
        configs["type_tags"] = [{"split": re.sub(r"[^A-Za-z0-9_]", "_", Path(path).stem), "path": path}
                                for path in tags]
    if full_tables:
        configs["full_tables"] = full_tables
    runs_and_texts = {(Path(table["path"]).parts[1], Path(table["path"]).parts[3]) for table in full_tables}
    if not index.empty:
        runs_and_texts |= set(zip(index["run"], index["text"]))
    card = render_template(CARD_TEMPLATE, configs=configs, index=None if index.empty else RUN_INDEX_PARQUET,
                           texts=sorted({text for _, text in runs_and_texts}),
                           num_runs=len({run for run, _ in runs_and_texts}), columns=columns,
                           full_tables_json=FULL_TABLES_JSON, type_totals=TYPE_TOTALS_PARQUET,
                           archived=(full_tables_note(report_dir) or {}).get("archived"))
    return write_text_atomically(report_dir / DATASET_CARD, card)


def stage_dataset(report_dir: Path, staging_dir: Path) -> Path:
    """A folder holding what the Hub dataset repository gets: the card, the index, each kept run's run.json and
    type sums (or type totals), the runs' tokenizers (a run kept before the shared folder: its own), the full
    per-token tables and archived run tables the folder lists (read from git where the working tree no longer has
    them), and the document (replaced whole if it existed)."""
    report_dir = Path(report_dir)
    if not (report_dir / DATASET_CARD).is_file():
        raise TwoTowerUserError(
            f"{report_dir} holds no dataset card: no kept run has per-type sums ({TYPE_SUMS_PARQUET}) and it lists no "
            f"full per-token tables ({FULL_TABLES_JSON}); run the study with a cross-fitted recipe "
            "(probe_replica_data: disjoint), or pass its report folder."
        )
    files = [report_dir / DATASET_CARD, *[report_dir / name for name in (RUN_INDEX_PARQUET, FULL_TABLES_JSON)
                                          if (report_dir / name).is_file()]]
    files += [path for pattern in STAGED_FILES for path in report_dir.glob(pattern)]
    for pattern in (f"runs/*/**/{TYPE_SUMS_PARQUET}", f"runs/*/**/{TYPE_TOTALS_PARQUET}", "runs/*/run.json",
                    f"runs/*/{KEPT_TOKENIZER}"):
        files += report_dir.glob(pattern)
    staging_dir = Path(staging_dir)
    partial = staging_dir.with_name(f".{staging_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    for path in sorted(set(files)):
        target = partial / path.relative_to(report_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    for entry in read_full_tables(report_dir):
        target = partial / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(full_table_bytes(report_dir, entry))
    shutil.rmtree(staging_dir, ignore_errors=True)  # the staging folder is ours: a copy, never a user's file
    partial.replace(staging_dir)
    return staging_dir


def push_study_dataset(report_dir: Path, repo_id: str, staging_dir: Path, dry_run: bool = False) -> dict:
    """Stage the dataset repository, then upload it (huggingface_hub's upload_folder) unless `dry_run`."""
    check_repo_id(repo_id, "--push_to_hub")
    folder = stage_dataset(report_dir, staging_dir)
    commit_url = None
    if not dry_run:
        commit_url = push_to_hub(folder, repo_id, repo_type="dataset", commit_message="Upload tower preference study")
    return {"folder": str(folder), "files": describe_folder(folder), "commit_url": commit_url}
