"""Generates the wire types from `proto/` when the package is built; the metadata is in
pyproject.toml."""

from __future__ import annotations

import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


class BuildWithProto(build_py):
    """`build_py` that first generates `switchyard/v1/*_pb2.py` from the repository's protos."""

    def run(self) -> None:
        sys.path.insert(0, str(HERE))
        from generate_proto import generate

        generate(HERE / "src")
        super().run()


setup(cmdclass={"build_py": BuildWithProto})
