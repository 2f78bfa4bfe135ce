"""The demo's sources: real files this machine has, sampled within a budget, staged stably."""

from __future__ import annotations

from flows.demo_sources import MB, DemoBudget, demo_sources, sample, stage, stdlib_files


def _tree(path):
    return {p.relative_to(path).as_posix(): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()}


def test_demo_sources_are_real_bounded_and_stable(tmp_path):
    budget = DemoBudget(code_bytes=MB // 2, prose_bytes=MB // 4, license_bytes=MB // 4)
    sources = demo_sources(tmp_path / "demo", budget)
    by_name = {s.name: s for s in sources}
    assert by_name["python-stdlib"].kind == "code" and by_name["package-docs"].kind == "prose"
    code = tmp_path / "demo" / "python-stdlib"
    assert any(p.name == "os.py" or p.suffix == ".py" for p in code.rglob("*"))
    assert sum(p.stat().st_size for p in code.rglob("*") if p.is_file()) <= budget.code_bytes
    assert all(p.name == "METADATA" for p in (tmp_path / "demo" / "package-docs").rglob("*") if p.is_file())

    before = {name: _tree(tmp_path / "demo" / name) for name in by_name}
    demo_sources(tmp_path / "demo", budget)
    after = {name: _tree(tmp_path / "demo" / name) for name in by_name}
    assert after == before, "a second staging changes nothing, so the next run reuses every stage"


def test_sampling_spreads_over_the_set_and_staging_mirrors_it(tmp_path):
    files = dict(stdlib_files())
    chosen = sample(files.items(), budget_bytes=200_000, max_file_bytes=50_000)
    assert 0 < sum(p.stat().st_size for p in chosen.values()) <= 200_000
    assert len({rel.split("/")[0] for rel in chosen}) > 1, "not just the first files in path order"
    dest = stage(chosen, tmp_path / "staged")
    stale = dest / "stale.py"
    stale.write_text("x = 1\n")
    stage(chosen, dest)
    assert set(_tree(dest)) == set(chosen), "files no longer chosen are removed"
