# SPDX-License-Identifier: Apache-2.0
"""The wheel's file filters keep every file of the package: scikit-build-core drops the paths that
pyproject.toml's sdist.exclude (gitignore patterns) match, so an unanchored pattern such as
"build*" once dropped integrations/vllm/builder.py from installed wheels."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
pathspec = pytest.importorskip("pathspec")  # scikit-build-core's own dependency

REPO = Path(__file__).resolve().parents[2]


def test_no_exclude_pattern_drops_a_package_file():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    excludes = config["tool"]["scikit-build"]["sdist"]["exclude"]
    spec = pathspec.GitIgnoreSpec.from_lines(excludes)
    files = [p.relative_to(REPO).as_posix() for p in (REPO / "python" / "sparse_swa").rglob("*")
             if p.is_file() and p.suffix in (".py", ".pyi", ".typed")]
    assert any(f.endswith("integrations/vllm/builder.py") for f in files)
    assert [f for f in files if spec.match_file(f)] == []
