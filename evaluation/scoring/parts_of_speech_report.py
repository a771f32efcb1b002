"""
The part-of-speech section of a scoring report (preference.json's `parts_of_speech`, report.md's "Part of speech"):
the scored text tagged once (parts_of_speech_tagging), then, over the eligible types that get a tag, the mean
preference of each part of speech with its bootstrap interval and the function-word against content-word contrast
with its permutation z and p (tower_preference/parts_of_speech.py).

Without spaCy and its English model the section is {"available": false, "install": ...}, and report.md says how to
get it; everything else in the report is unchanged.
"""

from twotower.training.data.blocks import load_raw_datasets

from .parts_of_speech_tagging import INSTALL_HINT, load_tagger, tag_lines, tagger_available
from ..tower_preference.parts_of_speech import CONTENT_TAGS, FUNCTION_TAGS, parts_of_speech_summary


def scored_text_lines(args) -> list[str]:
    """
    The lines of the text whose blocks are scored (ScoringArguments `args`), read as the scoring command reads
    them: the validation text, or, for blocks held out of a training text (or for the train split), that whole
    training text; its types' tags then come from all of it.
    """
    if args.split == "validation" and args.validation_file is not None:
        raw = load_raw_datasets(args.dataset_name, args.dataset_config_name, train_file=args.validation_file)
        return raw["train"][args.text_column_name]
    raw = load_raw_datasets(args.dataset_name, args.dataset_config_name, args.train_file, args.validation_file)
    split = args.split if args.split in raw else "train"
    return raw[split][args.text_column_name]


def parts_of_speech_section(lines, tokenizer, result) -> dict:
    """
    preference.json's `parts_of_speech` for `result` (a PreferenceResult) of `lines` scored with `tokenizer`:
    {"available": True, "tagger", "threshold", "num_types" (eligible), "num_tagged_types", "num_below_threshold",
    "num_without_tag", "english_word_share", "looks_english", "function_tags", "content_tags", "towers": [{"tower",
    "per_tag", "function_content"}], "types": {"token_id", "tag", "tag_share"}}, `types` holding every scored type
    the tagger saw inside a word, with its majority tag and that tag's share of its occurrences (a type is tagged
    at `threshold`); or {"available": False, "install"} without the tagger. `lines` may be a callable returning them,
    so that the text is read only where it is tagged.
    """
    if not tagger_available():
        return {"available": False, "install": INSTALL_HINT}
    lines = lines() if callable(lines) else lines
    tags = tag_lines(lines, tokenizer, load_tagger())
    eligible = result.eligible.astype(bool)
    token_ids = result.token_ids[eligible]
    summary = parts_of_speech_summary(token_ids, result.preference_nats[:, eligible], tags.type_tags())
    table = tags.table()
    scored = table[table["token_id"].isin(result.token_ids)]
    return {
        "available": True,
        **tags.summary(token_ids),
        "function_tags": list(FUNCTION_TAGS),
        "content_tags": list(CONTENT_TAGS),
        "towers": summary["towers"],
        "types": {
            "token_id": scored["token_id"].tolist(),
            "tag": scored["tag"].tolist(),
            "tag_share": scored["agreement"].round(4).tolist(),
        },
    }
