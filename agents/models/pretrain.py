"""Language-model pretraining of the embedded tiny model on conversations synthesised
from the environments' own tool graphs (issue 13: "a tiny model that reads instructions").

The random tiny model (:func:`agents.models.tiny.build_tiny_model`) neither reads
instructions nor tool results. This stage gives it a prior before any SFT or RL:
plain next-token training (AdamW) on a corpus of *plays* of every single-agent
environment's non-evaluation tasks, each rendered with the tiny tokenizer's own chat
template exactly as a rollout renders it (system prompt with the tool schemas,
instruction, Hermes ``<tool_call>`` turns, ``<tool_response>`` turns, final answer), so
the text it learns from is what it later sees.

Plays (:func:`pretrain_corpus`), per task, each with the environment's *real* outputs:

* ``oracle``: the reference solution, then the oracle's answer;
* ``detour``: the reference solution with detours before some of its steps, then the
  answer. A detour is either the next reference call with one argument perturbed
  (another value that argument takes somewhere in the environment's tool graph) or a
  random call of any of the environment's tools with arguments drawn from that
  graph; the reference call follows it. So the model sees many (instruction, tool
  result, next call) patterns, errors included.

The *tool graph* of an environment is its tools and, per tool argument, the values
its non-evaluation reference solutions pass. Evaluation tasks (``spec.split(task) ==
"eval"``) are never played and never contribute values; :func:`check_no_eval`
asserts it on every corpus before training.

Packing (:func:`_shared_rows`). An episode's opening (system prompt and tool schemas,
~400-1200 tokens) is 80-90% of its tokens and the same for every task of an
environment, so plain packing spends most of its compute re-reading openings. A row
here is one environment's opening followed by several of its conversations, each
attending to the opening and to itself only, at the positions it has in its own
episode: each play is scored exactly as if alone (a test checks it) and the opening is
computed once per row. Measured on 2 cores: 1.7x the conversation tokens per second of
plain packing.

Size (:data:`PRETRAIN_MODEL`). The budget is ~3 minutes on 2 CPU cores. The random
build's size (hidden 256, 4 heads, 4.0M parameters) gets ~210 steps in that time and a
held-out loss of 1.61; hidden 128 with 2 heads (head dim 64 kept, 1.2M parameters, 5 MB)
gets 450 steps and 0.83, so the pretrained model has that size and its own seeded
initialisation (the tokenizer and chat template are the random build's).

:func:`pretrained_tiny_model` returns the
folder, cached next to the random build, keyed by a hash of the corpus text, the
pretraining config (size included), the random build (tokenizer), the seed and a format
version, and published with the same atomic rename. ``envfactory pretrain`` runs it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from envfactory.checks.scripted import random_value

__all__ = ["PRETRAIN_CONFIG", "PRETRAIN_MODEL", "Play", "pretrain_corpus", "corpus_hash", "check_no_eval", "heldout",
           "pretrained_tiny_model", "pretrain", "lm_loss"]

_FORMAT = 1  # bump when the corpus recipe or the training loop changes, to invalidate caches

PRETRAIN_MODEL: dict[str, Any] = {
    "hidden_size": 128,
    "num_attention_heads": 2,  # head dim 64, as the random build's
    "num_key_value_heads": 1,
    "intermediate_size": 352,
}
"""The pretrained model's size, as overrides of :data:`agents.models.tiny.TINY_CONFIG` (4 layers kept):
1.2M parameters (5 MB) instead of 4.0M (16 MB). In the same ~3 minutes on 2 cores it takes
twice as many steps as the random build's size and ends with a lower held-out loss (0.83
against 1.61); see the module docstring."""

PRETRAIN_CONFIG: dict[str, Any] = {
    "steps": 450,            # optimizer steps (about 0.36 s each on 2 cores)
    "batch": 1,              # rows per step
    "seq_len": 2048,         # positions per row: one opening (~400-1200 tokens) and the plays after it
    "lr": 6e-3,              # AdamW peak learning rate (linear warmup, cosine decay to a tenth)
    "warmup": 20,
    "weight_decay": 0.1,
    "betas": (0.9, 0.95),
    "grad_clip": 1.0,
    "detours": 2,            # detour plays per task (plus one oracle play)
    "detour_p": 0.4,         # chance of a detour before each reference step
    "heldout_share": 0.05,   # share of tasks kept out of training, for the held-out loss
    "heldout_tokens": 16384,  # positions of held-out plays scored before and after (rows of 2048)
    "model": PRETRAIN_MODEL,  # overrides of TINY_CONFIG ({}: the random build's size and weights)
    "envs": None,            # only these environments (default: the tokenizer's pinned tiny.CORPUS_ENVS)
}
"""The default pretraining recipe (all of it is part of the cache key): about 3 minutes on 2 CPU cores.
An optional key, absent here: ``"tokenizer"``, how the random build's tokenizer cuts words
(:data:`agents.models.tiny.TOKENIZERS`; absent: ``"qwen"``)."""


@dataclass(frozen=True)
class Play:
    """One synthesised conversation: which environment and task it plays, how, and its text."""

    env: str
    task_id: str
    split: str  # the task's split ("sft" or "rl"; never "eval")
    kind: str   # "oracle" or "detour"
    text: str   # rendered with the tiny model's chat template


# -- the corpus ------------------------------------------------------------------
def _single_agent_specs() -> list[Any]:
    import envfactory

    return [s for s in sorted(envfactory.specs(), key=lambda s: s.name) if not getattr(s, "multi_agent", False)]


def _tool_graph(spec: Any, tasks: list[Any]) -> dict[str, dict[str, list[Any]]]:
    """Per tool (``finish`` excluded), per argument: the values the given tasks' reference
    solutions pass it, in first-seen order (JSON-distinct)."""
    graph: dict[str, dict[str, list[Any]]] = {name: {} for name, t in spec.tools_of().items() if not t.finish}
    seen: set[tuple[str, str, str]] = set()
    for task in tasks:
        for c in task.solution:
            if c.name not in graph:
                continue
            for k, v in c.arguments.items():
                key = (c.name, k, json.dumps(v, sort_keys=True, default=str))
                if key not in seen:
                    seen.add(key)
                    graph[c.name].setdefault(k, []).append(v)
    return graph


def _typed_value(schema: dict[str, Any], rng: random.Random) -> Any:
    """A plausible value of ``schema``'s type: small numbers, short common words."""
    return random_value(schema, rng, ints=(0, 20), numbers=(0, 100),
                        text=lambda r: r.choice(["a", "x", "new", "main", "1"]))


def _arg_value(graph: dict[str, dict[str, list[Any]]], tool: str, arg: str, schema: dict[str, Any],
               rng: random.Random, avoid: Any = None) -> Any:
    pool = [v for v in graph.get(tool, {}).get(arg, []) if v != avoid]
    return rng.choice(pool) if pool else _typed_value(schema, rng)


def _random_call(spec: Any, graph: dict[str, dict[str, list[Any]]], rng: random.Random) -> Any:
    from envfactory.task import ToolCall

    tools = spec.tools_of()
    name = rng.choice(sorted(graph))
    params = tools[name].parameters
    props, required = params.get("properties", {}), set(params.get("required", []))
    args = {k: _arg_value(graph, name, k, s, rng) for k, s in props.items()
            if k in required or (k in graph[name] and rng.random() < 0.5)}
    return ToolCall(name, args)


def _perturbed(spec: Any, graph: dict[str, dict[str, list[Any]]], step: Any, rng: random.Random) -> Any:
    """``step`` with one argument replaced by another value from the tool graph (or a random call
    when ``step`` has no argument)."""
    from envfactory.task import ToolCall

    if not step.arguments or step.name not in graph:
        return _random_call(spec, graph, rng)
    k = rng.choice(sorted(step.arguments))
    schema = spec.tools_of()[step.name].parameters.get("properties", {}).get(k, {})
    return ToolCall(step.name, {**step.arguments, k: _arg_value(graph, step.name, k, schema, rng,
                                                                avoid=step.arguments[k])})


def _actions(spec: Any, graph: dict[str, dict[str, list[Any]]], task: Any, kind: str, rng: random.Random,
             detour_p: float) -> list[str]:
    from envfactory.checks.scripted import OraclePolicy

    oracle = OraclePolicy.actions(task)
    if kind == "oracle":
        return oracle
    out: list[str] = []
    for step, text in zip(task.solution, oracle):
        if rng.random() < detour_p:
            detour = _perturbed(spec, graph, step, rng) if rng.random() < 0.5 else _random_call(spec, graph, rng)
            out.append(detour.to_hermes())
        out.append(text)
    return out + oracle[len(task.solution):]


def pretrain_corpus(tokenizer: Any = None, *, detours: int | None = None, detour_p: float | None = None,
                    envs: list[str] | None = None) -> list[Play]:
    """The pinned corpus environments' (:data:`agents.models.tiny.CORPUS_ENVS`) non-evaluation tasks, played once by the oracle and
    ``detours`` times with detours (see the module docstring), rendered with ``tokenizer``'s
    chat template (default: the tiny model's). Deterministic: the same registry gives the same
    plays in the same order.

    Args:
        tokenizer: Anything with ``apply_chat_template``; default: the tiny build's tokenizer.
        envs: Only these environments (default: :data:`agents.models.tiny.CORPUS_ENVS`; any registered
            single-agent environment may be named).
    """
    import envfactory

    if tokenizer is None:
        from transformers import AutoTokenizer

        from agents.models.tiny import build_tiny_model

        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    detours = PRETRAIN_CONFIG["detours"] if detours is None else detours
    detour_p = PRETRAIN_CONFIG["detour_p"] if detour_p is None else detour_p
    specs = _single_agent_specs()
    unknown = sorted(set(envs or ()) - {s.name for s in specs})
    if unknown:
        raise ValueError(f"no single-agent environment named {', '.join(unknown)}")
    if envs is None:
        from agents.models.tiny import CORPUS_ENVS

        envs = list(CORPUS_ENVS)
    plays: list[Play] = []
    for spec in specs:
        if spec.name not in envs:
            continue
        tasks = [t for t in spec.get_tasks() if spec.split(t) != "eval"]  # evaluation tasks: never
        graph = _tool_graph(spec, tasks)
        longest = max(len(t.solution) for t in tasks) if tasks else 0
        env = envfactory.make(spec.name, max_turns=max(spec.max_turns, 2 * longest + 2))
        schemas = env.tool_schemas()
        try:
            for task in tasks:
                for i in range(1 + detours):
                    kind = "oracle" if i == 0 else "detour"
                    rng = random.Random(zlib.crc32(f"{spec.name}/{task.id}/{i}".encode()))
                    env.reset(task)
                    for action in _actions(spec, graph, task, kind, rng, detour_p):
                        if env.done:
                            break
                        env.step(action)
                    text = tokenizer.apply_chat_template(env.transcript(), tools=schemas, tokenize=False)
                    plays.append(Play(spec.name, task.id, spec.split(task), kind, text))
        finally:
            env.close()
    return plays


def corpus_hash(plays: list[Play]) -> str:
    """A hash of the corpus: every play's environment, task, kind and text, in order."""
    h = hashlib.sha256()
    for p in plays:
        h.update(f"{p.env}\0{p.task_id}\0{p.kind}\0".encode())
        h.update(p.text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def check_no_eval(plays: list[Play]) -> None:
    """Raise ``ValueError`` if an evaluation task is in the corpus: no play is of a task whose split is
    ``eval``, and no play's text holds an evaluation task's instruction as a user turn, unless
    a non-evaluation task of the same environment has the very same instruction. (A single
    step of a compositional task may read like another task's whole instruction; only the
    instruction as a turn of its own counts.)"""
    import envfactory

    by_env: dict[str, list[str]] = {}
    for p in plays:
        spec = envfactory.spec(p.env)
        split = spec.split(p.task_id)
        if split == "eval" or p.split != split:
            raise ValueError(f"{p.env}/{p.task_id} is an evaluation task (or its split changed): not in a corpus")
        by_env.setdefault(p.env, []).append(p.text)
    for name, texts in by_env.items():
        spec = envfactory.spec(name)
        shared = {t.instruction for t in spec.get_tasks() if spec.split(t) != "eval"}
        private = [t for t in spec.tasks_in("eval") if t.instruction not in shared]
        for text in texts:
            for t in private:
                turn = f"<|im_start|>user\n{t.instruction}<|im_end|>"
                if turn in text:
                    raise ValueError(f"{name}/{t.id}: an evaluation instruction is in the corpus")


def heldout(play: Play, share: float) -> bool:
    """Whether ``play``'s task is held out of training (a stable hash of environment and task)."""
    return zlib.crc32(f"{play.env}/{play.task_id}".encode()) % 10_000 < share * 10_000


# -- training --------------------------------------------------------------------
_OPENING_END = "<|im_start|>user\n"  # the first user turn: what follows the system prompt and tools


def _split_opening(text: str) -> tuple[str, str]:
    """``(system turn with the tools, the rest)`` of a play's text."""
    i = text.index(_OPENING_END)
    return text[:i], text[i:]


@dataclass
class _Rows:
    """Rows of ids for the model: ``seg`` says which segment each position is in (-1 padding,
    0 the shared opening, k >= 1 the k-th play's conversation), ``labels`` the next id (-100: none)."""

    ids: Any
    pos: Any
    seg: Any
    labels: Any

    def batch(self, i: int, n: int) -> tuple[Any, Any, Any, Any]:
        """Ids, 4-D attention mask, position ids and labels of rows ``i .. i+n``."""
        import torch

        seg = self.seg[i:i + n]
        T = seg.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=seg.device).tril()
        same = (seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0)
        mask = causal & same & (seg[:, None, :] >= 0)
        mask |= torch.eye(T, dtype=torch.bool, device=seg.device)  # padding attends to itself (no empty softmax rows)
        return self.ids[i:i + n], mask[:, None], self.pos[i:i + n], self.labels[i:i + n]


_ASSISTANT = "<|im_start|>assistant\n"
_TURN_END = "<|im_end|>"


def assistant_mask(encode: Callable[[str], list[int]], rest: str) -> tuple[list[int], list[int]]:
    """Ids of a conversation (the text after the opening) and, per id, 1 when it is the model's
    own (an assistant turn's content and its closing ``<|im_end|>``), else 0. Encoded piece by
    piece at the chat markup, whose special tokens end every piece, so the ids are those of the
    whole text."""
    ids: list[int] = []
    mask: list[int] = []
    pos = 0
    while pos < len(rest):
        a = rest.find(_ASSISTANT, pos)
        if a < 0:
            piece = encode(rest[pos:])
            ids += piece
            mask += [0] * len(piece)
            break
        head = encode(rest[pos:a + len(_ASSISTANT)])
        end = rest.find(_TURN_END, a + len(_ASSISTANT))
        stop = len(rest) if end < 0 else end + len(_TURN_END)
        body = encode(rest[a + len(_ASSISTANT):stop])
        ids += head + body
        mask += [0] * len(head) + [1] * len(body)
        pos = stop
    return ids, mask


def _shared_rows(plays: list[Play], encode: Callable[[str], list[int]], n_rows: int, seq_len: int, pad: int,
                 rng: random.Random, assistant_only: bool = False) -> _Rows:
    """``n_rows`` rows of ``seq_len`` positions, each one environment's opening (system prompt
    with its tool schemas) followed by conversations of that environment's plays, every
    conversation attending only to the opening and to itself, with the positions it has in
    its own episode: one forward pass scores each play exactly as the model sees it in a
    rollout, while the opening (most of an episode's tokens) is computed once per row
    (``assistant_only``: only the model's own tokens are scored, as in SFT). A row's
    environment is drawn in proportion to its number of plays; plays are taken in a
    shuffled order, reshuffled whenever an environment's run out. The last conversation of a
    row may be cut."""
    import torch

    by_env: dict[str, list[Play]] = {}
    for p in plays:
        by_env.setdefault(p.env, []).append(p)
    names = sorted(by_env)
    shares = [len(by_env[n]) for n in names]
    queues: dict[str, list[Play]] = {n: [] for n in names}
    openings: dict[str, list[int]] = {}
    ids = torch.full((n_rows, seq_len), pad, dtype=torch.long)
    pos = torch.zeros((n_rows, seq_len), dtype=torch.long)
    seg = torch.full((n_rows, seq_len), -1, dtype=torch.long)
    labels = torch.full((n_rows, seq_len), -100, dtype=torch.long)
    for r in range(n_rows):
        env = rng.choices(names, shares)[0]
        first = True
        n, k = 0, 0
        while n < seq_len:
            if not queues[env]:
                queues[env] = list(by_env[env])
                rng.shuffle(queues[env])
            play = queues[env].pop()
            opening, rest = _split_opening(play.text)
            if first:
                o = openings.setdefault(env, encode(opening))
                if len(o) + 8 > seq_len:
                    raise ValueError(f"{env}: its opening ({len(o)} tokens) does not fit seq_len {seq_len}")
                ids[r, :len(o)] = torch.tensor(o)
                pos[r, :len(o)] = torch.arange(len(o))
                seg[r, :len(o)] = 0
                if not assistant_only:
                    labels[r, :len(o) - 1] = ids[r, 1:len(o)]
                n, first = len(o), False
            P = len(openings[env])
            if assistant_only:
                conv, own = assistant_mask(encode, rest)
            else:
                conv, own = encode(rest), None
            if k >= 1 and n + len(conv) // 2 > seq_len:  # most of it would be cut: keep it for a later row
                queues[env].append(play)
                break
            conv = conv[:seq_len - n]
            k += 1
            t = torch.tensor(conv)
            ids[r, n:n + len(conv)] = t
            pos[r, n:n + len(conv)] = torch.arange(P, P + len(conv))
            seg[r, n:n + len(conv)] = k
            labels[r, n:n + len(conv) - 1] = t[1:]
            if k == 1:
                labels[r, P - 1] = t[0]  # the opening's last position predicts the conversation's start
            if own is not None:  # score only the model's own ids (the position before each predicts it)
                keep = torch.tensor(own[1:len(conv)], dtype=torch.bool)
                labels[r, n:n + len(conv) - 1][~keep] = -100
                if k == 1 and not own[0]:
                    labels[r, P - 1] = -100
            n += len(conv)
    return _Rows(ids, pos, seg, labels)


def rows_on(rows: _Rows, device: str) -> _Rows:
    """``rows`` with their tensors on ``device`` (the same object on the CPU)."""
    if str(device) == "cpu":
        return rows
    return _Rows(rows.ids.to(device), rows.pos.to(device), rows.seg.to(device), rows.labels.to(device))


def _loss_sums(model: Any, rows: _Rows, i: int, n: int, scored_only: bool = False) -> tuple[Any, Any]:
    """Next-token losses at every position of rows ``i .. i+n`` and where they count (labels != -100).

    ``scored_only``: run the output layer only at the positions that count (0 elsewhere): the same
    losses there, up to float rounding, without the vocabulary-wide logits of every other position
    (a quarter of a small model's forward pass when a big vocabulary meets SFT's few scored tokens)."""
    import torch

    ids, mask, pos, labels = rows.batch(i, n)
    valid = labels != -100
    if scored_only:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        losses = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
        logits = model.get_output_embeddings()(hidden[valid])
        losses[valid] = torch.nn.functional.cross_entropy(logits.float(), labels[valid], reduction="none")
        return losses, valid
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                               reduction="none").view_as(labels)
    return losses, valid


def lm_loss(model: Any, rows: _Rows, batch: int = 2) -> tuple[float, float]:
    """Mean next-token loss of ``model`` over ``rows`` (no gradient): over every scored position,
    and over the conversations' positions alone (without the environments' openings)."""
    import torch

    was = model.training
    model.eval()
    tot = conv = 0.0
    n_tot = n_conv = 0
    with torch.no_grad():
        for i in range(0, rows.ids.shape[0], batch):
            losses, valid = _loss_sums(model, rows, i, batch)
            in_conv = valid & (rows.seg[i:i + batch] > 0)
            tot += float(losses[valid].sum())
            n_tot += int(valid.sum())
            conv += float(losses[in_conv].sum())
            n_conv += int(in_conv.sum())
    model.train(was)
    return tot / max(1, n_tot), conv / max(1, n_conv)


def _key(base: str, chash: str, cfg: dict[str, Any], seed: int) -> str:
    blob = json.dumps({"format": _FORMAT, "base": os.path.basename(base), "corpus": chash, "config": cfg,
                       "seed": seed}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _train(dest: Path, base: str, plays: list[Play], cfg: dict[str, Any], seed: int,
           log: Callable[[str], None] | None, device: str = "cpu") -> dict[str, Any]:
    import torch

    from agents.metrics import progress

    bar = log is None  # without a log, a tqdm bar on stderr when it is a terminal (minutes of silence otherwise)
    log = log or (lambda m: None)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from agents.models.tiny import TINY_CONFIG

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tok = AutoTokenizer.from_pretrained(base)
        arch = {**TINY_CONFIG, **cfg["model"]}
        if cfg["model"]:  # another size than the random build's: a fresh seeded initialisation of it
            config = AutoConfig.from_pretrained(base)
            for k, v in cfg["model"].items():
                setattr(config, k, v)
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
            model.generation_config = GenerationConfig.from_pretrained(base)
        else:  # the random build itself
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
        pad = tok.convert_tokens_to_ids("<|endoftext|>")

        def encode(text: str) -> list[int]:
            return tok(text, add_special_tokens=False)["input_ids"]

        held = [p for p in plays if heldout(p, cfg["heldout_share"])]
        train = [p for p in plays if not heldout(p, cfg["heldout_share"])]
        steps, batch, seq_len = cfg["steps"], cfg["batch"], cfg["seq_len"]
        # the held-out slice: the same for every seed, each play scored as a rollout sees it
        held_rows = _shared_rows(held, encode, max(1, cfg["heldout_tokens"] // 2048), 2048, pad, random.Random(0))
        rows = _shared_rows(train, encode, steps * batch, seq_len, pad, random.Random(seed))
        model.to(device)
        held_rows, rows = rows_on(held_rows, device), rows_on(rows, device)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg["lr"], betas=tuple(cfg["betas"]))

        def lr_at(step: int) -> float:  # linear warmup, cosine decay to a tenth
            if step < cfg["warmup"]:
                return cfg["lr"] * (step + 1) / cfg["warmup"]
            frac = (step - cfg["warmup"]) / max(1, steps - cfg["warmup"])
            return cfg["lr"] * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))

        before = lm_loss(model, held_rows)
        log(f"pretrain: {len(train)} training plays, {len(held)} held out; held-out loss {before[0]:.3f} "
            f"(conversations {before[1]:.3f}); {steps} steps of {batch}x{seq_len} positions "
            f"({time.perf_counter() - t0:.0f}s)")
        model.train()
        train_losses = []
        for step in range(steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            losses, valid = _loss_sums(model, rows, step * batch, batch)
            loss = losses[valid].mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            train_losses.append(float(loss.detach()))
            if bar:
                progress("pretrain", step + 1, steps, t0, loss=train_losses[-1])
            if (step + 1) % max(1, steps // 10) == 0 or step == steps - 1:
                recent = train_losses[-10:]
                log(f"pretrain: step {step + 1}/{steps} loss {sum(recent) / len(recent):.3f} "
                    f"({time.perf_counter() - t0:.0f}s)")
        after = lm_loss(model, held_rows)
        model.eval()
        model.to("cpu")
        for f in Path(base).iterdir():
            if f.is_file() and f.name != "model.safetensors":
                shutil.copy(f, dest / f.name)
        model.save_pretrained(dest, safe_serialization=True)
        info = json.loads((Path(base) / "envfactory-tiny.json").read_text())
        info["config"] = arch
        seconds = round(time.perf_counter() - t0, 1)
        info["pretrain"] = {
            "format": _FORMAT, "seed": seed, "config": cfg, "base": os.path.basename(base),
            "corpus_hash": corpus_hash(plays), "plays": len(plays), "train_plays": len(train),
            "heldout_plays": len(held), "heldout_tokens": int((held_rows.labels != -100).sum()),
            "train_tokens": int((rows.labels != -100).sum()),
            "loss_before": round(before[0], 4), "loss_after": round(after[0], 4),
            "conversation_loss_before": round(before[1], 4), "conversation_loss_after": round(after[1], 4),
            "train_loss_first": round(train_losses[0], 4), "train_loss_last": round(train_losses[-1], 4),
            "seconds": seconds, "torch": torch.__version__, "device": str(device),
        }
        (dest / "envfactory-tiny.json").write_text(json.dumps(info, indent=2, default=list))
        log(f"pretrain: held-out loss {before[0]:.3f} -> {after[0]:.3f} (conversations {before[1]:.3f} -> "
            f"{after[1]:.3f}) in {seconds}s")
        return info["pretrain"]
    finally:
        torch.set_num_threads(threads)


def pretrain(seed: int = 0, steps: int | None = None, cache_dir: str | os.PathLike[str] | None = None, *,
             config: dict[str, Any] | None = None, log: Callable[[str], None] | None = None,
             device: str = "cpu") -> dict[str, Any]:
    """Pretrain (or reuse from the cache) the tiny model of ``seed``; a report of it.

    ``log``: called with a progress line every tenth of the run (without one, a tqdm bar shows
    the steps on stderr when it is a terminal). ``device``: where it trains (``"cuda"`` on a
    GPU machine); the saved model is the same folder either way (the cache key does not hold
    the device: a checkpoint trained on a GPU differs from the CPU one by floating-point order
    only, and is reused on the CPU).

    Returns:
        ``{"path", "corpus_hash", "loss_before", "loss_after", "seconds", "cached", ...}``: the
        losses are on the held-out slice, ``seconds`` the training run's own time (also
        when cached), plus ``elapsed`` (this call's time).
    """
    from transformers import AutoTokenizer

    from agents.models.tiny import TINY_CONFIG, build_tiny_model, cache_root, publish_folder

    t0 = time.perf_counter()
    cfg = {**PRETRAIN_CONFIG, **(config or {})}
    if steps is not None:
        cfg["steps"] = int(steps)
    if cfg["steps"] < 1:
        raise ValueError("steps must be at least 1")
    arch = {**TINY_CONFIG, **cfg["model"]}
    if arch["hidden_size"] // arch["num_attention_heads"] != 64:
        raise ValueError("the tiny model keeps head dim 64 (hidden_size / num_attention_heads)")
    cfg["betas"] = list(cfg["betas"])
    # the tokenizer chooses the random build, and the key holds the build's folder
    base = build_tiny_model(cache_dir, seed=seed, tokenizer=cfg.pop("tokenizer", "qwen"))
    plays = pretrain_corpus(AutoTokenizer.from_pretrained(base), detours=cfg["detours"], detour_p=cfg["detour_p"],
                           envs=cfg.get("envs"))
    check_no_eval(plays)
    chash = corpus_hash(plays)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    dest = root / f"tiny-qwen2-pretrained-{_key(base, chash, cfg, seed)}"
    marker = dest / "envfactory-tiny.json"
    built: list[bool] = []  # this call trained it (not the cache, nor another process it waited for)
    if not marker.exists():
        publish_folder(dest, marker.name, lambda tmp: (built.append(True), _train(tmp, base, plays, cfg, seed, log,
                                                                                  device)),
                       waiting=None if log is None else
                       lambda: log(f"pretrain: another process is building {dest.name}; waiting for it"))
    cached = not built
    info = json.loads(marker.read_text())["pretrain"]
    return {"path": str(dest), "cached": cached, "elapsed": round(time.perf_counter() - t0, 1), **info}


def pretrained_tiny_model(seed: int = 0, steps: int | None = None,
                          cache_dir: str | os.PathLike[str] | None = None, *,
                          log: Callable[[str], None] | None = None, device: str = "cpu",
                          tokenizer: str = "qwen") -> str:
    """The tiny model of ``seed`` after language-model pretraining (:func:`pretrain`); its folder.

    ``steps`` defaults to ``PRETRAIN_CONFIG["steps"]``; ``log`` and ``device`` as for
    :func:`pretrain`; ``tokenizer``: :data:`agents.models.tiny.TOKENIZERS`. The folder loads with
    ``AutoModelForCausalLM`` / ``AutoTokenizer`` offline, like the random build's."""
    return pretrain(seed=seed, steps=steps, cache_dir=cache_dir, config={"tokenizer": tokenizer}, log=log,
                    device=device)["path"]
