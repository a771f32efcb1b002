"""Write each tower preference summary key's description (summary.py) into the metric card and docs/preference.md.

    python scripts/summary_keys_docs.py          # rewrite the generated blocks
    python scripts/summary_keys_docs.py --check  # exit 1 if a file differs from what it would write

Each file holds the block between BEGIN and END below; tests/metric/test_summary_keys.py checks that it is current.
"""

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "evaluation" / "tower_preference"))  # summary.py alone: no package import needed

from summary import summary_key_lines  # noqa: E402

BEGIN = "<!-- summary keys: generated from evaluation/tower_preference/summary.py by scripts/summary_keys_docs.py -->"
END = "<!-- end of summary keys -->"
# file -> the lines of its block: the card lists the keys, the guide tabulates them
BLOCKS = {
    "evaluation/tower_preference/README.md": summary_key_lines(style="markdown"),
    "docs/preference.md": ["| key | meaning |", "|---|---|", *summary_key_lines(style="table")],
}


def with_block(text: str, lines: list[str], name: str) -> str:
    """`text` with its one generated block replaced by `lines`."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"{name} must hold one block from {BEGIN!r} to {END!r}.")
    return pattern.sub(lambda match: "\n".join([BEGIN, *lines, END]), text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which files are out of date")
    args = parser.parse_args(argv)
    stale = []
    for name, lines in BLOCKS.items():
        path = REPO / name
        text = path.read_text(encoding="utf-8")
        generated = with_block(text, lines, name)
        if generated != text:
            stale.append(name)
            if not args.check:
                path.write_text(generated, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/summary_keys_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
