"""Typed stage configs: one dataclass per stage, loaded from YAML and CLI flags, hashed for lineage.

Each field is documented once (``help`` metadata: effect, range, recommended value); the CLI builds its flags from
these fields, so a flag and a YAML key are always the same thing. Fields marked ``io`` (input/output URIs, run
identity) are excluded from the config hash: two runs with the same hash used the same settings on possibly
different data, and the data URIs are recorded next to the hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from sdarflow.errors import ConfigError


def content_hash(value: Any, length: int = 12) -> str:
    """The one hash of settings and requests: sha256 of ``value`` as canonical JSON (sorted keys; what JSON cannot
    hold, as ``str``), its first ``length`` hex digits. Every "the same settings" check (config hashes, request
    hashes, resume fingerprints, model and game caches, study settings) compares these."""
    blob = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def cache_dir() -> Path:
    """Where sdarflow caches generated things on this machine (games, imported and downloaded models):
    ``$SDARFLOW_CACHE`` if set, else ``~/.cache/sdarflow``."""
    return Path(os.environ.get("SDARFLOW_CACHE") or Path.home() / ".cache" / "sdarflow")


def opt(
    default: Any,
    help: str,
    io: bool = False,
    choices: tuple | None = None,
    *,
    reads: bool = False,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> Any:
    """A documented config field; ``ge``/``gt``/``le`` bound a number (checked on construction, so every stage, the
    CLI and the KFP ``prepare`` task refuse an out-of-range value in one line). ``reads``: a path or URI the stage
    reads (an input, so ``io`` too): the CLI refuses a local one that does not exist before the stage starts."""
    meta = {"help": help, "io": io or reads, "reads": reads, "choices": choices, "bounds": (ge, gt, le)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def like(cls: type, name: str, help: str | None = None) -> Any:
    """A field that is the same setting as ``cls``'s field ``name`` (a pipeline parameter feeding a stage's flag):
    its default, choices and bounds, declared once, there; ``help`` replaces its help text."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = f.metadata
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    ge, gt, le = meta["bounds"]
    return opt(
        default, help or meta["help"], meta["io"], meta["choices"], reads=meta["reads"], ge=ge, gt=gt, le=le
    )


@dataclass
class StageConfig:
    """Base: construction from dicts/YAML with unknown-key errors, validation, and a stable hash."""

    stage: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(
                    f"{self.stage}: {f.name} = {value!r} is not one of {', '.join(map(str, choices))}; "
                    f"fix: pick one of those"
                )
            rule = _out_of_bounds(value, *f.metadata.get("bounds", (None, None, None)))
            if rule:
                target = rule if rule.startswith("a ") else f"a value {rule}"
                raise ConfigError(
                    f"{self.stage}: {f.name} = {value!r} must be {rule} ({f.metadata['help']}); "
                    f"fix: set {f.name} to {target}"
                )
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses raise ConfigError with the numbers and the fix."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> typing.Self:
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in data if k not in names)  # a YAML key may be a number
        if unknown:
            raise ConfigError(
                f"{cls.stage}: unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(names))}"
            )
        hints = typing.get_type_hints(cls)
        values = {k: _coerce(cls.stage, k, v, hints[k]) for k, v in data.items()}
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> typing.Self:
        """YAML file (optional) first, then explicit overrides (e.g. CLI flags that were given)."""
        data: dict[str, Any] = {}
        if path:
            try:
                loaded = yaml.safe_load(Path(path).read_text()) or {}
            except (OSError, yaml.YAMLError) as err:
                raise ConfigError(
                    f"cannot read config file '{path}': {err}; fix: pass a valid YAML file"
                ) from err
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
            data.update(loaded)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        params = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata.get("io")}
        return content_hash({"stage": self.stage, **params})


def _out_of_bounds(value: Any, ge: float | None, gt: float | None, le: float | None) -> str:
    """The rule ``value`` breaks (e.g. ">= 1", "in (0, 1]"), or "" when it is within its bounds. NaN and infinity
    break every float field's rule: no setting means "not a number"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return ""
    low = f"[{ge}" if ge is not None else f"({gt}" if gt is not None else ""
    if low and le is not None:
        rule = f"in {low}, {le}]"
    elif ge is not None:
        rule = f">= {ge}"
    elif gt is not None:
        rule = f"> {gt}"
    elif le is not None:
        rule = f"<= {le}"
    else:
        return ""
    broken = (
        (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le)
    )
    return rule if broken else ""


_NUMBER = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.I
)
# Seeds seed numpy too, whose seeds are 32-bit.
MAX_SEED = 2**32 - 1


def _coerce(stage: str, name: str, value: Any, hint: Any) -> Any:
    """Convert YAML/CLI values to the annotated type, with an error naming the key and the expected type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None:
        if origin in (types.UnionType, typing.Union) and type(None) in args:
            return None
        raise ConfigError(f"{stage}: {name} is empty (null); fix: give it a value or leave the key out")
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return _coerce(stage, name, value, inner[0])
    if origin is list:
        if isinstance(value, str):
            value = [value]  # one item: never split, a URI may hold a comma (S3 keys do)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{stage}: {name} = {value!r} is not a list; fix: a list, e.g. [a, b]")
        return [_coerce(stage, name, v, args[0]) for v in value]
    if origin is Literal:
        return value
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{stage}: {name} = {value!r} is not a valid {hint.__name__}")
    if hint is int and isinstance(value, float) and not value.is_integer():
        # int(1.9) would silently become 1; a KFP parameter may carry 8 as 8.0, which is fine
        raise ConfigError(f"{stage}: {name} = {value!r} is not a whole number; fix: pass an integer")
    if hint is str and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise ConfigError(f"{stage}: {name} = {value!r} is not a text value; fix: pass a string")
    try:
        if hint is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if value in (True, False, 0, 1):  # KFP's dict parameters carry 1 as 1.0
                return bool(value)
            raise ValueError(value)
        if hint in (int, float) and isinstance(value, str) and not _NUMBER.fullmatch(value):
            # int() and float() also take " 3", "1_000" and other scripts' digits: not what a config means
            raise ValueError(value)
        return hint(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise ConfigError(f"{stage}: {name} = {value!r} is not a valid {hint.__name__}") from err


def field_help(cls: type[StageConfig]) -> list[tuple[str, Any, dataclasses.Field]]:
    """(name, type hint, field) for building CLI flags, inputs and outputs first (a stage's settings may come
    from the classes it extends, whose fields dataclasses list first)."""
    hints = typing.get_type_hints(cls)
    fields = sorted(dataclasses.fields(cls), key=lambda f: not f.metadata.get("io"))
    return [(f.name, hints[f.name], f) for f in fields]
