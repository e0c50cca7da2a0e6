#!/usr/bin/env bash
# End to end on MovieLens latest-small (../shared/data): ingest -> fit -> evaluate, on a
# LocalCluster of 2 worker processes started and stopped by each command itself (--workers 2;
# without it a store this small is fitted in-process, to bitwise the same model).
# The paper's protocol: ratings x2 -> classes 1..10, items then users with >= 20 ratings, 80/20
# random split (seed 0), K = 50, alpha = 0.3, tol = 1e-5.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="${DATA:-$here/../../shared/data}/ml-latest-small/ratings.csv"
out="${OUT:-$here/../out/movielens_small}"
mkdir -p "$out"
ordnmf-dask ingest "$data" --out "$out/store.zarr" --ratings halfstar --min-count 20 \
    --seed 0 --overwrite
ordnmf-dask fit "$out/store.zarr" --out "$out/model.zarr" -k 50 --tol 1e-5 --seed 0 \
    --overwrite --log-file "$out/fit.log" -q --workers 2
ordnmf-dask evaluate "$out/store.zarr" "$out/model.zarr" --json "$out/results.json" \
    --workers 2
