"""Hyper-parameter search (``ordnmf_dask.tune``): the pure schedule and space
(:mod:`.schedule`) and the search that fits the trials on a cluster (:mod:`.search`)."""
