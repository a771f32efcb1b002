"""
The token view in a real browser (headless Chromium, driven by Playwright): tokens.html of planted preferences, and
the metric's Space started on 127.0.0.1 with a model whose probes are planted to prefer. Skipped, with the reason,
where Chromium or Playwright is missing (conftest.py's `chromium`); CI installs both.
"""

import importlib.util
import json
import os
import re
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from twotower.evaluation.tower_preference.preference_stats import PreferenceAccumulator
from twotower.evaluation.tower_preference.replica_preference import compute_preference
from twotower.evaluation.tower_preference.measures import PROBE_FREE_MEASURES
from twotower.evaluation.tower_preference.token_view import TOWER_COLORS, render_token_view
from twotower.training.data.tokenizer import train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]
METRIC_DIR = REPO / "evaluation" / "tower_preference"
SHAKESPEARE = REPO / "data" / "tiny-shakespeare"
TOWERS, REPLICAS = 2, 2
PROBE_TOWERS, PROBE_RUNS = [0, 0, 1, 1], [0, 1, 0, 1]  # replica r of every tower shares a data order: paired
# planted: type 20 is predicted 1 nat better by tower 0's probes, type 21 by tower 1's; the others by neither
PREFERS_TOWER_0, PREFERS_TOWER_1, NEITHER = 20, 21, range(22, 32)
NOISE_RELIED_ON = 22  # of NEITHER: the joint model is planted to need the tower its probes' noise does not point to
OCCURRENCES, PASSAGES, PASSAGE_LENGTH = 40, 3, 40
# token_view.py: full colour is opacity 0.7 (MAX_OPACITY), from the 95th percentile of the preferences on; a faded
# type keeps 0.3 of its opacity (FADED_SHARE). The planted 1-nat preferences are the largest two of 12.
FULL_OPACITY, STRONG_OPACITY, FADED_OPACITY = 0.7, 0.6, 0.7 * 0.3


def rgb(color: str) -> tuple[int, ...]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))


def css_background(span) -> tuple[tuple[int, ...], float]:
    """(red, green, blue), alpha of a span's computed background colour."""
    values = re.fullmatch(r"rgba?\((.*)\)", span.evaluate("e => getComputedStyle(e).backgroundColor"))[1].split(",")
    return tuple(int(v) for v in values[:3]), float(values[3]) if len(values) == 4 else 1.0


@pytest.fixture(scope="module")
def planted():
    """Gold log-probabilities [probes, n] of planted preferences, their result, and passages of their first tokens."""
    rng = np.random.default_rng(0)
    types = [PREFERS_TOWER_0, PREFERS_TOWER_1, *NEITHER]
    token_ids = rng.permutation(np.repeat(types, OCCURRENCES))
    effect = np.zeros((TOWERS, 40))
    effect[0, PREFERS_TOWER_0], effect[1, PREFERS_TOWER_1] = 0.5, 0.5
    effect[1, PREFERS_TOWER_0], effect[0, PREFERS_TOWER_1] = -0.5, -0.5
    probe_offset = rng.normal(0, 0.05, (4, 40))  # each probe's own error on each type: probe noise
    gold = (
        -3.0 + rng.normal(0, 0.5, token_ids.size)  # how hard each occurrence is, for every probe
        + effect[PROBE_TOWERS][:, token_ids] + probe_offset[:, token_ids] + rng.normal(0, 0.2, (4, token_ids.size))
    )
    results = compute_preference(
        token_ids, gold, min_count=10, probe_towers=PROBE_TOWERS, probe_runs=PROBE_RUNS
    ).to_dict()
    tokens = [f"Ġw{token_id}" for token_id in results["token_ids"]]
    passages = []
    for p in range(PASSAGES):
        span = slice(p * PASSAGE_LENGTH, (p + 1) * PASSAGE_LENGTH)
        passage_gold = gold[:, span].copy()
        passage_gold[:, 0] = np.nan  # as a causal LM scores a block: its first token is not predicted
        ids = token_ids[span].tolist()
        passages.append({"token_ids": ids, "texts": [f" w{i}" for i in ids], "gold_logprobs": passage_gold})
    # the mean-ablation increases [towers, n], planted the other way round: the joint model needs tower 1 more for
    # type 20 (by 0.4 nats), and for type 22 the tower other than the one its probe noise happens to point to
    increases = rng.normal(0.3, 0.2, (TOWERS, token_ids.size))
    increases[1, token_ids == PREFERS_TOWER_0] += 0.4
    noise_tower = results["preferred_tower"][results["token_ids"].index(NOISE_RELIED_ON)]
    increases[1 - noise_tower, token_ids == NOISE_RELIED_ON] += 0.4
    accumulator = PreferenceAccumulator(num_towers=TOWERS)
    accumulator.update(token_ids, increases - increases.max(axis=0))  # as evaluation/scoring/ablation.py feeds it
    ablation = accumulator.compute(min_count=10).to_dict()
    return {"token_ids": token_ids, "gold": gold, "results": results, "tokens": tokens, "passages": passages,
            "increases": increases, "ablation": ablation}


@pytest.fixture
def token_view(planted, chromium, tmp_path):
    """tokens.html of the planted preferences, opened offline; yields (page, URLs the page requested)."""
    kinds = ["word-initial" if i % 2 else "continuation" for i in planted["results"]["token_ids"]]
    page_html = render_token_view(planted["results"], planted["tokens"], planted["passages"], {"kind": kinds},
                                  measures={"ablation": planted["ablation"]})
    path = tmp_path / "tokens.html"
    path.write_text(page_html, encoding="utf-8")
    context = chromium.new_context(offline=True, viewport={"width": 1100, "height": 800})
    page = context.new_page()
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(path.as_uri())
    yield page, requested
    context.close()


def test_planted_preferences_render_in_their_towers_colours(token_view, planted):
    page, requested = token_view
    results = planted["results"]
    significant = {t for t, s in zip(results["token_ids"], results["significant"]) if s}
    assert significant == {PREFERS_TOWER_0, PREFERS_TOWER_1}  # the planted effects, and nothing else
    for token_id, tower in ((PREFERS_TOWER_0, 0), (PREFERS_TOWER_1, 1)):
        spans = page.locator(f".token.scored[data-type='{token_id}']")
        assert spans.count() > 0
        for i in range(spans.count()):
            color, alpha = css_background(spans.nth(i))
            assert color == rgb(TOWER_COLORS[tower]) and alpha >= STRONG_OPACITY
    for token_id in NEITHER:
        for span in page.locator(f".token.scored[data-type='{token_id}']").all():
            color, alpha = css_background(span)
            assert alpha <= FADED_OPACITY + 1e-6 and "faded" in span.get_attribute("class")
    # the first token of each passage was not predicted: no colour
    firsts = page.locator(".passage > .token:first-child")
    assert firsts.count() == PASSAGES
    assert all(css_background(span)[1] == 0 for span in firsts.all())
    assert all(url.startswith("file://") for url in requested), requested  # one self-contained file


def test_the_hover_card_shows_this_positions_numbers(token_view, planted):
    page, _ = token_view
    results, gold, token_ids = planted["results"], planted["gold"], planted["token_ids"]
    span = page.locator(f".passage[data-passage='1'] .token.scored[data-type='{PREFERS_TOWER_0}']").first
    position = int(span.get_attribute("data-position"))
    span.hover()
    card = page.locator("#card")
    assert card.is_visible()

    # independently: each tower's replica mean here, and the type's mean tower 0 minus tower 1 over its occurrences
    here = gold[:, PASSAGE_LENGTH + position]
    assert card.locator("[data-field=logprobs]").inner_text() == (
        f"Log-probability here: tower 0 {here[:2].mean():.3f}, tower 1 {here[2:].mean():.3f} nats "
        "(each tower: the mean of its probe replicas)"
    )
    occurrences = token_ids == PREFERS_TOWER_0
    preference = (gold[:2, occurrences].mean(axis=0) - gold[2:, occurrences].mean(axis=0)).mean()
    index = results["token_ids"].index(PREFERS_TOWER_0)
    df = results["residual_df"] + (np.inf if results["prior_df"] is None else results["prior_df"])
    low, high = stats.t.interval(0.95, df, loc=preference, scale=results["standard_error"][0][index])
    assert card.locator("[data-field=preference]").inner_text() == (
        f"Decodable from the tower (probes): the type, seen {OCCURRENCES} times, is predicted better from tower 0 by "
        f"{preference:.3f} nats (95% interval {low:.3f} to {high:.3f})"
    )
    eligible = results["num_eligible_types"]
    assert card.locator("[data-field=significance]").inner_text().startswith(
        f"Beyond probe noise, after Benjamini-Hochberg over the {eligible} eligible types at alpha = 0.05: yes; p = "
    )
    # the planted ablation preference: tower 1's mean increase over the type's occurrences minus tower 0's
    needs_tower_1 = (planted["increases"][1, occurrences] - planted["increases"][0, occurrences]).mean()
    assert card.locator("[data-field=ablation]").inner_text().startswith(
        f"Relied on by the joint model (mean ablation, no probe): it loses more without tower 1, by {needs_tower_1:.3f} "
        "nats; beyond chance, after Benjamini-Hochberg: yes; p = "
    )
    # planted to point to different towers: the card says what that means, with the page's agreement over types
    assert card.locator("[data-field=measures]").inner_text().startswith(
        "The two measures point to different towers: tower 0's features let a probe predict this type better, yet "
        "the joint model loses more without tower 1 (mean ablation). Not a contradiction"
    )
    assert card.locator("[data-field=categories]").inner_text() == "kind: continuation"  # 20 is even
    page.mouse.move(0, 0)
    assert not card.is_visible()


def test_the_two_measures_are_said_to_differ_only_where_both_are_beyond_noise(token_view, planted):
    page, _ = token_view
    results = planted["results"]
    index = results["token_ids"].index(NOISE_RELIED_ON)
    probe_tower, significant = results["preferred_tower"][index], results["significant"][index]
    ablation_index = planted["ablation"]["token_ids"].index(NOISE_RELIED_ON)
    assert not significant and planted["ablation"]["significant"][ablation_index]
    assert planted["ablation"]["preferred_tower"][ablation_index] == 1 - probe_tower
    page.locator(f".token.scored[data-type='{NOISE_RELIED_ON}']").first.hover()
    card = page.locator("#card")
    assert card.locator("[data-field=significance]").inner_text().startswith(
        f"Beyond probe noise, after Benjamini-Hochberg over the {results['num_eligible_types']} eligible types at "
        "alpha = 0.05: no; p = "
    )
    assert card.locator("[data-field=ablation]").inner_text().startswith(
        f"Relied on by the joint model (mean ablation, no probe): it loses more without tower {1 - probe_tower}"
    )
    # the probes' tower is noise, so the two do not point to different towers: no line says they do
    assert card.locator("[data-field=measures]").count() == 0
    # type 20, beyond noise both ways and planted to point to different towers, keeps its line
    page.locator(f".token.scored[data-type='{PREFERS_TOWER_0}']").first.hover()
    assert card.locator("[data-field=measures]").count() == 1


def test_the_filters_keep_the_tokens_they_name(token_view, planted):
    page, _ = token_view
    results = planted["results"]
    preferred = dict(zip(results["token_ids"], results["preferred_tower"]))
    shown = [t for passage in planted["passages"] for t in passage["token_ids"][1:]]  # the scored tokens

    def kept():
        return [int(span.get_attribute("data-type")) for span in page.locator(".token.scored:not(.filtered-out)").all()]

    page.locator("input[data-tower='0']").uncheck()
    assert kept() == [t for t in shown if preferred[t] == 1]
    matching = sum(preferred[t] == 1 for t in shown)
    assert page.locator("#match-count").inner_text() == f"{matching} of {len(shown)} scored tokens match"
    page.locator("input[data-tower='0']").check()
    page.locator("#significance").select_option("significant")
    assert kept() == [t for t in shown if t in (PREFERS_TOWER_0, PREFERS_TOWER_1)]
    page.locator("select[data-scheme='kind']").select_option("word-initial")  # odd ids: 21
    assert kept() == [t for t in shown if t == PREFERS_TOWER_1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def planted_model_dir(tmp_path_factory):
    """A tiny causal model with 2 probe replicas a tower, planted: tower 0's probes favour " the", tower 1's ","."""
    lines = (SHAKESPEARE / "train.txt").read_text(encoding="utf-8").splitlines()[:3000]
    tokenizer = train_bpe_tokenizer(iter([lines]), vocab_size=320)
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset(
        "tiny", vocab_size=320, max_position_embeddings=64, probe_replicas=REPLICAS, probe_training_steps=1
    )
    model = TwoTowerForCausalLM(config).eval()
    the, comma = tokenizer.convert_tokens_to_ids(["Ġthe", ","])
    with torch.no_grad():
        model.probes.decoder.bias[:REPLICAS, the] += 3.0  # probes are tower-major: [tower 0's replicas, tower 1's]
        model.probes.decoder.bias[REPLICAS:, comma] += 3.0
    folder = tmp_path_factory.mktemp("planted") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer, {"the": the, "comma": comma}


def mean_ablation_increases(model, ids, block_size=64):
    """[towers, n] for the text's next-token positions, blocks of 64: each tower's features replaced by their mean over
    the text, the joint model's loss rise, computed from the model's fused hidden states and LM head."""
    fused, targets = [], []
    with torch.no_grad():
        for start in range(0, len(ids), block_size):
            block = torch.tensor([ids[start : start + block_size]])
            fused.append(model.model(block).last_hidden_state[0, :-1])
            targets.append(block[0, 1:])
        fused, targets = torch.cat(fused), torch.cat(targets)  # [n, towers * hidden], [n]
        hidden = fused.shape[1] // 2
        joint = torch.nn.functional.cross_entropy(model.lm_head(fused[None])[0][0], targets, reduction="none")
        increases = []
        for tower in (0, 1):
            ablated = fused.clone()
            ablated[:, tower * hidden : (tower + 1) * hidden] = fused[:, tower * hidden : (tower + 1) * hidden].mean(0)
            logits = model.lm_head(ablated[None])[0][0]
            increases.append(torch.nn.functional.cross_entropy(logits, targets, reduction="none") - joint)
    return torch.stack(increases).numpy()


@pytest.fixture(scope="module")
def space_url():
    """The Space's app (app.py, as the Space runs it) served on 127.0.0.1."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.path.insert(0, str(METRIC_DIR))  # a Space's folder is its working directory: app.py imports its neighbours
    try:
        spec = importlib.util.spec_from_file_location("tower_preference_space_app", METRIC_DIR / "app.py")
        app = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(app)
        port = free_port()
        app.demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        yield f"http://127.0.0.1:{port}"
        app.demo.close()
    finally:
        sys.path.remove(str(METRIC_DIR))


def test_the_space_scores_a_model_and_a_text_and_shows_the_token_view(planted_model_dir, space_url, chromium,
                                                                     monkeypatch):
    folder, model, tokenizer, planted_ids = planted_model_dir
    monkeypatch.setenv("TOWER_PREFERENCE_MODEL_DIR", str(folder.parent))  # the Space's --model_dir
    text = "".join((SHAKESPEARE / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:40])
    page = chromium.new_page(viewport={"width": 1200, "height": 1400})
    outside = []
    page.route(re.compile(r"^(?!http://127\.0\.0\.1).*"), lambda route: (outside.append(route.request.url),
                                                                       route.abort()))  # fmt: skip
    page.goto(space_url)
    page.get_by_role("tab", name="A model and a text").click()
    page.get_by_label("model: a twotower model").fill(folder.name)  # a folder under the model directory
    page.get_by_label("text: a short text to score").fill(text)
    page.locator("button:visible", has_text="Submit").click()
    view = page.frame_locator("iframe[title='token view']")
    the_spans = view.locator(f".token.scored[data-type='{planted_ids['the']}']")
    the_spans.first.wait_for(timeout=60_000)

    # independently: the model's probes on the text's blocks of 64 positions
    ids = tokenizer(text)["input_ids"]
    tower_means = []
    for start in range(0, len(ids), 64):
        block = torch.tensor([ids[start : start + 64]])
        with torch.no_grad():
            logprobs = model.probe_logprobs(block, all_replicas=True)[:, :, 0].mean(dim=1)  # [towers, seq - 1]
        tower_means.append((block[0, 1:], logprobs))
    targets = torch.cat([t for t, _ in tower_means])
    per_tower = torch.cat([lp for _, lp in tower_means], dim=1)
    for name, tower in (("the", 0), ("comma", 1)):
        occurrences = targets == planted_ids[name]
        preference = float((per_tower[tower] - per_tower[1 - tower])[occurrences].mean())
        spans = view.locator(f".token.scored[data-type='{planted_ids[name]}']")
        assert spans.count() == int(occurrences.sum()) > 2
        assert {css_background(span) for span in spans.all()} == {(rgb(TOWER_COLORS[tower]), FULL_OPACITY)}
        spans.first.hover()
        assert view.locator("#card [data-field=preference]").inner_text().startswith(
            f"Decodable from the tower (probes): the type, seen {int(occurrences.sum())} times, is predicted better "
            f"from tower {tower} by {preference:.3f} nats"
        )
        # and the type's mean-ablation preference: the joint model's loss rise without each tower, over its occurrences
        increases = mean_ablation_increases(model, ids)[:, occurrences.numpy()]
        needed = int(increases.mean(axis=1).argmax())
        by = abs((increases[0] - increases[1]).mean())
        assert view.locator("#card [data-field=ablation]").inner_text().startswith(
            f"Relied on by the joint model (mean ablation, no probe): it loses more without tower {needed}, by {by:.3f} "
            "nats"
        )
    # the metric's numbers beside the view: the same computation as the metric module's
    results = compute_preference(
        targets.numpy(), torch.cat([model.probe_logprobs(torch.tensor([ids[s : s + 64]]), all_replicas=True)
                                    .flatten(0, 1)[:, 0] for s in range(0, len(ids), 64)], dim=1).detach().numpy(),
        min_count=2, probe_towers=PROBE_TOWERS, probe_runs=PROBE_RUNS,
    ).to_dict()  # fmt: skip
    label, shown = page.locator("[data-testid=json]:visible").inner_text().split("\n", 1)  # one value a line
    assert label == "tower_preference"
    shown = json.loads(shown.replace("\n", ""))
    for key in ("num_predictions", "num_eligible_types", "num_significant", "significant", "reliability"):
        assert shown[key] == pytest.approx(results[key], rel=1e-6), key
    # every registered probe-free measure: its summary beside the metric's, its line on the card
    spans = view.locator(f".token.scored[data-type='{planted_ids['the']}']")
    spans.first.hover()
    for measure in PROBE_FREE_MEASURES:
        assert set(shown[measure.name]) == set(measure.summary_key_descriptions), measure.name
        assert shown[measure.name]["num_eligible_types"] == results["num_eligible_types"]
        assert view.locator(f"#card [data-field={measure.name}]").inner_text().startswith(
            f"Relied on by the joint model ({measure.method}): "), measure.name
    page.screenshot(path=folder.parent / "space.png")
    page.close()
