#!/usr/bin/env bash
# The paper's comparison (OrdNMF vs BePoF, PF and dcPF) on three datasets: filter >= 20, one 80/20
# split, alpha = 0.3, tol = 1e-5, K in {25, 50}, 5 seeds; writes out/reproduce (or OUT)/report.md
# (the table in README.md), runs.csv and figures per dataset. About 45 minutes on 2 cores.
# Needs DATA=DIR holding ml-latest-small/, hetrec2011-lastfm-2k/ and tasteprofile-gouvert-subset/
# (only MovieLens is shipped; README, Data). Extra arguments go to `ordnmf-dask reproduce`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="${DATA:-$here/../../shared/data}"
for need in ml-latest-small/ratings.csv hetrec2011-lastfm-2k/user_artists.dat \
        tasteprofile-gouvert-subset/derived/tps_98765_U1502_I786_triplets.txt; do
    if [[ ! -f "$data/$need" ]]; then
        echo "reproduce_paper.sh: error: $data/$need not found: set DATA to a directory holding" \
            "ml-latest-small/, hetrec2011-lastfm-2k/ and tasteprofile-gouvert-subset/ (README, Data)" >&2
        exit 2
    fi
done
ordnmf-dask reproduce --out "${OUT:-$here/../out/reproduce}" --data "$data" --k-grid 25,50 \
    --seeds 0,1,2,3,4 --jobs 4 "$@"
