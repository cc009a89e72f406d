# SPDX-License-Identifier: Apache-2.0
"""The shipped type stubs (__init__.pyi, py.typed) match the module: every stub name exists,
and every public name of the module and its classes is in the stub."""

import ast
import re
from pathlib import Path

import sparse_swa

PACKAGE = Path(sparse_swa.__file__).parent
STUB_ONLY = {"Array", "ChunkPlan", "ImageSpans", "Stream", "_BuildFlag"}  # the stub's own types


def stub_names():
    tree = ast.parse((PACKAGE / "__init__.pyi").read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            names = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign):
                    names.add(item.target.id)
            members[node.name] = names
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets)
    return top, members


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_package_ships_typing_markers():
    assert (PACKAGE / "py.typed").exists()
    assert (PACKAGE / "__init__.pyi").exists()


def test_stub_matches_module():
    top, members = stub_names()
    assert top - STUB_ONLY == public(sparse_swa.__all__) | {"__version__"} - {"__all__"}
    for cls, names in members.items():
        obj = getattr(sparse_swa, cls)
        assert public(names) - {"__init__"} == public(dir(obj)), cls


def test_docstrings_give_shapes():
    doc = sparse_swa.SwaMetadata.decode_swa_indices.__doc__
    assert "[num_decode_tokens, 1, decode_swa_width] int32" in doc
    assert "query_start_loc: [num_reqs + 1] int32" in sparse_swa.MetadataBuilder.build.__doc__


def test_version_matches_installed_metadata():
    from importlib import metadata
    try:
        installed = metadata.version("sparse_swa")
    except metadata.PackageNotFoundError:
        installed = None  # the CMake tree's package (PYTHONPATH), not a pip install
    if installed is not None and Path(sparse_swa.__file__).parent.name == "sparse_swa":
        assert installed == sparse_swa.__version__
    assert sparse_swa.__version__.count(".") == 2


def test_version_is_the_cmake_project_version():
    # One version: project(VERSION) in CMakeLists.txt -> sparse_swa/version.h -> __version__.
    cmake = Path(__file__).resolve().parents[2] / "CMakeLists.txt"
    match = re.search(r"^project\(sparse_swa VERSION ([0-9.]+)", cmake.read_text(), re.M)
    assert match is not None
    assert sparse_swa.__version__ == match.group(1)
