"""lm-evaluation-harness hooks for the local WikiText-2 task (copied next to the generated task YAML)."""

import re


def process_results(doc, results):
    """Word and byte counts of the original document, as the harness's own wikitext task counts them."""
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["page"]))
    num_bytes = len(doc["page"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, num_bytes),
        "bits_per_byte": (loglikelihood, num_bytes),
    }
