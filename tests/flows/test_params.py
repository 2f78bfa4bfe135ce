"""CurateParams keys: the validate stage's section is ``[validation]``; ``[filters]``, its name
before, still loads (old TOML files and saved deployment parameters)."""

from __future__ import annotations

import importlib.util
import logging
import re
from typing import Any

import pytest
from pydantic import ValidationError

from flows.params import CurateParams


@pytest.mark.parametrize("section", ["validation", "filters"])
def test_the_validate_section_loads_under_its_name_and_its_old_name(tmp_path, section):
    config = tmp_path / "curate.toml"
    config.write_text(f"[{section}]\nbatch_rows = 7\n\n[{section}.langid]\nenabled = false\n")
    params = CurateParams.from_toml(config)
    assert params.validation.batch_rows == 7 and params.validation.langid.enabled is False
    assert CurateParams.model_validate(params.model_dump(mode="json")) == params, "a dump loads back"


def test_an_unknown_section_is_named_in_one_sentence(tmp_path):
    config = tmp_path / "curate.toml"
    config.write_text("[filterz]\nbatch_rows = 7\n")
    with pytest.raises(ValueError, match=r"curate.toml: filterz: Extra inputs are not permitted"):
        CurateParams.from_toml(config)


def _descriptions(schema: object) -> list[str]:
    if isinstance(schema, dict):
        found = [schema["description"]] if isinstance(schema.get("description"), str) else []
        return found + [d for value in schema.values() for d in _descriptions(value)]
    if isinstance(schema, list):
        return [d for value in schema for d in _descriptions(value)]
    return []


def test_the_ui_forms_show_every_description_as_written():
    """The Prefect UI renders descriptions as HTML: '<preset>' would vanish ("run name; default -")."""
    from flows.janitor import JanitorParams
    from flows.pipeline import PipelineParams
    from flows.rollback import RollbackParams

    for model in (
        PipelineParams,
        JanitorParams,
        RollbackParams,
    ):  # PipelineParams holds CurateParams and TrainParams
        descriptions = _descriptions(model.model_json_schema())
        assert len(descriptions) >= 3
        assert not [d for d in descriptions if re.search(r"<[A-Za-z/][^>]*>", d)], model.__name__


@pytest.mark.parametrize(
    ("runner", "error"),
    [
        ({"spec": "spark"}, r"runner\.spec: String should match pattern"),
        (
            {"spec": "dask", "memory_limit": "2 gigs"},
            r"memory_limit '2 gigs' is not a size: write e\.g\. 2GiB",
        ),
        ({"spec": "dask", "workers": 0}, r"runner\.workers: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_runner_is_refused_in_one_sentence(tmp_path, runner, error):
    config = tmp_path / "curate.toml"
    config.write_text("[runner]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in runner.items()))
    with pytest.raises(ValueError, match=error):
        CurateParams.from_toml(config)


def test_a_scheduler_address_becomes_a_dask_task_runner_on_it():
    from prefect_dask import DaskTaskRunner

    from flows.runners import task_runner

    params = CurateParams.model_validate(
        {"runner": {"spec": "dask:tcp://scheduler:8786", "memory_limit": "2GiB"}}
    )
    runner = task_runner(params.runner.spec, params.runner.workers, params.runner.memory_limit)
    assert isinstance(runner, DaskTaskRunner) and runner.address == "tcp://scheduler:8786"
    local = task_runner("dask", 2, "512MiB")
    assert local.cluster_kwargs == {
        "n_workers": 2,
        "threads_per_worker": 1,
        "processes": True,
        "memory_limit": "512MiB",
        "dashboard_address": None,
        "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
        "env": {"ARROW_DEFAULT_MEMORY_POOL": "system"},
    }


def _worker_settings(dask_worker: Any) -> tuple[object, str, bool]:
    import dask
    import pyarrow as pa

    return (
        dask.config.get("distributed.worker.memory.pause"),
        pa.default_memory_pool().backend_name,
        "profile" in dask_worker.periodic_callbacks,
    )


def test_workers_of_a_cluster_started_for_the_run_never_pause_use_the_system_allocator_and_do_not_profile():
    from flows.runners import partitions_on

    with partitions_on("dask", 1, "1GiB") as runner:
        settings = list(runner.client.run(_worker_settings).values())
    # a paused worker holding unmanaged memory would wait forever; the profiler's history grows
    # a worker by megabytes a minute
    assert settings == [(False, "system", False)]


def test_a_lakefs_repository_name_lakefs_would_refuse_fails_the_parameters():
    with pytest.raises(ValueError) as refused:
        CurateParams.from_dict({"repository": {"spec": "lakefs://Bad_Name"}})
    assert str(refused.value) == (
        "parameters: repository.spec: repository name 'Bad_Name' is invalid: "
        "3-63 characters of lowercase letters, digits and '-'"
    )
    assert (
        CurateParams.from_dict({"repository": {"spec": "lakefs://good-name"}}).repository.spec
        == "lakefs://good-name"
    )


def test_a_cluster_started_for_the_run_serves_no_dashboard_and_says_none_unless_asked(caplog):
    from flows.notices import to_console
    from flows.runners import partitions_on

    said: list[str] = []
    caplog.set_level(logging.INFO, logger="prefect.task_runner.dask")
    with to_console(lambda level, message: said.append(message)), partitions_on("dask", 1, "1GiB") as runner:
        http = runner.client.scheduler_info()["services"]["dashboard"]
        address = runner.client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.http_server.address)
    prefect_dask = [r.getMessage() for r in caplog.records if r.name == "prefect.task_runner.dask"]
    assert prefect_dask and not [m for m in prefect_dask if "dashboard" in m.lower()] and said == []
    # the HTTP server distributed always starts (health, metrics): loopback, a free port, never :8787
    assert address == "127.0.0.1" and http != 8787


def test_a_dashboard_asked_for_is_served_and_its_url_said(caplog):
    import urllib.request

    from flows.notices import to_console
    from flows.runners import partitions_on

    said: list[tuple[int, str]] = []
    with to_console(lambda level, message: said.append((level, message))):
        with partitions_on("dask", 1, "1GiB", dashboard="127.0.0.1:0") as runner:
            url = runner.client.dashboard_link
            with urllib.request.urlopen(url) as page:  # without bokeh, Dask's page that says so
                assert page.status == 200
    assert said == [(logging.INFO, f"Dask dashboard: {url}")]


def test_a_dashboard_needs_a_cluster_started_for_the_run_and_bokeh():
    with pytest.raises(ValidationError, match="an existing scheduler serves its own"):
        CurateParams.model_validate({"runner": {"spec": "dask:tcp://scheduler:8786", "dashboard": ":8787"}})
    if importlib.util.find_spec("bokeh") is None:
        with pytest.raises(ValidationError, match="pip install 'bokeh"):
            CurateParams.model_validate({"runner": {"spec": "dask", "dashboard": ":8787"}})
