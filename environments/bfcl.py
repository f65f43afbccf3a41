"""BFCL v4 multi-turn (the Berkeley Function Calling Leaderboard) as envfactory environments.

Built from the installed ``bfcl-eval`` package (``pip install --no-deps bfcl-eval==2026.3.23
mpmath``): its eight classes, unchanged, through :func:`~envfactory.factory.from_class.from_class`
(one :class:`~envfactory.factory.from_class.Service` each), its entries, its gold answers and its
function docs. One environment per category, 200 conversation tasks each (task id = the entry id):

===============================  =====================================================
``BFCLMultiTurnBase-v0``         ``BFCL_v4_multi_turn_base``
``BFCLMultiTurnMissParam-v0``    ``BFCL_v4_multi_turn_miss_param``
``BFCLMultiTurnMissFunc-v0``     ``BFCL_v4_multi_turn_miss_func``
``BFCLMultiTurnLongContext-v0``  ``BFCL_v4_multi_turn_long_context``
===============================  =====================================================

What BFCL does, done the same way:

* a task's initial state holds every class; those the entry involves are built as BFCL's execution
  builds them (``cls()``, then ``_load_scenario(initial_config[cls], long_context=...)``, not for
  the stateless ``MathAPI``), the others with an empty configuration, and their tools are never
  shown (``Conversation.hidden``: BFCL prompts an entry with its involved classes' functions only);
* tools: each class's public methods, described by BFCL's own function docs as its OpenAI
  function-calling handler converts them; arguments reach the method as the model sent them; a
  result reads as BFCL's execution renders it (a ``dict`` as ``json.dumps``, anything else
  ``str``; an exception as ``Error during execution: <message>``);
* each BFCL turn is a :class:`~envfactory.conversation.UserTurn`: its user message (a ``miss_func``
  turn that adds functions says BFCL's "I have updated some more functions you can choose from.
  What about now?"), its gold calls as the reference, the missed functions as the turn's ``tools``
  (hidden before it);
* scoring is BFCL's ``multi_turn_checker`` turn by turn: after each turn with gold calls, the model
  made a call in it (``"call"``), the involved instances' public attributes equal the gold's
  (``"state"``, compared with ``==`` through ``Conversation.state_view``: not the current
  directory, the random generators or a file's modification time, which BFCL leaves out), and
  each result of the turn's gold calls is among the model's results so far, as often
  (``"results"``). A turn without gold calls checks nothing when it ends: BFCL's runner does not
  call ``multi_turn_irrelevance_checker`` (2026.3.23 imports it and leaves it out); its calls
  still change the state the later turns are judged on. :func:`bfcl_spec` with
  ``irrelevance=True`` adds that check (``"no_call"``) for such turns.

:func:`decoded_calls` turns an episode into BFCL's decoded model result (per turn, per step, the
call strings) and :func:`bfcl_valid` judges it with BFCL's own checker, so any agent can be scored
both ways (``tests/test_bfcl.py`` plays five scripted agents through all 800 entries and asserts
the two verdicts agree; ``docs/bfcl.md`` has the table). ``envfactory eval`` reports BFCL's verdict
beside envfactory's success (``metadata["suite_judge"]``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import importlib.metadata
import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path
from typing import Any, Sequence

from envfactory import register
from envfactory.conversation import Conversation, UserTurn
from envfactory.definition import ToolEnvSpec
from envfactory.factory.from_class import Service, from_class
from envfactory.task import Task, ToolCall
from envfactory.tooling import Tool, ToolOutcome

__all__ = ["BFCL_VERSION", "CATEGORIES", "CLASSES", "READ_ONLY", "available", "entries", "ground_truth",
           "bfcl_class", "bfcl_render", "parse_call", "call_string", "bfcl_spec", "decoded_calls", "bfcl_valid",
           "same_instance", "PublicAttributes", "judge"]

BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release these environments were built and measured against."""

CATEGORIES: dict[str, str] = {
    "BFCLMultiTurnBase-v0": "base",
    "BFCLMultiTurnMissParam-v0": "miss_param",
    "BFCLMultiTurnMissFunc-v0": "miss_func",
    "BFCLMultiTurnLongContext-v0": "long_context",
}
"""Environment name -> BFCL category (``BFCL_v4_multi_turn_<category>.json``)."""

CLASSES = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
           "VehicleControlAPI")
"""The classes of the multi-turn categories, in BFCL's order."""

READ_ONLY: dict[str, frozenset[str]] = {
    "GorillaFileSystem": frozenset({"cat", "diff", "du", "find", "grep", "ls", "pwd", "sort", "tail", "wc"}),
    "MathAPI": frozenset({"absolute_value", "add", "divide", "imperial_si_conversion", "logarithm", "max_value",
                          "mean", "min_value", "multiply", "percentage", "power", "round_number",
                          "si_unit_conversion", "square_root", "standard_deviation", "subtract", "sum_values"}),
    "MessageAPI": frozenset({"get_message_stats", "get_user_id", "list_users", "message_get_login_status",
                             "search_messages", "view_messages_sent"}),
    "TwitterAPI": frozenset({"get_tweet", "get_tweet_comments", "get_user_stats", "get_user_tweets",
                             "list_all_following", "posting_get_login_status", "search_tweets"}),
    "TicketAPI": frozenset({"get_ticket", "get_user_tickets", "ticket_get_login_status"}),
    "TradingBot": frozenset({"filter_stocks_by_price", "get_account_info", "get_available_stocks",
                             "get_current_time", "get_order_details", "get_order_history", "get_stock_info",
                             "get_symbol_by_name", "get_transaction_history", "get_watchlist",
                             "notify_price_change", "trading_get_login_status"}),
    "TravelAPI": frozenset({"compute_exchange_rate", "contact_customer_support", "get_all_credit_cards",
                            "get_booking_history", "get_budget_fiscal_year", "get_credit_card_balance",
                            "get_nearest_airport_by_city", "list_all_airports", "retrieve_invoice",
                            "travel_get_login_status", "verify_traveler_information"}),
    "VehicleControlAPI": frozenset({"check_tire_pressure", "displayCarStatus", "display_log", "estimate_distance",
                                    "estimate_drive_feasibility_by_mileage", "find_nearest_tire_shop",
                                    "gallon_to_liter", "get_outside_temperature_from_weather_com",
                                    "get_zipcode_based_on_city", "liter_to_gallon"}),
}
"""The methods that never change their instance (no attribute, public or private): what the
tools' ``read_only`` marks say. The others write, some only privately: ``cd`` (the current
directory), ``get_flight_cost`` (the cost cache ``book_flight`` reads), ``get_current_speed`` and
``get_outside_temperature_from_google`` (a random generator). ``tests/test_bfcl.py`` checks the
table against every gold call of the four categories."""

STEP_LIMIT = 20
"""BFCL's ``MAXIMUM_STEP_LIMIT``: the model steps a turn may take before BFCL forces it to quit; an
episode may take that many per user turn (``max_turns`` is this times the category's most turns)."""


def available() -> bool:
    """Whether ``bfcl_eval`` is installed (without importing it)."""
    return importlib.util.find_spec("bfcl_eval") is not None


def _data() -> Path:
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@functools.lru_cache(maxsize=None)
def entries(category: str) -> tuple[dict[str, Any], ...]:
    """The entries of a category (``base``, ``miss_param``, ``miss_func``, ``long_context``) as BFCL
    ships them (do not change them: they are shared)."""
    return tuple(_lines(_data() / f"BFCL_v4_multi_turn_{category}.json"))


@functools.lru_cache(maxsize=None)
def ground_truth(category: str) -> dict[str, list[list[str]]]:
    """Entry id -> its gold calls, per turn, as BFCL's call strings."""
    return {a["id"]: a["ground_truth"] for a in _lines(_data() / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")}


@functools.lru_cache(maxsize=None)
def bfcl_class(name: str) -> type:
    """One of BFCL's classes, from the module its execution imports it from."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)


@functools.lru_cache(maxsize=None)
def _owners() -> dict[str, str]:
    """Method name -> the class it belongs to (no two of the eight classes share one)."""
    out: dict[str, str] = {}
    for name in CLASSES:
        for m, _ in inspect.getmembers(bfcl_class(name), inspect.isfunction):
            if not m.startswith("_"):
                out[m] = name
    return out


def bfcl_render(result: Any) -> str:
    """A result as BFCL's execution (``execute_multi_turn_func_call``) renders it."""
    if type(result) == str:  # noqa: E721 (BFCL's exact test, on purpose)
        return result
    if type(result) == dict:  # noqa: E721
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)


def parse_call(text: str) -> ToolCall:
    """A BFCL call string (``"cd(folder='document')"``, ``"sort('a.pdf')"``) as a tool call, its
    positional arguments named after the method's parameters."""
    node = ast.parse(text, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"not a BFCL call: {text!r}")
    name = node.func.id
    params = list(inspect.signature(getattr(bfcl_class(_owners()[name]), name)).parameters)[1:]
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return ToolCall(name, args)


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as BFCL's decoder writes a function-calling model's call
    (``convert_to_function_call``: ``name(k=repr(v),...)``)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


# -- the environment ---------------------------------------------------------------------------------
class _Load:
    """How BFCL's execution loads an instance: ``_load_scenario(config, long_context=...)``, except
    for a stateless class (picklable, unlike a closure)."""

    def __init__(self, long_context: bool) -> None:
        self.long_context = long_context

    def __call__(self, instance: Any, config: Any) -> None:
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        if type(instance).__name__ not in STATELESS_CLASSES:
            instance._load_scenario(config, long_context=self.long_context)


class PublicAttributes:
    """A conversation's ``state_view``: the public attributes (not starting with ``_``) of the
    instances held in the given state fields, by field: exactly what BFCL's ``state_checker``
    compares (``_compare_instances``), compared with ``==`` as it does."""

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = tuple(fields)

    def __call__(self, state: Any) -> dict[str, dict[str, Any]]:
        d = state.__dict__
        return {f: {a: v for a, v in vars(d[f]).items() if not a.startswith("_")} for f in self.fields}

    def __repr__(self) -> str:
        return f"PublicAttributes({list(self.fields)})"


def same_instance(final: Any, expected: Any) -> bool:
    """Whether two instances of a BFCL class are the same world as BFCL's state checker says
    (``_compare_instances``: the public attributes, by ``==``): the environment's ``compare``, which
    ``envfactory verify`` judges determinism, forks and snapshots by (a file's modification time is
    a clock reading, which BFCL does not compare)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import _compare_instances

    return bool(_compare_instances(final, expected)[0])


@dataclasses.dataclass(eq=False)
class _BFCLTool(Tool):
    """A class method as BFCL's execution calls it: the arguments as the model sent them (no
    validation: a wrong one fails as the method's call fails), an exception answered as
    ``Error during execution: <message>`` (an error outcome here)."""

    def invoke(self, state: Any, arguments: Any) -> ToolOutcome:
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return super().invoke(state, arguments)
        try:
            result = self.fn(state, **arguments)
        except Exception as exc:  # (BFCL: execution_results.append(f"Error during execution: {str(e)}"))
            return ToolOutcome(f"Error during execution: {exc}", False, "tool_error")
        return ToolOutcome(result if result.__class__ is str else bfcl_render(result), True)


def _openai_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc's parameters as its OpenAI function-calling handler sends them
    (``convert_to_tool`` with ``GORILLA_TO_OPENAPI``: ``model_handler.utils`` itself needs
    tree-sitter, which ``--no-deps`` leaves out, so its conversion is done here the same way)."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI as mapping

    def cast(properties: dict[str, Any]) -> dict[str, Any]:
        for key, value in properties.items():
            if "type" not in value:
                value["type"] = "string"
            else:
                var_type = value["type"]
                if var_type == "float":
                    value["format"] = "float"
                    value["description"] += " This is a float type value."
                value["type"] = mapping.get(var_type, "string")
            if value["type"] in ("array", "object"):
                if "properties" in value:
                    value["properties"] = cast(value["properties"])
                elif "items" in value:
                    value["items"]["type"] = mapping[value["items"]["type"]]
                    inner = value["items"]
                    if inner["type"] == "array" and "items" in inner:
                        inner["items"]["type"] = mapping[inner["items"]["type"]]
                    elif inner["type"] == "object" and "properties" in inner:
                        inner["properties"] = cast(inner["properties"])
        return properties

    out = copy.deepcopy(parameters)
    out["type"] = "object"
    out["properties"] = cast(out["properties"])
    return out


@functools.lru_cache(maxsize=None)
def _docs() -> dict[str, dict[str, Any]]:
    """Function name -> BFCL's function doc (``multi_turn_func_doc``)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    out: dict[str, dict[str, Any]] = {}
    for name in CLASSES:
        for doc in _lines(_data() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[name]):
            out[doc["name"]] = doc
    return out


def _key(cls_name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", cls_name).lower()


def _added_functions_message() -> str:
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC


def _reveals(entry: dict[str, Any], gold: list[list[str]]) -> dict[str, int]:
    """Each missed function of a ``miss_func`` entry -> the turn it is shown from: the turn BFCL adds
    it at, or an earlier one whose gold calls it (``multi_turn_miss_func_49`` calls ``tail`` at turn
    1, which BFCL adds at turn 3: its prompt hides it, its execution runs it all the same)."""
    out: dict[str, int] = {}
    for k, names in (entry.get("missed_function") or {}).items():
        for n in names:
            used = [t for t, calls in enumerate(gold) if any(parse_call(c).name == n for c in calls)]
            out[n] = min([int(k)] + used)
    return out


def _turn_checks(gold: list[str], irrelevance: bool) -> tuple[str, ...]:
    if gold:
        return ("call", "state", "results")
    return ("no_call",) if irrelevance else ()


def bfcl_spec(category: str, *, name: str | None = None, irrelevance: bool = False) -> ToolEnvSpec:
    """The environment of one BFCL multi-turn category (``base``, ``miss_param``, ``miss_func``,
    ``long_context``).

    Args:
        name: Its registry name (default: the registered one, :data:`CATEGORIES`).
        irrelevance: Also check that the model makes no call in a turn without gold calls
            (``multi_turn_irrelevance_checker``, which BFCL's runner leaves out).
    """
    if name is None:
        name = next(n for n, c in CATEGORIES.items() if c == category)
    long_context = "long_context" in category
    load = _Load(long_context)
    services = [Service(bfcl_class(c), key=_key(c), loader=load, read_only=sorted(READ_ONLY[c])) for c in CLASSES]
    base = from_class(services, name=name, domain="bfcl", config={}, tasks=[], render=bfcl_render,
                      errors="detailed", validation="lax", read_only=[], require_reads="never",
                      compare=same_instance)
    docs = _docs()
    tools = []
    for t in base.tools:
        doc = docs[t.name]
        fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.init}
        fields.update(description=doc["description"], parameters=_openai_parameters(doc["parameters"]))
        tools.append(_BFCLTool(**fields))
    make_state = base.metadata["state_from_config"]
    methods = {c: [m for m, owner in _owners().items() if owner == c] for c in CLASSES}
    stateless = _stateless()
    added = _added_functions_message()

    def tasks() -> list[Task]:
        gold = ground_truth(category)
        out = []
        for e in entries(category):
            involved = list(e["involved_classes"])
            config = {_key(c): e["initial_config"].get(c, {}) for c in involved if c not in stateless}
            missed = _reveals(e, gold[e["id"]])
            turns = []
            for k, (messages, calls) in enumerate(zip(e["question"], gold[e["id"]], strict=True)):
                words = "\n\n".join(m["content"] for m in messages if m.get("role") == "user") if messages else added
                turns.append(UserTurn(message=words, solution=[parse_call(c) for c in calls],
                                      tools=sorted(n for n, at in missed.items() if at == k),
                                      checks=_turn_checks(calls, irrelevance)))
            conv = Conversation(turns=turns, hidden=sorted(m for c in CLASSES if c not in involved for m in methods[c]),
                                state_view=PublicAttributes([_key(c) for c in involved]))
            basis = ("turn_call", "turn_state", "turn_results") + (("no_call",) if irrelevance else ())
            out.append(Task(id=e["id"], initial_state=make_state(config), conversation=conv, reward_basis=basis,
                            metadata={"bfcl": {"category": category, "involved_classes": involved,
                                               "path": e.get("path", []),
                                               "missed_function": e.get("missed_function") or {}}}))
        return out

    most = max(len(e["question"]) for e in entries(category))
    return ToolEnvSpec(
        name=name, domain="bfcl", state_type=base.state_type, tools=tools, tasks=tasks,
        description=f"BFCL v4 multi-turn {category} ({len(entries(category))} entries, bfcl-eval {BFCL_VERSION}): "
                    "its classes, data and gold, scored as its multi_turn_checker scores",
        max_turns=STEP_LIMIT * most, finish_tool=False,
        metadata={**base.metadata, "bfcl": {"category": category, "irrelevance": irrelevance,
                                            "version": BFCL_VERSION},
                  # the Docker runtime's image installs these (without their dependencies, as setup.sh does)
                  "image_requirements": [f"bfcl-eval=={BFCL_VERSION}", f"mpmath=={importlib.metadata.version('mpmath')}"],
                  "suite_judge": ("BFCL multi_turn_checker" + (" + irrelevance" if irrelevance else ""),
                                  functools.partial(judge, category, irrelevance=irrelevance))})


@functools.lru_cache(maxsize=None)
def _stateless() -> frozenset[str]:
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    return frozenset(STATELESS_CLASSES)


# -- BFCL's own verdict on an episode --------------------------------------------------------------
def decoded_calls(transcript: Sequence[dict[str, Any]]) -> list[list[list[str]]]:
    """An episode's transcript as BFCL's decoded model result: per user turn, per step (an
    assistant message with tool calls), the calls as BFCL's call strings. Steps without a call (the
    answer that ends a turn) are left out, as BFCL's runner leaves out a step that decodes to none."""
    turns: list[list[list[str]]] = []
    for m in transcript:
        if m["role"] == "user":
            turns.append([])
        elif m["role"] == "assistant" and m.get("tool_calls") and turns:
            step = []
            for c in m["tool_calls"]:
                args = c["function"]["arguments"]
                step.append(call_string(c["function"]["name"], json.loads(args) if isinstance(args, str) else args))
            turns[-1].append(step)
    return turns


_RUNS = [0]


def judge(category: str, task_id: str, messages: Sequence[dict[str, Any]], *, irrelevance: bool = False) -> bool:
    """BFCL's verdict on an episode's transcript (:func:`decoded_calls`, :func:`bfcl_valid`): the
    environments' ``metadata["suite_judge"]``, which ``envfactory eval`` reports beside success."""
    return bfcl_valid(category, task_id, decoded_calls(messages), irrelevance=irrelevance)[0]


def bfcl_valid(category: str, entry_id: str, decoded: list[list[list[str]]], *, irrelevance: bool = False
               ) -> tuple[bool, dict[str, Any]]:
    """BFCL's own verdict on a decoded model result, as its runner reaches it
    (``_evaluate_single_multi_turn_entry``: the turn count, then ``multi_turn_checker``; with
    ``irrelevance``, ``multi_turn_irrelevance_checker`` too). Returns (valid, BFCL's result).

    BFCL's execution keeps its instances in its module's globals, named after the model and the
    entry; each call here uses a fresh model name and drops them afterwards."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (multi_turn_checker,
                                                                            multi_turn_irrelevance_checker)

    entry = next(e for e in entries(category) if e["id"] == entry_id)
    gold = ground_truth(category)[entry_id]
    if len(decoded) != len(gold):
        return False, {"valid": False, "error_type": "multi_turn:force_terminated"}
    _RUNS[0] += 1
    model = f"envfactory_check_{_RUNS[0]}"
    try:
        result = multi_turn_checker(decoded, gold, copy.deepcopy(entry), f"multi_turn_{category}", model)
        if result["valid"] and irrelevance:
            result = multi_turn_irrelevance_checker(decoded, gold)
    finally:
        prefix = re.sub(r"[-./:]", "_", model + "_")
        g = vars(multi_turn_utils)
        for k in [k for k in g if k.startswith(prefix)]:
            del g[k]
    return bool(result["valid"]), result


if available():
    for _name, _category in CATEGORIES.items():
        register(bfcl_spec(_category, name=_name))
