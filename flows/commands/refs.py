"""Refs named on the command line, resolved before any flow starts: a typo fails in about a
second, as one sentence that names the flag and what the repository does hold."""

from __future__ import annotations

from flows.refusals import Refusal
from versioning import NotFound, open_repo

SHOWN_TAGS = 5


@Refusal.register
class UnknownRef(ValueError):
    """A ref the repository does not hold; the message names the tags and branches it does."""


def resolve_ref(repo_spec: str | None, ref: str, flag: str) -> str:
    """``ref``'s commit id in the repository, or :class:`UnknownRef` naming ``flag`` and the refs there are."""
    repo = open_repo(repo_spec, create=False)  # a missing repository is NotFound naming its path
    try:
        return repo.resolve(ref)
    except NotFound:
        tags = sorted(repo.list_tags(), reverse=True)
        shown = ", ".join(tags[:SHOWN_TAGS]) + (
            f" and {len(tags) - SHOWN_TAGS} more" if len(tags) > SHOWN_TAGS else ""
        )
        branches = ", ".join(sorted(repo.list_branches()))
        raise UnknownRef(
            f"{flag} {ref}: no such tag, branch or commit in the repository {repo_spec_label(repo_spec)} "
            f"(tags: {shown or 'none'}; branches: {branches or 'none'})"
        ) from None


def repo_spec_label(repo_spec: str | None) -> str:
    """The repository as a user finds it: its path, or lakefs://NAME."""
    from pathlib import Path

    from versioning import default_repo_spec

    spec = repo_spec or default_repo_spec()
    return spec if spec.startswith("lakefs://") else str(Path(spec.removeprefix("local://")).resolve())
