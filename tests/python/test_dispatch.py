# SPDX-License-Identifier: Apache-2.0
"""sparse_swa.dispatch: the dispatch-width policy from Python, host only (hand-computed cases on
a DSV4-Flash-like config: W = 128, B = 64, C4A + C128A, max_model_len 64K)."""

import numpy as np
import pytest

import sparse_swa
from sparse_swa import dispatch


def flash_config(**overrides):
    fields = dict(window_size=128, block_size=64, max_num_batched_tokens=8192, max_num_seqs=256,
                  max_model_len=65536, compress_ratios=[1, 4, 128])
    fields.update(overrides)
    return sparse_swa.BuilderConfig(**fields)


def dspark(k=5, **overrides):
    return flash_config(speculative_method="dspark", parallel_drafting=True,
                        num_speculative_tokens=k, **overrides)


def test_builtin_policies_are_listed_with_their_layout():
    assert set(dispatch.POLICIES) == {"flashmla_sparse_decode", "flashinfer_sm120_decode",
                                      "flashinfer_sm100", "rocm_ragged", "sparse_swa"}
    assert dispatch.policy_info("flashinfer_sm100")["layout"] == "mixed"
    assert dispatch.policy_info("rocm_ragged")["layout"] == "ragged"
    assert dispatch.policy_info("flashmla_sparse_decode")["reads_prefill_rows"] is False


def test_choose_width_golden():
    assert dispatch.choose_width(133, "flashinfer_sm120_decode", heads=64) == 192
    assert dispatch.choose_width(1024, "flashinfer_sm120_decode", heads=128) == 1024
    assert dispatch.choose_width(133, "flashmla_sparse_decode", heads=64) == 192
    assert dispatch.choose_width(133, "flashmla_sparse_decode", heads=128) == 256
    assert dispatch.choose_width(133, "flashmla_sparse_decode") == 192  # any heads rule
    assert dispatch.choose_width(133, "rocm_ragged") == 133
    assert dispatch.choose_width(133, "flashinfer_sm100", heads=64) == 136  # rows of 4
    assert dispatch.choose_width(np.int64(133), "sparse_swa") == 133


def test_choose_width_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^needed: expected >= 1, got 0"):
        dispatch.choose_width(0, "sparse_swa")
    with pytest.raises(ValueError, match="accepted"):
        dispatch.choose_width(2048, "flashinfer_sm120_decode", heads=128)
    with pytest.raises(ValueError, match=r'policy: expected a built-in policy name .*"sparse_swa".*'
                                         r"got 'flashmla'"):
        dispatch.choose_width(64, "flashmla")
    with pytest.raises(ValueError, match=r"heads: expected an int"):
        dispatch.choose_width(64, "sparse_swa", heads=64.0)


def test_accepts():
    assert dispatch.accepts("flashmla_sparse_decode", heads=64, topk=192, page_block_size=64)
    assert not dispatch.accepts("flashmla_sparse_decode", heads=128, topk=192, page_block_size=64)
    assert dispatch.accepts("flashmla_sparse_decode", heads=64, topk=128, page_block_size=64,
                            extra_topk=512, extra_page_block_size=2)
    assert not dispatch.accepts("flashmla_sparse_decode", heads=64, topk=128, page_block_size=64,
                                extra_topk=100, extra_page_block_size=64)


def test_validate_config_passes_and_rejects_naming_the_tuple():
    for name in dispatch.POLICIES:
        assert dispatch.validate_config(flash_config(), name, heads=64) is None
    with pytest.raises(ValueError, match=r"flashmla_sparse_decode rejects decode non-causal "
                                         r"\(dspark\) swaonly: heads 128, topk 192.*accepted:"):
        dispatch.validate_config(dspark(), "flashmla_sparse_decode", heads=128)
    dispatch.validate_config(dspark(), "flashinfer_sm120_decode", heads=64)
    # A dict config works as well as a BuilderConfig.
    dispatch.validate_config(flash_config().to_dict(), "sparse_swa")


def test_validate_config_errors_name_python_arguments():
    with pytest.raises(ValueError, match=r"^heads: expected >= 1, got 0"):
        dispatch.validate_config(flash_config(), "sparse_swa", heads=0)
    with pytest.raises(ValueError, match=r"^attn_block_size: .*got 100"):
        dispatch.validate_config(flash_config(), "sparse_swa", attn_block_size=100)
    with pytest.raises(ValueError, match=r"config\.window_size"):
        dispatch.validate_config(flash_config(window_size=0), "sparse_swa")


def test_dispatch_tuples_golden():
    tuples = dispatch.dispatch_tuples(dspark(), "flashmla_sparse_decode", heads=64)
    assert len(tuples) == 6  # swaonly, c4a, c128a x {causal W, non-causal Wn}
    assert tuples[0] == {"heads": 64, "topk": 128, "page_block_size": 64, "extra_topk": 0,
                         "extra_page_block_size": 0, "source": "decode causal swaonly",
                         "accepted": True}
    assert tuples[3]["source"] == "decode non-causal (dspark) c4a"
    assert (tuples[3]["topk"], tuples[3]["extra_topk"], tuples[3]["extra_page_block_size"]) == (
        192, 512, 64)
    # C128A: extra_topk = round_up(ceil(65536 / 128), 128) = 512 on 256 / 128 = 2-entry pages.
    assert (tuples[5]["extra_topk"], tuples[5]["extra_page_block_size"]) == (512, 2)


def test_choose_noncausal_width_feeds_the_builder_config():
    cfg = dspark()  # theta = 11: rows need W + theta = 139
    assert dispatch.choose_noncausal_width(cfg, "flashinfer_sm120_decode", heads=64) == 192
    assert dispatch.choose_noncausal_width(cfg, "flashmla_sparse_decode", heads=128) == 256
    assert dispatch.choose_noncausal_width(cfg, "sparse_swa") == 139
    cfg.noncausal_index_width = dispatch.choose_noncausal_width(cfg, "flashmla_sparse_decode",
                                                                heads=128)
    dispatch.validate_config(cfg, "flashmla_sparse_decode", heads=128)
    small = dspark(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=4096)
    small.noncausal_index_width = 256
    builder = sparse_swa.MetadataBuilder(small)
    assert builder.noncausal_index_width == 256
    with pytest.raises(ValueError, match=r"config\.speculative_method.*expected dspark.*got none"):
        dispatch.choose_noncausal_width(flash_config(), "sparse_swa")
