import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_models_toml_and_the_demo_model(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("specgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "specgen/models.toml" in names
    for f in ["model.safetensors", "config.json", "tokenizer.json", "NOTICE.md"]:
        assert f"specgen/bundled/stories260K/{f}" in names
    toml = zipfile.ZipFile(wheel).read("specgen/models.toml").decode()
    assert toml == (ROOT / "models.toml").read_text()


def test_linux_backends_are_extras_so_that_cuda_does_not_meet_the_cpu_build():
    # mlx[cpu] and mlx[cuda13] both install mlx/lib/libmlx.so: a core dependency on either would
    # leave `specgen[cuda]` with whichever pip wrote last.
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any("mlx[" in d for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert extras["cpu"] == ["mlx[cpu]; sys_platform == 'linux'"]
    assert extras["cuda"] == ["mlx[cuda13]; sys_platform == 'linux'"]
    readme = (ROOT / "README.md").read_text()
    assert ".[cpu,serve,test]" in readme and "specgen[cuda]" in readme


# Where each mlx-lm name specgen imports first appeared (read from the released wheels); names not
# listed are older than any floor specgen has had.
FIRST_RELEASE = {"BatchCounters": (0, 32), "BatchCountersSnapshot": (0, 32), "TextStateMachine": (0, 32),
                 "make_text_state_machine": (0, 32)}


def test_the_mlx_lm_floor_has_every_name_specgen_imports():
    # An install over an older mlx-lm satisfied ">=0.28" and then failed at import.
    import ast

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    (req,) = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
              if d.startswith("mlx-lm")]
    floor = tuple(int(x) for x in req.split(">=")[1].split(".")[:2])
    imported = {(node.module, a.name) for f in (ROOT / "specgen").rglob("*.py")
                for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("mlx_lm") for a in node.names}
    import importlib

    for module, name in imported:  # the installed release has them all...
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
        assert floor >= FIRST_RELEASE.get(name, (0, 0)), f"mlx-lm {floor} lacks {module}.{name}"  # ...and the floor
