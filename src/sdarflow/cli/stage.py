"""``sdarflow <stage>``: one command per pipeline stage, its flags built from the stage's config class, so the CLI
and the KFP component run the same ``run(config)``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Callable

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
        flag = "--" + name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = None if f.default is dataclasses.MISSING else f.default
        if hint is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} (default {default})",
            )
            continue
        list_type = typing.get_origin(hint) is list
        if f.metadata.get("reads"):
            parser.add_argument(
                flag,
                dest=name,
                default=None,
                action=ReadsPath,
                append=list_type,
                help=f"{help_text} (default {default!r})" + (" [repeatable]" if list_type else ""),
            )
            continue
        choices = f.metadata.get("choices")
        if typing.get_origin(hint) is dict:
            parser.add_argument(
                flag, dest=name, default=None, type=_json_object, help=f"{help_text} (a JSON object)"
            )
            continue
        parser.add_argument(
            flag,
            dest=name,
            default=None,
            action="append" if list_type else "store",
            # numeric choices are compared as numbers (argparse compares the raw string otherwise)
            type=type(choices[0]) if choices and not isinstance(choices[0], str) else None,
            choices=choices,
            help=f"{help_text} (default {default!r})" + (" [repeatable]" if list_type else ""),
        )


def _stage_command(name: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        module = STAGES.get(name)
        config_cls = config_class(name)
        overrides = {
            k: v for k, v in vars(args).items() if k in config_cls.__dataclass_fields__ and v is not None
        }
        from sdarflow.model_cache import with_local_model

        result = module.run(with_local_model(config_cls.load(args.config, **overrides)))
        emit(result)
        return 0

    return handler


def add_stage(name: str, p: argparse.ArgumentParser) -> None:
    _add_config_flags(p, config_class(name))
    p.set_defaults(func=_stage_command(name))
