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
"""The reliability of per-type preferences: the share of their spread over token types that is not replica noise,
with a percentile bootstrap interval over the types.
"""

import numpy as np
from scipy import stats

from .preference_stats import MIN_TYPES_FOR_CORRELATION


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0  # fixed: the same predictions always give the same reliability interval
BOOTSTRAP_BATCH_VALUES = 1 << 24  # resampled values held at once (128 MiB), whatever the number of token types


def preference_reliability(preference_nats, sampling_variance):
    """1 - mean(sampling_variance) / var(preference_nats) over token types (last axis), averaged over contrast
    rows (the axis before): the share of the across-type variance of the preference that is not replica noise.
    """
    share_of_noise = sampling_variance.mean(axis=-1) / preference_nats.var(axis=-1, ddof=1)
    return (1.0 - share_of_noise).mean(axis=-1)


def reliability_interval(preference_nats, sampling_variance):
    """Percentile bootstrap interval [low, high] of `reliability` over token types ([rows, types] inputs)."""
    num_rows, num_types = preference_nats.shape

    def statistic(*samples, axis):  # each row's preferences, then each row's variances; resampled types last
        return preference_reliability(np.stack(samples[:num_rows], axis=-2), np.stack(samples[num_rows:], axis=-2))

    batch = max(1, BOOTSTRAP_BATCH_VALUES // (2 * num_rows * num_types))  # resamples held in memory at once
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of one repeated type has no variance
        interval = stats.bootstrap(
            (*preference_nats, *sampling_variance), statistic, n_resamples=BOOTSTRAP_RESAMPLES, batch=batch,
            vectorized=True, paired=True, axis=-1, method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED),
        ).confidence_interval
    return [finite_or_none(interval.low), finite_or_none(interval.high)]


def finite_or_none(value):
    return float(value) if np.isfinite(value) else None


def reliability_summary(preference_nats, sampling_variance, replicas):
    """reliability, reliability_ci and reliability_single_probe from the eligible types' preferences [rows, types]
    and their squared replica-level standard errors; None with too few types or no spread between them."""
    if preference_nats.shape[1] < MIN_TYPES_FOR_CORRELATION or (np.ptp(preference_nats, axis=1) == 0).any():
        return {"reliability": None, "reliability_ci": [None, None], "reliability_single_probe": None}
    reliability = float(preference_reliability(preference_nats, sampling_variance))
    return {
        "reliability": reliability,
        "reliability_ci": reliability_interval(preference_nats, sampling_variance),
        # Spearman-Brown: from the reliability of a mean of `replicas` probes to that of one probe per tower
        "reliability_single_probe": reliability / (replicas - (replicas - 1) * reliability),
    }


__all__ = [
    "finite_or_none",
    "preference_reliability",
    "reliability_interval",
    "reliability_summary",
]
