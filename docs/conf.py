"""Sphinx configuration for the turnkv spec."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "turnkv"
author = "turnkv developers"
release = "0.1.0"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["cupy"]
nitpicky = False
suppress_warnings = ["myst.xref_missing"]
