#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU iteration of the few-heads prefill kernel, from the repo root on the GPU machine (carry
# .gpu-bin from scripts/gpu/build.sh): a smoke run (a hang or failure ends the call), the
# attention tests with it (auto), with its CTAs capped at 2 and without it (few=0), then the 8 and
# 16-head prefill shapes timed against the 64-row bf16 kernel (SPARSE_SWA_ATTENTION_FEW_HEADS=0)
# in alternating rounds. [ROUNDS=2] [RUNS=20]
set -uo pipefail
VARIANTS=${VARIANTS:-"auto walk=2 few=0"} bash scripts/gpu/attention_iter.sh smoke tests || exit $?
ROUNDS=${ROUNDS:-2} RUNS=${RUNS:-20} CHOICES="bin:head env:SPARSE_SWA_ATTENTION_FEW_HEADS=0" \
  SHAPES=${SHAPES:-"prefill_h8_t4096_bf16 prefill_h16_t4096_bf16 prefill_h8_t4096_fp8 prefill_h16_t4096_fp8"} \
  bash scripts/gpu/ab_shapes.sh
