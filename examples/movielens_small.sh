#!/usr/bin/env bash
# End to end on MovieLens latest-small: ingest -> fit -> evaluate, with the paper's protocol:
# ratings x2 -> classes 1..10, items then users with >= 20 ratings, 80/20 random split (seed 0),
# K = 50, alpha = 0.3, tol = 1e-5. Reads the copy shipped in examples/data (DATA=DIR reads
# DIR/ml-latest-small/ratings.csv instead); writes to out/movielens_small (or OUT).
# A store this small is fitted in this process; add `--workers 2` to the fit and evaluate
# commands to run them on a LocalCluster of 2 worker processes instead (the same model, bitwise,
# after some seconds of cluster start-up).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="${DATA:-$here/data}/ml-latest-small/ratings.csv"
out="${OUT:-$here/../out/movielens_small}"
mkdir -p "$out"
ordnmf-dask ingest "$data" --out "$out/store.zarr" --ratings halfstar --min-count 20 \
    --seed 0 --overwrite
ordnmf-dask fit "$out/store.zarr" --out "$out/model.zarr" -k 50 --tol 1e-5 --seed 0 \
    --overwrite --log-file "$out/fit.log" -q
ordnmf-dask evaluate "$out/store.zarr" "$out/model.zarr" --json "$out/results.json"
