"""An LLM as a judge: a rubric criterion (:mod:`envfactory.evaluation.rubric`) that asks any
policy backend a yes/no question about a finished episode.

``LLMJudge(policy, "Did the agent confirm before cancelling?")`` is a
:class:`~envfactory.evaluation.rubric.Criterion`: the judge model sees the task, the agent's
conversation (compact: tool calls and their results) and the final answer, and answers yes
(score 1) or no (score 0). A reply that is neither is that criterion's error (score 0, the
reply quoted in the grade's ``errors``). It never replaces the sparse task reward by itself.
"""

from __future__ import annotations

import json
import zlib
from envfactory.evaluation.rubric import Criterion, Finished

from agents.policies.policy import Policy

__all__ = ["LLMJudge", "JUDGE_PROMPT"]

JUDGE_PROMPT = (
    "You grade an AI agent's work on a task. Read the task, what the agent did and its final answer, "
    "then answer the question with one word: yes or no."
)


def _compact(finished: Finished, limit: int) -> str:
    lines = []
    for agent, messages in finished.transcripts.items():
        for m in messages[2:]:  # after the system prompt and the instruction
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or ():
                    lines.append(f"{agent} calls {c['function']['name']}({c['function']['arguments']})")
                if m.get("content") and not m.get("tool_calls"):
                    lines.append(f"{agent} says: {m['content']}")
            elif m["role"] == "tool":
                lines.append(f"  -> {m.get('content') or ''}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2:]


def LLMJudge(policy: Policy, question: str, *, name: str = "judge", weight: float = 1.0, max_new_tokens: int = 4,
             max_chars: int = 4000, seed: int = 0) -> Criterion:
    """A criterion scored by ``policy`` answering ``question`` (yes: 1, no: 0) about the episode.

    Args:
        policy: Any backend whose tokenizer has a chat template (HF, vLLM, OpenAI-compatible).
        question: A yes/no question about what the agent did, e.g. "Did the agent ask before acting?".
        max_chars: The longest conversation shown (its middle is cut beyond).
        seed: Greedy decoding makes the verdict deterministic; the seed serves sampling backends.
    """
    if not question.strip():
        raise ValueError("LLMJudge needs a question")

    def score(f: Finished) -> float:
        messages = [
            {"role": "system", "content": JUDGE_PROMPT},
            {"role": "user", "content": f"Task: {f.task.instruction}\n\nWhat the agent did:\n"
                                        f"{_compact(f, max_chars) or '(nothing)'}\n\nFinal answer: "
                                        f"{json.dumps(f.answer or '')}\n\nQuestion: {question}\nAnswer yes or no."},
        ]
        tok = policy.tokenizer
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding (a mapping, not a dict)
            ids = ids["input_ids"]
        gen = policy.generate([list(ids)], max_new_tokens=max_new_tokens, temperature=0.0,
                              seed=zlib.crc32(f"{seed}/{question}".encode()) & 0x7FFFFFFF)[0]
        tokens = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        reply = tok.decode(tokens, skip_special_tokens=True).strip().lower()
        word = reply.lstrip("\"'*`( ").split(maxsplit=1)[0].strip(".,!:;\"'*`)") if reply.strip() else ""
        if word in ("yes", "no"):
            return 1.0 if word == "yes" else 0.0
        raise ValueError(f"the judge answered neither yes nor no: {reply[:80]!r}")

    return Criterion(name, score, weight)
