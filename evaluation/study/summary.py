"""
The study's summary, generated: every figure the README and docs/study.md quote of the study comes from the study
documents' JSON (docs/study/study.json, crossfit/study.json, long/study.json, causes/study.json and
gradient/study.json where they have runs) through the templates templates/study_summary.md.j2 (the whole summary)
and templates/study_findings.md.j2 (README's findings, in plain words), never copied by hand.

    python -m twotower.evaluation.study.summary --study_dir docs/study

writes docs/study/SUMMARY.md and the findings' figure (docs/study/findings.png: the 2x2's cells), fills README.md's
`<!-- study-findings -->` block and docs/study.md's `<!-- study-summary -->` block (each up to its closing
`<!-- /study-NAME -->`); `--check` only says whether they are up to date (a test runs it). Run it after the study
command has redone a document.
"""

import json
import re
from pathlib import Path

from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.cli import CommandParser, run
from twotower.training.utils.errors import TwoTowerUserError

from ..scoring.formatting import markdown_table
from ..scoring.report import template_environment
from .document import TEMPLATES_DIR
from .cross_fit import cross_fit_table
from .joint_gradient import paired_difference
from .long_run import long_run_table
from .plots import plot_factorial_cells

SUMMARY_TEMPLATE = "study_summary.md.j2"
SUMMARY_MD = "SUMMARY.md"
# a generated block: `<!-- study-NAME -->` ... `<!-- /study-NAME -->`, NAME one of `blocks`' keys
BLOCK = r"(<!-- study-{name} -->\n)(.*?)(<!-- /study-{name} -->)"
PARTS = {"main": "study.json", "crossfit": "crossfit/study.json", "long": "long/study.json",
         "causes": "causes/study.json", "gradient": "gradient/study.json"}
AGREEMENT_JSON = "agreement_by_length.json"  # benchmarks/agreement_by_length.py --table: docs/preference.md's table
CORPUS_NAMES = {"tiny-shakespeare": "Tiny Shakespeare", "wikitext-2": "WikiText-2"}
MAIN_JOB = ("tiny-shakespeare", 200, 42)  # the main job's corpus, pretraining steps and seed
FINDINGS_TEMPLATE = "study_findings.md.j2"
FINDINGS_FIGURE = "findings.png"


def _with_ci(figure, digits=2) -> str:
    """`value [low, high]` from {"value", "ci"} (or a (value, ci) pair); the value alone without an interval."""
    value, ci = (figure["value"], figure.get("ci")) if isinstance(figure, dict) else figure
    if value is None:
        return "n/a"
    if not ci:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def load_results(study_dir: Path) -> dict:
    """The study documents' JSON that exist under study_dir, by part."""
    results = {part: json.loads((study_dir / path).read_text())
               for part, path in PARTS.items() if (study_dir / path).is_file()}
    if "main" not in results:
        raise TwoTowerUserError(f"{study_dir / PARTS['main']} does not exist; pass --study_dir docs/study.")
    return results


def tower_heads_effect(results: dict) -> dict | None:
    """
    Not pre-registered: the joint-gradient experiment's joint arm (the 2x2's cooperative, shared-embedding model
    with every tower's own head and loss added) minus that 2x2 cell, in cross-fitted r at the final point on the
    primary text, paired by the seeds both have (the same recipe, data and seed, the heads apart). None until both
    are complete.
    """
    causes, gradient = results.get("causes"), results.get("gradient")
    experiment = gradient and gradient.get("joint_gradient")
    if not causes or not experiment or experiment["runs_kept"] < experiment["runs_planned"]:
        return None
    factorial = causes["factorial"]
    if factorial["runs_kept"] < factorial["runs_planned"]:
        return None

    def final_r(study):
        return next(point["endpoints"]["cross_fitted_r"] for point in study["points"]
                    if point["step"] == study["final_step"] and point["text"] == study["primary_text"])

    cells = final_r(factorial)["cells"]
    cell, joint = cells["cooperative, shared embedding"], final_r(experiment)["arms"]["joint"]
    return {"cell": cell, "independent_shared": cells["independent, shared embedding"],
            "difference": paired_difference(joint["per_seed"], cell["per_seed"])}


def render_summary(results: dict, links: str, study_md: str) -> str:
    """The summary's Markdown; `links` and `study_md` are the paths from the page it goes into to the study folder
    (e.g. docs/study) and to docs/study.md."""
    environment = template_environment(TEMPLATES_DIR)
    return environment.get_template(SUMMARY_TEMPLATE).render(
        links=links, study_md=study_md, ci=_with_ci, percent=lambda share: f"{100 * share:.1f}%",
        tower_heads=tower_heads_effect(results), **{part: results.get(part) for part in PARTS})


def render_findings(results: dict, links: str, study_md: str) -> str:
    """README's findings: each finding in plain words with its figures (the 2x2's and, where kept, the joint-gradient
    experiment's)."""
    environment = template_environment(TEMPLATES_DIR)
    return environment.get_template(FINDINGS_TEMPLATE).render(
        links=links, study_md=study_md, ci=_with_ci, percent0=lambda share: f"{100 * share:.0f}%",
        causes=results["causes"], gradient=results.get("gradient"), tower_heads=tower_heads_effect(results))


def fill_blocks(path: Path, blocks: dict[str, str]) -> str:
    """The document at `path` with each of its generated blocks (every one it holds must be known) filled."""
    document = path.read_text()
    names = re.findall(r"<!-- study-([a-z-]+) -->", document)
    if not names:
        raise TwoTowerUserError(f"{path} has no `<!-- study-summary -->` ... `<!-- /study-summary -->` block to fill.")
    for name in names:
        if name not in blocks:
            raise TwoTowerUserError(f"{path} has a block `study-{name}`; known: {sorted(blocks)}.")
        pattern = re.compile(BLOCK.format(name=re.escape(name)), re.DOTALL)
        document = pattern.sub(lambda match: match.group(1) + blocks[name] + match.group(3), document, count=1)
    return document


def table_blocks(results: dict) -> dict[str, str]:
    """The cross-fitted arms' table and the long-run table, as the study documents write them."""
    blocks = {}
    if "crossfit" in results:
        blocks["table-crossfit"] = markdown_table(cross_fit_table(results["crossfit"]["cross_fit_verdicts"])) + "\n"
    if "long" in results:
        blocks["table-long"] = markdown_table(long_run_table(results["long"]["long_run"])) + "\n"
    return blocks


def agreement_table(rows: list[dict]) -> str:
    """docs/preference.md's table of the main job's recipe at several lengths, corpora and seeds (the kept rows of
    benchmarks/agreement_by_length.py, in their order)."""
    lines = ["| corpus | pretraining steps | seed | joint ppl | probe ppl, tower 0 / 1 | probe reliability | "
             "ablation against probe preference, r |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        steps = f"{row['steps']:,}" + (" (the main job)" if (row["corpus"], row["steps"], row["seed"]) == MAIN_JOB else "")
        probes = " / ".join(f"{value:.2f}" for value in row["probe ppl"])
        low, high = row["agreement 95% CI"]
        lines.append(f"| {CORPUS_NAMES.get(row['corpus'], row['corpus'])} | {steps} | {row['seed']} | "
                     f"{row['joint ppl']:.2f} | {probes} | {row['probe reliability']:.3f} | "
                     f"{row['agreement r']:.2f} [{low:.2f}, {high:.2f}] |")
    return "\n".join(lines) + "\n"


def summary_targets(study_dir: Path, repo_root: Path) -> dict[Path, str]:
    """Each generated file or filled document with its expected text."""
    results = load_results(study_dir)
    readme, study_md = repo_root / "README.md", study_dir.parent / "study.md"
    agreement = study_dir / AGREEMENT_JSON
    preference_md = study_dir.parent / "preference.md"
    rows = json.loads(agreement.read_text()) if agreement.is_file() else None
    return {
        **({preference_md: fill_blocks(preference_md, {"table-agreement": agreement_table(rows)})} if rows else {}),
        study_dir / SUMMARY_MD: "# Study summary (generated)\n\n" + render_summary(results, ".", "../study.md"),
        readme: fill_blocks(readme, {"findings": render_findings(results, "docs/study", "docs/study.md")}),
        study_md: fill_blocks(study_md, {"summary": render_summary(results, "study", "study.md"),
                                         **table_blocks(results)}),
    }


def main(argv=None) -> list[str]:
    parser = CommandParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--study_dir", default="docs/study", help="the study's report folder (docs/study)")
    parser.add_argument("--repo_root", default=".", help="the folder holding README.md")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a target is out of date")
    args = parser.parse_args(argv)
    study_dir = Path(args.study_dir)
    if not args.check:
        plot_factorial_cells(load_results(study_dir)["causes"]["factorial"], study_dir / FINDINGS_FIGURE)
    stale = []
    for path, text in summary_targets(Path(args.study_dir), Path(args.repo_root)).items():
        if not path.is_file() or path.read_text() != text:
            stale.append(str(path))
            if not args.check:
                write_text_atomically(path, text)
    if args.check and stale:
        raise TwoTowerUserError(f"Out of date: {', '.join(stale)}; run `python -m twotower.evaluation.study.summary`.")
    print("Up to date." if not stale else f"Wrote {', '.join(stale)}.")
    return stale


if __name__ == "__main__":
    run(main)
