# SPDX-License-Identifier: Apache-2.0
"""Importing sparse_swa and sparse_swa.integrations never imports torch (nor vLLM or Triton):
sparse_swa.torch_ops and the vLLM drop-in bring their frameworks in only when imported."""

import importlib.util
import os
import subprocess
import sys

import pytest


def imported_after(statement):
    code = (f"import sys\n{statement}\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules}\n"
            "                      & {'torch', 'vllm', 'triton'})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_sparse_swa_imports_no_framework():
    assert imported_after("import sparse_swa, sparse_swa.integrations") == ""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_the_vllm_drop_in_without_vllm_imports_no_framework():
    assert imported_after("import sparse_swa.integrations.vllm") == ""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_ops_import_torch_and_register_the_ops():
    out = imported_after("import sparse_swa.torch_ops, torch\n"
                         "assert torch.ops.sparse_swa.sparse_attention.default is not None")
    assert "torch" in out.split()
