"""Sphinx configuration of the durable-dispatch documentation (issue 47).

Build (CI does, warnings are errors)::

    python -m sphinx -b html -n -W --keep-going -E docs docs/_build/html

Pages are Markdown (MyST) or reStructuredText. The API reference is generated from each public
module's ``__all__`` (``_ext/apipages.py``), the command-line reference from
``durable_dispatch.cli:build_parser`` (sphinx-argparse). Nothing here reaches the network:
there is no intersphinx (the build runs offline), so references to the standard library and
mpi4py are plain text, and the few base classes that need a link are listed in
``nitpick_ignore_regex``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent / "src"))

project = "durable-dispatch"
author = "the durable-dispatch authors"
copyright = "2026, the durable-dispatch authors"

import durable_dispatch  # noqa: E402

release = version = durable_dispatch.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "apipages",
]

# Keep "--option" and 'quotes' as typed: a command's help text is shown as it is written.
smartquotes = False
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# MyST: GitHub's heading anchors, so the links the Markdown pages already use
# (protocol.md#the-adaptive-rule) work on the site as on GitHub.
myst_heading_anchors = 6
myst_enable_extensions = ["deflist", "colon_fence"]
suppress_warnings = [
    # a JSON example with an ellipsis ({...}) is shown as it is, not highlighted: on purpose
    "misc.highlighting_failure",
]

# autodoc + napoleon: Google-style docstrings, type hints in the description.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_member_order = "bysource"
autodoc_default_options = {"undoc-members": False}
autodoc_mock_imports: list[str] = []
autosummary_generate = False  # the pages come from apipages; autosummary only draws tables
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
napoleon_use_ivar = True  # an Attributes section is a field list: autodoc documents the members

# Every reference must resolve (apipages resolves a private module's path to the public name,
# and shows a name that exists but is not public as code), except these standard-library
# classes that public classes derive from: there is no intersphinx offline to link them.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:(class|mod)", r"concurrent\.futures(\._base\.(Future|Executor))?"),
    (r"py:class", r"enum\.Enum"),
]

html_theme = "alabaster"
html_title = f"durable-dispatch {release}"
html_theme_options = {
    "description": "Crash-safe MPI master/worker task farms",
    "fixed_sidebar": True,
    "page_width": "1240px",
    "body_max_width": "none",
    "sidebar_width": "260px",
}
html_static_path: list[str] = []
