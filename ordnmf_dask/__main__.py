"""``python -m ordnmf_dask ARGS`` runs the ``ordnmf-dask`` command."""

import sys

from ordnmf_dask.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
