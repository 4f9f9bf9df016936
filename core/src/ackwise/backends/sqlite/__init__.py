"""``sqlite://``: the embedded default broker and its stores."""
