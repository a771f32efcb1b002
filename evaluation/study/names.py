"""The names a study recipe gives its families and texts: they name folders (runs/FAMILY-tN-sS, scores/TEXT) and
appear in the results document's text, headings and tables, so they are plain names, checked when the recipe is read."""

import re

from twotower.training.utils.errors import TwoTowerUserError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_recipe_names(sections: dict) -> None:
    """Raise TwoTowerUserError for a name of `sections` ({section: {name: ...}}) that is not a plain name."""
    for section, entries in sections.items():
        for name in entries:
            if not NAME.fullmatch(str(name)):
                raise TwoTowerUserError(
                    f"The study recipe's {section} has the name {str(name)!r}; a name is a folder name and a word of "
                    "the results document: letters, digits, '.', '_' and '-', starting with a letter or digit "
                    "(e.g. causal_control)."
                )
