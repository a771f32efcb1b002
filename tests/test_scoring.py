"""The scoring command on a tiny model trained here, its report folder, and the comparison of two reports."""

import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from twotower.evaluation import PreferenceAccumulator, compute_preference
from twotower.evaluation import compare, report, score
from twotower.training.data import collate_blocks, load_raw_datasets, split_blocks, tokenize_and_group
from twotower.training.tokenizer import padded_vocab_size, train_bpe_tokenizer


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
    assert set(written) == {"model", "data", "settings", "perplexity", "summary"}
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

    tokenizer = scored["tokenizer"]
    files = dict(train_file=str(scored["train_file"]), validation_file=str(scored["validation_file"]))
    # a validation file alone, or with the training file: the validation blocks training evaluated on
    for data in (files, {"validation_file": files["validation_file"]}):
        args = score.ScoringArguments(model_dir="unused", output_dir="unused", block_size=BLOCK_SIZE, **data)
        torch.testing.assert_close(input_ids(score.load_blocks(args, tokenizer)), input_ids(scored["blocks"]["validation"]))
    # the training text alone: the blocks held out of it, as training holds them out
    args = score.ScoringArguments(
        model_dir="unused", output_dir="unused", block_size=BLOCK_SIZE, train_file=files["train_file"],
        validation_split_percentage=10.0, max_blocks=7,
    )
    lm_datasets = tokenize_and_group(load_raw_datasets("unused", None, files["train_file"]), tokenizer, BLOCK_SIZE)
    held_out = split_blocks(lm_datasets, BLOCK_SIZE, 10.0)["validation"]
    torch.testing.assert_close(input_ids(score.load_blocks(args, tokenizer)), input_ids(held_out)[:7])


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


def test_scoring_rejects_bad_arguments(scored, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        score.score_model(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        score.score_model(scored["model_dir"], tmp_path / "out", block_size=BLOCK_SIZE + 1, cpu=True)
    with pytest.raises(ValueError, match="`split` is 'test'"):
        score.score_model(scored["model_dir"], tmp_path / "out", split="test")
    with pytest.raises(FileNotFoundError, match="not a tower preference report"):
        compare.compare_reports(scored["output_dir"], tmp_path, tmp_path / "cmp")
