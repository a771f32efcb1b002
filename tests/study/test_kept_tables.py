"""What a new run of the study keeps, at the study's size: its scored points' per-type sums in the kept form, within
half a megabyte for the run."""

import gzip
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml
from tokenizers import Tokenizer

from twotower.evaluation.scoring.cross_fitting import CrossFittedPreference
from twotower.evaluation.study.kept_tables import keep_point_sums, kept_tokenizer_file

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPE = REPO_ROOT / "evaluation" / "study" / "recipes" / "causes.yaml"  # the design the joint-gradient runs share
KEPT_RUN = REPO_ROOT / "docs" / "study" / "causes" / "runs" / "causal-t2-s0"  # its run.json and tokenizer
NEW_RUN_BYTES = 500_000
BLOCK_SIZE = 128
BLOCK_CHARACTERS = 2000  # of text, enough for BLOCK_SIZE tokens anywhere in the study's texts
REPLICAS, NUM_TOWERS = 4, 2


def scored_token_ids(tokenizer, path: Path, max_tokens: int) -> np.ndarray:
    """The ids the study scores of a text: blocks of BLOCK_SIZE tokens evenly spaced over it, max_tokens in all (each
    block tokenized from its own stretch of the text: tokenizing the whole of a large text takes minutes)."""
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    text = "".join(file.read_text(encoding="utf-8") for file in files)
    starts = np.linspace(0, len(text) - BLOCK_CHARACTERS, max_tokens // BLOCK_SIZE).astype(int)
    encoded = tokenizer.encode_batch([text[start : start + BLOCK_CHARACTERS] for start in starts])
    assert min(len(block.ids) for block in encoded) >= BLOCK_SIZE
    return np.concatenate([block.ids[:BLOCK_SIZE] for block in encoded])


def point_sums(token_ids: np.ndarray, vocab_size: int, rng) -> CrossFittedPreference:
    """A point's sums as scoring feeds them, from float32 log-probabilities and ablation increases drawn around each
    type's unigram log-probability (sums of such floats compress no better than a model's)."""
    unigram = np.log(np.bincount(token_ids, minlength=vocab_size) / token_ids.size + 1e-9)
    per_probe = rng.normal(0.0, 0.3, (NUM_TOWERS * REPLICAS, vocab_size))  # each probe's own per-type error
    noise = rng.normal(0.0, 1.5, (NUM_TOWERS * REPLICAS, token_ids.size))
    gold = np.minimum(unigram[token_ids] + per_probe[:, token_ids] + noise, 0.0).astype(np.float32)
    increases = rng.normal(0.1, 0.5, (NUM_TOWERS, token_ids.size)).astype(np.float32)
    documents = np.arange(token_ids.size) // (BLOCK_SIZE * 16)  # documents of 16 blocks: alternate ones form halves
    cross_fit = CrossFittedPreference(NUM_TOWERS, REPLICAS, vocab_size)
    cross_fit.update(token_ids, gold, documents)
    cross_fit.update_ablation(token_ids, increases, documents)
    return cross_fit


def test_a_new_run_keeps_at_most_half_a_megabyte(shared_data, tmp_path):
    recipe = yaml.safe_load(RECIPE.read_text())
    tokenizer_file = kept_tokenizer_file(KEPT_RUN)
    tokenizer = Tokenizer.from_str(gzip.decompress(tokenizer_file.read_bytes()).decode())
    min_count = recipe["scoring"]["min_count"]
    run_dir = tmp_path / "causal-t2-s0"
    run_dir.mkdir()
    rng = np.random.default_rng(0)
    points = {"trajectory/step-1000": False, ".": True}  # 1x and 4x: the earlier point, the last one
    for text, spec in recipe["eval_texts"].items():
        token_ids = scored_token_ids(tokenizer, shared_data / spec["file"], spec["max_tokens"])
        for point, is_last in points.items():
            written = tmp_path / "scores" / f"{text}-{point}" / "type_sums.parquet"  # as the scoring writes it
            written.parent.mkdir(parents=True)
            point_sums(token_ids, tokenizer.get_vocab_size(), rng).type_sums().to_parquet(written, index=False)
            kept = run_dir / point / "scores" / text / "type_sums.parquet"
            keep_point_sums(written, kept, min_count, is_last)
            if is_last:  # the last point keeps every sum (the sums of squares, the ablation's) and its report
                columns = set(pq.read_schema(kept).names)
                assert {"preference_sq_sum_tower0", "ablation_preference_sq_sum_tower0"} <= columns
                shutil.copyfile(KEPT_RUN / "scores" / text / "preference.json", kept.with_name("preference.json"))
    shutil.copyfile(KEPT_RUN / "run.json", run_dir / "run.json")
    sizes = {path.relative_to(run_dir).as_posix(): path.stat().st_size for path in run_dir.rglob("*") if path.is_file()}
    assert len(sizes) == 4 + 2 + 1, sizes  # 4 sums, 2 preference.json, run.json
    # its tokenizer is kept once per report folder: counted here, as for a run whose tokenizer no other run shares
    sizes["tokenizer"] = tokenizer_file.stat().st_size
    assert sum(sizes.values()) <= NEW_RUN_BYTES, sizes

