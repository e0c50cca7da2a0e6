"""Sources -> store: read interactions (text, Parquet, arrays, synthetic), clean, split, block."""
