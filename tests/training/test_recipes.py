"""Recipes: every name resolves to the values it always had, and `extends` composes recipes (overrides, cycles)."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from twotower.training.arguments import RECIPES_DIR, TwoTowerTrainingConfig, load_config, read_recipe
from twotower.training.utils.errors import TwoTowerUserError

# dataclasses.asdict(load_config(name)) of every recipe, pinned when the recipes were written out in full; written
# by scripts/resolve_recipes.py
REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "recipes_resolved.json"
PINNED = json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_every_recipe_is_pinned():
    assert sorted(path.stem for path in RECIPES_DIR.glob("*.yaml")) == sorted(PINNED)


@pytest.mark.parametrize("recipe", sorted(PINNED))
def test_recipe_resolves_to_its_pinned_values(recipe):
    resolved = json.loads(json.dumps(dataclasses.asdict(load_config(recipe))))  # through JSON, as the pin was stored
    assert resolved == PINNED[recipe]


@pytest.mark.parametrize("recipe", sorted(PINNED))
def test_recipe_sets_only_what_differs_from_its_parent(recipe):
    own = yaml.safe_load((RECIPES_DIR / f"{recipe}.yaml").read_text(encoding="utf-8"))
    if "extends" not in own:
        return
    inherited = read_recipe(own.pop("extends"))
    assert own, f"{recipe} sets nothing of its own"
    assert not [name for name, value in own.items() if inherited.get(name) == value]


def write_recipes(folder: Path, **recipes: str) -> Path:
    for name, text in recipes.items():
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
    return folder


def test_a_child_overrides_its_parent_and_inherits_the_rest(tmp_path):
    recipes = write_recipes(
        tmp_path,
        parent="block_size: 64\nlearning_rate: 1.0e-3\nseed: 7\n",
        child="extends: parent\nlearning_rate: 3.0e-3\n",
        grandchild="extends: child\nseed: 11\nmax_train_steps: 5\n",
    )
    assert read_recipe("grandchild", TwoTowerTrainingConfig, recipes) == {
        "block_size": 64, "learning_rate": 3.0e-3, "seed": 11, "max_train_steps": 5,
    }  # fmt: skip


def test_a_parent_given_as_a_path_is_read_beside_the_recipe(tmp_path):
    (tmp_path / "shared").mkdir()
    write_recipes(tmp_path / "shared", common="block_size: 32\n")
    recipes = write_recipes(tmp_path, mine="extends: shared/common.yaml\nseed: 3\n")
    assert read_recipe(str(recipes / "mine.yaml"), TwoTowerTrainingConfig, recipes) == {"block_size": 32, "seed": 3}


def test_a_cycle_is_refused_and_named(tmp_path):
    recipes = write_recipes(tmp_path, a="extends: b\nseed: 1\n", b="extends: c\n", c="extends: a\n")
    with pytest.raises(TwoTowerUserError, match=r"cycle \(a -> b -> c -> a\); remove one of these `extends`"):
        read_recipe("a", TwoTowerTrainingConfig, recipes)


def test_extends_must_name_one_recipe(tmp_path):
    recipes = write_recipes(tmp_path, odd="extends: [tiny, tiny_probe]\n")
    with pytest.raises(TwoTowerUserError, match=r"sets `extends: \['tiny', 'tiny_probe'\]`; name one recipe"):
        read_recipe("odd", TwoTowerTrainingConfig, recipes)


def test_an_unknown_option_names_the_recipe_that_sets_it(tmp_path):
    recipes = write_recipes(tmp_path, parent="lerning_rate: 1.0e-3\n", child="extends: parent\nseed: 1\n")
    with pytest.raises(TwoTowerUserError, match=r"parent\.yaml sets unknown options \['lerning_rate'\] \(did you mean"):
        read_recipe("child", TwoTowerTrainingConfig, recipes)


def test_a_missing_parent_names_the_recipe_that_extends_it_and_lists_the_known_recipes(tmp_path):
    recipes = write_recipes(tmp_path, child="extends: nowhere\n")
    with pytest.raises(FileNotFoundError) as raised:
        read_recipe("child", TwoTowerTrainingConfig, recipes)
    assert str(raised.value) == (
        f"Recipe {recipes / 'child.yaml'} extends 'nowhere', which is not found (looked for "
        f"{recipes / 'nowhere.yaml'}); known recipes: ['child']."
    )


def test_the_command_line_overrides_an_inherited_value():
    config = load_config("tiny_control", ["--max_train_steps", "7"])
    assert (config.max_train_steps, config.cooperative, config.recipe) == (7, False, "tiny_control")


def test_the_pinned_values_are_what_the_regenerator_writes():
    # scripts/resolve_recipes.py rewrites the fixture after a new option: it must write exactly the pinned file
    spec = importlib.util.spec_from_file_location("resolve_recipes", REPO_ROOT / "scripts" / "resolve_recipes.py")
    resolve_recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(resolve_recipes)
    assert resolve_recipes.FIXTURE == FIXTURE
    assert resolve_recipes.resolved_recipes_text() == FIXTURE.read_text(encoding="utf-8")
