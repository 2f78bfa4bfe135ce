"""No two of the project's modules import each other, directly (lazy and ``TYPE_CHECKING`` imports
count): a circle means neither module can be read, tested or moved without the other."""

import grimp

PACKAGES = ("flows", "tasks", "training", "versioning", "formats", "expectations")


def test_no_two_project_modules_import_each_other():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    circles = sorted(
        f"{a} <-> {b}"
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if a < b and graph.direct_import_exists(importer=b, imported=a)
    )
    assert circles == [], "modules that import each other: " + ", ".join(circles)
