"""GPU constants: a known card gets its shipped, measured constants; an unknown one its device's SMs, a
conservative ceiling, and a log line saying so."""

import logging
from types import SimpleNamespace

import pytest

from decode_projection.runtime import gpu


def fake_device(monkeypatch, name, sms, smem=233472):
    props = SimpleNamespace(name=name, multi_processor_count=sms, shared_memory_per_multiprocessor=smem)
    monkeypatch.setattr(gpu.torch.cuda, "get_device_properties", lambda device: props)


@pytest.mark.parametrize("spec", [gpu.H100, gpu.H200], ids=["H100", "H200"])
def test_a_known_card_gets_its_shipped_constants(monkeypatch, spec):
    fake_device(monkeypatch, spec.name, spec.sm_count)
    assert gpu.gpu_spec(0) == spec


def test_the_cards_differ_in_their_measured_ceiling():
    assert gpu.H100.hbm_bytes_per_us == 3.08e6 and gpu.H200.hbm_bytes_per_us == 4.4e6
    assert gpu.H100.clusters_at_once(4) == 30 and gpu.H100.clusters_at_once(8) == 15


def test_an_unknown_card_says_its_constants_are_assumed(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="decode_projection")
    gpu._log_unknown.cache_clear()
    fake_device(monkeypatch, "NVIDIA H100 PCIe", 114, smem=200000)
    for _ in range(2):
        spec = gpu.gpu_spec(0)
    assert (spec.sm_count, spec.smem_per_sm, spec.hbm_bytes_per_us) == (114, 200000, gpu.UNKNOWN_BYTES_PER_US)
    assert spec.clusters_at_once(4) == 114 // 4
    assert caplog.text.count("no shipped constants for NVIDIA H100 PCIe (114 SMs)") == 1


def test_a_known_name_with_other_sms_is_not_taken_for_the_known_card(monkeypatch):
    fake_device(monkeypatch, gpu.H100.name, 120)
    assert gpu.gpu_spec(0).hbm_bytes_per_us == gpu.UNKNOWN_BYTES_PER_US
