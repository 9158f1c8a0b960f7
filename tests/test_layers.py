"""The layering of the packages holds (issue 26 item 7): the import-linter contracts of
pyproject.toml pass on the tree, and they do bite — a peer import, an import circle or an import
across the bridge's two sides planted in a copy of the tree, even inside a function, breaks them.

Why a copy for the second part: a contract that never fails proves nothing; planting the imports in
the real tree would race other tests that import it.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import procs

PACKAGES = ("colibri_site", "api", "chat", "experts", "ops", "engine_bridge", "colibri_base")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the packages under root with the project's contracts (no cache: nothing is
    written into the tree)."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(procs.ROOT / "pyproject.toml")],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})  # rich wraps its report at the width


def test_the_tree_keeps_every_contract() -> None:
    result = lint(procs.ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(procs.ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "templates", "static", "data"))
    return tmp_path


PLANTED = {
    # a peer reached from inside a function (how experts/views.py reached chat.services)
    "peer": ("experts/planted.py", "def read(pk):\n    from chat.services import message_routing\n\n"
             "    return message_routing(pk)\n", "experts is not allowed to import chat"),
    # the base reaching up into an app
    "upward": ("colibri_base/planted.py", "from api.models import ApiKey\n", "colibri_base is not allowed to import api"),
    # a circle inside an app, closed by a function-level import (relay imports services)
    "circle": ("chat/services.py", "\n\ndef _planted():\n    from chat import relay\n\n    return relay\n",
               "No cycles are allowed in chat"),
    # the bridge's engine side reaching its web side (how jobs and engine took GenerationRequest
    # from client), and the web side reaching the engine side
    "engine-to-web": ("engine_bridge/jobs.py", "\n\ndef _planted():\n    from engine_bridge.client import generate\n\n"
                      "    return generate\n", "engine_bridge.jobs is not allowed to import engine_bridge.client"),
    "web-to-engine": ("engine_bridge/client.py", "\n\ndef _planted():\n    from engine_bridge import protocol\n\n"
                      "    return protocol\n", "engine_bridge.client is not allowed to import engine_bridge.protocol"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_import_breaks_a_contract(tree_copy: Path, case: str) -> None:
    path, text, broken = PLANTED[case]
    target = tree_copy / path
    target.write_text((target.read_text() if target.exists() else "") + text)
    result = lint(tree_copy)
    assert result.returncode != 0, result.stdout
    assert broken in result.stdout, result.stdout
