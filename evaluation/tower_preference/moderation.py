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
"""Moderated variances (limma's empirical Bayes, Smyth 2004): the prior of the replica variances of all token
types, and each type's variance shrunk towards it.
"""

import math

import numpy as np
from scipy import special


MIN_VARIANCES_FOR_PRIOR = 3  # limma's prior fit needs the variance of the log variances, and a few of them


def trigamma_inverse(value):
    """The y > 0 with trigamma(y) = value > 0, by Smyth's Newton iteration (limma's trigammaInverse)."""
    if value > 1e7:
        return 1.0 / math.sqrt(value)
    if value < 1e-6:
        return 1.0 / value
    y = 0.5 + 1.0 / value  # a start below the root, from which Newton's steps increase monotonically
    for _ in range(50):
        trigamma = special.polygamma(1, y)
        step = trigamma * (1.0 - trigamma / value) / special.polygamma(2, y)
        y += step
        if -step / y < 1e-8:
            break
    return float(y)


def fit_f_distribution(variances, df):
    """Prior (df, variance) of residual variances on df degrees of freedom: limma's fitFDist (Smyth 2004).

    Each variance is taken as prior_variance times an F(df, prior_df) draw; the method of moments on the log
    variances fits both. Zero variances are left out (their log is undefined). Returns (inf, variance) when the
    variances vary no more than df alone explains, and (0, NaN), no moderation, with fewer than 3 positive ones.
    """
    variances = np.asarray(variances, dtype=np.float64)
    variances = variances[variances > 0]
    if variances.shape[0] < MIN_VARIANCES_FOR_PRIOR:
        return 0.0, math.nan
    log_variance = np.log(variances) - special.digamma(df / 2) + math.log(df / 2)
    log_mean = float(log_variance.mean())
    excess_variance = float(log_variance.var(ddof=1) - special.polygamma(1, df / 2))
    if excess_variance <= 0:
        return math.inf, math.exp(log_mean)
    prior_df = 2 * trigamma_inverse(excess_variance)
    return prior_df, math.exp(log_mean + special.digamma(prior_df / 2) - math.log(prior_df / 2))


def moderated_variance(residual_variance, residual_df, prior_df, prior_variance):
    """Posterior variance (prior_df prior_variance + residual_df residual_variance) / (prior_df + residual_df)."""
    if prior_df == 0:
        return residual_variance
    if math.isinf(prior_df):
        return np.full_like(residual_variance, prior_variance)
    return (prior_df * prior_variance + residual_df * residual_variance) / (prior_df + residual_df)


__all__ = [
    "fit_f_distribution",
    "moderated_variance",
    "trigamma_inverse",
]
