"""A team's file:// folder is <root>/<team-slug>/: no root may lie inside another, nor a platform folder inside one.

Reproduction: with E31_DATA_ROOTS=/srv and E31_OUTPUT_ROOTS=/srv/outputs, team "outputs" had /srv/outputs as its
own data folder and staged every team's delivered outputs; the staging cache, agents' and checkpoint folders
inside a data root were readable the same way by a team named like them. Settings are read once, at start-up,
so each case runs a fresh Python process, and the refusal names both folders.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _start(tmp_path, **values: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E31_")}
    env |= {"DJANGO_SETTINGS_MODULE": "e31web.settings", "E31_STATE_DIR": str(tmp_path / "state")}
    env |= values
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("values", "inner", "outer"),
    [
        ({"E31_DATA_ROOTS": "{t}/srv", "E31_OUTPUT_ROOTS": "{t}/srv/outputs"}, "srv/outputs", "srv"),
        ({"E31_DATA_ROOTS": "{t}/out/data", "E31_OUTPUT_ROOTS": "{t}/out"}, "out/data", "out"),
        ({"E31_DATA_ROOTS": "{t}/a:{t}/a/b"}, "a/b", "a"),
        ({"E31_OUTPUT_ROOTS": "{t}/o:{t}/o/p"}, "o/p", "o"),
        ({"E31_DATA_ROOTS": "{t}/d", "E31_STAGING_ROOT": "{t}/d/staging"}, "d/staging", "d"),
        ({"E31_OUTPUT_ROOTS": "{t}/o", "E31_AGENT_ROOT": "{t}/o/agents"}, "o/agents", "o"),
        ({"E31_DATA_ROOTS": "{t}/d", "E31_CHECKPOINT_ROOT": "{t}/d"}, "d", "d"),
        (
            {
                "E31_DATA_ROOTS": "{t}/d",
                "E31_STATE_DIR": "{t}/d/state",
                "E31_STAGING_ROOT": "{t}/s",
                "E31_AGENT_ROOT": "{t}/a",
                "E31_CHECKPOINT_ROOT": "{t}/c",
                "E31_OUTPUT_ROOTS": "{t}/o",
            },
            "d/state",
            "d",
        ),
    ],
)
def test_a_root_inside_another_is_refused_at_start(tmp_path, values, inner, outer):
    started = _start(tmp_path, **{name: value.format(t=tmp_path) for name, value in values.items()})
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert f"{tmp_path}/{inner}" in started.stderr and f"{tmp_path}/{outer}" in started.stderr


def test_roots_apart_start_and_one_folder_for_data_and_outputs_is_allowed(tmp_path):
    shared = f"{tmp_path}/pool"
    started = _start(tmp_path, E31_DATA_ROOTS=shared, E31_OUTPUT_ROOTS=shared)
    assert started.returncode == 0, started.stderr
    assert _start(tmp_path).returncode == 0  # the defaults, all under E31_STATE_DIR, side by side
