"""The exact CAVI fit on a Dask cluster: the iteration loop, its worker tasks and checkpoints."""
