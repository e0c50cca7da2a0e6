"""Example datasets as local files: a user cache, the checkout's shipped copy, or a download.

``fetch_movielens_small()`` returns the path of MovieLens latest-small's ``ratings.csv`` for
the examples, in the manner of scikit-learn's ``fetch_*``: the cache directory
(``$ORDNMF_DASK_DATA``, else ``~/.cache/ordnmf_dask``) first, then the copy a source checkout
ships in ``examples/data/`` (not in the wheel), else the publisher's zip, checked against its
sha256 before anything of it is kept, and unpacked into the cache by one rename, with the
sha256 of each file kept (``SHA256SUMS``). A copy found is checked before it is returned: against
its ``SHA256SUMS``, or (a copy unzipped by hand, the shipped one) against the published
``ratings.csv``; a damaged copy is an error naming it, never data.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from ordnmf_dask.errors import InputError

ENV_VAR = "ORDNMF_DASK_DATA"
MOVIELENS_SMALL = "ml-latest-small"
MOVIELENS_SMALL_URL = "https://files.grouplens.org/datasets/movielens/ml-latest-small.zip"
MOVIELENS_SMALL_SHA256 = "696d65a3dfceac7c45750ad32df2c259311949efec81f0f144fdfb91ebc9e436"
# the files kept from the zip: the ratings and the licence that must travel with them
MOVIELENS_SMALL_FILES = ("ratings.csv", "README.txt")
# the published ratings.csv of that zip (the copy examples/data ships)
MOVIELENS_SMALL_RATINGS_SHA256 = "aa289ca83157595d0df6aea1be6a4ded676ddc4385472e8313a8ed9805352646"
SUMS = "SHA256SUMS"  # beside the files a download kept: "<sha256>  <name>" per line
SHIPPED = Path(__file__).resolve().parents[2] / "examples" / "data"


def cache_dir(data_home: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory: ``data_home``, else ``$ORDNMF_DASK_DATA``, else
    ``~/.cache/ordnmf_dask``.

    Examples
    --------
    >>> from ordnmf_dask.datasets import cache_dir
    >>> cache_dir("data").name  # data_home given: that directory
    'data'
    """
    chosen = data_home or os.environ.get(ENV_VAR) or Path.home() / ".cache" / "ordnmf_dask"
    return Path(chosen).expanduser()


def fetch_movielens_small(
    data_home: str | os.PathLike[str] | None = None,
    *,
    url: str = MOVIELENS_SMALL_URL,
    sha256: str = MOVIELENS_SMALL_SHA256,
) -> Path:
    """The path of MovieLens latest-small's ``ratings.csv`` (GroupLens; licence in the
    ``README.txt`` beside it), downloaded from ``url`` into the cache only when neither the
    cache nor the checkout holds it. Raises :class:`InputError` (one line: where to get the
    zip and where to put it) when the download fails or its sha256 is not ``sha256``.

    Examples
    --------
    >>> from ordnmf_dask.datasets import fetch_movielens_small
    >>> path = fetch_movielens_small()  # the cache, the checkout's copy, or a checked download
    >>> path.name
    'ratings.csv'
    """
    home = cache_dir(data_home)
    for root in (home, SHIPPED):
        found = root / MOVIELENS_SMALL / "ratings.csv"
        if found.is_file():
            _check_copy(found.parent, {"ratings.csv": MOVIELENS_SMALL_RATINGS_SHA256})
            return found
    target = home / MOVIELENS_SMALL
    if target.exists():  # not ours to replace: something else made it
        raise InputError(
            f"{target}: exists without ratings.csv; remove it or set {ENV_VAR} to another directory"
        )
    _download_zip(url, sha256, home, MOVIELENS_SMALL, MOVIELENS_SMALL_FILES)
    return target / "ratings.csv"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_copy(directory: Path, published: dict[str, str]) -> None:
    """InputError unless the files of the cached copy ``directory`` are whole: those its
    ``SHA256SUMS`` lists match it, or without one (unzipped by hand) those of ``published``
    (name -> sha256) match the published files."""
    try:
        lines = (directory / SUMS).read_text().splitlines()
        pairs = [line.split(maxsplit=1) for line in lines if line.strip()]
        expected = {name: digest for digest, name in pairs}
    except FileNotFoundError:
        expected = published
    except (OSError, ValueError) as e:
        raise InputError(f"{directory / SUMS}: unreadable ({e}); remove {directory}") from None
    for name, want in expected.items():
        try:
            got = _sha256(directory / name)
        except OSError as e:
            raise InputError(
                f"{directory / name}: cannot be read ({e.strerror}); remove {directory} to "
                "download it again"
            ) from None
        if got != want:
            raise InputError(
                f"{directory / name}: damaged (sha256 {got}, expected {want}); remove "
                f"{directory} to download it again"
            )


def _download_zip(url: str, sha256: str, home: Path, name: str, files: tuple[str, ...]) -> None:
    """Download the zip at ``url``, check its sha256, and move ``name/<files>`` from it to
    ``home/name`` by one rename; nothing is left in ``home`` on any failure."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        unpacked = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=home))
    except OSError as e:
        raise InputError(
            f"{home}: cannot write the data cache there ({e.strerror}); set {ENV_VAR} "
            "to a writable directory"
        ) from None
    try:
        archive = unpacked / "download.zip"
        digest = _fetch(url, archive, home, name)
        if digest != sha256:
            raise InputError(
                f"{url}: sha256 {digest} is not the expected {sha256}; the download was discarded"
            )
        with zipfile.ZipFile(archive) as zf:
            for member in files:
                with zf.open(f"{name}/{member}") as src, open(unpacked / member, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        (unpacked / SUMS).write_text(
            "".join(f"{_sha256(unpacked / member)}  {member}\n" for member in files)
        )
        archive.unlink()
        unpacked.rename(home / name)
    except KeyError as e:  # a member missing from the zip
        raise InputError(f"{url}: the zip holds no {e.args[0]}") from None
    except zipfile.BadZipFile:
        raise InputError(f"{url}: not a zip file") from None
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)


def _fetch(url: str, dest: Path, home: Path, name: str) -> str:
    """Stream ``url`` into ``dest``; its sha256. A failure says where to put the data."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e.strerror or e
        raise InputError(
            f"{name} is not cached and the download failed ({reason}): download "
            f"{url} and unzip it into {home} (or set {ENV_VAR} to the directory "
            f"it is unzipped into)"
        ) from None
    return digest.hexdigest()
