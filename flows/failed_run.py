"""What a failed curate run says, in its Prefect log and on the command line: one paragraph.

Which gate failed and its failing expectations or rule (or the error), where its Data Docs
are, what became of ``main`` and the run branch, and what to change. The curate flow logs it
at ERROR and leaves it as the run's ``curate-summary`` artifact (state Failed); ``tokenlake
curate`` and ``tokenlake run`` print it. Prefect's own lines about a refusal carry no traceback
(:mod:`flows.refusals`): a traceback in a run's log is a bug's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flows.refusals import PublishRefused, is_refusal
from flows.wap import MainMoved
from tasks.gates import ExpectationsFailed

# the CurateParams section of each stage's settings
STAGE_SECTION = {
    "ingest": "ingest",
    "validate": "validation",
    "dedup": "dedup",
    "shard": "shards",
    "mix": "mix",
}
TRACEBACK_IN_LOG = "its traceback is in this run's log"


def main_head(spec: str) -> str | None:
    """main's commit id, or None where the repository (or main) does not exist yet."""
    from formats.layout import MAIN
    from versioning import NotFound, open_repo

    try:
        return open_repo(spec, create=False).resolve(MAIN)
    except NotFound:
        return None


def failure_report(exc: BaseException, repository: str, in_run: bool = False) -> str:
    """The paragraph on a failed curate run: what failed (the gate, its failing expectations or
    rule, its Data Docs), ``repository`` (:func:`repository_state`), and what to change.

    ``in_run``: written for the run's own log, where an unexpected exception's traceback is
    (on the command line, ``--debug`` shows it)."""
    if isinstance(exc, ExpectationsFailed):
        lines = [f"the {exc.stage} stage's gate {exc.summary}:"]
        lines += [f"  - {failure}" for failure in exc.failures]
        if exc.data_docs:
            lines.append(f"Data Docs: {Path(exc.data_docs).as_uri()}")
        section = STAGE_SECTION.get(exc.stage, exc.stage)
        change = (
            "To publish: fix the documents the failing expectations name (the Data Docs show examples), "
            f"or change the [{section}] settings they check; then run curate again."
        )
    elif isinstance(exc, PublishRefused):
        lines = ["the publish gates ([gates] of the config) refused the run:"]
        lines += [f"  - {failure}" for failure in exc.failures]
        change = (
            "To publish: give the run more or better data (sources, documents), or change the [gates] "
            "settings named above; then run curate again."
        )
    elif isinstance(exc, MainMoved):
        lines, change = [f"not published: {exc}."], ""  # the message says what to do
    elif (train := sys.modules.get("flows.train")) and isinstance(exc, train.TrainingFailed):
        # the pipeline published, then training failed
        return f"training failed: {exc}; the dataset version stays published (`tokenlake datasets`)"
    elif is_refusal(exc):
        lines, change = [f"the run failed: {exc}"], ""
    elif in_run:
        lines, change = [f"the run failed: {type(exc).__name__}: {exc} ({TRACEBACK_IN_LOG})"], ""
    else:
        from flows.cli import explain

        lines, change = [f"the run failed: {explain(exc)[1]}"], ""
    return "\n".join([*lines, repository, *([change] if change else [])])


def repository_state(spec: str, main_before: str | None, branch: str | None) -> str:
    """What became of main and the run branch, as checked in the repository now."""
    from flows import publish_guard
    from formats.layout import MAIN
    from versioning import RepoError, open_repo

    try:
        now = main_head(spec)
        if now == main_before:
            where = f"still {now[:12]}" if now else "no dataset version yet"
            said = f"main is unchanged ({where})"
        else:
            added = []
            for commit in open_repo(spec, create=False).log(MAIN, limit=20):
                if commit.id == main_before:
                    break
                added.append(commit)
            if all(c.metadata.get("stage") == publish_guard.INSTALL_STAGE for c in added):
                said = "main is unchanged but for the publish guard this run installed on it (no dataset version)"
            else:
                said = f"main moved from {(main_before or 'nothing')[:12]} to {(now or 'nothing')[:12]} (another run published?)"
        if branch is None:
            return said + "."
        if now is not None and branch in open_repo(spec, create=False).list_branches():
            return f"{said}; the run branch {branch} is still there (`tokenlake janitor` removes it once its run is over)."
        return f"{said} and the run branch {branch} was removed."
    except RepoError as exc:  # unreachable, or refusing these credentials now
        return unchecked_state(exc)


def unchecked_state(exc: BaseException) -> str:
    """What can be said of main and the run branch while the repository cannot be asked."""
    return (
        f"main and the run branch could not be checked ({exc}); a failed run never moves main, and its "
        "branch is removed once the repository answers again (or by `tokenlake janitor`)."
    )


def failed_summary_markdown(
    report: str, branch: str | None, data_docs: dict[str, str], stages: list[str]
) -> str:
    """The ``curate-summary`` of a failed run: state Failed, the report, the Data Docs to read."""
    reason, *rest = report.splitlines()
    lines = ["# curate: Failed, nothing published", "", "State: **Failed**.", "", f"Reason: {reason}", ""]
    for line in rest:
        lines += [f"- {line.removeprefix('  - ')}"] if line.startswith("  - ") else ["", line]
    lines.append("")
    if stages:
        lines += [f"Stages this run finished: {', '.join(stages)}.", ""]
    if branch:
        lines += [f"Run branch `{branch}`.", ""]
    if data_docs:
        lines += ["Great Expectations Data Docs:", ""]
        lines += [f"- [{name}]({url}) `{url}`" for name, url in data_docs.items()]
        if any(url.startswith("file://") for url in data_docs.values()):
            lines += [
                "",
                "Browsers do not open `file://` links from a web page: copy the path into the address bar "
                "(on the machine that ran the flow).",
            ]
    return "\n".join(lines).rstrip() + "\n"


def failed_summary(report: str, branch: str | None, data_docs: dict[str, str], stages: list[str]) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        failed_summary_markdown(report, branch, data_docs, stages),
        key="curate-summary",
        description=f"Failed: {report.splitlines()[0]}"[:500],
    )
