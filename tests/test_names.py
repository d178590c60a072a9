"""The one registry type for things chosen by name: write-once binding, lazy import paths, one-line errors."""

from __future__ import annotations

import sys

import pytest

from sdarflow.errors import ConfigError
from sdarflow.names import NameRegistry, UnknownNameError


def test_a_name_binds_once_and_keeps_its_first_object():
    reg: NameRegistry[int] = NameRegistry("thing")
    reg.register("a")(1)
    assert reg.get("a") == 1 and "a" in reg and list(reg) == ["a"]
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a")(2)
    with pytest.raises(ValueError, match="already registered"):
        reg.add_lazy("a", "json:dumps")
    assert reg.get("a") == 1


def test_an_unknown_name_is_a_config_error_naming_the_choices():
    reg: NameRegistry[int] = NameRegistry("colour")
    reg.register("red")(1)
    reg.add_lazy("blue", "json:dumps")
    with pytest.raises(UnknownNameError) as err:
        reg.get("green")
    assert isinstance(err.value, ConfigError) and isinstance(err.value, ValueError)
    assert str(err.value) == "unknown colour 'green'; fix: choose one of red, blue"
    assert reg.names() == ("red", "blue")


def test_a_lazy_entry_is_imported_on_first_get_only():
    reg: NameRegistry[object] = NameRegistry("module")
    reg.add_lazy("wave", "wave")  # a stdlib module nothing here imports
    reg.add_lazy("dumps", "json:dumps")
    sys.modules.pop("wave", None)
    assert "wave" in reg and "wave" not in sys.modules
    module = reg.get("wave")
    assert module is sys.modules["wave"] and reg.get("wave") is module
    import json

    assert reg.get("dumps") is json.dumps
