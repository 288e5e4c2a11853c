"""docs/operator-guide.md must list every setting (with its current default) and every cv_* metric.

A settings class's section is the heading that names it in backticks, e.g.
``### Gateway (`GatewaySettings`)``; its table rows read ``| `CV_NAME` | default | meaning |``.
Fields a service inherits unchanged from ``ServiceSettings`` are documented once, in its section.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from clairvoyant.core.config import ServiceSettings

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDE = REPO_ROOT / "docs" / "operator-guide.md"
METRIC_DEFINITION = re.compile(r"\b(?:Counter|Gauge|Histogram|Summary|Info|Enum)\(\s*[\"'](cv_\w+)[\"']")


def rendered_default(field: FieldInfo) -> str:
    """How the guide writes a default: `8000`, `true`, `""`, *unset* for None."""
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "*required*"
    if value is None:
        return "*unset*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def section(text: str, class_name: str) -> str:
    """The text under the heading that names ``class_name``, up to the next heading of its level or above."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("#") and f"`{class_name}`" in line]
    assert len(starts) == 1, f"the guide needs one heading naming `{class_name}`, found {len(starts)}"
    level = len(lines[starts[0]]) - len(lines[starts[0]].lstrip("#"))
    end = next(
        (
            i
            for i in range(starts[0] + 1, len(lines))
            if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level
        ),
        len(lines),
    )
    return "\n".join(lines[starts[0] + 1 : end])


def table_rows(text: str) -> dict[str, list[str]]:
    """First cell (the variable, backticks stripped) -> the row's cells."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    return rows


def documented_fields(cls: type[ServiceSettings]) -> dict[str, FieldInfo]:
    """The fields ``cls``'s own section must list: its own, and inherited ones whose default it changes."""
    if cls is ServiceSettings:
        return dict(cls.model_fields)
    common = ServiceSettings.model_fields
    return {
        name: field
        for name, field in cls.model_fields.items()
        if name not in common or field.get_default(call_default_factory=True) != common[name].get_default()
    }


def test_every_setting_is_documented_with_its_default(
    all_settings: dict[str, Any], settings_env_name: Any
) -> None:
    text = GUIDE.read_text()
    problems = []
    for cls in all_settings.values():
        rows = table_rows(section(text, cls.__name__))
        for name, field in documented_fields(cls).items():
            variable = settings_env_name(cls, name)
            row = rows.get(variable)
            if row is None:
                problems.append(f"{cls.__name__}.{name}: no row for `{variable}`")
            elif row[1] != rendered_default(field):
                problems.append(
                    f"{cls.__name__}.{name}: `{variable}` documented as {row[1]}, is {rendered_default(field)}"
                )
    assert not problems, "docs/operator-guide.md is out of date:\n" + "\n".join(problems)


def test_no_documented_setting_is_stale(all_settings: dict[str, Any], settings_env_name: Any) -> None:
    text = GUIDE.read_text()
    for cls in all_settings.values():
        current = {settings_env_name(cls, name) for name in cls.model_fields}
        stale = sorted(set(table_rows(section(text, cls.__name__))) - current - {"Variable"})
        assert not stale, (
            f"docs/operator-guide.md lists {stale} under {cls.__name__}, which has no such fields"
        )


def test_every_service_with_settings_has_a_section(all_settings: dict[str, Any]) -> None:
    # all_settings finds every services/*/config.py; a section per class keeps new services visible.
    assert {"core", "gateway", "scheduler", "worker"} <= set(all_settings)
    text = GUIDE.read_text()
    for cls in all_settings.values():
        assert f"`{cls.__name__}`" in text


def test_every_metric_in_the_code_is_documented() -> None:
    sources = [*REPO_ROOT.glob("libs/*/src/**/*.py"), *REPO_ROOT.glob("services/*/src/**/*.py")]
    defined = {name for path in sources for name in METRIC_DEFINITION.findall(path.read_text())}
    assert defined, "found no cv_* metrics in the code; has the naming changed?"
    documented = set(re.findall(r"`(cv_\w+)`", GUIDE.read_text()))
    missing = sorted(defined - documented)
    assert not missing, f"metrics missing from docs/operator-guide.md: {missing}"
