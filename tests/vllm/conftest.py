"""`make test-vllm` tier: skipped unless KVFLEET_TEST_VLLM=1; see vllm_helpers.py."""

from vllm_helpers import figures, pytest_collection_modifyitems, vllm_server

__all__ = ["figures", "pytest_collection_modifyitems", "vllm_server"]
