"""The test suite's own rules: helpers are imported one way, and no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HELPERS = {p.stem for p in TESTS.rglob("*.py") if not p.stem.startswith(("test_", "conftest", "__init__"))}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def test_helpers_are_imported_through_the_tests_package_and_never_from_test_modules():
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module in imported_modules(path):
            where = f"{path.relative_to(TESTS.parent)}:{line}"
            parts = module.lstrip(".").split(".")
            if module.startswith("."):
                problems.append(f"{where}: relative import {module!r}; write 'tests.…'")
            elif parts[0] in HELPERS:
                problems.append(f"{where}: bare helper import {module!r}; write 'tests.{module}'")
            elif parts[0] == "tests" and parts[-1].startswith("test_"):
                problems.append(f"{where}: imports the test module {module!r}; move what it needs to a helper")
            elif parts[0] == "tests" and parts[-1] == "conftest":
                problems.append(f"{where}: imports conftest (pytest loads it itself); move what it needs to a helper")
    assert not problems, "\n".join(problems)
    assert {"snapshot_factory", "spark_helpers", "operator_helpers"} <= HELPERS  # the rule sees the helpers


def test_tiers_read_markers_from_the_parts_a_test_uses():
    from tests.tiers import excluded_parts, markers_for

    assert markers_for(("tmp_path", "s3_root", "s3_server"), {}) == {"s3"}
    assert markers_for(("any_root", "file_root"), {"any_root": "file"}) == set()
    assert markers_for(("any_root",), {"any_root": "s3"}) == {"s3"}
    assert markers_for(("spark", "run_dag", "airflow_env"), {}) == {"spark", "airflow"}
    assert excluded_parts("not spark and not s3 and not airflow") == {"spark", "s3", "airflow"}
    assert excluded_parts("spark and (not s3)") == {"s3"}
    assert excluded_parts("") == set()


def test_the_no_spark_home_refuses_every_launcher(tmp_path):
    import subprocess

    from tests.tiers import write_spark_refusal

    home = write_spark_refusal(tmp_path / "home")
    for name in ("spark-submit", "spark-class", "pyspark"):
        proc = subprocess.run([str(home / "bin" / name), "--version"], capture_output=True, text=True, check=False)
        assert proc.returncode == 3 and "not marked 'spark'" in proc.stderr
