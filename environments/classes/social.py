"""A social network account: posts, follows, likes and comments."""


class SocialFeed:
    """A social network seen from one account: post, follow, like, comment, delete."""

    def __init__(self, me="you", people=None, following=None, posts=None):
        self.me = me
        self.people = list(people or ["kai", "lou", "mia", "noor"])
        self.following = list(following or ["kai"])
        self.posts = {pid: dict(p, likes=list(p.get("likes", [])), comments=list(p.get("comments", [])))
                      for pid, p in (posts or {
                          "p1": {"author": "kai", "text": "Sunrise hike today"},
                          "p2": {"author": "mia", "text": "New album is out"},
                          "p3": {"author": "you", "text": "Hello world"}}).items()}
        self.next_post = len(self.posts) + 1

    def timeline(self) -> str:
        """Posts by you and the people you follow, with like and comment counts."""
        mine = [self.me] + self.following
        return "\n".join(f"{pid} {p['author']}: {p['text']} ({len(p['likes'])} likes, "
                         f"{len(p['comments'])} comments)"
                         for pid, p in sorted(self.posts.items()) if p["author"] in mine) or "(empty)"

    def publish(self, text: str) -> str:
        """Publish a new post.

        Args:
            text: Post text (1 to 280 characters).
        """
        if not 1 <= len(text) <= 280:
            raise ValueError("posts are 1 to 280 characters")
        pid = f"p{self.next_post}"
        self.next_post += 1
        self.posts[pid] = {"author": self.me, "text": text, "likes": [], "comments": []}
        return f"published {pid}"

    def follow(self, person: str) -> str:
        """Follow a person.

        Args:
            person: Their handle.
        """
        if person not in self.people or person in self.following:
            raise ValueError(f"cannot follow {person!r} (unknown or already followed)")
        self.following.append(person)
        return f"following {person}"

    def unfollow(self, person: str) -> str:
        """Stop following a person.

        Args:
            person: Their handle.
        """
        if person not in self.following:
            raise ValueError(f"you do not follow {person!r}")
        self.following.remove(person)
        return f"unfollowed {person}"

    def like(self, post_id: str) -> str:
        """Like a post.

        Args:
            post_id: The post id, e.g. 'p2'.
        """
        if post_id not in self.posts:
            raise KeyError(f"no post {post_id!r}")
        if self.me in self.posts[post_id]["likes"]:
            raise ValueError("already liked")
        self.posts[post_id]["likes"].append(self.me)
        return f"liked {post_id}"

    def comment(self, post_id: str, text: str) -> str:
        """Comment on a post.

        Args:
            post_id: The post id.
            text: Comment text.
        """
        if post_id not in self.posts:
            raise KeyError(f"no post {post_id!r}")
        self.posts[post_id]["comments"].append({"author": self.me, "text": text})
        return f"commented on {post_id}"

    def delete_post(self, post_id: str) -> str:
        """Delete one of your own posts.

        Args:
            post_id: The post id.
        """
        if post_id not in self.posts or self.posts[post_id]["author"] != self.me:
            raise ValueError(f"{post_id!r} is not one of your posts")
        del self.posts[post_id]
        return f"deleted {post_id}"
