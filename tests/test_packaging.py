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
