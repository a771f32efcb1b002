"""
Write tests/fixtures/recipes_resolved.json: every training recipe resolved (`load_config(name)`, defaults < recipe
and its `extends`), the values tests/training/test_recipes.py pins. Run it after adding an option or changing a recipe on
purpose, and review the diff: each changed value is a changed run.

    python scripts/resolve_recipes.py            # rewrite the fixture
    python scripts/resolve_recipes.py --check    # exit 1 if the fixture differs
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from twotower.training.arguments import RECIPES_DIR, load_config

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "recipes_resolved.json"


def resolved_recipes_text() -> str:
    """The fixture's text: {recipe name: its resolved options}, sorted, one value a line."""
    resolved = {path.stem: dataclasses.asdict(load_config(path.stem)) for path in sorted(RECIPES_DIR.glob("*.yaml"))}
    return json.dumps(resolved, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the fixture differs")
    args = parser.parse_args(argv)
    text = resolved_recipes_text()
    if args.check:
        return 0 if FIXTURE.read_text(encoding="utf-8") == text else 1
    FIXTURE.write_text(text, encoding="utf-8")
    print(f"Wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
