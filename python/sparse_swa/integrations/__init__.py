# SPDX-License-Identifier: Apache-2.0
"""Drop-ins for serving engines; each submodule imports its engine lazily (none is a dependency).

- ``sparse_swa.integrations.vllm``: the SWA metadata builder of vLLM's DeepSeek-V4 sparse MLA
  backend (README.md#using-it-from-vllm).
"""
