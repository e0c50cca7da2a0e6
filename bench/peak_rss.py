"""Wall time and peak RSS of every process of a command (e.g. a CLI that starts a LocalCluster).

Usage: ``python bench/peak_rss.py -- ordnmf-dask synth --out STORE ...``. Runs the command,
samples the RSS of it and of all its descendants with psutil every 0.2 s, and prints the wall
time, the exit code and each process's peak (the LocalCluster workers are the
``multiprocessing`` children).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RssSampler  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit(__doc__)
    start = time.perf_counter()
    proc = subprocess.Popen(argv)
    with RssSampler([proc.pid], interval=0.2) as sampler:
        code = proc.wait()
    wall = time.perf_counter() - start
    print(f"wall {wall:.1f} s ({wall / 60:.1f} min), exit code {code}")
    for pid, peak in sorted(sampler.peak.items(), key=lambda kv: -kv[1]):
        print(f"  peak RSS {peak:8.0f} MB  pid {pid}  {sampler.names.get(pid, '')}")
    sys.exit(code)


if __name__ == "__main__":
    main()
