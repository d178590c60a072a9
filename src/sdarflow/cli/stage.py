"""``sdarflow <stage>``: one command per pipeline stage, its flags built from the stage's config class, so the CLI
and the KFP component run the same ``run(config)``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing

from sdarflow.cli.common import ReadsPath, emit
from sdarflow.stages import STAGES, config_class


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object; fix: e.g. '{{\"key\": 1}}'")
    return value


def _add_config_flags(parser: argparse.ArgumentParser, config_cls) -> None:
    from sdarflow.config import field_help

    parser.add_argument(
        "--config", action=ReadsPath, help="YAML file with this stage's settings (flags override it)"
    )
    for name, hint, f in field_help(config_cls):
        help_text = f.metadata.get("help", "")
        default = None if f.default is dataclasses.MISSING else f.default
        list_type = typing.get_origin(hint) is list
        shown = f"{help_text} (default {default!r})" + (" [repeatable]" if list_type else "")
        if hint is bool:
            kwargs = {"action": argparse.BooleanOptionalAction, "help": f"{help_text} (default {default})"}
        elif f.metadata.get("reads"):
            kwargs = {"action": ReadsPath, "append": list_type, "help": shown}
        elif typing.get_origin(hint) is dict:
            kwargs = {"type": _json_object, "help": f"{help_text} (a JSON object)"}
        else:
            # numeric choices are compared as numbers (argparse compares the raw string otherwise)
            choices = f.metadata.get("choices")
            numeric = choices and not isinstance(choices[0], str)
            kwargs = {"action": "append" if list_type else "store", "choices": choices, "help": shown}
            kwargs["type"] = type(choices[0]) if numeric else None
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, **kwargs)


def _run_stage(args: argparse.Namespace) -> int:
    from sdarflow.model_cache import with_local_model

    config_cls = config_class(args.command)
    overrides = {
        k: v for k, v in vars(args).items() if k in config_cls.__dataclass_fields__ and v is not None
    }
    emit(STAGES.get(args.command).run(with_local_model(config_cls.load(args.config, **overrides))))
    return 0


def add_stage(name: str, p: argparse.ArgumentParser) -> None:
    _add_config_flags(p, config_class(name))
    p.set_defaults(func=_run_stage)
