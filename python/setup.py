"""Packs the CMake-built extensions into a platform wheel (pyproject.toml has the metadata)."""
import glob
import os

from setuptools import setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
if not glob.glob(os.path.join(HERE, "cobalt", "_core*.so")):
    raise SystemExit(
        "cobalt: python/cobalt/_core*.so is missing: build the extensions first "
        "(`make build-python` from the repository root)"
    )


class BinaryDistribution(Distribution):
    """The wheel holds compiled extensions: tag it for this interpreter and platform."""

    def has_ext_modules(self) -> bool:
        return True


setup(distclass=BinaryDistribution)
