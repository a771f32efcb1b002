"""
User data (file names, paths, token text, names, free text) written into Markdown that MkDocs, the Hub or Python-
Markdown render as HTML: shown as written, never read as HTML or Markdown syntax.

- `markdown_text`: running text. Every character that could start HTML, an entity, a link, an image, emphasis, code
  or a table cell becomes a numeric character reference, which Markdown shows as that character and never parses.
- `code_span`: a code span (inside one Markdown shows HTML literally) fenced with more backticks than the text holds,
  so no backtick of the text can end it; in a table cell its pipes are escaped.
- `markdown_url`: a link or image target, percent-encoded, so that no character of it ends the target.
"""

import re
from urllib.parse import quote

# what starts HTML or an entity (< > &), a link or image ([ ]), emphasis (* _), code (`), an escape (\), a table
# cell (|) or a heading's closing (#); the text stays on its line (a newline becomes a space), so nothing else can
# start a block
MARKDOWN_SPECIALS = frozenset("<>&[]*_`\\|#")


def markdown_text(value) -> str:
    """`value` as running Markdown text that renders as written."""
    text = " ".join(str(value).splitlines())
    return "".join(f"&#{ord(char)};" if char in MARKDOWN_SPECIALS else char for char in text)


def code_span(value, table_cell: bool = False) -> str:
    """`value` as a Markdown code span that shows it as written (its newlines as spaces)."""
    text = " ".join(str(value).splitlines())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or text.startswith(" ") else ""
    if table_cell:
        text = text.replace("|", "\\|")
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_url(value) -> str:
    """A relative path as a link or image target: percent-encoded but for its slashes (no scheme survives)."""
    return quote(str(value), safe="/")
