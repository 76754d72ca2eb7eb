"""The tiny GGUF model is written once per test session and shared by every real-llama.cpp test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

# llamacpp_harness.py and tiny_gguf.py sit beside this file; found this way under any pytest import mode.
import llamacpp_harness as harness
import pytest


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    try:
        harness.server_binary()
    except RuntimeError as e:
        # `make test` builds llama-server and sets OOMGUARD_REQUIRE_REALLAMACPP: there a missing binary fails.
        if os.environ.get("OOMGUARD_REQUIRE_REALLAMACPP"):
            pytest.fail(str(e))
        pytest.skip(f"real llama.cpp tests skipped: {e}")
    from tiny_gguf import write_tiny_llama

    model = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
    yield model
    model.unlink()  # 270 MB: not left behind in pytest's kept temporary folders
