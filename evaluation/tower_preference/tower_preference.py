# Copyright 2026 The twotower Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Tower preference: which tower of a multi-tower language model predicts each token type better."""

import json
import os
import textwrap
from pathlib import Path

import datasets
import evaluate
import numpy as np
import yaml

# evaluate.load copies beside this script only the sibling files that it imports itself, not those they import, and
# reads a comment after an import as a URL to fetch: one plain line for each module of the maths
from .comparisons import compare_preferences
from .moderation import fit_f_distribution
from .parts_of_speech import parts_of_speech_summary
from .preference_stats import validate_predictions
from .reliability import preference_reliability
from .replica_preference import compute_preference
from .summary import REPLICA_SUMMARY_KEYS, summary_key_lines


PROBE_PHASE_COMMAND = (
    "python -m twotower.training.train --recipe tiny_probe --pretrained_model {model} --output_dir OUTPUT_DIR"
)


_DESCRIPTION = """
Tower preference measures the "spontaneous emerging preference" of He & Toyoizumi (2022): after two (or
more) towers of a language model are trained together, a probe trained on each tower alone predicts some
token types better than the other probes do. For every predicted token, pass its gold token id and each
tower probe's log-probability of it. Per token type, the metric averages each tower's log-probability;
the preference of tower t is its mean minus the mean of the other towers' means, in nats (with two
towers: tower 0 minus tower 1, positive means tower 0 is preferred). It reports each type's preference with
a paired t-test, and a summary: the share of token types and of token occurrences preferring each tower,
the share of types whose preference is significant after Benjamini-Hochberg, the split-half consistency
(correlation of preferences measured on two interleaved halves of each type's occurrences), Sarle's
bimodality coefficient of the preference distribution, and each tower's top token types. When one tower
is better overall, every type's preference shifts by the same global offset (with two towers, the difference
of the probes' log perplexities); the metric always reports it, and `center=True` subtracts it before testing.

A second probe trained on the same tower disagrees with the first about as much as the two towers' probes do,
so with one probe per tower the per-type test mostly tells one probe from another. Pass several probe
replicas per tower (other seeds or data orders) with `probe_towers`, and the per-type test takes the replica
as its unit of replication: paired by training run when `probe_runs` says which probes were trained together
(their shared per-type error cancels in the tower contrast), pooled within towers otherwise, with the replica
variances of all eligible types shrunk towards a common prior (a moderated t-test, Smyth 2004). `reliability`
is the share of the across-type variance of the preference that is a difference between towers rather than
between replicas (about 0 for probe noise alone, about 1 when replicas agree), with a bootstrap interval over
token types, and `two_tower_difference_nats` (probes of two towers) stands next to `same_tower_floor_nats`
(probes of one tower). The occurrence-level test, on each tower's replica-mean log-probability, is kept under
`occurrence_*`.
"""

_KWARGS_DESCRIPTION = """
Args:
    token_ids (`list` of `int`): the gold token id of each prediction (>= 0; drop ignored positions).
    gold_logprobs (`list` of `list` of `float`): for each prediction, each tower probe's log-probability
        of the gold token, one value per tower (at least 2 towers; values <= 0, finite); with probe_towers,
        one value per probe replica.
    alpha (`float`, defaults to 0.05): false discovery rate of the Benjamini-Hochberg procedure.
    min_count (`int`, defaults to 10): token types seen fewer times are listed per type but excluded from
        the shares, significance, split-half consistency, bimodality and top tokens (>= 2).
    top_k (`int`, defaults to 20): how many of each tower's most preferred token types to list.
    center (`bool`, defaults to False): subtract each tower's global offset from every type's preference
        (and its split halves) before the preferred tower, p-values, significance and summary are computed,
        so a tower that is better overall does not make every type prefer it. mean_logprob and
        standard_error are unchanged. With probe_towers, each probe's mean log-probability over all
        predictions is subtracted from its per-type means first.
    probe_towers (`list` of `int`, optional): the tower (0 to num_towers - 1) each probe replica reads, one
        per value of a gold_logprobs row, at least 2 per tower. Turns on the replica-level test.
    probe_runs (`list` of `int`, optional): the training run each probe comes from; every run must hold one
        probe of every tower. Pairs the probes of a run in the replica-level test.
    model_config (`dict`, a transformers config, or a model folder path, optional): the configuration of the
        twotower model whose probes gave gold_logprobs. When given, probes that were never trained (no
        `probe_training_steps` recorded by the probe phase) are refused: their preference is noise.
    type_tags (`dict` of `int` to `str`, optional): each token type's part of speech, a UPOS tag (DET, ADP, NOUN, ...;
        e.g. the majority tag of its occurrences, twotower.evaluation.scoring.parts_of_speech_tagging); types without one are
        left out. Adds `parts_of_speech` (below).
Returns:
{summary_keys}
    Per token type (observed types in increasing id order):
    token_ids, count, mean_logprob [towers][types], preference_nats [towers][types] (minus the offset if centered),
    standard_error [towers][types], preferred_tower, p_value, eligible, significant.
    With probe_towers, mean_logprob and preference_nats are those of each tower's replica mean; standard_error,
    p_value, significant, num_significant, significant_share and num_significant_preferring are the replica-level
    test's; and, per token type:
    probe_mean_logprob [probes][types], occurrence_standard_error [towers][types], occurrence_p_value,
    occurrence_significant, two_tower_difference_per_type_nats, same_tower_difference_per_type_nats.
    With type_tags, parts_of_speech: {num_tagged_types (eligible types with a tag), towers: per tower shown (tower 0
    alone with two towers) {tower, per_tag: [{tag, group (function, content or other), num_types,
    mean_preference_nats, ci (95% bootstrap over the tag's types)}], function_content: {d_nats (mean preference over
    function-word types DET ADP PRON AUX CCONJ SCONJ PART minus over content-word types NOUN VERB ADJ ADV PROPN),
    null_mean_nats, null_sd_nats (of |d| over 1,000 permutations of the two labels), z, p_value,
    num_function_types, num_content_types, permutations} or None}}.
Examples:
    Token 11 is predicted better by tower 0, token 12 by tower 1:

    >>> import evaluate
    >>> tower_preference = evaluate.load("evaluation/tower_preference")
    >>> results = tower_preference.compute(
    ...     token_ids=[11, 12, 11, 12, 11, 12],
    ...     gold_logprobs=[[-1.0, -2.0], [-3.0, -1.0], [-1.2, -2.1], [-3.1, -0.8], [-0.9, -2.2], [-2.9, -1.1]],
    ...     min_count=3,
    ... )
    >>> print(results["token_ids"], [round(p, 2) for p in results["preference_nats"][0]])
    [11, 12] [1.07, -2.03]
    >>> print(results["preferred_tower"], results["significant"], results["type_share_preferring"])
    [0, 1] [True, True] [0.5, 0.5]

    Predictions can be added batch by batch (e.g. per evaluation step) and computed at the end:

    >>> batches = [
    ...     ([5, 5], [[-1.0, -1.5], [-1.1, -1.4]]),
    ...     ([5, 6, 6], [[-0.9, -1.6], [-2.0, -2.0], [-2.5, -2.1]]),
    ... ]
    >>> for token_ids, gold_logprobs in batches:
    ...     tower_preference.add_batch(token_ids=token_ids, gold_logprobs=gold_logprobs)
    >>> results = tower_preference.compute(min_count=2)
    >>> print(results["count"], [round(p, 2) for p in results["preference_nats"][1]], results["num_eligible_types"])
    [3, 2] [-0.5, 0.2] 2

    Three probe replicas per tower, with probe noise alone: each probe has its own per-type error and the
    towers do not differ. The occurrence-level test flags most types; the replica-level test none:

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> token_ids = np.repeat(np.arange(200), 30)  # 200 token types, 30 occurrences each
    >>> difficulty = -rng.uniform(4.0, 8.0, 200)[token_ids] + rng.normal(0.0, 1.0, token_ids.size)  # all probes
    >>> probe_error = rng.normal(0.0, 0.3, (6, 200))  # [probes, types]: each probe's own per-type error
    >>> gold_logprobs = difficulty + probe_error[:, token_ids] + rng.normal(0.0, 0.3, (6, token_ids.size))
    >>> results = tower_preference.compute(
    ...     token_ids=token_ids.tolist(), gold_logprobs=gold_logprobs.T.tolist(), probe_towers=[0, 0, 0, 1, 1, 1]
    ... )
    >>> print(results["occurrence_significant_share"], results["significant_share"])
    0.7 0.0
    >>> print(round(results["reliability"], 2), [round(bound, 2) for bound in results["reliability_ci"]])
    -0.01 [-0.28, 0.19]
    >>> print(round(results["two_tower_difference_nats"], 2), round(results["same_tower_floor_nats"], 2))
    0.35 0.35

    The same probes on towers that really differ: tower 0 gains 0.5 nats on some types and tower 1 on the others:

    >>> tower_effect = rng.choice([-0.5, 0.5], 200)  # per type: tower 0's gain, tower 1's loss
    >>> gold_logprobs += np.repeat([tower_effect, -tower_effect], 3, axis=0)[:, token_ids]
    >>> results = tower_preference.compute(
    ...     token_ids=token_ids.tolist(), gold_logprobs=gold_logprobs.T.tolist(), probe_towers=[0, 0, 0, 1, 1, 1]
    ... )
    >>> print(results["significant_share"], round(results["reliability"], 2))
    0.95 0.94
    >>> print(round(results["two_tower_difference_nats"], 2), round(results["same_tower_floor_nats"], 2))
    1.01 0.35
"""
# The summary's keys, each with its one description (summary.py), in the docstring's layout
_KWARGS_DESCRIPTION = _KWARGS_DESCRIPTION.replace("{summary_keys}", "\n".join(
    ["    Summary (lists have one entry per tower; the keys from `test` on only with probe_towers):"]
    + [textwrap.fill(line, 116, initial_indent="    ", subsequent_indent="        ", break_on_hyphens=False)
       for line in summary_key_lines(style="docstring")]
))

_CITATION = """
@article{he2022spontaneous,
  title={Spontaneous Emerging Preference in Two-tower Language Model},
  author={He, Zhengqi and Toyoizumi, Taro},
  journal={arXiv preprint arXiv:2210.07041},
  year={2022}
}
@article{smyth2004linear,
  title={Linear Models and Empirical Bayes Methods for Assessing Differential Expression in Microarray Experiments},
  author={Smyth, Gordon K.},
  journal={Statistical Applications in Genetics and Molecular Biology},
  volume={3},
  number={1},
  pages={Article 3},
  year={2004}
}
@article{benjamini1995controlling,
  title={Controlling the False Discovery Rate: A Practical and Powerful Approach to Multiple Testing},
  author={Benjamini, Yoav and Hochberg, Yosef},
  journal={Journal of the Royal Statistical Society: Series B (Methodological)},
  volume={57},
  number={1},
  pages={289--300},
  year={1995}
}
"""


def untrained_probes_error(model_config: dict, training_config: dict | None, model_dir: str | None) -> str | None:
    """
    Why the probes of a model must not be scored, or None when a probe phase trained them: its config.json records
    `probe_training_steps`; a model saved before that record counts as trained when its training_config.yaml says
    `phase: probe`.
    """
    if model_config.get("probe_training_steps") or (training_config or {}).get("phase") == "probe":
        return None
    return (
        f"{model_dir or 'The model'} has untrained probes (no probe phase recorded: `probe_training_steps` is unset "
        f"in its config), so a preference would only measure their random initial weights. Train them first, e.g. "
        f"`{PROBE_PHASE_COMMAND.format(model=model_dir or 'MODEL_DIR')}`, and score OUTPUT_DIR/model."
    )


def _read_model_config(model_config) -> tuple[dict, dict | None, str | None]:
    """(config dict, training config dict or None, model folder if known) of a dict, a config object or a folder."""
    if isinstance(model_config, (str, os.PathLike)):
        folder = Path(model_config)
        folder = folder.parent if folder.name == "config.json" else folder
        if not (folder / "config.json").is_file():
            raise ValueError(f"model_config {str(model_config)!r} has no config.json; pass a model folder.")
        # RESOLVED_CONFIG_NAME of twotower.training.arguments, written out: `evaluate.load` copies this folder alone
        training_config_file = folder / "training_config.yaml"
        training_config = yaml.safe_load(training_config_file.read_text()) if training_config_file.is_file() else None
        return json.loads((folder / "config.json").read_text()), training_config, str(folder)
    if hasattr(model_config, "to_dict"):
        model_config = model_config.to_dict()
    if not isinstance(model_config, dict):
        raise ValueError(
            f"model_config is a {type(model_config).__name__}; pass the model's config (a dict or `model.config`) or "
            "its folder."
        )
    return model_config, None, model_config.get("_name_or_path") or None


def check_token_ids(token_ids) -> None:
    """
    One integer per prediction. The metric's int64 feature would otherwise read 1.5 as 1, "7" as 7 and True as 1
    without a word.
    """
    try:
        array = np.asarray(token_ids)
    except ValueError:  # ragged nested lists
        array = np.asarray(token_ids, dtype=object)
    if array.ndim != 1 or array.dtype == object and any(isinstance(value, (list, tuple)) for value in array):
        raise ValueError(
            f"token_ids must be a flat list of integers, one per prediction; got nested values (shape {array.shape}). "
            "Flatten them, dropping ignored positions."
        )
    if array.dtype.kind in "iu":
        return
    for position, value in enumerate(token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
            raise ValueError(
                f"token_ids must be integers >= 0; got {value!r} ({type(value).__name__}) at prediction {position}. "
                "Pass the gold token ids as ints (e.g. `labels.long().tolist()`)."
            )


def check_gold_logprobs(gold_logprobs, num_predictions: int) -> None:
    """
    Numbers only, one row per prediction: [num_predictions, num_towers]. The float64 feature would otherwise read
    "-1.5" as -1.5 and True as 1.0, and `evaluate` refuses another shape without naming the one it expects.
    """
    try:
        array = np.asarray(gold_logprobs)
    except ValueError:
        return  # ragged rows: `_compute` names their lengths
    if array.size == 0:
        return  # the core names empty input
    if array.dtype.kind not in "iuf":
        raise ValueError(
            f"gold_logprobs must be numbers (log-probabilities); got {array.flat[0].item()!r} among them. Pass floats."
        )
    if array.ndim != 2:
        raise ValueError(
            f"gold_logprobs must hold one row per prediction, each with one log-probability per tower (shape "
            f"[num_predictions, num_towers], e.g. [[-1.2, -2.3], [-0.7, -1.9]]); got shape {array.shape}."
        )
    if array.shape[0] != num_predictions and array.shape[1] == num_predictions:
        raise ValueError(
            f"gold_logprobs has {array.shape[0]} rows of {num_predictions} value(s) for {num_predictions} token_ids, "
            "one row per tower; the metric takes one row per prediction, [num_predictions, num_towers]: transpose "
            "it (e.g. `np.asarray(gold_logprobs).T.tolist()`)."
        )
    if array.shape[1] < 2:
        raise ValueError(
            f"gold_logprobs has rows of {array.shape[1]} value(s); each row is one prediction, holding one "
            "log-probability per tower (per probe, with probe_towers), and preference needs at least 2 towers: pass "
            "every tower's log-probability of the gold token."
        )


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TowerPreference(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "token_ids": datasets.Value("int64"),
                    "gold_logprobs": datasets.Sequence(datasets.Value("float64")),
                }
            ),
            reference_urls=["https://arxiv.org/abs/2210.07041"],
        )

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch of predictions (token_ids, gold_logprobs), checked before the features' silent casts."""
        check_token_ids(kwargs.get("token_ids", []))
        check_gold_logprobs(kwargs.get("gold_logprobs", []), len(kwargs.get("token_ids", [])))
        super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one prediction (token_ids, gold_logprobs), checked before the features' silent casts."""
        if "token_ids" in kwargs:
            check_token_ids([kwargs["token_ids"]])
        super().add(prediction=prediction, reference=reference, **kwargs)

    def compute(self, *, predictions=None, references=None, model_config=None, **kwargs):
        """Compute the tower preference; with `model_config`, untrained probes are refused before any input is kept."""
        if model_config is not None:
            reason = untrained_probes_error(*_read_model_config(model_config))
            if reason is not None:
                raise ValueError(reason)
        return super().compute(predictions=predictions, references=references, **kwargs)

    def _compute(
        self, token_ids, gold_logprobs, alpha=0.05, min_count=10, top_k=20, center=False, probe_towers=None,
        probe_runs=None, type_tags=None,
    ):
        num_logprobs = sorted({len(row) for row in gold_logprobs})
        if len(num_logprobs) > 1:
            raise ValueError(
                "every prediction needs one log-probability per tower (per probe, with probe_towers); got rows of "
                f"lengths {num_logprobs}."
            )
        gold_logprobs = np.asarray(gold_logprobs, dtype=np.float64).T  # the core takes [towers or probes, predictions]
        result = compute_preference(
            token_ids, gold_logprobs, alpha=alpha, min_count=min_count, top_k=top_k, center=center,
            probe_towers=probe_towers, probe_runs=probe_runs,
        )
        if type_tags is None:
            return result.to_dict()
        type_tags = {int(token_id): str(tag) for token_id, tag in dict(type_tags).items()}
        summary = parts_of_speech_summary(
            result.token_ids[result.eligible], result.preference_nats[:, result.eligible], type_tags
        )
        return result.to_dict() | {"parts_of_speech": summary}
