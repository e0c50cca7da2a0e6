"""Sphinx configuration of the documentation site: the Markdown pages (myst-parser) as the user
guide and an API reference of the package's public names (autodoc, numpy-style docstrings).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (run by ``.ci/run``).
"""

import argparse
import contextlib
import os
import re
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
# a trailing underscore of a name (``elbo_``) kept as written, not read as markup
strip_signature_backslash = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "furo"  # maintained; the docs extra installs it
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


# the package's docstrings write a field as "name : what it is" (the description on the name's
# line, as help() reads best); numpy style reads the text after " : " as a type. Such a text (a
# sentence, not a short type) becomes the field's description before napoleon parses it.
_FIELD = re.compile(r"^(\s*)([\w*][\w*, ]*) : (.+)$")
_FIELD_SECTIONS = {"Parameters", "Other Parameters", "Attributes"}


def _is_type(text: str, continued: bool) -> bool:
    """Whether ``text`` after " : " is a type: short, no sentence, a description below it."""
    return continued and len(text) <= 40 and ": " not in text and not text.endswith((".", ","))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip()) if line.strip() else 0


def descriptions_on_the_name_line(app, what, name, obj, options, lines: list[str]) -> None:
    """autodoc-process-docstring, before napoleon: "name : text" -> "name" + indented text
    in the field sections when the text is a description, not a type."""
    original = list(lines)
    out: list[str | None] = list(lines)
    section = None
    for j, line in enumerate(original):
        after = original[j + 1] if j + 1 < len(original) else ""
        if re.fullmatch(r"-{3,}", after.strip()):
            section = line.strip()
        match = _FIELD.match(line)
        if section not in _FIELD_SECTIONS or not match or out[j] is None:
            continue
        indent, field, text = match.groups()
        continued = _indent(after) > len(indent)
        if _is_type(text, continued):
            continue
        body = [f"{indent}    {text}"]
        names = [field]
        if section == "Attributes":  # one entry per name (":ivar a, b:" is not one)
            names = [n.strip() for n in field.split(",")]
            k = j + 1
            while len(names) > 1 and k < len(original) and _indent(original[k]) > len(indent):
                body.append(original[k])
                out[k] = None  # moved into each name's entry
                k += 1
        out[j] = "\n".join(f"{indent}{n}\n" + "\n".join(body) for n in names)
    lines[:] = "\n".join(line for line in out if line is not None).split("\n")


# a docstring cites a page of this site as its path ("docs/design.md §2"), as help() reads best;
# on the site the path becomes a link to the page (not inside ``literal`` text)
_CITATION = re.compile(r"(?<![`/\w])docs/([\w/-]+)\.md\b(?!`)")


def cited_pages_as_links(app, what, name, obj, options, lines: list[str]) -> None:
    """autodoc-process-docstring: "docs/x.md" -> a :doc: link to the page x of the site."""
    lines[:] = [_CITATION.sub(r":doc:`docs/\1.md </\1>`", line) for line in lines]


def setup(app: Sphinx) -> None:
    app.add_directive("command-help", CommandHelp)
    app.connect("autodoc-process-docstring", descriptions_on_the_name_line, priority=400)
    app.connect("autodoc-process-docstring", cited_pages_as_links, priority=450)
