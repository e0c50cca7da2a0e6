"""fetch_movielens_small: cache, then the shipped copy, then a checked download (served here by
a real HTTP server on loopback from a zip built by the test)."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ordnmf_dask import datasets
from ordnmf_dask.datasets import fetch_movielens_small
from ordnmf_dask.errors import InputError

RATINGS = b"userId,movieId,rating,timestamp\r\n1,1,4.0,964982703\r\n"
LICENCE = b"Usage License\r\n"


def movielens_zip(ratings: bytes = RATINGS) -> bytes:
    """A zip laid out as GroupLens's ml-latest-small.zip (one folder, more files than kept)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ml-latest-small/ratings.csv", ratings)
        zf.writestr("ml-latest-small/README.txt", LICENCE)
        zf.writestr("ml-latest-small/movies.csv", b"movieId,title,genres\r\n")
    return buf.getvalue()


@pytest.fixture
def served() -> Iterator[tuple[str, bytes]]:
    """A loopback HTTP server answering every GET with the test's zip; yields (url, body)."""
    body = movielens_zip()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/ml-latest-small.zip", body
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def no_shipped_copy(tmp_path, monkeypatch):
    """As in an installed package: no checkout beside the module."""
    monkeypatch.setattr(datasets, "SHIPPED", tmp_path / "no-checkout")


def test_shipped_copy_is_the_published_file():
    path = fetch_movielens_small(Path("/nonexistent-cache"))
    assert path == datasets.SHIPPED / "ml-latest-small" / "ratings.csv"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "aa289ca83157595d0df6aea1be6a4ded676ddc4385472e8313a8ed9805352646"
    )
    assert (path.parent / "README.txt").is_file()  # its licence travels with it


def test_download_is_checked_unpacked_and_then_cached(tmp_path, served, no_shipped_copy):
    url, body = served
    home = tmp_path / "cache"
    path = fetch_movielens_small(home, url=url, sha256=hashlib.sha256(body).hexdigest())
    assert path == home / "ml-latest-small" / "ratings.csv"
    assert path.read_bytes() == RATINGS
    assert sorted(p.name for p in home.iterdir()) == ["ml-latest-small"]  # no temporary left
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "README.txt",
        "SHA256SUMS",
        "ratings.csv",
    ]
    # the cache answers without the network
    assert fetch_movielens_small(home, url="http://127.0.0.1:9/nothing") == path


def test_cache_directory_from_the_environment(tmp_path, served, no_shipped_copy, monkeypatch):
    url, body = served
    monkeypatch.setenv(datasets.ENV_VAR, str(tmp_path / "env-cache"))
    path = fetch_movielens_small(url=url, sha256=hashlib.sha256(body).hexdigest())
    assert path == tmp_path / "env-cache" / "ml-latest-small" / "ratings.csv"


def test_checksum_mismatch_is_refused_and_nothing_is_kept(tmp_path, served, no_shipped_copy):
    url, body = served
    home = tmp_path / "cache"
    wrong = hashlib.sha256(body + b"x").hexdigest()
    with pytest.raises(InputError) as e:
        fetch_movielens_small(home, url=url, sha256=wrong)
    message = str(e.value)
    assert "\n" not in message
    assert url in message and hashlib.sha256(body).hexdigest() in message and wrong in message
    assert list(home.iterdir()) == []


def test_offline_without_a_cached_copy_says_what_to_do(tmp_path, no_shipped_copy):
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url, home = f"http://127.0.0.1:{port}/ml-latest-small.zip", tmp_path / "cache"
    with pytest.raises(InputError) as e:
        fetch_movielens_small(home, url=url)
    message = str(e.value)
    assert "\n" not in message
    assert url in message and str(home) in message and datasets.ENV_VAR in message
    assert list(home.iterdir()) == []


def test_a_foreign_directory_in_the_cache_is_not_replaced(tmp_path, served, no_shipped_copy):
    url, body = served
    home = tmp_path / "cache"
    (home / "ml-latest-small").mkdir(parents=True)
    (home / "ml-latest-small" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="exists without ratings.csv"):
        fetch_movielens_small(home, url=url, sha256=hashlib.sha256(body).hexdigest())
    assert [p.name for p in (home / "ml-latest-small").iterdir()] == ["notes.txt"]


def test_18_a_damaged_cached_copy_is_an_error_naming_it(tmp_path, served, no_shipped_copy):
    url, body = served
    home = tmp_path / "cache"
    path = fetch_movielens_small(home, url=url, sha256=hashlib.sha256(body).hexdigest())
    path.write_bytes(RATINGS[:-5])  # cut short
    with pytest.raises(InputError, match=r"ratings\.csv: damaged \(sha256 .*remove .* to download"):
        fetch_movielens_small(home, url=url, sha256=hashlib.sha256(body).hexdigest())


def test_18_a_copy_unzipped_by_hand_is_checked_against_the_published_file(
    tmp_path, no_shipped_copy
):
    home = tmp_path / "cache"
    (home / "ml-latest-small").mkdir(parents=True)
    (home / "ml-latest-small" / "ratings.csv").write_bytes(RATINGS)  # not the published one
    with pytest.raises(
        InputError, match="damaged .*expected " + datasets.MOVIELENS_SMALL_RATINGS_SHA256
    ):
        fetch_movielens_small(home)


def test_18_a_cache_that_cannot_be_written_is_one_line(
    tmp_path, served, no_shipped_copy, monkeypatch
):
    """A read-only cache directory (simulated: the tests may run as root, whom permissions do
    not stop) is an InputError saying what to do, not a raw OSError."""
    url, body = served
    home = tmp_path / "cache"
    home.mkdir()

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(datasets.tempfile, "mkdtemp", read_only)
    with pytest.raises(InputError, match=f"cannot write the data cache there .*{datasets.ENV_VAR}"):
        fetch_movielens_small(home, url=url, sha256=hashlib.sha256(body).hexdigest())


def test_a_skipped_data_test_points_to_a_section_that_says_how_to_set_data():
    from conftest import CHECKOUT, DATA_DOC

    path, section = DATA_DOC.split(", ")
    text = (CHECKOUT / path).read_text()
    heading = f"## {section.strip(chr(34))}\n"
    assert heading in text
    body = text.split(heading, 1)[1].split("\n## ", 1)[0]
    assert "set `DATA`" in body and "hetrec2011-lastfm-2k" in body
