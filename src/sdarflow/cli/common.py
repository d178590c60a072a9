"""What several commands share: the parser class, flags that read paths, JSON/YAML output, ``KEY=VALUE`` flags, the
demo presets' names, study flags, the images ``make images`` built."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from sdarflow.defaults import RUN_AS_UID
from sdarflow.errors import ConfigError, StorageError

log = logging.getLogger(__name__)

# What `make images` built and tagged; compile pins these images unless --image* flags say otherwise.
BUILT_IMAGES = Path("images") / "built.json"
IMAGE_KEYS = ("image", "train_image", "rollout_image")


def built_images(path: Path) -> dict[str, str]:
    """The image references ``make images`` recorded in ``path`` ({} when there is no such file)."""
    if not path.is_file():
        return {}
    fix = "fix: run `make images` again, or pass --image, --train-image and --rollout-image"
    try:
        built = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read the built images in '{path}' ({err}); {fix}") from err
    if not isinstance(built, dict) or not all(isinstance(built.get(k), str) and built[k] for k in IMAGE_KEYS):
        raise ConfigError(f"'{path}' does not name the three images ({', '.join(IMAGE_KEYS)}); {fix}")
    return {k: built[k] for k in IMAGE_KEYS}


def pinned_image(key: str, release: str, flag: str) -> str:
    """The image ``make images`` recorded under ``key`` in :data:`BUILT_IMAGES`, else ``release`` with a warning
    (for a command with an image flag of its own, ``flag``)."""
    built = built_images(BUILT_IMAGES)
    if key in built:
        return built[key]
    log.warning(
        "no %s from `make images`: using the release tag %s; pin yours with %s", BUILT_IMAGES, release, flag
    )
    return release


def _uid(text: str) -> int | None:
    """``--run-as-user``: a positive UID, or none."""
    if text == "none":
        return None
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a non-root UID; fix: a UID above 0 (the images run as {RUN_AS_UID}) or none"
        )
    return int(text)


def run_as_user_flag(p: argparse.ArgumentParser) -> None:
    """``--run-as-user UID|none``: the user every pod a command writes runs as."""
    p.add_argument(
        "--run-as-user",
        type=_uid,
        default=RUN_AS_UID,
        metavar="UID|none",
        help=f"UID and GID the pods run as (default {RUN_AS_UID}, the images' user), so a namespace enforcing Pod "
        "Security restricted admits them; none: only runAsNonRoot, the platform assigns the user (OpenShift)",
    )


# sdarflow.sizes.SIZES' names (a test keeps them equal; importing it here would slow every --help)
PRESET_NAMES = ("demo", "smoke", "gpu", "pretrained")


class LiteralHelp(argparse.HelpFormatter):
    """Help shown as written. sdarflow's help texts come from the config docs, where '%' is a percent sign ("the 95%
    lower bound"), not an argparse format directive (which crashed ``--help`` with a TypeError)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return (action.help or "").replace("%", "%%")


class Parser(argparse.ArgumentParser):
    """Every sdarflow (sub)parser: ``add_subparsers`` makes subparsers of this class, so all get ``LiteralHelp``
    and take each flag only as spelled (no prefixes: ``--out`` is not ``--output``, and a new flag cannot change
    what an old abbreviation meant)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", LiteralHelp)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


class ReadsPath(argparse.Action):
    """A flag naming a file, folder or URI the command reads (``append``: repeatable; ``fix``: a better way out
    than checking the path). A missing local path is refused while the flags are parsed, before anything runs; an
    s3:// URI is checked by the command, which has the credentials."""

    def __init__(
        self, option_strings: list[str], dest: str, append: bool = False, fix: str = "", **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.append, self.fix = append, fix or "check the path (a local path, file:// or s3:// URI)"

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, flag=None
    ) -> None:
        local = value.removeprefix("file://")
        if value and (local != value or "://" not in value) and not Path(local).expanduser().exists():
            raise StorageError(f"{flag} '{value}' does not exist; fix: {self.fix}")
        setattr(
            namespace, self.dest, [*(getattr(namespace, self.dest) or []), value] if self.append else value
        )


class ReadsModel(ReadsPath):
    """A base-model flag: an HF folder or URI as ``ReadsPath``, or a known pretrained model's name
    (``models.gguf_import.KNOWN``), imported into the model cache when the command starts."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        from sdarflow.models.gguf_import import KNOWN

        fix = f"pass an HF model folder, an s3:// URI or a known model ({', '.join(sorted(KNOWN))})"
        super().__init__(option_strings, dest, fix=fix, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, flag=None
    ) -> None:
        from sdarflow.models.gguf_import import KNOWN

        if value in KNOWN and not Path(value).exists():
            setattr(namespace, self.dest, value)
        else:
            super().__call__(parser, namespace, value, flag)


def output_flag(p: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    """The one spelling of "where this command writes" across commands: ``--output``, as the stages spell it."""
    default = kwargs.get("default")
    shown = f"{help} (default {default})" if default else help
    p.add_argument("--output", dest="out", metavar="PATH", help=shown, **kwargs)


def policy_name_flag(p: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    """``--policy-name``: the registry's adapter name, as the pipeline and evaluate spell it."""
    p.add_argument("--policy-name", dest="name", help=help, **kwargs)


def emit(obj: Any, as_json: bool = True) -> None:
    """A command's result on stdout (JSON, or YAML), so scripts can read it; logs go to stderr."""
    if as_json:
        sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False))


def pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a dict; a value may itself contain '='."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE; fix: e.g. {flag} train=8")
        out[key.strip()] = value.strip()
    return out


def study_flags(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """--methods and --seeds, shared by ``sdarflow study`` and ``pipeline compile --pipeline study``."""
    from sdarflow.extensions.options import OPTIONS
    from sdarflow.study import DEFAULT_METHODS, DEFAULT_SEEDS

    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        metavar="METHOD[+OPTION...]",
        help=f"{prefix}must include grpo (the baseline); +OPTION adds a training option ({', '.join(OPTIONS)}), "
        f"e.g. grpo+scpo",
    )
    p.add_argument(
        "--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS), help=f"{prefix}seeds per method"
    )
