"""Reliability suite helpers: each test reports one figure line, printed again in the run summary."""

from __future__ import annotations

import pytest

_FIGURES: list[str] = []


@pytest.fixture
def figure(request):
    """``figure(requests_faulted=…, retries_seen=…, rows_checked=…)``: print and keep one line."""

    def report(**numbers: object) -> str:
        line = f"FIGURE {request.node.name}: " + ", ".join(f"{k.replace('_', ' ')}={v}" for k, v in numbers.items())
        print(line)
        _FIGURES.append(line)
        return line

    return report


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("reliability figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
