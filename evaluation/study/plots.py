"""The study document's plots: the noise floor of every run, reliability along each trajectory, convergence."""

import numpy as np
import pandas as pd
from matplotlib import pyplot as plt

from ..scoring.report import save_figure


def plot_noise_floor(frame, path):
    """Per run and text: two towers against the same-tower floor, the two tests, and the reliability."""
    figure, axes = plt.subplots(1, 3, figsize=(14, 0.4 * len(frame) + 1.5), sharey=True)
    positions = np.arange(len(frame))
    panels = (
        ("two_tower_difference_nats", "two towers", "same_tower_floor_nats", "same tower (floor)"),
        ("significant_share", "replica-level test", "occurrence_significant_share", "occurrence-level test"),
    )
    titles = ("mean |difference| between probes (nats)", "share of eligible token types significant")
    for axis, (key, label, other_key, other_label), title in zip(axes, panels, titles):
        axis.barh(positions - 0.2, frame[key].fillna(0), height=0.4, label=label)
        axis.barh(positions + 0.2, frame[other_key].fillna(0), height=0.4, label=other_label)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8, loc="lower right")
    low, high = frame[["reliability_ci_low", "reliability_ci_high"]].to_numpy(dtype=float).T
    axes[2].hlines(positions, low, high, color="C0", label="95% interval")
    axes[2].scatter(frame["reliability"].to_numpy(dtype=float), positions, color="C0", label="reliability")
    axes[2].scatter(
        frame["reliability_single_probe"].to_numpy(dtype=float), positions, color="C1", marker="x", label="one probe"
    )
    axes[2].axvline(0, color="gray", linewidth=0.8)
    axes[2].set_title("reliability", fontsize=10)
    axes[2].legend(fontsize=8, loc="best")
    axes[0].set_yticks(positions, [f"{row.run} / {row.text}" for row in frame.itertuples()], fontsize=8)
    axes[0].invert_yaxis()
    figure.tight_layout()
    save_figure(figure, path)


def plot_trajectory(trajectory, study, path):
    """Per cooperative family: reliability against validation loss, both arms, every seed (a line per run)."""
    frame = pd.DataFrame(trajectory)
    families = [name for name, family in study.families.items()
                if family.control_of is None and name in set(frame["family"])]
    figure, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4), squeeze=False)
    for axis, family in zip(axes[0], families):
        arms = [family] + [name for name, other in study.families.items() if other.control_of == family]
        for color, arm in enumerate(arms):
            for index, (_, run) in enumerate(frame[frame["family"] == arm].groupby("run")):
                run = run.sort_values("step")
                axis.plot(run["validation_loss"], run["reliability"], marker="o", color=f"C{color}",
                          label=arm if index == 0 else None)
        axis.set_title(family, fontsize=10)
        axis.set_xlabel("pretraining validation loss (nats)")
        axis.invert_xaxis()
        axis.legend(fontsize=8)
    axes[0][0].set_ylabel("reliability of the preference")
    figure.tight_layout()
    save_figure(figure, path)


def plot_convergence(checks, path):
    figure, axis = plt.subplots(figsize=(7, 4))
    for color, check in enumerate(checks):
        for history, style, label in ((check["history"], "-", "run"), (check["long_history"], ":", "2x as long")):
            axis.plot([entry["step"] for entry in history], [entry["loss"] for entry in history], style,
                      color=f"C{color}", label=f"{check['family']} ({label})")
    axis.set_xlabel("pretraining step")
    axis.set_ylabel("validation loss (nats)")
    axis.set_xscale("log")
    axis.legend(fontsize=8)
    figure.tight_layout()
    save_figure(figure, path)


def plot_factorial_cells(factorial: dict, path):
    """The 2x2's cross-fitted r at its final point: per text a panel, per cell its seeds (dots) and their mean with the
    95% t interval (bar), from the study's JSON (factorial.factorial_analysis)."""
    final = [point for point in factorial["points"] if point["step"] == factorial["final_step"]]
    figure, axes = plt.subplots(1, len(final), figsize=(4.2 * len(final), 2.8), sharey=True, squeeze=False)
    for axis, point in zip(axes[0], final):
        cells = point["endpoints"]["cross_fitted_r"]["cells"]
        for position, (cell, figure_of_cell) in enumerate(cells.items()):
            seeds = list(figure_of_cell["per_seed"].values())
            axis.scatter(seeds, [position] * len(seeds), color="0.6", s=14, zorder=2)
            if figure_of_cell["ci"] is not None:
                axis.hlines(position, *figure_of_cell["ci"], color="C0", linewidth=3, zorder=1)
            axis.scatter([figure_of_cell["value"]], [position], color="C0", marker="|", s=200, zorder=3)
        axis.axvline(0, color="gray", linewidth=0.8)
        axis.set_yticks(range(len(cells)), list(cells), fontsize=8)
        axis.set_title(f"{point['text']}, {point['multiple']:g}x", fontsize=9)
        axis.set_xlabel("cross-fitted r (per-type preference reproduced)", fontsize=8)
    axes[0][0].invert_yaxis()
    figure.tight_layout()
    save_figure(figure, path)
