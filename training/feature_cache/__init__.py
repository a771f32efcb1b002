"""The probe phase's feature store: the frozen towers' features kept in memory or on disk, or recomputed
(probe_cache), and the checks of its budget and of a disk cache's shards (feature_cache_checks)."""
