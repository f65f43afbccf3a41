"""GameBattleship-v0 (zero-sum, hidden information): two admirals hunt each other's fleet.

Each admiral has a fleet hidden on its own 5x5 grid (by default a ship of 3
cells and two of 2, placed by the task; only its owner knows where: private
notes). Each round an admiral fires one shot (``fire(row, col)``) at the
other's grid and learns whether it missed, hit, or sank a ship (a sunk ship's
cells are revealed). The task says the fleet and the rule of victory
(:data:`RULES`): sink the whole enemy fleet (the classic game), sink any one
ship (a skirmish), sink the enemy's flagship (its largest ship), be the first
to land a number of hits, or land more hits than the enemy with a fixed number
of shots each. The game ends when it is decided.

Payoff (zero-sum): the winner gets 1 and the loser -1 (a draw: 0 each); a game
still undecided at the end of the episode gives each side (its hits - the
other's hits) / (the fleet's cells). Success (the task): the game was played
out: it was decided, and both admirals took part (a game the opponent never
played is a walk-over, not a match).

The expert (:class:`ExpertAdmiral`) hunts on a checkerboard (every ship covers
a cell of each colour), in an order of its own, and after a hit targets the
neighbours, following the line of two hits; it uses its own shots' results
only. The reference solution is expert against expert.
"""

from __future__ import annotations

import random
import zlib
from typing import Annotated, Any

from pydantic import BaseModel, Field

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from envfactory.checks.scripted import PASS
from envfactory.task import ToolCall
from tools.messaging import TOOLS as MESSAGING

ADMIRALS = ("admiral_0", "admiral_1")
SIZE = 5
FLEET = (3, 2, 2)
N_TASKS = 50
FLEETS = ((3, 2, 2), (4, 3), (3, 3, 2), (4, 2), (2, 2, 2), (4, 2, 2))  # largest ship first
RULES = ("fleet", "first_ship", "flagship", "hits", "timed")
DRAW = "draw"


class Shot(BaseModel):
    row: int
    col: int
    result: str                      # miss | hit | sunk
    round: int
    sunk: list[list[int]] = []       # the cells of the ship this shot sank


class BattleState(MultiState):
    ships: dict[str, list[list[list[int]]]]    # agent -> ships -> cells [row, col], the largest first
    shots: dict[str, list[Shot]] = {}          # shooter -> its shots
    winner: str | None = None                  # an admiral, or "draw"
    rule: str = "fleet"                        # one of RULES
    target_hits: int = 0                       # rule "hits": hits needed to win
    shots_limit: int = 0                       # rule "timed": shots each


def _sunk(state: BattleState, shooter: str) -> list[list[list[int]]]:
    """The enemy ships ``shooter`` has sunk."""
    hits = _hits(state, shooter)
    return [sh for sh in state.ships[_other(shooter)] if all(tuple(c) in hits for c in sh)]


def has_won(state: BattleState, shooter: str) -> bool:
    """Whether ``shooter``'s shots meet the rule of victory (``timed`` is decided by :func:`fire` at the end)."""
    sunk = _sunk(state, shooter)
    if state.rule == "fleet":
        return len(sunk) == len(state.ships[_other(shooter)])
    if state.rule == "first_ship":
        return bool(sunk)
    if state.rule == "flagship":
        return state.ships[_other(shooter)][0] in sunk
    if state.rule == "hits":
        return len(_hits(state, shooter)) >= state.target_hits
    return False


def out_of_shots(state: BattleState, agent: str) -> bool:
    return bool(state.shots_limit) and len(state.shots.get(agent, [])) >= state.shots_limit


def _other(agent: str) -> str:
    return ADMIRALS[1] if agent == ADMIRALS[0] else ADMIRALS[0]


def _hits(state: BattleState, shooter: str) -> set[tuple[int, int]]:
    return {(s.row, s.col) for s in state.shots.get(shooter, []) if s.result != "miss"}


Coordinate = Annotated[int, Field(ge=0, le=SIZE - 1)]  # the board's size, in the tool's schema


@tool
def fire(state: BattleState, row: Coordinate, col: Coordinate) -> str:
    """Fire one shot at the enemy grid (one shot per round).

    Args:
        row: Row, 0 to 4.
        col: Column, 0 to 4.
    """
    if state.winner is not None:
        raise ConflictError("the game is over: " + ("a draw" if state.winner == DRAW else f"{state.winner} won"))
    if not (0 <= row < SIZE and 0 <= col < SIZE):
        raise ToolError(f"row and col must be between 0 and {SIZE - 1}")
    me = state.acting
    mine = state.shots.setdefault(me, [])
    if out_of_shots(state, me):
        raise ConflictError(f"you have fired all {state.shots_limit} of your shots")
    if any(s.round == state.round for s in mine):
        raise ToolError("you already fired this round; one shot per round")
    if any((s.row, s.col) == (row, col) for s in mine):
        raise ToolError(f"you already fired at ({row}, {col})")
    hits = _hits(state, me) | {(row, col)}
    ship = next((sh for sh in state.ships[_other(me)] if [row, col] in sh), None)
    if ship is None:
        mine.append(Shot(row=row, col=col, result="miss", round=state.round))
        text = f"Miss at ({row}, {col})."
    elif not all(tuple(c) in hits for c in ship):
        mine.append(Shot(row=row, col=col, result="hit", round=state.round))
        text = f"Hit at ({row}, {col})."
    else:
        mine.append(Shot(row=row, col=col, result="sunk", round=state.round, sunk=[list(c) for c in ship]))
        cells = ", ".join(f"({r}, {c})" for r, c in ship)
        if state.rule == "fleet" and has_won(state, me):
            state.winner = me
            return f"Hit at ({row}, {col}): you sank the last ship ({cells}). You win."
        text = f"Hit at ({row}, {col}): you sank a ship of {len(ship)} cells ({cells})."
    if has_won(state, me):
        state.winner = me
        return text + " You win."
    if state.shots_limit and all(out_of_shots(state, a) for a in ADMIRALS):
        n = {a: len(_hits(state, a)) for a in ADMIRALS}
        state.winner = DRAW if n[me] == n[_other(me)] else max(ADMIRALS, key=n.__getitem__)
        verdict = "a draw" if state.winner == DRAW else ("you win" if state.winner == me else f"{state.winner} wins")
        return text + f" Every shot is fired: {n[me]} hits to {n[_other(me)]}, {verdict}."
    return text


@tool(read_only=True)
def view_boards(state: BattleState) -> str:
    """Your shots on the enemy grid (X hit, o miss, . not fired at) and your own grid with your
    ships (S) and the enemy's shots on it (X hit, o miss)."""
    me = state.acting
    theirs = {(s.row, s.col) for s in state.shots.get(_other(me), [])}
    mine = {(s.row, s.col): s.result for s in state.shots.get(me, [])}
    own = {tuple(c) for sh in state.ships[me] for c in sh}
    left, right = ["Enemy grid:"], ["Your grid:"]
    for r in range(SIZE):
        left.append(" ".join("." if (r, c) not in mine else ("o" if mine[(r, c)] == "miss" else "X")
                             for c in range(SIZE)))
        right.append(" ".join(("X" if (r, c) in own else "o") if (r, c) in theirs else ("S" if (r, c) in own else ".")
                              for c in range(SIZE)))
    return "\n".join(left + right)


def legal_moves(state: BattleState, agent: str) -> list[ToolCall]:
    """The shots ``agent`` may fire now: every cell of the enemy grid it has not fired at, while the
    game is undecided and it has not fired this round (none otherwise)."""
    mine = state.shots.get(agent, [])
    if state.winner is not None or out_of_shots(state, agent) or any(s.round == state.round for s in mine):
        return []
    fired = {(s.row, s.col) for s in mine}
    return [ToolCall("fire", {"row": r, "col": c}) for r in range(SIZE) for c in range(SIZE) if (r, c) not in fired]


def _decided_and_played(state: BattleState) -> bool:
    return state.winner is not None and all(state.shots.get(a) for a in ADMIRALS)


def payoff(task: Task, state: BattleState, success: bool) -> dict[str, float]:
    """Zero-sum: 1 / -1 for a win, 0 for a draw; otherwise the difference in hits over the fleet's size."""
    if state.winner == DRAW:
        return dict.fromkeys(ADMIRALS, 0.0)
    if state.winner is not None:
        return {a: 1.0 if a == state.winner else -1.0 for a in ADMIRALS}
    cells = sum(len(sh) for sh in state.ships[ADMIRALS[0]])
    d = round((len(_hits(state, ADMIRALS[0])) - len(_hits(state, ADMIRALS[1]))) / cells, 4)
    return {ADMIRALS[0]: d, ADMIRALS[1]: -d if d else 0.0}


# -- the expert -----------------------------------------------------------------
def hunt_order(task_id: str, agent: str) -> list[tuple[int, int]]:
    """The expert's search order: the checkerboard cells first, each colour in an order of its own."""
    cells = [(r, c) for r in range(SIZE) for c in range(SIZE)]
    parity = zlib.crc32(f"{task_id}/{agent}".encode()) % 2
    key = lambda rc: ((rc[0] + rc[1]) % 2 != parity, zlib.crc32(f"{task_id}/{agent}/{rc}".encode()))  # noqa: E731
    return sorted(cells, key=key)


def next_shot(shots: list[Shot], order: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The expert's next target from its own shots so far (``None``: nothing left)."""
    fired = {(s.row, s.col) for s in shots}
    sunk = {tuple(c) for s in shots for c in s.sunk}
    open_hits = [(s.row, s.col) for s in shots if s.result != "miss" and (s.row, s.col) not in sunk]
    rank = {rc: i for i, rc in enumerate(order)}

    def free(rc: tuple[int, int]) -> bool:
        return 0 <= rc[0] < SIZE and 0 <= rc[1] < SIZE and rc not in fired

    if open_hits:
        hits = set(open_hits)
        line = []
        for r, c in open_hits:  # extend a line of two adjacent hits first
            for dr, dc in ((0, 1), (1, 0)):
                if (r + dr, c + dc) in hits:
                    run = [(r, c)]
                    while (run[-1][0] + dr, run[-1][1] + dc) in hits:
                        run.append((run[-1][0] + dr, run[-1][1] + dc))
                    line += [rc for rc in ((r - dr, c - dc), (run[-1][0] + dr, run[-1][1] + dc)) if free(rc)]
        if line:
            return min(line, key=rank.__getitem__)
        around = [(r + dr, c + dc) for r, c in open_hits for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0))]
        around = [rc for rc in around if free(rc)]
        if around:
            return min(around, key=rank.__getitem__)
    return next((rc for rc in order if rc not in fired), None)


class ExpertAdmiral:
    """Strong scripted admiral (see the module docstring); reads only its own shots, then passes."""

    name = "expert"
    stochastic = False

    def act(self, episode: Any, agent: str, seed: int) -> Any:
        state = episode.state
        if state.winner is not None or out_of_shots(state, agent):
            return PASS
        target = next_shot(state.shots.get(agent, []), hunt_order(episode.task.id, agent))
        if target is None:
            return PASS
        return ToolCall("fire", {"row": target[0], "col": target[1]}).to_hermes()


class NaiveAdmiral:
    """Weak scripted admiral (a rating baseline): fires at every cell in an order of its own, never
    following up a hit."""

    name = "naive"
    stochastic = False

    def act(self, episode: Any, agent: str, seed: int) -> Any:
        state = episode.state
        if state.winner is not None or out_of_shots(state, agent):
            return PASS
        fired = {(s.row, s.col) for s in state.shots.get(agent, [])}
        cells = sorted(((r, c) for r in range(SIZE) for c in range(SIZE)),
                       key=lambda rc: zlib.crc32(f"{episode.task.id}/{agent}/naive/{rc}".encode()))
        target = next((rc for rc in cells if rc not in fired), None)
        return PASS if target is None else ToolCall("fire", {"row": target[0], "col": target[1]}).to_hermes()


# -- tasks ----------------------------------------------------------------------
def place_fleet(rng: random.Random, fleet: tuple[int, ...] = FLEET) -> list[list[list[int]]]:
    """Non-overlapping ships of the ``fleet``'s lengths (largest first), horizontal or vertical."""
    taken: set[tuple[int, int]] = set()
    ships = []
    for n in fleet:
        while True:
            horizontal = rng.random() < 0.5
            r = rng.randrange(SIZE if horizontal else SIZE - n + 1)
            c = rng.randrange(SIZE - n + 1 if horizontal else SIZE)
            cells = [(r, c + k) if horizontal else (r + k, c) for k in range(n)]
            if not taken & set(cells):
                taken |= set(cells)
                ships.append([list(x) for x in cells])
                break
    return ships


def expert_game(task_id: str, ships: dict[str, list[list[list[int]]]], **rules: Any) -> list[Any]:
    """Expert against expert, one shot each per round (admiral_0 first), until the game is decided
    (``rules``: the state's ``rule``, ``target_hits``, ``shots_limit``): the joint reference solution."""
    state = BattleState(ships=ships, agents=list(ADMIRALS), **rules)
    orders = {a: hunt_order(task_id, a) for a in ADMIRALS}
    calls = []
    for rnd in range(1, SIZE * SIZE + 1):
        for a in ADMIRALS:
            row, col = next_shot(state.shots.get(a, []), orders[a])
            state.acting, state.round = a, rnd
            out = fire.invoke(state, {"row": row, "col": col})
            assert out.ok, out.content
            calls.append(by(a, "fire", row=row, col=col))
            if state.winner is not None:
                return calls
    raise AssertionError("the expert game did not end")


def _notes(ships: list[list[list[int]]]) -> str:
    where = "; ".join(f"{len(s)} cells at " + ", ".join(f"({r}, {c})" for r, c in s) for s in ships)
    return f"Your fleet (hidden from the enemy): {where}."


def _fleet_words(fleet: tuple[int, ...]) -> str:
    sizes = [str(n) for n in fleet]
    return f"ships of {', '.join(sizes[:-1])} and {sizes[-1]} cells"


def instruction(rule: str, fleet: tuple[int, ...], target_hits: int = 0, shots_limit: int = 0) -> str:
    """The task's words for a rule of victory and a fleet."""
    grid, fleet_text = "5x5 grids (rows and columns 0-4)", _fleet_words(fleet)
    if rule == "fleet":
        return (f"Battleship on {grid}: sink the enemy fleet ({fleet_text}) before yours is sunk. One shot per round "
                "with fire(row, col).")
    if rule == "first_ship":
        return (f"Skirmish on {grid}, each side hiding {fleet_text}: the first admiral to sink any one enemy ship "
                "wins at once. One shot per round with fire(row, col).")
    if rule == "flagship":
        return (f"Hunt the flagship. Each side hides {fleet_text} on one of two {grid}; its {fleet[0]}-cell ship is "
                "its flagship. Sink the enemy flagship before yours goes down: escorts sunk count for nothing. One "
                "shot per round with fire(row, col).")
    if rule == "hits":
        return (f"Gunnery race on {grid}, each side hiding {fleet_text}: the first admiral to land {target_hits} "
                "hits on enemy ships wins. One shot per round with fire(row, col).")
    return (f"Each admiral has exactly {shots_limit} shots, one per round with fire(row, col), at the other's 5x5 "
            f"grid (rows and columns 0-4), where {fleet_text} are hidden. Once both have fired them all, the one "
            "with more hits wins; equal hits make a draw.")


def tasks() -> list[Task]:
    """Fifty games: the rule of victory cycles through :data:`RULES` and the fleet through :data:`FLEETS`
    (task 0 is the classic game with the classic fleet; a flagship game uses a fleet whose largest ship
    is unique)."""
    out = []
    for seed in range(N_TASKS):
        rule = RULES[seed % len(RULES)]
        fleet = FLEETS[(seed // len(RULES)) % len(FLEETS)]
        if rule == "flagship" and fleet.count(fleet[0]) > 1:
            fleet = FLEETS[0]
        rng = random.Random(f"GameBattleship/{seed}")
        ships = {a: place_fleet(rng, fleet) for a in ADMIRALS}
        cells = sum(fleet)
        rules: dict[str, Any] = {"rule": rule}
        if rule == "hits":
            rules["target_hits"] = rng.randint(cells // 2 + 1, cells - 1)
        if rule == "timed":
            rules["shots_limit"] = rng.randint(8, 14)
        tid = f"battleship-{seed:03d}"
        out.append(Task(
            id=tid,
            instruction=instruction(rule, fleet, rules.get("target_hits", 0), rules.get("shots_limit", 0)),
            private={a: _notes(ships[a]) for a in ADMIRALS},
            initial_state=BattleState(ships=ships, **rules), check=_decided_and_played,
            solution=expert_game(tid, ships, **rules),
            metadata={"generator_seed": seed, "rule": rule, "fleet": list(fleet)}))
    return out


SPEC = register(ToolEnvSpec(
    name="GameBattleship-v0",
    domain="battleship",
    description="Zero-sum, hidden information: two admirals hunt each other's hidden fleet, one shot per round.",
    state_type=BattleState,
    roles=[Role(a, "an admiral: sink the enemy's hidden fleet before it sinks yours (your own fleet is in your "
                "private notes)", [fire, view_boards]) for a in ADMIRALS],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=2 * SIZE * SIZE,
    terminal=lambda state: state.winner is not None,
    payoff=payoff,
    legal_actions=legal_moves,
    metadata={"competitive": True, "zero_sum": True, "expert": ExpertAdmiral, "policies": {"naive": NaiveAdmiral}},
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of GameBattleship-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of GameBattleship-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
