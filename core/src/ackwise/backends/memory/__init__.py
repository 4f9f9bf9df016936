"""``memory://``: the in-process broker and its stores."""
