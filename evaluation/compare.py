"""
Compare the tower preferences of two report folders (two seeds, or two model types with one tokenizer).

Tower labels are arbitrary, so towers are matched first (for two towers: the larger of corr and -corr); the
correlation is over the token types eligible in both reports. Writes comparison.json and comparison.png.

    python -m twotower.evaluation.compare outputs/seed1-report outputs/seed2-report --output_dir outputs/seed1-vs-seed2
"""

import json
from pathlib import Path

import numpy as np

from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.cli import CommandParser, run
from twotower.training.utils.errors import TwoTowerUserError

from .scoring.report import eligible_preferences, load_report, plot_preference_comparison
from .tower_preference.comparisons import compare_preferences


COMPARISON_JSON = "comparison.json"
COMPARISON_PNG = "comparison.png"


def _check_same_tokenizer(ids_a, tokens_a, ids_b, tokens_b):
    """Token ids can only be matched when they name the same strings in both reports."""
    strings_b = dict(zip(ids_b.tolist(), tokens_b))
    for token_id, token in zip(ids_a.tolist(), tokens_a):
        if token_id in strings_b and strings_b[token_id] != token:
            raise TwoTowerUserError(
                f"token id {token_id} is {token!r} in the first report but {strings_b[token_id]!r} in the second: the "
                "models use different tokenizers, so their per-token preferences cannot be matched."
            )


def compare_reports(first_report_dir, second_report_dir, output_dir):
    """Matched correlation of two reports' per-type preferences; writes comparison.json and comparison.png."""
    _, table_a = load_report(first_report_dir)
    _, table_b = load_report(second_report_dir)
    ids_a, preference_a, tokens_a = eligible_preferences(table_a)
    ids_b, preference_b, tokens_b = eligible_preferences(table_b)
    _check_same_tokenizer(ids_a, tokens_a, ids_b, tokens_b)
    comparison = compare_preferences(ids_a, preference_a, ids_b, preference_b)

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _, index_a, index_b = np.intersect1d(ids_a, ids_b, return_indices=True)
    plot_preference_comparison(
        preference_a[:, index_a], preference_b[:, index_b], comparison, output_dir / COMPARISON_PNG
    )
    comparison = {
        "first_report": str(Path(first_report_dir).resolve()),
        "second_report": str(Path(second_report_dir).resolve()),
        **comparison,
    }
    write_text_atomically(output_dir / COMPARISON_JSON, json.dumps(comparison, indent=2) + "\n")
    return comparison


def main(argv=None):
    parser = CommandParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("first_report_dir", help="a report folder written by twotower.evaluation.scoring.score")
    parser.add_argument("second_report_dir", help="the report folder to compare it with")
    parser.add_argument("--output_dir", required=True, help="folder for comparison.json and comparison.png")
    args = parser.parse_args(argv)
    comparison = compare_reports(args.first_report_dir, args.second_report_dir, args.output_dir)
    print(
        f"Matched correlation {comparison['correlation']:.3f} over {comparison['num_shared_types']} token types "
        f"(second report's tower for each of the first's: {comparison['tower_mapping']}); wrote {args.output_dir}"
    )
    return comparison


if __name__ == "__main__":
    run(main)
