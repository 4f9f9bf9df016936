"""A griffe extension: ackwise documents attributes with ``#:`` comments above them (Sphinx's
convention); griffe reads only a string after the assignment.  This makes the comments the
attributes' docstrings, so the API reference shows them (mkdocs.yml loads it)."""

from __future__ import annotations

import ast
from typing import Any

from griffe import Attribute, Docstring, Extension


class CommentDocs(Extension):
    def on_attribute_instance(self, *, node: ast.AST | Any, attr: Attribute, **kwargs: Any) -> None:
        if attr.docstring is not None or not isinstance(node, ast.AST) or attr.lineno is None:
            return
        try:
            lines = attr.lines_collection[attr.filepath]  # type: ignore[index]
        except (KeyError, TypeError):
            return
        comment: list[str] = []
        index = attr.lineno - 2  # the line above the assignment, 0-based
        while index >= 0 and lines[index].strip().startswith("#:"):
            comment.insert(0, lines[index].strip()[2:].strip())
            index -= 1
        if comment:
            attr.docstring = Docstring(" ".join(comment), parent=attr)
