"""The tiny GGUF model is written once per test session and shared by every real-llama.cpp test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real.gate import require
from tests.real.llamacpp import harness


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require("OOMGUARD_REQUIRE_REALLAMACPP", harness.server_binary, "real llama.cpp")
    from tests.real.llamacpp.tiny_gguf import write_tiny_llama

    model = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
    yield model
    model.unlink()  # 270 MB: not left behind in pytest's kept temporary folders
