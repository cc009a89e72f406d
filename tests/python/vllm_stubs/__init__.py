# SPDX-License-Identifier: Apache-2.0
"""Support for the vLLM drop-in's tests: a fresh import of the drop-in (bound to whatever vLLM
sys.modules holds now) and, in fake_vllm, a stand-in of vLLM 0.33's class structure."""

import importlib
import sys

DROPIN = "sparse_swa.integrations.vllm"


def fresh_dropin():
    """sparse_swa.integrations.vllm imported anew: its builders derive from the vLLM found now
    (the modules imported before keep the vLLM they found)."""
    for name in [m for m in sys.modules if m == DROPIN or m.startswith(DROPIN + ".")]:
        del sys.modules[name]
    return importlib.import_module(DROPIN)
