"""Competitive games for self-play (GameAuction-v0, GameBattleship-v0): zero-sum payoffs, the random
policy plays legal moves only, the expert beats no-op players always and random ones mostly from
either seat and rates above random by more than the rating's uncertainty, the reference is expert
self-play, the rules, and the Elo-scale rating of the team evaluation (envfactory.evaluation.rating)."""

import json
import random

import pytest

import envfactory
from envfactory.checks.scripted import PASS, NoopPolicy, OraclePolicy, RandomPolicy, play
from envfactory.evaluation.eval import ExpertPolicy, competitive, evaluate
from envfactory.evaluation.rating import (Match, expected_score, head_to_head, match_score, matches_from_head_to_head,
                                     rate)
from envfactory.evaluation.report import write_report
from envfactory.task import ToolCall

GAMES = ["GameAuction-v0", "GameBattleship-v0"]


def _expert(name):
    return envfactory.spec(name).metadata["expert"]()


@pytest.mark.parametrize("name", GAMES)
def test_game_is_registered_competitive_with_50_tasks(name):
    spec = envfactory.spec(name)
    assert spec.multi_agent and competitive(spec) and spec.metadata["zero_sum"] and spec.payoff is not None
    assert len(spec.get_tasks()) >= 50 and not spec.replay_errors
    import environments

    assert environments.MULTI_AGENT[name] == spec.module


@pytest.mark.parametrize("name", GAMES)
def test_payoffs_are_zero_sum_and_bounded_for_every_pairing(name):
    spec = envfactory.spec(name)
    ep = envfactory.make_multi(name)
    a0, a1 = spec.agent_ids
    players = {"expert": _expert(name), "random": RandomPolicy(), "noop": NoopPolicy(), "oracle": OraclePolicy()}
    seen = set()
    for task in spec.get_tasks()[:12]:
        for x in players:
            for y in players:
                out = play(ep, {a0: players[x], a1: players[y]}, task.id, seed=7)
                r = out.rewards
                assert r[a0] + r[a1] == pytest.approx(0.0, abs=1e-9), (task.id, x, y, r)
                assert all(-1.0 <= v <= 1.0 for v in r.values())
                seen.add(round(r[a0], 4))
    assert len(seen) >= 3  # wins, losses and draws all happen


@pytest.mark.parametrize("name", GAMES)
def test_expert_beats_noop_always_and_random_mostly_from_either_seat(name):
    spec = envfactory.spec(name)
    ep = envfactory.make_multi(name)
    expert = _expert(name)
    wins = games = 0
    for task in spec.get_tasks():
        for seat in spec.agent_ids:
            other = next(a for a in spec.agent_ids if a != seat)
            out = play(ep, {seat: expert, other: NoopPolicy()}, task.id, seed=1)
            assert out.rewards[seat] > out.rewards[other], (task.id, seat, out.rewards)
            assert not out.success  # a walk-over is not a completed match
            out = play(ep, {seat: expert, other: RandomPolicy()}, task.id, seed=1)
            assert out.errors == {} and out.success  # random plays legal moves: the match is played out
            wins += out.rewards[seat] > out.rewards[other]
            games += 1
    assert wins >= 2 / 3 * games, (wins, games)  # a random player of legal moves wins now and then, not often


@pytest.mark.parametrize("name", GAMES)
def test_random_policy_plays_only_legal_moves(name):
    """Over many seeds and every task, each move the random policy makes is one the environment lists
    as legal (``legal_actions``) and one the tools accept; it keeps playing until the match is over,
    and it uses the whole move list (its moves are spread, not a fixed few)."""
    from envfactory.checks.scripted import legal_moves

    spec = envfactory.spec(name)
    assert spec.legal_actions is not None
    ep = envfactory.make_multi(name)
    policy, moves, distinct = RandomPolicy(), 0, set()
    for task in spec.get_tasks():
        for seed in range(6):
            ep.reset(task.id)
            while not ep.done:
                agent = ep.status.next_agent
                legal = [m.to_hermes() for m in legal_moves(ep, agent)]
                action = policy.act(ep, agent, seed)
                assert action in legal or (not legal and action == PASS), (task.id, seed, agent, action)
                result = ep.act(agent, action)
                if legal:
                    moves += 1
                    distinct.add(action)
                    assert not result.messages[0]["content"].startswith("Error"), result.messages
            assert all(e["ok"] for e in ep.status.log) and ep.success, (task.id, seed, ep.status.log[-3:])
    assert moves > 1000 and len(distinct) >= 25, (moves, len(distinct))


@pytest.mark.parametrize("name", GAMES)
def test_reference_is_expert_self_play_and_completes_the_match(name):
    spec = envfactory.spec(name)
    ep = envfactory.make_multi(name)
    wins = {a: 0 for a in spec.agent_ids}
    for task in spec.get_tasks():
        out = play(ep, _expert(name), task.id)
        assert out.success and out.errors == {}
        calls = [(e["agent"], e["name"], e["arguments"]) for e in out.log]
        assert calls == [(c.agent, c.name, c.arguments) for c in task.solution]
        for a in spec.agent_ids:
            wins[a] += out.rewards[a] > 0
    assert all(w >= 5 for w in wins.values()), wins  # neither seat wins everything against an equal player


def test_auction_rules():
    spec = envfactory.spec("GameAuction-v0")
    task = spec.task("auction-000")
    ep = envfactory.make_multi("GameAuction-v0")
    ep.reset(task.id)
    budget = task.metadata["budget"]["bidder_0"]
    r = ep.act("bidder_0", ToolCall("bid", {"lot": "lot-1", "amount": budget + 1}).to_hermes())
    assert r.messages[0]["content"].startswith("Error") and "budget" in r.messages[0]["content"]
    ep.act("bidder_1", ToolCall("bid", {"lot": "lot-1", "amount": 3}).to_hermes())
    r = ep.act("bidder_0", ToolCall("bid", {"lot": "lot-1", "amount": 3}).to_hermes())
    assert "unsold" in r.messages[0]["content"]  # a tie sells nothing
    r = ep.act("bidder_1", ToolCall("bid", {"lot": "lot-1", "amount": 1}).to_hermes())
    assert "already bid" in r.messages[0]["content"]
    # the other bidder's sealed bid stays hidden until the lot closes
    ep.act("bidder_0", ToolCall("bid", {"lot": "lot-2", "amount": 2}).to_hermes())
    r = ep.act("bidder_1", ToolCall("auction_status", {}).to_hermes())
    assert "lot-2: open; you have not bid" in r.messages[0]["content"]
    # at the end, a lot with a single bid goes to that bidder at its bid
    while not ep.done:
        ep.act(ep.status.next_agent, "pass")
    values = task.metadata["values"]
    scale = sum(max(values[a][lot] for a in values) for lot in task.initial_state.lots)
    assert ep.rewards["bidder_0"] == pytest.approx(round((values["bidder_0"]["lot-2"] - 2) / scale, 4))
    assert ep.success is False


def test_battleship_rules():
    spec = envfactory.spec("GameBattleship-v0")
    task = spec.task("battleship-000")
    ep = envfactory.make_multi("GameBattleship-v0")
    ep.reset(task.id)
    ship = task.initial_state.ships["admiral_1"][0]
    fire = lambda r, c: ToolCall("fire", {"row": r, "col": c}).to_hermes()  # noqa: E731
    two = f"{fire(*ship[0])}{fire(*ship[1])}"
    r = ep.act("admiral_0", two)
    assert r.messages[0]["content"].startswith("Hit") and "one shot per round" in r.messages[1]["content"]
    ep.act("admiral_1", "pass")
    assert "already fired" in ep.act("admiral_0", fire(*ship[0])).messages[0]["content"]
    ep.act("admiral_1", "pass")
    # the grid shows only one's own fleet and one's own shots
    view = ep.act("admiral_0", ToolCall("view_boards", {}).to_hermes()).messages[0]["content"]
    assert view.count("X") == 1 and view.count("S") == sum(len(s) for s in task.initial_state.ships["admiral_0"])
    while not ep.done:
        ep.act(ep.status.next_agent, "pass")
    # undecided: the difference in hits over the fleet's size
    assert ep.rewards == {"admiral_0": pytest.approx(1 / 7, abs=1e-4), "admiral_1": pytest.approx(-1 / 7, abs=1e-4)}


def test_experts_use_only_their_own_information():
    """Changing the opponent's hidden values or fleet does not change the expert's own first move."""
    import environments.game_auction as auction
    import environments.game_battleship as battle

    values = {"lot-1": 10, "lot-2": 4}
    assert auction.expert_bids(values, ["lot-1", "lot-2"], 100) == {"lot-1": 5, "lot-2": 2}
    assert sum(auction.expert_bids({"lot-1": 20, "lot-2": 20}, ["lot-1", "lot-2"], 10).values()) <= 10
    order = battle.hunt_order("t", "admiral_0")
    assert battle.next_shot([], order) == order[0]
    hit = battle.Shot(row=2, col=2, result="hit", round=1)
    assert battle.next_shot([hit], order) in {(1, 2), (3, 2), (2, 1), (2, 3)}  # targets around a hit
    line = [hit, battle.Shot(row=2, col=3, result="hit", round=2)]
    assert battle.next_shot(line, order) in {(2, 1), (2, 4)}  # then along the line


# -- ratings ------------------------------------------------------------------------
def test_match_score_and_expected_score():
    assert match_score(1.0, -1.0) == 1.0 and match_score(-0.5, 0.5) == 0.0 and match_score(0.2, 0.2) == 0.5
    assert expected_score(1500, 1500) == 0.5 and expected_score(1900, 1500) == pytest.approx(10 / 11)


def test_rating_recovers_elo_differences_and_orders_players():
    rng = random.Random(0)
    true = {"a": 1800.0, "b": 1500.0, "c": 1300.0}
    matches = []
    for _ in range(3000):
        x, y = rng.sample(sorted(true), 2)
        matches.append(Match(x, y, 1.0 if rng.random() < expected_score(true[x], true[y]) else 0.0))
    r = rate(matches)
    assert list(r) == ["a", "b", "c"]
    assert r["a"]["rating"] - r["b"]["rating"] == pytest.approx(300, abs=50)
    assert r["b"]["rating"] - r["c"]["rating"] == pytest.approx(200, abs=50)
    assert all(0 < v["sd"] < 40 for v in r.values())
    assert rate(list(reversed(matches))) == r  # order does not matter (unlike incremental Elo)


def test_rating_of_equal_players_and_its_uncertainty_shrinks_with_matches():
    few = rate([Match("a", "b", 1.0), Match("a", "b", 0.0)])
    many = rate([Match("a", "b", s) for s in (1.0, 0.0, 0.5) * 100])
    assert few["a"]["rating"] == pytest.approx(1500, abs=0.2) == many["b"]["rating"]
    assert many["a"]["sd"] < few["a"]["sd"] < 350
    assert many["a"]["wins"] == 100 and many["a"]["draws"] == 100 and many["a"]["matches"] == 300
    # a clean sweep stays finite thanks to the prior
    sweep = rate([Match("a", "b", 1.0)] * 50)
    assert 1500 < sweep["a"]["rating"] < 2500 and sweep["b"]["rating"] < 1500
    assert rate([], ["a", "b"])["a"]["rating"] == 1500.0
    h2h = head_to_head([Match("a", "b", 1.0), Match("a", "b", 0.5), Match("b", "a", 0.0)])
    assert h2h == {"a": {"b": {"wins": 1, "draws": 1, "losses": 0}}, "b": {"a": {"wins": 0, "draws": 0, "losses": 1}}}
    assert rate(matches_from_head_to_head(h2h)) == rate([Match("a", "b", 1.0), Match("a", "b", 0.5),
                                                         Match("b", "a", 0.0)])


@pytest.mark.parametrize("name", GAMES)
def test_team_evaluation_rates_the_expert_clearly_above_random_and_noop(name, tmp_path):
    """The random policy plays legal moves (it completes matches, and beats a no-op player), yet the
    expert's rating is above it by far more than either rating's uncertainty: "a strong policy rates
    above random" is no longer true of any player that makes a move."""
    doc = evaluate([name], ["expert", "env:naive", "random", "noop"], episodes=1, modes=["aec"])
    env = doc["environments"][0]
    ratings = env["rating"]["ratings"]
    n = env["tasks"]
    # seat-rotated: each of the 6 pairs plays every task with each policy in each of the two seats
    assert env["rating"]["matches"] == 6 * 2 * n
    expert, naive, rnd, noop = (ratings[p] for p in ("expert", "env:naive", "random", "noop"))
    h2h = env["rating"]["head_to_head"]
    assert h2h["expert"]["noop"]["wins"] == 2 * n  # every match, from either seat
    assert h2h["expert"]["random"]["wins"] >= 2 / 3 * 2 * n  # random is a real player: it wins a few
    assert h2h["random"]["noop"]["wins"] > 0.75 * 2 * n  # and it beats a player who never moves
    assert h2h["expert"]["env:naive"]["wins"] > h2h["expert"]["env:naive"]["losses"]
    assert doc["summary"]["random"]["aec"]["success_rate"] > 0  # random against random plays matches out
    gap = expert["rating"] - rnd["rating"]
    assert gap > 3 * (expert["sd"] + rnd["sd"]) and gap > 200, ratings  # far beyond its uncertainty
    assert expert["ci95"][0] > rnd["ci95"][1] and expert["ci95"][0] > naive["ci95"][1]  # intervals apart
    assert rnd["ci95"][0] > noop["ci95"][1]  # legal moves beat no moves
    assert expert["rating"] > naive["rating"] > noop["rating"]
    assert doc["rating"]["environments"] == [name] and doc["rating"]["ratings"] == ratings
    paths = write_report(doc, tmp_path)
    md = open(paths["markdown"]).read()
    assert "## Ratings (competitive games, pooled)" in md and "Head to head" in md and "| expert |" in md
    assert open(paths["rating"]).read().startswith("<svg")
    assert json.loads(open(paths["json"]).read())["rating"]["ratings"]["expert"]["rating"] == expert["rating"]


def test_coordination_environments_get_no_rating_and_expert_is_the_oracle_there():
    doc = evaluate(["MultiSupport-v0"], ["expert", "noop"], episodes=1, modes=["aec"])
    assert "rating" not in doc and "rating" not in doc["environments"][0]
    assert doc["summary"]["expert"]["aec"]["success_rate"] == 1.0
    ep = envfactory.make_multi("MultiSupport-v0")
    ep.reset(0)
    assert ExpertPolicy().act(ep, "customer_0", 0) == OraclePolicy().act(ep, "customer_0", 0)
    assert ExpertPolicy("naive").act(ep, "customer_0", 0) == NoopPolicy().act(ep, "customer_0", 0)
