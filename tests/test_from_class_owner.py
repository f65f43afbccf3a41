"""Third-party worlds scored as their owners score them (issue 31).

A class written for its own users keeps what it is given, stamps clocks and ids on its
records and loads its scenario in a method of its own; from_class must neither let such a
class change a task's reference solution nor fail a correct replay over a value that only
differs from run to run."""

from __future__ import annotations

import pytest

from envfactory import Episode
from envfactory.checks.scripted import OraclePolicy, play
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.task import call


class Feed:
    """A feed that keeps the lists it is given (no copy), as plain classes do."""

    def __init__(self, posts: list | None = None):
        self.posts = list(posts or [])

    def post(self, text: str, mentions: list) -> str:
        """Post a message.

        Args:
            text: The message.
            mentions: Who it mentions.
        """
        self.posts.append({"text": text, "mentions": mentions})
        return f"posted #{len(self.posts) - 1}"

    def mention(self, index: int, who: str) -> str:
        """Mention someone in a post.

        Args:
            index: The post.
            who: The person.
        """
        self.posts[index]["mentions"].append(who)
        return "ok"


@pytest.mark.parametrize("validation", ["lax", "coerce", "strict"])
def test_a_class_that_keeps_its_arguments_cannot_change_the_reference(validation):
    """Before: with validation='lax' the stored ``mentions`` was the solution's own list, so
    building the task (the reads replay, then the expected state) appended to the reference
    solution, and the gold replay could never reach the expected state."""
    solution = [call("post", text="hi", mentions=["ann"]), call("mention", index=0, who="bob")]
    task = ClassTask("post-hi", "Post hi mentioning ann, then mention bob.", {"posts": []}, solution)
    spec = from_class(Feed, name="Feed-v0", domain="social", tasks=[task], validation=validation,
                      read_only=None, require_reads="always")
    built = spec.get_tasks()[0]
    assert solution[0].arguments == {"text": "hi", "mentions": ["ann"]}
    assert built.solution[0].arguments == {"text": "hi", "mentions": ["ann"]}
    out = play(Episode(spec), OraclePolicy(), "post-hi")
    assert out.success and set(out.rewards.values()) == {1.0}
    assert built.solution[0].arguments["mentions"] == ["ann"]
