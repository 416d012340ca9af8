"""smore profiling harness: architectural features, solo and co-location measurements (SMORE)."""
