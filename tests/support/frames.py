"""What tests hold every app's socket frames to (colibri_base.frames): no frame built by hand."""
import ast
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def hand_built_frames(module: ModuleType) -> list[str]:
    """Each dict literal whose "type" is one of the app's server frame types, anywhere in the app
    of `module` (its frames' funnel, e.g. chat.server_frames) but the funnel itself and migrations:
    a frame built by hand. Group messages ({"type": "chat.frame"}, {"type": "atlas.build"}) are
    not frames, since their types are no frame's."""
    app, funnel = module.__name__.split(".")
    kinds = {module.frame_type(c) for c in module.FRAMES}
    found = []
    for path in sorted((ROOT / app).rglob("*.py")):
        if path.name == f"{funnel}.py" or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and key.value == "type" and isinstance(value, ast.Constant)
                        and value.value in kinds):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} builds a {value.value!r} frame")
    return found
