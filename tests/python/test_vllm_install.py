# SPDX-License-Identifier: Apache-2.0
"""sparse_swa.integrations.vllm.install() without vLLM or torch: vLLM 0.33's class structure
(module paths, class names, bases, CUDA-graph support levels, the attention classes'
swa_backend_cls) is the stand-in of vllm_stubs/fake_vllm.py, whose own builders refuse to run.
After install() the builder class vLLM's attention layers get is ours and builds on host arrays;
a vLLM without those classes gets UnsupportedVllmError naming what it looked for.
tests/python/test_vllm_033_builder.py does the same on vLLM 0.33's real model files."""

import importlib.util
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace as NS

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case
from sparse_swa.integrations import vllm_plugin
from test_vllm_dropin import common, vllm_objects
from vllm_stubs import fake_vllm, fresh_dropin

if importlib.util.find_spec("vllm") is not None:
    pytest.skip("vLLM is installed: the stand-in takes its module names",
                allow_module_level=True)

ATTENTION = [  # (module, attention class, the drop-in's builder it must get)
    ("models.deepseek_v4.nvidia.flashmla", "DeepseekV4FlashMLAAttention",
     "SparseSWAFlashMLAMetadataBuilder"),
    ("models.deepseek_v4.nvidia.flashinfer_sparse", "DeepseekV4FlashInferMLAAttention",
     "SparseSWAFlashInferMetadataBuilder"),
    ("models.deepseek_v4.nvidia.flashinfer_sparse", "DeepseekV4FlashInferSM120Attention",
     "SparseSWAFlashInferMetadataBuilder"),
    ("models.deepseek_v41.nvidia.flashmla", "DeepseekV4FlashMLAAttention",
     "SparseSWAV41FlashMLAMetadataBuilder"),
    ("models.deepseek_v41.nvidia.flashinfer_sparse", "DeepseekV4FlashInferMLAAttention",
     "SparseSWAV41FlashInferMetadataBuilder"),
    ("models.deepseek_v41.nvidia.flashinfer_sparse", "DeepseekV4FlashInferSM120Attention",
     "SparseSWAV41FlashInferMetadataBuilder"),
]


@pytest.fixture
def vllm(request):
    """(the stand-in's modules as `vllm`, the drop-in bound to them); make()'s arguments as the
    test's indirect parameter."""
    mods = fake_vllm.make("vllm", **getattr(request, "param", {}))
    with fake_vllm.installed(mods):
        dropin = fresh_dropin()
        try:
            yield mods, dropin
        finally:
            dropin.uninstall()
    fresh_dropin()


def attention(mods, module, name):
    return getattr(mods[f"vllm.{module}"], name)


def builder_patches(installation):
    """The builder patches of an Installation (install() also patches the attention class:
    tests/python/test_vllm_attention.py)."""
    return [p for p in installation.patches if p.target.kind == "swa_builder"]


def test_install_hands_vllms_attention_layers_our_builders(vllm):
    mods, dropin = vllm
    base = mods["vllm.v1.attention.backends.mla.sparse_swa"].DeepseekSparseSWAMetadataBuilder
    assert dropin.SparseSWAMetadataBuilder.__mro__[1] is base  # vLLM's model state: replay_start
    installation = dropin.install()
    assert installation.vllm == "vllm" and installation.skipped == {}
    assert [p.target for p in builder_patches(installation)] == list(
        dropin.SWA_BUILDER_TARGETS)
    for module, name, ours in ATTENTION:
        backend = attention(mods, module, name).swa_backend_cls
        handed_out = backend.get_builder_cls()
        vllm_cls = getattr(mods[f"vllm.{module}"], installation.builder_cls(backend).__name__
                           .replace("SparseSWA", "DeepseekSparseSWA").replace("V41", ""))
        assert handed_out is installation.builder_cls(backend)
        assert issubclass(handed_out, getattr(dropin, ours)), name
        assert issubclass(handed_out, vllm_cls) and issubclass(handed_out, base)
        assert handed_out._cudagraph_support is fake_vllm.AttentionCGSupport.ALWAYS
        assert handed_out.build is getattr(dropin, ours).build  # our methods
    again = dropin.install()  # idempotent: the same classes, nothing wrapped twice
    assert [p.handed_out for p in again.patches] == [p.handed_out for p in installation.patches]


def test_the_handed_out_builder_builds_like_the_plain_builder(vllm):
    mods, dropin = vllm
    installation = dropin.install()
    case = load_case("dspark_draft")
    kv, vc = vllm_objects(case["config"])
    for module, name, _ in ATTENTION:
        cls = attention(mods, module, name).swa_backend_cls.get_builder_cls()
        if "V41" in cls.__name__:
            vc.model_config.hf_config.compress_ratios = [0, 1, 2]
        builder = cls(kv, ["layer.0"], vc, "cpu")
        arrays = batch_arrays(case["batch"])
        plain = sparse_swa.MetadataBuilder(case["config"]).build(*arrays, causal=False)
        zeros = np.zeros(len(arrays[1]), dtype=np.int32)
        md = builder.build(0, common(arrays, causal=False), replay_start=zeros)
        np.testing.assert_array_equal(md.decode_swa_indices, plain.decode_swa_indices)
        assert md.replay_start is zeros and md.tile_sched_swaonly is not None
        if "V41" in cls.__name__:
            assert builder._layer_types == {"swaonly", "c1a", "c2a"}
    assert len(builder_patches(installation)) == 4


def test_uninstall_gives_vllm_its_own_builders_back(vllm):
    mods, dropin = vllm
    owners = {m: attention(mods, m, n).swa_backend_cls for m, n, _ in ATTENTION}
    before = {m: b.get_builder_cls() for m, b in owners.items()}
    installation = dropin.install()
    assert dropin.uninstall(installation) == 5  # the four builders and the attention class
    assert {m: b.get_builder_cls() for m, b in owners.items()} == before
    kv, vc = vllm_objects(load_case("mixed_mtp")["config"])
    with pytest.raises(fake_vllm.VllmBuilderRan):
        before["models.deepseek_v4.nvidia.flashmla"](kv, ["l"], vc, "cpu")


@pytest.mark.parametrize("vllm", [dict(v4=False, v41=False)], indirect=True)
def test_a_vllm_without_the_backends_gets_a_clear_error(vllm):
    mods, dropin = vllm
    with pytest.raises(dropin.UnsupportedVllmError) as e:
        dropin.install()
    message = str(e.value)
    assert message.startswith("install: expected vLLM's DeepSeek-V4 SWA backends (vLLM 0.33), "
                              "found none in vllm")
    for t in dropin.SWA_BUILDER_TARGETS:
        assert f"  vllm.{t.module}.{t.cls}: no module vllm.{t.module}" in message


@pytest.mark.parametrize("vllm", [dict(missing=("DeepseekSparseSWAFlashMLABackend",
                                                 "DeepseekSparseSWAFlashInferBackend"))],
                         indirect=True)
def test_renamed_backends_get_a_clear_error(vllm):
    _, dropin = vllm
    with pytest.raises(dropin.UnsupportedVllmError,
                       match=r"vllm\.models\.deepseek_v41\.nvidia\.flashinfer_sparse\."
                             r"DeepseekSparseSWAFlashInferBackend: no class "
                             r"DeepseekSparseSWAFlashInferBackend in "
                             r"vllm\.models\.deepseek_v41\.nvidia\.flashinfer_sparse"):
        dropin.install()


@pytest.mark.parametrize("vllm", [dict(v41=False)], indirect=True)
def test_a_vllm_with_deepseek_v4_only_gets_those(vllm):
    _, dropin = vllm
    installation = dropin.install()
    assert [p.target.module for p in builder_patches(installation)] == [
        "models.deepseek_v4.nvidia.flashmla", "models.deepseek_v4.nvidia.flashinfer_sparse"]
    assert installation.skipped["vllm.models.deepseek_v41.nvidia.flashmla."
                                "DeepseekSparseSWAFlashMLABackend"] == (
        "no module vllm.models.deepseek_v41.nvidia.flashmla")


@pytest.mark.parametrize(
    "vllm", [dict(extra_methods={"DeepseekSparseSWAFlashMLAMetadataBuilder": ["refresh"]})],
    indirect=True)
def test_a_builder_with_methods_the_drop_in_lacks_is_left_alone_and_said(vllm):
    mods, dropin = vllm
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        installation = dropin.install()
    where = "vllm.models.deepseek_v4.nvidia.flashmla.DeepseekSparseSWAFlashMLABackend"
    assert installation.skipped[where] == (
        "vLLM's DeepseekSparseSWAFlashMLAMetadataBuilder.refresh have no sparse_swa counterpart")
    assert any(where in str(w.message) for w in caught)
    assert len(builder_patches(installation)) == 2  # the FlashInfer ones
    backend = attention(mods, "models.deepseek_v4.nvidia.flashmla",
                        "DeepseekV4FlashMLAAttention").swa_backend_cls
    assert backend.get_builder_cls().__module__.startswith("vllm.")


def test_no_vllm_at_all_gets_a_clear_error():
    dropin = fresh_dropin()
    with pytest.raises(dropin.UnsupportedVllmError,
                       match="install: expected an importable vllm package, got No module "
                             "named 'vllm'"):
        dropin.install()


def test_a_stand_in_under_another_name_installs_by_its_module():
    mods = fake_vllm.make("fakevllm")
    dropin = fresh_dropin()  # bound to no vLLM: vLLM's classes come in as bases at install
    with fake_vllm.installed(mods):
        try:
            installation = dropin.install(mods["fakevllm"])
            backend = mods["fakevllm.models.deepseek_v4.nvidia.flashmla"]
            cls = backend.DeepseekSparseSWAFlashMLABackend.get_builder_cls()
            assert issubclass(cls, backend.DeepseekSparseSWAFlashMLAMetadataBuilder)
            assert len(builder_patches(installation)) == 4
            kv, vc = vllm_objects(load_case("mixed_mtp")["config"])
            md = cls(kv, ["l"], vc, "cpu").build(0, common(batch_arrays(
                load_case("mixed_mtp")["batch"])))
            assert md.num_decode_tokens == 3
        finally:
            dropin.uninstall()


def test_the_plugin_installs_only_when_asked(vllm, monkeypatch):
    mods, dropin = vllm
    backend = attention(mods, *ATTENTION[0][:2]).swa_backend_cls
    own = backend.get_builder_cls()
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    vllm_plugin.register()
    assert backend.get_builder_cls() is own
    monkeypatch.setenv(vllm_plugin.ENV, "yes")
    with pytest.raises(ValueError, match="SPARSE_SWA_VLLM: expected 1 \\(install\\) or "
                                         "0/unset, got 'yes'"):
        vllm_plugin.register()
    monkeypatch.setenv(vllm_plugin.ENV, "1")
    vllm_plugin.register()  # the drop-in as sys.modules holds it: the fixture's
    assert issubclass(backend.get_builder_cls(), dropin.SparseSWAFlashMLAMetadataBuilder)


def test_vllms_decode_threshold_rule_is_checked(vllm):
    mods, dropin = vllm
    kv, vc = vllm_objects(load_case("mixed_mtp")["config"])
    vc.use_v2_model_runner = False
    assert dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu").decode_threshold == 2
    mods["vllm.v1.attention.backend"].max_decode_query_len = lambda c: 3
    with pytest.raises(ValueError, match="vllm_config: expected vLLM's max_decode_query_len to "
                                         "give the drop-in's decode threshold 2, got 3"):
        dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu")


def test_images_widen_rows_only_for_vllms_deepseek_v4_config(vllm):
    mods, dropin = vllm
    case = load_case("vision_prefill")
    kv, vc = vllm_objects(case["config"])
    plain = vc.model_config.hf_config
    v4 = mods["vllm.v1.attention.backends.mla.sparse_swa"].DeepseekV4Config()
    v4.__dict__.update(vars(plain))
    W, mi = case["config"]["window_size"], case["config"]["max_image_tokens"]
    for hf, width in ((v4, W + mi), (plain, W)):
        vc.model_config = NS(max_model_len=vc.model_config.max_model_len, hf_config=hf)
        builder = dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu")
        md = builder.build(0, common(batch_arrays(case["batch"]),
                                     spans={0: [(3, 7)]}))
        assert builder.prefill_index_width == width and md.prefill_swa_indices.shape[-1] == width
        assert (md.prefill_left_visible is None) == (width == W)


def test_the_plugin_unasked_imports_nothing():
    code = ("import os, sys\nos.environ.pop('SPARSE_SWA_VLLM', None)\n"
            "from sparse_swa.integrations import vllm_plugin\nvllm_plugin.register()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('vllm', 'torch', "
            "'sparse_swa.integrations.vllm.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=os.environ.copy(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
