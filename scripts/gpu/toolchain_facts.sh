#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prints the toolchain facts behind a Python-module build on the GPU machine (for crash reports).
c++ --version | head -1
python3 -m pip show nanobind scikit-build-core numpy | grep -E "^(Name|Version)"
ldd /tmp/pysite/sparse_swa/*.so
grep -E "CMAKE_CXX_COMPILER:|CMAKE_CXX_FLAGS:|CMAKE_CUDA_HOST_COMPILER" /tmp/pybuild2/CMakeCache.txt
