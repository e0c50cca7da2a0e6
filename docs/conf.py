"""Sphinx configuration of the documentation site: the Markdown pages (myst-parser) as the user
guide and an API reference of the package's public names (autodoc, numpy-style docstrings).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (run by ``.ci/run``).
"""

import argparse
import contextlib
import os
from collections.abc import Iterator

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx

import ordnmf_dask

project = "ordnmf_dask"
author = "ordnmf_dask contributors"
release = ordnmf_dask.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.autosummary",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: `[text](page.md#a-heading)` links resolve to the generated heading anchors
myst_heading_anchors = 3

# the API reference: numpy-style docstrings, members in source order, signatures with types
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# Attributes as fields of the class, so a property that is also listed (n_active_components_)
# is described once
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "alabaster"
html_title = f"ordnmf_dask {release}"


class CommandHelp(Directive):
    """``.. command-help::``: the ``--help`` of ``ordnmf-dask`` and of each of its commands, one
    section per command, generated from the parser itself so the page cannot fall behind it."""

    def run(self) -> list[nodes.Node]:
        from ordnmf_dask.app.parser import build_parser

        parser = build_parser()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        found = [("ordnmf-dask", parser), *commands.choices.items()]
        sections = []
        with _columns(100):
            for name, command in found:
                section = nodes.section(ids=[nodes.make_id(f"command {name}")])
                title = name if name == "ordnmf-dask" else f"ordnmf-dask {name}"
                section += nodes.title(text=title)
                text = command.format_help()
                section += nodes.literal_block(text, text)
                sections.append(section)
        return sections


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse lays help out to ``$COLUMNS``: a fixed width for the page, the old value after."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def setup(app: Sphinx) -> None:
    app.add_directive("command-help", CommandHelp)
