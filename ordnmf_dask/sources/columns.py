"""Which columns of a table or file hold the user, item and value, told by their names.

A table (a DataFrame, a pyarrow Table) is read by column name, never by position
(``named_columns``). A file with named columns (a text header line, a Parquet schema) whose
names tell all three roles is read by those names too; one whose names do not is read by the
positions 0, 1, 2, unless a name says that a column read by position holds another role
(``file_columns``): a file of ``movieId, userId, rating`` is never fitted transposed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ordnmf_dask.errors import InputError

# The names read as the user, item and value columns when ``columns`` is not given, compared
# with case, "_", "-", "." and spaces ignored (userId = user_id = UserID) (docs/guide/data.md,
# "Data in memory").
COLUMN_NAMES: dict[str, tuple[str, ...]] = {
    "user": ("user", "userid", "users", "uid"),
    "item": (
        "item", "itemid", "items", "iid", "movieid", "movie", "artistid", "artist",
        "trackid", "track", "songid", "song", "bookid", "book", "productid",
    ),
    "value": (
        "value", "values", "rating", "ratings", "stars", "count", "counts", "playcount",
        "plays", "weight",
    ),
}  # fmt: skip


def _normalized(name: str) -> str:
    return re.sub(r"[\s_.\-]", "", name).lower()


def _matches(names: Sequence[str]) -> dict[str, list[str]]:
    """For each role, the names among ``names`` that ``COLUMN_NAMES`` gives it."""
    return {
        role: [n for n in names if _normalized(n) in aliases]
        for role, aliases in COLUMN_NAMES.items()
    }


def named_columns(names: Sequence[str], label: str) -> list[str]:
    """The user, item and value columns of a table told by their names (``COLUMN_NAMES``);
    an InputError naming the table's columns when a role matches none or several."""
    picked, problems = [], []
    for role, found in _matches(names).items():
        if len(found) == 1:
            picked.append(found[0])
        elif found:
            problems.append(f"{len(found)} could be the {role} ({', '.join(found)})")
        else:
            problems.append(f"none is named as a {role} column")
    if problems:
        raise InputError(
            f"{label}: cannot tell the user, item and value columns by name: of its columns "
            f"({', '.join(names)}), {'; '.join(problems)}. Name them with columns=(USER, "
            "ITEM, VALUE); a table is never read by column position"
        )
    return picked


def file_columns(names: Sequence[str], label: str) -> tuple[str, str, str] | tuple[int, int, int]:
    """The columns of a file whose columns are named ``names`` (a header line, a Parquet
    schema) when none were chosen: the three told by name when each role matches exactly one
    name, else the positions 0, 1, 2; an InputError when the names contradict a position (a
    column read as one role is named as another, or a role is named at another column;
    ``label`` names the file)."""
    found = _matches(names)
    if all(len(v) == 1 for v in found.values()) and len({v[0] for v in found.values()}) == 3:
        user, item, value = (v[0] for v in found.values())
        return user, item, value
    for at, role in enumerate(COLUMN_NAMES):
        if at >= len(names):
            break
        here = [r for r, v in found.items() if names[at] in v]
        if here and role not in here:
            problem = f"is named as the {here[0]}"
        elif found[role] and names[at] not in found[role]:
            problem = f"is not; {found[role][0]!r} is named as the {role}"
        else:
            continue
        raise InputError(
            f"{label}: column {at} ({names[at]!r}) would be read by position as the {role} "
            f"but {problem} (columns: {', '.join(names)}); name the user, item and value "
            "columns with --columns / columns=(USER, ITEM, VALUE)"
        )
    return 0, 1, 2
