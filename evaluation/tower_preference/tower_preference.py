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

import datasets
import evaluate
import numpy as np

from .preference_stats import compute_preference


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
"""

_KWARGS_DESCRIPTION = """
Args:
    token_ids (`list` of `int`): the gold token id of each prediction (>= 0; drop ignored positions).
    gold_logprobs (`list` of `list` of `float`): for each prediction, each tower probe's log-probability
        of the gold token, one value per tower (at least 2 towers; values <= 0, finite).
    alpha (`float`, defaults to 0.05): false discovery rate of the Benjamini-Hochberg procedure.
    min_count (`int`, defaults to 10): token types seen fewer times are listed per type but excluded from
        the shares, significance, split-half consistency, bimodality and top tokens (>= 2).
    top_k (`int`, defaults to 20): how many of each tower's most preferred token types to list.
    center (`bool`, defaults to False): subtract each tower's global offset from every type's preference
        (and its split halves) before the preferred tower, p-values, significance and summary are computed,
        so a tower that is better overall does not make every type prefer it. mean_logprob and
        standard_error are unchanged.
Returns:
    Summary (numbers; lists have one entry per tower):
    num_towers, num_predictions, num_token_types, num_eligible_types (count >= min_count), num_excluded_types,
    min_count, alpha,
    global_offset_nats (per tower: the preference of the mean log-probability over all predictions, i.e. the
    occurrence-weighted mean preference), centered (whether it was subtracted),
    type_share_preferring, occurrence_share_preferring (among eligible types),
    mean_abs_preference_nats (mean over eligible types of the preferred tower's preference),
    num_significant, significant_share (of eligible types), num_significant_preferring,
    split_half_consistency (mean over towers of the Pearson correlation between halves; None if undefined),
    bimodality_coefficient (Sarle's, mean over towers; > 5/9 suggests two modes; None if undefined),
    top_token_ids, top_preference_nats (per tower, most preferred first).
    Per token type (observed types in increasing id order):
    token_ids, count, mean_logprob [towers][types], preference_nats [towers][types] (minus the offset if centered),
    standard_error [towers][types], preferred_tower, p_value, eligible, significant.
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
"""

_CITATION = """
@article{he2022spontaneous,
  title={Spontaneous Emerging Preference in Two-tower Language Model},
  author={He, Zhengqi and Toyoizumi, Taro},
  journal={arXiv preprint arXiv:2210.07041},
  year={2022}
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

    def _compute(self, token_ids, gold_logprobs, alpha=0.05, min_count=10, top_k=20, center=False):
        num_logprobs = sorted({len(row) for row in gold_logprobs})
        if len(num_logprobs) > 1:
            raise ValueError(
                f"every prediction needs one log-probability per tower; got rows of lengths {num_logprobs}."
            )
        gold_logprobs = np.asarray(gold_logprobs, dtype=np.float64).T  # the core takes [towers, predictions]
        result = compute_preference(
            token_ids, gold_logprobs, alpha=alpha, min_count=min_count, top_k=top_k, center=center
        )
        return result.to_dict()
