"""The package version, one place: the face and the HTML report read it."""

__version__ = "0.2.0"
