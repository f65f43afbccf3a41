"""Built-in envfactory environments, one module per environment family.

Announced through the ``envfactory.environments`` entry point
(``builtin = "environments:register_all"``). Registration is lazy:
:func:`register_all` returns a table ``{environment name: module}`` and
envfactory imports a module only when one of its environments is first used
(``envfactory.make`` / ``envfactory.spec``); ``envfactory.specs()`` imports
them all. This package's ``__init__`` must therefore stay cheap: it imports
nothing from the environment modules.

Adding a module here means adding its environments to :data:`SINGLE_AGENT`
or :data:`MULTI_AGENT` (``tests/test_imports.py`` checks the tables against
what the modules actually register).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["SINGLE_AGENT", "MULTI_AGENT", "register_all", "import_all"]

_SPEC_FILES = "environments.spec_envs"   # a module per specs/*.yaml (and specs/composed/*.yaml)
_CLASSES = "environments.class_envs"     # one environment per classes/*.py

# environment name -> the module whose import registers it
SINGLE_AGENT: dict[str, str] = {
    "Bank-v0": "environments.bank",
    "Counter-v0": "environments.counter",
    "FileSystem-v0": "environments.filesystem",
    **{f"FindLight-v{d}": "environments.find_light" for d in range(3)},
    "Helpdesk-v0": "environments.helpdesk",
    "Lights-v0": "environments.lights",
    "RecordsDesk-v0": "environments.records_desk",
    **{name: _CLASSES for name in (
        "GitRepo-v0", "LabBench-v0", "SmartHome-v0", "Social-v0", "Spreadsheet-v0", "TeamChat-v0",
        "Trading-v0", "Vehicle-v0",
    )},
}


def _spec_file_names() -> dict[str, str]:
    """``{environment: module}`` for what the spec files declare (their ``name:`` and variants'
    ``{name: ...}``), read with a regular expression: cheap, no YAML parsing, no import. Each
    file is its own module (see :mod:`environments.spec_envs`; its ``files``/``module_for`` say the
    same, but announcing names must import no environment module, that one included)."""
    folder = Path(__file__).parent / "specs"
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")) + sorted((folder / "composed").glob("*.yaml")):
        module = f"{_SPEC_FILES}.{'composed_' if path.parent.name == 'composed' else ''}{path.stem}"
        for name in re.findall(r"(?:^|[{\s])name: *([A-Z][A-Za-z0-9]*-v\d+)\b", path.read_text(), re.M):
            found[name] = module
    return found


SINGLE_AGENT.update(_spec_file_names())

# team environments (no Gymnasium id: they are PettingZoo environments)
MULTI_AGENT: dict[str, str] = {
    "GameAuction-v0": "environments.game_auction",
    "GameBattleship-v0": "environments.game_battleship",
    "MultiDeal-v0": "environments.multi_deal",
    "MultiMeeting-v0": "environments.multi_meeting",
    "MultiPipeline-v0": "environments.multi_pipeline",
    "MultiRecords-v0": "environments.multi_records",
    "MultiRooms-v0": "environments.multi_rooms",
    "MultiSupport-v0": "environments.multi_support",
}


def register_all() -> dict[str, Any]:
    """The lazy registration table: ``{name: module}`` for single-agent environments and
    ``{name: {"module": module, "multi_agent": True}}`` for team ones. Imports nothing."""
    table: dict[str, Any] = dict(SINGLE_AGENT)
    table.update({name: {"module": module, "multi_agent": True} for name, module in MULTI_AGENT.items()})
    return table


def import_all() -> None:
    """Import every built-in environment module now (each registers its specs)."""
    import importlib

    importlib.import_module(_SPEC_FILES)  # makes the per-file spec modules importable
    for module in sorted(set(SINGLE_AGENT.values()) | set(MULTI_AGENT.values())):
        importlib.import_module(module)
