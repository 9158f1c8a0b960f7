"""Session fixtures shared by every test package: the built engine and the tiny fixture model."""
import pytest

from tests.support import procs


@pytest.fixture(scope="session")
def engine_binary():
    return procs.build_engine()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return procs.make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-moe.gguf")
