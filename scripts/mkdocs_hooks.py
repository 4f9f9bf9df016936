"""MkDocs hooks: the pages of docs/ link to a few files outside it (the README, bench results, the
example adapter).  Those files join the site as pages of their own, and every link to them or
from them is rewritten to the site's layout; a link to a file that exists nowhere is left as it
is, so `mkdocs build --strict` fails on it.

The README is the site's quickstart page; any other file keeps its repository path under
``repo/``.  A link to a folder goes to the folder's README.md.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# [text](target) and [text](target#anchor), not images, not absolute URLs, not bare anchors
LINK = re.compile(r"(?<!!)\]\((?P<target>(?![a-z][a-z0-9+.-]*:|#)[^)\s]+)\)")
# fenced code blocks keep their text
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)

_SITE_PATH_OF: dict[str, str] = {}  # repository path -> site path, for files outside docs/


def _site_path(repo_path: str) -> str:
    if repo_path == "README.md":
        return "quickstart.md"
    return f"repo/{repo_path}" if repo_path.endswith(".md") else f"repo/{repo_path}.md"


def _targets(markdown: str) -> list[str]:
    text = FENCE.sub("", markdown)
    return [m["target"] for m in LINK.finditer(text)]


def _resolve(repo: Path, from_repo_path: str, target: str) -> str | None:
    """The repository path a relative link points to (a folder's README.md), or None."""
    path = target.split("#", 1)[0]
    if not path:
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(from_repo_path), path))
    if joined.startswith(".."):
        return None
    if (repo / joined).is_dir() and (repo / joined / "README.md").is_file():
        joined = posixpath.join(joined, "README.md")
    return joined if (repo / joined).is_file() else None


def on_files(files: Files, config: Any) -> Files:
    docs = Path(config["docs_dir"]).resolve()
    repo = docs.parent
    docs_rel = docs.relative_to(repo).as_posix()
    pending = [f"{docs_rel}/{f.src_uri}" for f in files.documentation_pages()]
    seen: set[str] = set(pending)
    while pending:
        current = pending.pop()
        for target in _targets((repo / current).read_text(encoding="utf-8")):
            found = _resolve(repo, current, target)
            if found is None or found in seen or found.startswith(f"{docs_rel}/"):
                continue
            seen.add(found)
            if found.endswith(".md"):
                pending.append(found)
            _SITE_PATH_OF[found] = _site_path(found)
    for repo_path, site_path in sorted(_SITE_PATH_OF.items()):
        text = (repo / repo_path).read_text(encoding="utf-8")
        if not repo_path.endswith(".md"):
            lang = Path(repo_path).suffix.lstrip(".")
            text = f"# `{repo_path}`\n\n```{lang}\n{text}\n```\n"
        files.append(File.generated(config, site_path, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = docs.parent
    docs_rel = docs.relative_to(repo).as_posix()
    site_uri = page.file.src_uri
    by_site = {site: repo_path for repo_path, site in _SITE_PATH_OF.items()}
    here = by_site.get(site_uri, f"{docs_rel}/{site_uri}")

    def rewrite(match: re.Match[str]) -> str:
        target = match["target"]
        found = _resolve(repo, here, target)
        if found is None:
            return match.group(0)
        if found.startswith(f"{docs_rel}/"):
            new_site = found.removeprefix(f"{docs_rel}/")
        elif found in _SITE_PATH_OF:
            new_site = _SITE_PATH_OF[found]
        else:
            return match.group(0)
        anchor = "#" + target.split("#", 1)[1] if "#" in target else ""
        relative = posixpath.relpath(new_site, posixpath.dirname(site_uri) or ".")
        return f"]({relative}{anchor})"

    parts = []
    last = 0
    for fence in FENCE.finditer(markdown):
        parts.append(LINK.sub(rewrite, markdown[last : fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(parts)
