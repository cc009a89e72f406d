# SPDX-License-Identifier: Apache-2.0
"""vLLM's general plugin of sparse_swa (entry point group vllm.general_plugins, which vLLM runs
in each of its processes): with SPARSE_SWA_VLLM=1 it calls sparse_swa.integrations.vllm.install()
there; otherwise it does nothing and imports nothing (README.md#using-it-from-vllm)."""

import os

ENV = "SPARSE_SWA_VLLM"


def register() -> None:
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}: expected 1 (install) or 0/unset, got {value!r}")
    if value == "1":
        from sparse_swa.integrations.vllm import install

        install()
