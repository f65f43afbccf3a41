"""agents.models.torch_extras: a torchvision/torchaudio/torchcodec that cannot load (what plain
``pip install 'envfactory[vllm]'`` leaves) must not break transformers or vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_vllm

ROOT = Path(__file__).resolve().parents[1]


def _fake_torchvision(root: Path) -> None:
    """A torchvision like PyPI's CUDA build beside a CPU torch: installed, and its import fails."""
    pkg = root / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    info = root / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n"
                                   "Requires-Dist: torch (==2.13.0)\n")


def _run(code: str, site: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), ENVFACTORY_CACHE=str(cache))
    env.pop("ENVFACTORY_KEEP_TORCH_EXTRAS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def test_an_unloadable_torchvision_is_hidden_so_transformers_imports(tmp_path: Path) -> None:
    site, cache = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    _fake_torchvision(site)
    bare = _run("from transformers import Qwen2ForCausalLM", site, cache)
    assert bare.returncode != 0  # what a user gets without the guard
    guarded = _run("import agents\nfrom transformers import Qwen2ForCausalLM\nimport torchvision", site, cache)
    assert "pip uninstall -y torchvision" in guarded.stderr
    assert guarded.returncode != 0 and "ModuleNotFoundError" in guarded.stderr.splitlines()[-1]  # hidden, not broken
    ok = _run("import agents\nfrom transformers import Qwen2ForCausalLM, LlamaForCausalLM\nprint('imported')", site, cache)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "imported" in ok.stdout
    assert list((cache / "torch-extras").glob("*.json"))  # probed once, then read from the cache


def test_extras_that_import_are_left_alone(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text("loaded = True\n")
    (site / "torchvision-0.28.0.dist-info").mkdir()
    (site / "torchvision-0.28.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\n"
                                                                     "Version: 0.28.0\n")
    r = _run("import agents, torchvision\nprint(torchvision.loaded)", site, tmp_path / "cache")
    assert r.returncode == 0 and r.stdout.strip() == "True" and "uninstall" not in r.stderr


def test_the_installed_environment_imports_model_classes_and_vllm() -> None:
    """The CI check the installs answer to: transformers' model classes and, where vLLM is
    installed (always under CI), ``vllm.LLM``."""
    code = "import agents\nfrom transformers import Qwen2ForCausalLM, LlamaForCausalLM\n"
    try:
        require_vllm()
        code += "from vllm import LLM\n"
    except pytest.skip.Exception:
        pass
    r = subprocess.run([sys.executable, "-c", code + "print('ok')"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
