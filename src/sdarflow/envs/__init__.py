"""Environment protocol re-exports and the registry of env suite names: built-ins as lazy ``"module:Class"``
strings (importing ``sdarflow.envs`` stays cheap), plugins through the ``sdarflow.envs`` entry-point group
(docs/environments.md); a built-in name wins over a plugin.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from sdarflow.envs.base import (
    SPLITS,
    ActionFormat,
    Env,
    EnvError,
    EnvSuite,
    Reset,
    SkillTruth,
    Solutions,
    Step,
    Task,
)
from sdarflow.names import NameRegistry

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sdarflow.envs"

BUILTIN_ENVS: NameRegistry[type[EnvSuite]] = NameRegistry("env")
BUILTIN_ENVS.add_lazy("textworld-cooking", "sdarflow.envs.textworld_cooking:TextWorldCookingSuite")
BUILTIN_ENVS.add_lazy("textworld-cooking-score", "sdarflow.envs.textworld_cooking:TextWorldCookingScoreSuite")
BUILTIN_ENVS.add_lazy("tool-use", "sdarflow.envs.tool_use:ToolUseSuite")
BUILTIN_ENVS.add_lazy("tool-use-http", "sdarflow.envs.tool_server:HttpToolUseSuite")
BUILTIN_ENVS.add_lazy("search-qa", "sdarflow.envs.search_qa:SearchQASuite")


def _plugins() -> dict:
    """Entry points of the ``sdarflow.envs`` group by name, minus names a built-in already takes."""
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN_ENVS:
            log.warning("ignoring entry point %s=%s: %r is a built-in env", ep.name, ep.value, ep.name)
            continue
        found[ep.name] = ep
    return found


def list_envs() -> list[str]:
    """Every env suite name: built-ins and installed plugins, sorted."""
    return sorted({*BUILTIN_ENVS, *_plugins()})


def get_suite(name: str, **kwargs) -> EnvSuite:
    """Construct the env suite registered as ``name`` with ``kwargs`` (e.g. ``cache_dir``, ``max_turns``)."""
    if name in BUILTIN_ENVS:
        cls = BUILTIN_ENVS.get(name)
    else:
        plugins = _plugins()
        if name not in plugins:
            raise EnvError(
                f"unknown env {name!r}; available: {', '.join(list_envs())}; "
                f"fix: pick one of those, or install a package that registers {name!r} in the "
                f"{ENTRY_POINT_GROUP!r} entry-point group"
            )
        try:
            cls = plugins[name].load()
        except (ImportError, AttributeError) as err:
            raise EnvError(
                f"env {name!r} is registered as {plugins[name].value!r} but cannot be loaded: {err}; "
                f"fix: reinstall the package that provides it, or correct its {ENTRY_POINT_GROUP!r} entry point"
            ) from err
    return cls(**kwargs)
