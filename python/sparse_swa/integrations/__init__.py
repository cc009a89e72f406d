# SPDX-License-Identifier: Apache-2.0
"""Drop-ins for serving engines; each submodule imports its engine lazily (none is a dependency).

- ``sparse_swa.integrations.vllm``: the SWA metadata builders of the sparse MLA backends of
  vLLM's DeepSeek-V4 / V4.1 attention layers, and install() (README.md#using-it-from-vllm).
- ``sparse_swa.integrations.vllm_plugin``: vLLM's general plugin; it calls install() in each vLLM
  process when SPARSE_SWA_VLLM=1.
"""
