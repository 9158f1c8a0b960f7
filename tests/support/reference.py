"""Reference files from llama.cpp's tree that tests hold our code to (chat templates as the models
ship them). scripts/test.sh (reference_up) fetches them from the llama-cpp-python source
distribution on PyPI and sets LLAMA_CPP_SRC; a test that needs one fails, never skips, when it is
missing, so `make test` cannot pass without checking against it."""
import os
from pathlib import Path

import pytest


def llama_cpp_src() -> Path:
    return Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/colibri/llama-cpp-python-0.3.36/vendor/llama.cpp"))


def chat_template(name: str) -> str:
    """The text of llama.cpp's models/templates/<name>."""
    path = llama_cpp_src() / "models" / "templates" / name
    if not path.exists():
        pytest.fail(f"reference template {path} is missing: run `make test`, or source scripts/common.sh and run "
                    "reference_up, or set LLAMA_CPP_SRC to a llama.cpp tree", pytrace=False)
    return path.read_text()
