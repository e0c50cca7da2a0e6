"""The command line (``ordnmf-dask``), job files, the paper's reproduction and its figures."""
