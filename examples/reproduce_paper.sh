#!/usr/bin/env bash
# The paper's comparison (OrdNMF vs BePoF, PF and dcPF) on the three shared datasets: filter >= 20,
# one 80/20 split, alpha = 0.3, tol = 1e-5, K in {25, 50}, 5 seeds; writes out/reproduce/report.md
# (the table in README.md), runs.csv and figures per dataset. About 45 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ordnmf-dask reproduce --out "${OUT:-$here/../out/reproduce}" \
    --data "${DATA:-$here/../../shared/data}" --k-grid 25,50 --seeds 0,1,2,3,4 --jobs 4 "$@"
