"""OpenAIPolicy: any OpenAI-compatible server over httpx.

With a vLLM-style server the policy stays token-in/token-out: it posts the
prompt's token ids to ``/v1/completions`` and asks for the sampled ids
(``return_token_ids``), their logprobs and the top-20 alternatives
(``return_tokens_as_token_ids``), and the cached prompt tokens
(``usage.prompt_tokens_details``). Start vLLM so its numbers match the other
backends::

    vllm serve PATH --logprobs-mode processed_logprobs --max-logprobs 20 \\
        --enable-prefix-caching --enable-prompt-tokens-details --dtype float32

Servers that accept only text (``mode="text"``, or detected with
``mode="auto"``) get the prompt decoded to text and answer text; generations
then carry ``text`` and no ids or logprobs: fine for evaluation, not for
training (rollouts mark such trajectories ``token_exact=False``).

:class:`OpenAIChat` is the text-only client of ``/v1/chat/completions`` (messages in, the
assistant's text out, no tokenizer): what a chat-only endpoint can serve, e.g. the simulated
user of :class:`agents.policies.users.LLMUser`.
"""

from __future__ import annotations

from typing import Any

import httpx

from agents.policies.policy import ENTROPY_TOP_K, Generation, Policy, default_stop_ids, entropy_from_top_logprobs

__all__ = ["OpenAIChat", "OpenAIPolicy", "ServerError"]


class ServerError(RuntimeError):
    """The server refused or failed a request; the message carries its answer."""


def _tid(key: str) -> int:
    """``"token_id:123"`` -> 123 (vLLM's ``return_tokens_as_token_ids`` form)."""
    if not key.startswith("token_id:"):
        raise ValueError(f"expected 'token_id:N' (return_tokens_as_token_ids), got {key!r}")
    return int(key[len("token_id:"):])


class OpenAIChat:
    """A chat model behind an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Messages in, the assistant's text out: no tokenizer, no token ids, so any chat-only server
    (a hosted API, a vLLM or llama.cpp server, :mod:`agents.harness.endpoint`) can serve it.

    Args:
        base_url: The server root, its ``/v1``, or the full ``.../chat/completions`` URL.
        model: The model name sent with each request.
        api_key: Sent as a bearer token when given.
        timeout: Seconds per request.
        transport: An httpx transport (tests answer in-process with ``httpx.MockTransport``).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        base = base_url.rstrip("/")
        if base.endswith("/chat/completions"):
            self.url = base
        else:
            self.url = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)

    def complete(self, messages: list[dict[str, Any]], *, max_tokens: int = 256, temperature: float = 0.0,
                 seed: int | None = None) -> str:
        """The assistant's reply to ``messages`` (OpenAI chat format), as text.

        Raises:
            ServerError: the server cannot be reached, refused the request, or answered
                something that is not a chat completion with text; the message says which.
        """
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                                "temperature": temperature}
        if seed is not None:
            body["seed"] = seed
        try:
            r = self._client.post(self.url, json=body)
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise ServerError(f"{self.url} answered {r.status_code}: {r.text[:500]}")
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ServerError(f"{self.url} answered something that is not a chat completion: "
                              f"{r.text[:300]}") from exc
        if not isinstance(content, str):
            raise ServerError(f"{self.url} answered a chat completion without text: {r.text[:300]}")
        return content

    def close(self) -> None:
        self._client.close()


class OpenAIPolicy(Policy):
    """A model behind an OpenAI-compatible HTTP API.

    Args:
        base_url: The server root or its ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        model: The served model name.
        tokenizer: A tokenizer or a path for ``AutoTokenizer`` (default: ``model``,
            which for a local vLLM server is usually the model folder).
        api_key: Sent as a bearer token when given.
        mode: ``"tokens"`` (vLLM-style), ``"text"``, or ``"auto"`` (tokens, falling
            back to text when the server rejects token prompts).
        timeout: Seconds per request.
        concurrency: Prompts of a batch in flight at once (one request each).
    """

    def __init__(self, base_url: str, model: str, *, tokenizer: Any = None, api_key: str | None = None,
                 mode: str = "auto", timeout: float = 300.0, concurrency: int = 16) -> None:
        if mode not in ("auto", "tokens", "text"):
            raise ValueError(f"mode must be 'auto', 'tokens' or 'text', not {mode!r}")
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = model
        self.mode = mode
        if tokenizer is None or isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer or model)
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers,
                                    limits=httpx.Limits(max_connections=concurrency))
        self.concurrency = concurrency
        self.prefix_tokens_reused = 0

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_token_ids: list[int] | None = None,
                 seed: int | None = None) -> list[Generation]:
        from concurrent.futures import ThreadPoolExecutor

        stops = list(default_stop_ids(self.tokenizer) if stop_token_ids is None else stop_token_ids)
        jobs = [(p, None if seed is None else (int(seed) * 1_000_003 + i) % (2**31)) for i, p in enumerate(prompts)]
        run = lambda job: self._one(job[0], max_new_tokens, temperature, top_p, stops, job[1])  # noqa: E731
        if len(jobs) <= 1:
            return [run(j) for j in jobs]
        with ThreadPoolExecutor(min(self.concurrency, len(jobs))) as pool:
            return list(pool.map(run, jobs))

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = self._client.post(self.base_url + "/completions", json=body)
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.base_url}/completions: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise ServerError(f"{self.base_url}/completions answered {r.status_code}: {r.text[:500]}")
        return r.json()

    def _one(self, prompt: list[int], max_new: int, temperature: float, top_p: float, stops: list[int],
             seed: int | None) -> Generation:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_new, "temperature": temperature,
                                "top_p": top_p}
        if seed is not None:
            body["seed"] = seed
        if self.mode in ("auto", "tokens"):
            tok_body = {**body, "prompt": list(prompt), "logprobs": ENTROPY_TOP_K, "return_token_ids": True,
                        "return_tokens_as_token_ids": True, "stop_token_ids": stops, "ignore_eos": True,
                        "skip_special_tokens": False}
            try:
                return self._parse_tokens(prompt, self._post(tok_body), stops)
            except (ServerError, KeyError, ValueError, TypeError):
                if self.mode == "tokens":
                    raise
                self.mode = "text"  # this server cannot do token-in/token-out
        text_prompt = self.tokenizer.decode(prompt, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        stop_strs = [self.tokenizer.decode([s], skip_special_tokens=False) for s in stops]
        data = self._post({**body, "prompt": text_prompt, "stop": stop_strs[:4]})
        choice = data["choices"][0]
        self._count(len(prompt), data)
        finish = "stop" if choice.get("finish_reason") == "stop" else "length"
        return Generation([], [], [], finish, text=choice.get("text") or "")

    def _count(self, n_prompt: int, data: dict[str, Any]) -> None:
        details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
        self._prefill += n_prompt - cached
        self.prefix_tokens_reused += cached

    def _parse_tokens(self, prompt: list[int], data: dict[str, Any], stops: list[int]) -> Generation:
        choice = data["choices"][0]
        lp = choice["logprobs"]
        ids = choice.get("token_ids")
        if ids is None:  # older servers: the ids are only in the logprob tokens
            ids = [_tid(t) for t in lp["tokens"]]
        ids = [int(i) for i in ids]
        logprobs = [float(x) for x in lp["token_logprobs"]]
        if len(logprobs) != len(ids):
            raise ValueError("the server's logprobs do not cover every sampled token")
        ents = [entropy_from_top_logprobs(sorted(top.values(), reverse=True)[:ENTROPY_TOP_K], self.vocab_size)
                for top in lp.get("top_logprobs") or [{}] * len(ids)]
        self._count(len(prompt), data)
        finish = "stop" if ids and ids[-1] in set(stops) and choice.get("finish_reason") == "stop" else "length"
        return Generation(ids, logprobs, ents, finish)

    # -- weights --------------------------------------------------------------
    def load_weights(self, state_dict_items: Any, *, folder: str | None = None) -> int:
        """Push trained weights to the server: ``(name, tensor)`` pairs with HF parameter names.

        The mechanism (vLLM): the tensors are written as one safetensors file into
        ``folder`` (default: a private temporary folder, which the server must be able to
        read: same machine or shared storage), then ``POST /collective_rpc`` has every worker
        ``reload_weights(weights_path=folder)`` in place (checkpoint format: HF names are
        mapped, fused and repacked as at load time) and ``POST /reset_prefix_cache`` drops
        keys/values computed with the old weights. Both endpoints exist when the server runs
        with ``VLLM_SERVER_DEV_MODE=1`` (:func:`agents.policies.vllm_server.vllm_server` sets it).
        Returns the number of tensors pushed.

        Raises:
            ServerError: the server refused (e.g. not in dev mode: 404) or failed.
        """
        import os
        import tempfile

        from safetensors.torch import save_file

        items = {n: t.detach().to("cpu").contiguous().clone() for n, t in state_dict_items}  # tied: own copies
        if folder is None:
            if getattr(self, "_weights_dir", None) is None:
                self._weights_dir = tempfile.mkdtemp(prefix="envf-push-")
            folder = self._weights_dir
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "model.safetensors")
        save_file(items, path + ".tmp")
        os.replace(path + ".tmp", path)
        root = self.base_url[: -len("/v1")]
        for url, body in ((root + "/collective_rpc", {"method": "reload_weights",
                                                      "kwargs": {"weights_path": folder}}),
                          (root + "/reset_prefix_cache", None)):
            try:
                r = self._client.post(url, json=body)
            except httpx.HTTPError as exc:
                raise ServerError(f"{url}: {type(exc).__name__}: {exc}") from exc
            if r.status_code == 404:
                raise ServerError(f"{url} answered 404: start the vLLM server with VLLM_SERVER_DEV_MODE=1 "
                                  "(agents.policies.vllm_server does) to receive weights")
            if r.status_code != 200:
                raise ServerError(f"{url} answered {r.status_code}: {r.text[:500]}")
        return len(items)

    def close(self) -> None:
        self._client.close()
