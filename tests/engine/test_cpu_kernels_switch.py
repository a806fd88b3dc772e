"""KVFLEET_CPU_KERNELS=0 turns the fused kernels off, and says so once (README, docs)."""

from __future__ import annotations

import logging

import pytest
import torch
from kvfleet_engine.model import cpu_kernels, ops

LOGGER = "kvfleet_engine.model.cpu_kernels"


@pytest.fixture
def fresh_load(monkeypatch):
    """load() is cached per process; clear it around the test."""
    cpu_kernels.load.cache_clear()
    yield monkeypatch
    cpu_kernels.load.cache_clear()


def test_switched_off_kernels_log_one_warning(fresh_load, caplog):
    fresh_load.setenv("KVFLEET_CPU_KERNELS", "0")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert cpu_kernels.load() is None
        assert cpu_kernels.load() is None  # asked again: no second warning
        x = torch.randn(2, 8)
        assert ops.kernels(x) is None
        out, _ = ops.rms_norm(x, torch.ones(8), 1e-5)  # the torch path runs
    assert out.shape == (2, 8)
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "KVFLEET_CPU_KERNELS=0" in message and "torch" in message and "off" in message


def test_any_other_value_is_not_the_switch(fresh_load, caplog):
    fresh_load.setenv("KVFLEET_CPU_KERNELS", "1")
    fresh_load.setattr(cpu_kernels.shutil, "which", lambda name: None)  # no build here
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert cpu_kernels.load() is None
    assert "KVFLEET_CPU_KERNELS=0" not in caplog.text
    assert "no C++ compiler found" in caplog.text
