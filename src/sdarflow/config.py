"""Typed stage configs: one dataclass per stage, loaded from YAML and CLI flags, hashed for lineage.

Each field is documented once (``help`` metadata: effect, range, recommended value); the CLI builds its flags from
these fields, so a flag and a YAML key are always the same thing. Fields marked ``io`` (input/output URIs, run
identity) are excluded from the config hash: two runs with the same hash used the same settings on possibly
different data, and the data URIs are recorded next to the hash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import types
import typing
from collections.abc import Iterator
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


SHARED_CACHE_ENV = "SDARFLOW_SHARED_CACHE"


def shared_cache() -> str:
    """``$SDARFLOW_SHARED_CACHE``: a storage URI where machines share what they generate (TextWorld games), keyed
    by what made it; the pipeline's tasks get ``<storage>/cache``; '' = nothing shared."""
    return os.environ.get(SHARED_CACHE_ENV, "")


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
    keys: tuple | None = None,
) -> Any:
    """A documented setting of a ``Checked`` class; ``ge``/``gt``/``le`` bound a number (every number in a list or
    mapping too), ``keys`` names the keys a mapping may have: checked on construction, so every stage, the CLI and
    the KFP ``prepare`` task refuse an out-of-range value in one line. ``reads``: a path or URI the stage reads (an
    input, so ``io`` too): the CLI refuses a local one that does not exist before the stage starts."""
    meta = {
        "help": help,
        "io": io or reads,
        "reads": reads,
        "choices": choices,
        "bounds": (ge, gt, le),
        "keys": keys,
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def like(cls: type, name: str, help: str | None = None) -> Any:
    """A field that is the same setting as ``cls``'s field ``name`` (a pipeline parameter feeding a stage's flag):
    its default, choices and bounds, declared once, there; ``help`` replaces its help text."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = {**f.metadata, "help": help or f.metadata["help"]}
    if f.default is dataclasses.MISSING:
        return field(default_factory=f.default_factory, metadata=meta)
    return field(default=f.default, metadata=meta)


class Checked:
    """Settings and file schemas, validated one way: on construction every field's ``choices``, ``keys`` and
    bounds (``opt``) are checked, then ``validate`` (cross-field rules); ``from_dict`` refuses unknown keys (unless
    ``extra``) and converts YAML, CLI and JSON values to the annotated types, nested ``Checked`` classes included.
    Every refusal is a ConfigError of one line naming ``what``, the key, the value and the fix."""

    what: ClassVar[str] = ""  # the thing's name in messages ("train", "gate", "study")
    extra: ClassVar[bool] = False  # keys without a field are ignored rather than refused (a report's extras)
    strict: ClassVar[bool] = False  # values must have their types already (JSON files), no text to number

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            meta, value = f.metadata, getattr(self, f.name)
            choices = meta.get("choices")
            if choices and value not in choices:
                raise ConfigError(
                    f"{_prefix(self.what)}{f.name} = {value!r} is not one of {', '.join(map(str, choices))}; "
                    f"fix: pick one of those"
                )
            keys = meta.get("keys")
            unknown = sorted(set(value) - set(keys)) if keys and isinstance(value, dict) else []
            if unknown:
                raise ConfigError(
                    f"{_prefix(self.what)}{f.name}: unknown key(s) {', '.join(map(str, unknown))}; "
                    f"fix: use {', '.join(keys)}"
                )
            for path, leaf in _leaves(value):
                rule = _out_of_bounds(leaf, *meta.get("bounds", (None, None, None)))
                if rule:
                    target = rule if rule.startswith("a ") else f"a value {rule}"
                    raise ConfigError(
                        f"{_prefix(self.what)}{f.name}{path} = {leaf!r} must be {rule} ({meta.get('help', '')}); "
                        f"fix: set {f.name}{path} to {target}"
                    )
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses raise ConfigError with the numbers and the fix."""

    @classmethod
    def from_dict(cls, data: Any) -> typing.Self:
        if not isinstance(data, dict):
            raise ConfigError(f"{_prefix(cls.what)}{data!r} is not a mapping of keys to values")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in data if k not in names)  # a YAML key may be a number
        if unknown and not cls.extra:
            raise ConfigError(
                f"{_prefix(cls.what)}unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(names))}"
            )
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and f.name not in data
        ]
        if missing:
            raise ConfigError(f"{_prefix(cls.what)}missing key(s) {', '.join(missing)}")
        hints = typing.get_type_hints(cls)
        return cls(
            **{k: _coerce(cls.what, k, v, hints[k], cls.strict) for k, v in data.items() if k in names}
        )

    @classmethod
    def check(cls, data: Any, where: str, fix: str, error: type[Exception] = ConfigError) -> typing.Self:
        """``from_dict`` for a file read back: a refusal is ``error`` naming the file (``where``), what in it is
        wrong, and the file's own ``fix``."""
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            raise error(f"{where}: {str(err).split('; fix:')[0]}; {fix}") from None


class FileSchema(Checked):
    """A JSON file's schema: values must have their types already, and keys without a field are ignored (what
    other writers or versions add)."""

    extra: ClassVar[bool] = True
    strict: ClassVar[bool] = True


def _prefix(what: str) -> str:
    return f"{what}: " if what else ""


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every scalar in ``value``: itself, or each item of a list, tuple or mapping (``.key``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif not isinstance(value, Checked):
        yield path, value


@dataclass
class StageConfig(Checked):
    """A stage's settings: loaded from YAML and CLI flags, and a stable hash of what is not ``io``."""

    stage: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.what = cls.stage

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
                raise ConfigError(
                    f"config file '{path}' must hold a mapping of keys to values; fix: write it as `key: value` "
                    f"lines (the stage's flags without the dashes, e.g. `lr: 0.001`)"
                )
            data.update(loaded)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def settings(self) -> dict[str, Any]:
        """The fields that are not ``io``: what the stage does, not where it reads and writes."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata.get("io")}

    def config_hash(self) -> str:
        return content_hash({"stage": self.stage, **self.settings()})


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


def _coerce(stage: str, name: str, value: Any, hint: Any, strict: bool = False) -> Any:
    """Convert YAML/CLI values to the annotated type, with an error naming the key and the expected type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or isinstance(hint, type) and isinstance(value, hint) and not isinstance(value, bool):
        return value
    if value is None:
        if origin in (types.UnionType, typing.Union) and type(None) in args:
            return None
        raise ConfigError(
            f"{_prefix(stage)}{name} is empty (null); fix: give it a value or leave the key out"
        )
    if origin in (types.UnionType, typing.Union):
        *others, last = [a for a in args if a is not type(None)]
        for alternative in others:
            with contextlib.suppress(ConfigError):
                return _coerce(stage, name, value, alternative, strict)
        return _coerce(stage, name, value, last, strict)
    if isinstance(hint, type) and issubclass(hint, Checked):
        try:
            return hint.from_dict(value)
        except ConfigError as err:
            raise ConfigError(f"{_prefix(stage)}{name}: {err}") from None
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(
                f"{_prefix(stage)}{name} = {value!r} is not a mapping; fix: e.g. {{key: value}}"
            )
        return {k: _coerce(stage, f"{name}.{k}", v, args[1], strict) for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{_prefix(stage)}{name} = {value!r} is not {len(args)} values")
        return tuple(
            _coerce(stage, f"{name}[{i}]", v, a, strict) for i, (v, a) in enumerate(zip(value, args))
        )
    if origin is list:
        if isinstance(value, str) and not strict:
            value = [value]  # one item: never split, a URI may hold a comma (S3 keys do)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{_prefix(stage)}{name} = {value!r} is not a list; fix: a list, e.g. [a, b]")
        return [_coerce(stage, f"{name}[{i}]", v, args[0], strict) for i, v in enumerate(value)]
    if origin is Literal:
        return value
    if hint in (int, float) and (isinstance(value, bool) or strict and isinstance(value, str)):
        raise ConfigError(f"{_prefix(stage)}{name} = {value!r} is not a valid {hint.__name__}")
    if hint is int and isinstance(value, float) and not value.is_integer():
        # int(1.9) would silently become 1; a KFP parameter may carry 8 as 8.0, which is fine
        raise ConfigError(f"{_prefix(stage)}{name} = {value!r} is not a whole number; fix: pass an integer")
    if hint is str and (
        isinstance(value, bool)
        or not isinstance(value, (str, int, float))
        or strict
        and not isinstance(value, str)
    ):
        raise ConfigError(f"{_prefix(stage)}{name} = {value!r} is not a text value; fix: pass a string")
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
        raise ConfigError(f"{_prefix(stage)}{name} = {value!r} is not a valid {hint.__name__}") from err


def field_help(cls: type[StageConfig]) -> list[tuple[str, Any, dataclasses.Field]]:
    """(name, type hint, field) for building CLI flags, inputs and outputs first (a stage's settings may come
    from the classes it extends, whose fields dataclasses list first)."""
    hints = typing.get_type_hints(cls)
    fields = sorted(dataclasses.fields(cls), key=lambda f: not f.metadata.get("io"))
    return [(f.name, hints[f.name], f) for f in fields]
