"""The file names of a scoring report folder: `score.py` writes them (the plots through `report.py`), the study and
the model card read them. No plotting here, so that a reader imports the names instead of retyping them."""

PREFERENCE_JSON = "preference.json"
PER_TOKEN_CSV = "preference_per_token.csv"
# per half of the scored documents and token type: counts and every probe's log-prob sums (cross_fitting.type_sums)
TYPE_SUMS_PARQUET = "type_sums.parquet"
REPORT_MD = "report.md"
TOKEN_VIEW_HTML = "tokens.html"
PLOTS = {
    "logprob_scatter": "logprob_scatter.png",
    "preference_histogram": "preference_histogram.png",
    "preference_vs_frequency": "preference_vs_frequency.png",
}
REPLICA_PLOTS = {"preference_vs_floor": "preference_vs_floor.png"}  # only with probe replicas
