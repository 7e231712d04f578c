"""Figure lines of the reliability suite: kept on each test's report so xdist workers' lines reach the summary."""

from __future__ import annotations

PROPERTY = "reliability_figure"


def figure_lines(stats: dict) -> list[str]:
    return [
        value
        for reports in stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == PROPERTY
    ]
