"""Generic Dask helpers: which client to run on, fixed-order reductions, task runners, progress."""
