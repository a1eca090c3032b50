"""The interactive viewer of latent codes: one self-contained, offline HTML page per codes file
(`build_viewer`, `write_viewer`, `latentcode view`), also shown inline in Jupyter."""

from latentcode.analysis.viewer.data import DEFAULT_MAX_INSTANCES, viewer_data
from latentcode.analysis.viewer.page import Viewer, build_viewer, write_viewer

__all__ = ["DEFAULT_MAX_INSTANCES", "Viewer", "build_viewer", "viewer_data", "write_viewer"]
