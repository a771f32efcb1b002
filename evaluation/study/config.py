"""
A study recipe (evaluation/study/recipes/*.yaml, or any YAML or JSON path) as a StudyConfig: the texts, the model
families and their controls, the grid of runs, the trajectory and the options laid over every pretraining, probe run and
scoring; every option checked when the recipe loads, before hours of training.
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from twotower.training.arguments import read_recipe, resolve_recipe_path
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.utils.recipe_files import read_recipe_file

from ..scoring.score import ScoringArguments
from .names import check_recipe_names

STUDY_RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
MIN_PROBE_REPLICAS = 2  # the replica-level test and the same-tower floor compare replicas of one tower
SCORING_SET_BY_STUDY = ("model_dir", "output_dir", "validation_file", "max_blocks", "spread_blocks", "center")


@dataclass
class ModelFamily:
    pretrain_recipe: str  # a training recipe name (training/recipes) or YAML path
    probe_recipe: str
    overrides: dict = field(default_factory=dict)  # training options over this family's pretrain recipe
    # training options over this family's probe recipe (after the study's `probe`), e.g. the block_size of a family
    # pretrained on shorter blocks than its probe recipe's
    probe_overrides: dict = field(default_factory=dict)
    control_of: str | None = None  # the family this one is the independent-towers control of


@dataclass
class EvalText:
    file: str  # a .txt file, folder or glob, relative to --data_dir
    # score about this many tokens: max_tokens // block_size blocks (the probe model's blocks) evenly spaced over the
    # text, the same text for families of different block sizes; None = all
    max_tokens: int | None = None


@dataclass
class StudyConfig:
    train_file: str  # relative to --data_dir
    validation_file: str  # pretraining and probes stop on this text's loss
    eval_texts: dict[str, EvalText]  # name -> text scored after training
    families: dict[str, ModelFamily]
    grid: list[dict]  # [{family, num_towers: [..], seeds: [..]}]
    pretrain: dict = field(default_factory=dict)  # training options over every family's pretrain recipe
    # where probes train and the first text is scored, as fractions of each pretraining run (1.0, the end, scores
    # every text): reliability against validation loss, and the comparison at matched probe perplexity
    trajectory: list = field(default_factory=lambda: [1.0])
    convergence_factor: int | None = None  # per cooperative family: one run this many times as long (seed of its
    # first grid cell), whose validation loss the run's length must come within 2% of
    probe: dict = field(default_factory=dict)  # training options over every probe recipe; must set probe_replicas
    scoring: dict = field(default_factory=dict)  # ScoringArguments fields (batch_size, min_count, alpha, ...)
    long_run: bool = False  # the document follows each family along its trajectory, point by point (long.yaml)
    score_every_text: bool = False  # every trajectory point scores every text (default: the first; the end all)
    # run order: seed by seed over the whole grid (every cell's seed 0, then seed 1, ...), so that a study stopped
    # early holds whole seeds of a factorial design; default family by family
    seed_major: bool = False

    def __post_init__(self):
        check_recipe_names({"families": self.families, "eval_texts": self.eval_texts})
        for name, text in self.eval_texts.items():
            if "max_blocks" in text:
                raise TwoTowerUserError(
                    f"The study recipe's eval_texts.{name} sets max_blocks={text['max_blocks']}; set max_tokens "
                    f"instead (e.g. max_tokens: {text['max_blocks'] * 128} for {text['max_blocks']} blocks of 128 "
                    "tokens): families may use different block sizes, and each scores the same amount of text."
                )
        self.eval_texts = {name: EvalText(**text) for name, text in self.eval_texts.items()}
        self.families = {name: ModelFamily(**family) for name, family in self.families.items()}
        if not self.eval_texts:
            raise TwoTowerUserError("The study recipe lists no `eval_texts`; name at least one text to score.")
        for cell in self.grid:
            if cell.get("family") not in self.families:
                raise TwoTowerUserError(
                    f"Grid cell {cell} names family {cell.get('family')!r}; define it under `families` "
                    f"(known: {sorted(self.families)})."
                )
            unknown = set(cell) - {"family", "num_towers", "seeds"}
            if unknown:
                raise TwoTowerUserError(f"Grid cell {cell} has unknown keys {sorted(unknown)}; use family, num_towers, seeds.")
        for name, family in self.families.items():
            if family.control_of is not None and family.control_of not in self.families:
                raise TwoTowerUserError(f"Family {name!r} is the control of {family.control_of!r}, which is not defined.")
        replicas = self.probe.get("probe_replicas")
        if not isinstance(replicas, int) or replicas < MIN_PROBE_REPLICAS:
            raise TwoTowerUserError(
                f"The study recipe's `probe` options set probe_replicas={replicas!r}; set it to an integer >= "
                f"{MIN_PROBE_REPLICAS} (e.g. `probe: {{probe_replicas: 4}}`): the replica-level test and the "
                "same-tower noise floor compare probes of one tower."
            )
        if not self.trajectory or self.trajectory[-1] != 1.0 or any(
            not 0 <= a < b for a, b in zip([0.0, *self.trajectory], self.trajectory)
        ):
            raise TwoTowerUserError(
                f"The study recipe's `trajectory` is {self.trajectory!r}; list increasing fractions of each "
                "pretraining run in (0, 1], ending with 1.0 (the end of training), e.g. [0.25, 0.5, 1.0]."
            )
        self._check_scoring_options()

    def _check_scoring_options(self):
        """Scoring runs after hours of training: a bad option must fail now, not then."""
        known = {option.name for option in dataclasses.fields(ScoringArguments)}
        unknown = sorted(set(self.scoring) - known)
        if unknown:
            raise TwoTowerUserError(f"The study recipe's `scoring` sets unknown options {unknown}; see ScoringArguments.")
        fixed = sorted(set(self.scoring) & set(SCORING_SET_BY_STUDY))
        if fixed:
            raise TwoTowerUserError(
                f"The study recipe's `scoring` sets {fixed}, which the study sets itself (the probe model, the score "
                "folder, each text and its blocks spread over the text, centered preferences); drop them."
            )

    def runs(self) -> list["StudyRun"]:
        """The grid's runs, family by family: each cooperative family (grid order) with its controls, seed-major
        (family s0, control s0, family s1, ...), so that a study stopped early holds whole families; with
        `seed_major`, seed by seed over the whole grid."""
        runs = [
            StudyRun(cell["family"], num_towers, seed)
            for cell in self.grid
            for num_towers in cell.get("num_towers", [2])
            for seed in cell.get("seeds", [0])
        ]
        if self.seed_major:
            return sorted(runs, key=lambda run: run.seed)  # stable: grid order within a seed
        return sorted(runs, key=lambda run: (self._lead_order(run.family), run.seed))

    def lead_family(self, family: str) -> str:
        """The cooperative family a family belongs to: itself, or the family it is the control of."""
        return self.families[family].control_of or family

    def _lead_order(self, family: str) -> int:
        leads = list(dict.fromkeys(self.lead_family(cell["family"]) for cell in self.grid))
        return leads.index(self.lead_family(family))


@dataclass(frozen=True)
class StudyRun:
    family: str
    num_towers: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.family}-t{self.num_towers}-s{self.seed}"


def load_study_config(recipe: str) -> StudyConfig:
    """A study recipe name (evaluation/study/recipes) or a YAML or JSON path -> StudyConfig."""
    path = resolve_recipe_path(recipe, STUDY_RECIPES_DIR)
    if "probe_seed_offset" in (read_recipe_file(path) or {}):
        raise TwoTowerUserError(
            f"{path} sets `probe_seed_offset`, which the study no longer has: instead of a second probe set trained "
            "with another seed, each run trains one probe run with several probe replicas per tower, and the noise "
            "floor compares replicas of one tower. Delete `probe_seed_offset` and set `probe: {probe_replicas: 4}`."
        )
    return StudyConfig(**read_recipe(str(path), StudyConfig, STUDY_RECIPES_DIR))
