"""Print pip constraints pinning every runtime dependency to the series of its declared floor.

``numpy>=2.0`` becomes ``numpy==2.0.*``: installing with these constraints tests the oldest
versions pyproject.toml claims to support.
"""

import re
import sys
import tomllib

with open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml", "rb") as fh:
    project = tomllib.load(fh)["project"]
for spec in project["dependencies"]:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec.replace(" ", ""))
    if match is None:
        sys.exit(f"floors.py: cannot read a floor from {spec!r}")
    print(f"{match[1]}=={match[2]}.*")
