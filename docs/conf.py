"""Sphinx configuration of the documentation site: the Markdown pages (myst-parser) as the user
guide and an API reference of the package's public names (autodoc, numpy-style docstrings).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (run by ``.ci/run``).
"""

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
