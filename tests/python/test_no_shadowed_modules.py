# SPDX-License-Identifier: Apache-2.0
"""No function of the Python package binds, as a local name, a module the file imports at its top
(`import sparse_swa.torch_ops` inside a function makes `sparse_swa` local to all of it, so its
other branches fail with UnboundLocalError: a path the CPU tests never take can hide it)."""

import symtable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sparse_swa"


def functions(table):
    for child in table.get_children():
        if child.get_type() == "function":
            yield child
        yield from functions(child)


def test_no_function_shadows_a_module_imported_at_the_top():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top = symtable.symtable(path.read_text(), str(path), "exec")
        modules = {s.get_name() for s in top.get_symbols() if s.is_imported()}
        for fn in functions(top):
            for s in fn.get_symbols():
                if s.get_name() in modules and s.is_local():
                    found.append(f"{path.relative_to(PACKAGE)}:{fn.get_name()}: {s.get_name()}")
    assert found == []
