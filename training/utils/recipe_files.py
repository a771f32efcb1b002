"""
A recipe file read the same way whatever its format, YAML (`.yaml`, `.yml`) or JSON (`.json`): its value, with every
key of every mapping written once. PyYAML and Python's json module both keep the last of a repeated key without a word,
so a recipe that sets an option twice would run with whichever came last; here it is refused, naming the key.
"""

import json
from pathlib import Path

import yaml

from .errors import TwoTowerUserError

RECIPE_SUFFIXES = (".yaml", ".yml", ".json")
YAML_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *defaults`, whose keys a mapping may override on purpose


class RepeatedKeyError(TwoTowerUserError):
    """A recipe that writes a key twice in one mapping."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key written twice in one mapping (at any depth)."""

    path = None  # the file read, for the message

    def construct_mapping(self, node, deep=False):
        lines = {}
        for key_node, _ in node.value:
            if key_node.tag == YAML_MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                continue
            if first is not None:
                where = f"line {line}" if first == line else f"lines {first} and {line}"
                raise RepeatedKeyError(
                    f"Recipe {self.path} sets `{key}` twice ({where}) in one mapping; keep the one you mean and "
                    "delete the other (a YAML reader would silently keep the last)."
                )
            lines[key] = line
        return super().construct_mapping(node, deep)


def _refuse_repeated_keys(path: Path):
    def mapping(pairs):
        keys = [key for key, _ in pairs]
        repeated = next((key for index, key in enumerate(keys) if key in keys[:index]), None)
        if repeated is not None:
            raise RepeatedKeyError(
                f"Recipe {path} sets `{repeated}` twice in one object; keep the one you mean and delete the other (a "
                "JSON reader would silently keep the last)."
            )
        return dict(pairs)

    return mapping


def read_recipe_file(path: Path):
    """The value a recipe file holds, YAML or JSON by its suffix; unreadable text or a repeated key names the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise TwoTowerUserError(f"Recipe {path} is not UTF-8 text ({error}); save it as UTF-8.") from error
    if path.suffix == ".json":
        try:
            return json.loads(text, object_pairs_hook=_refuse_repeated_keys(path))
        except json.JSONDecodeError as error:
            raise TwoTowerUserError(f"Recipe {path} is not valid JSON ({error}); fix it.") from error
    loader = _UniqueKeyLoader(text)
    loader.path = path
    try:
        return loader.get_single_data()
    except yaml.YAMLError as error:
        raise TwoTowerUserError(f"Recipe {path} is not valid YAML ({' '.join(str(error).split())}); fix it.") from error
    finally:
        loader.dispose()
