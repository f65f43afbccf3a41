"""PettingZoo API, seeding and play-through tests for every multi-agent environment (local runtime)."""

import warnings

import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

import envfactory
import envfactory.faces.pettingzoo_env as multi
from envfactory.faces.pettingzoo_env import TextObservation, ToolAECEnv
from envfactory.checks.scripted import OraclePolicy

MULTI = sorted(s.name for s in envfactory.specs() if getattr(s, "multi_agent", False))


def test_there_are_six_coordination_environments():
    assert len(MULTI) >= 6
    assert {"MultiRecords-v0", "MultiSupport-v0", "MultiRooms-v0", "MultiPipeline-v0", "MultiDeal-v0",
            "MultiMeeting-v0"} <= set(MULTI)


@pytest.mark.parametrize("name", MULTI)
def test_pettingzoo_api_and_seed_tests(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pettingzoo recommends Box/Discrete spaces; ours are Text
        api_test(multi.env(name), num_cycles=50)
        parallel_api_test(multi.parallel_env(name), num_cycles=50)
        seed_test(lambda: multi.env(name), num_cycles=50)
        parallel_seed_test(lambda: multi.parallel_env(name), num_cycles=50)


@pytest.mark.parametrize("name", MULTI)
def test_oracle_team_through_the_aec_adapter(name):
    env = multi.env(name)
    oracle = OraclePolicy()
    env.reset(options={"task": 0})
    first_obs = env.observe(env.agent_selection)
    assert isinstance(first_obs, TextObservation) and env.observation_space(env.agent_selection).contains(first_obs)
    assert env.infos[env.agent_selection]["tools"]
    final = {}
    for agent in env.agent_iter(1000):
        obs, reward, term, trunc, info = env.last()
        final[agent] = reward
        if term or trunc:
            assert info["success"] is True
            env.step(None)
        else:
            env.step(oracle.act(env.episode, agent, 0))
    assert not env.agents
    spec = envfactory.spec(name)
    if spec.payoff is None:
        assert final == dict.fromkeys(spec.agent_ids, 1.0)
    elif spec.metadata.get("zero_sum"):  # a competitive game: what one side wins, the other loses
        assert sum(final.values()) == pytest.approx(0.0) and all(-1 <= r <= 1 for r in final.values())
    else:
        assert all(0 < r <= 1 for r in final.values())


@pytest.mark.parametrize("name", MULTI)
def test_oracle_team_through_the_parallel_adapter(name):
    env = multi.parallel_env(name)
    oracle = OraclePolicy()
    obs, infos = env.reset(seed=1)
    assert set(obs) == set(env.possible_agents)
    rounds = 0
    while env.agents:
        actions = {a: oracle.act(env.episode, a, 0) for a in env.agents}
        obs, rewards, terms, truncs, infos = env.step(actions)
        rounds += 1
    assert all(terms.values()) and not any(truncs.values())
    assert all(i["success"] for i in infos.values())
    assert rounds == env.episode.status.round


def test_seeded_reset_picks_the_same_task_and_options_pick_a_task():
    a, b = multi.env("MultiRooms-v0"), multi.env("MultiRooms-v0")
    a.reset(seed=7)
    b.reset(seed=7)
    assert a.episode.task.id == b.episode.task.id
    a.reset(options={"task": "rooms-002"})
    assert a.episode.task.id == "rooms-002"
    # the one seeding rule: both PettingZoo views pick what envfactory.make(...).reset(seed=s) picks
    ep, par = envfactory.make("MultiRooms-v0"), multi.parallel_env("MultiRooms-v0")
    for seed in range(20):
        ep.reset(seed=seed)
        a.reset(seed=seed)
        par.reset(seed=seed)
        assert a.episode.task.id == par.episode.task.id == ep.task.id, seed


def test_infos_are_cheap_and_the_transcript_is_one_call_away():
    env = multi.env("MultiRecords-v0")
    env.reset(options={"task": 0})
    opening = env.infos["reader_0"]["messages"]
    assert [m["role"] for m in opening] == ["system", "user"] and "records analyst" in opening[0]["content"]
    env.step('<tool_call>{"name": "search_employees", "arguments": {"name": "Alice"}}</tool_call>')
    assert "messages" not in env.infos["reader_0"] and env.infos["reader_0"]["round"] == 1
    said = env.transcript("reader_0")
    assert said[-1]["role"] == "tool" and "Alice Chen" in said[-1]["content"]
    assert env.transcript("writer_0") == env.episode.transcript("writer_0")


def test_private_notes_reach_only_their_owner():
    env = multi.parallel_env("MultiSupport-v0")
    obs, _ = env.reset(options={"task": 0})
    assert "4821" in obs["customer_0"] and "4821" not in obs["support_0"]


def test_render_and_module_level_entry_points():
    from environments import multi_records

    env = multi_records.env(render_mode="ansi")
    assert isinstance(env, ToolAECEnv)
    env.reset(options={"task": 0})
    env.step('<tool_call>{"name": "search_employees", "arguments": {"name": "Alice"}}</tool_call>')
    assert "search_employees" in env.render() and "-> ok" in env.render()
    assert multi_records.parallel_env().possible_agents == ["reader_0", "writer_0"]
    assert envfactory.make("MultiRecords-v0").agents == ["reader_0", "writer_0"]  # one engine for teams too
    with pytest.raises(TypeError, match="single-agent"):
        envfactory.make_multi("Counter-v0")
    with pytest.raises(TypeError, match="single-agent"):
        ToolAECEnv(episode=envfactory.make("Counter-v0"))
    from envfactory.faces.gym_env import ToolGymEnv

    with pytest.raises(TypeError, match="team environment"):
        ToolGymEnv(env=envfactory.make("MultiRecords-v0"))
