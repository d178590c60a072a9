"""``sdarflow registry ...``: the command-line face of the adapter registry (exit codes 3: gate refused, 4: lost a
race, retry). Library imports happen inside the handlers so ``sdarflow --help`` stays fast."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdarflow.cli.common import (
    ReadsPath,
    emit,
    output_flag,
    pairs,
    pinned_image,
    policy_name_flag,
    run_as_user_flag,
)
from sdarflow.defaults import RELEASE_STAGES
from sdarflow.errors import ConfigError, StorageError

if TYPE_CHECKING:
    from sdarflow.registry.roll import ServingRoll
    from sdarflow.registry.store import Registry


def _lineage(value: str | None) -> dict[str, Any]:
    """--lineage takes inline JSON (``'{"run_id": ...}'``) or a path/URI to a JSON file."""
    if not value:
        return {}
    if value.lstrip().startswith("{"):
        try:
            lineage = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"--lineage is not valid JSON ({err.msg}); fix: pass a JSON object or a file"
            ) from err
    else:
        from sdarflow import storage

        lineage = storage.read_json(value)
    if not isinstance(lineage, dict):
        raise ConfigError(f"--lineage must be a JSON object, got {type(lineage).__name__}; fix: pass {{...}}")
    return lineage


def _registry(args: argparse.Namespace) -> Registry:
    from sdarflow.registry.store import Registry

    return Registry(args.registry)


def cmd_register(args: argparse.Namespace) -> int:
    from sdarflow.stages.common import local_artifact

    with tempfile.TemporaryDirectory() as tmp:
        # a published adapter is registered from a verified copy of its files (its manifest is the registry's)
        adapter = local_artifact(args.adapter, "adapter", args.allow_unpublished, dest=tmp)
        version = _registry(args).register(
            args.name,
            adapter,
            args.eval,
            _lineage(args.lineage),
            base_model=args.model,
            base_eval_report=args.base_eval_report,
            actor=args.actor,
        )
    sys.stdout.write(f"{version}\n")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from sdarflow import storage

    registry = _registry(args)
    names = registry.list_names()
    # a mistyped --registry must not look like an empty one: nothing there at all is an error (an s3:// one)
    if not names and not storage.exists(registry.uri):
        raise StorageError(f"registry '{registry.uri}' does not exist; fix: {REGISTRY_FIX}")
    if not names:
        sys.stderr.write(f"registry {registry.uri} holds no adapters yet\n")
    if args.name and args.name not in names:
        raise StorageError(
            f"no adapter named '{args.name}' in registry '{registry.uri}'; fix: one of {', '.join(names) or '(none)'}"
        )
    if args.name:
        rows = registry.list_versions(args.name)
    else:
        rows = [{"name": n, "aliases": registry.aliases(n)} for n in names]
    if args.json:
        emit(rows)
        return 0
    for r in rows:
        if args.name:
            test, ood = ("-" if r["pass@1"][s] is None else f"{r['pass@1'][s]:.3f}" for s in ("test", "ood"))
            line = f"v{r['version']}\t{r['created_at']}\ttest@1 {test}\tood@1 {ood}\t{','.join(r['aliases']) or '-'}"
        else:
            line = f"{r['name']}\t" + (" ".join(f"{s}=v{v}" for s, v in sorted(r["aliases"].items())) or "-")
        sys.stdout.write(line + "\n")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    emit(_registry(args).show(args.name, args.version))
    return 0


def _thresholds(args: argparse.Namespace) -> dict[str, float | None]:
    """The gate threshold flags ``_gate_flags`` made (None where not given)."""
    from sdarflow.registry.gate import GATE_HELP

    return {name: getattr(args, name) for name in GATE_HELP}


def cmd_promote(args: argparse.Namespace) -> int:
    registry = _registry(args)
    roller = _roller(args, registry)
    event = registry.promote(
        args.name,
        args.version,
        stage=args.stage,
        thresholds=_thresholds(args),
        force=args.force,
        reason=args.reason or "",
        actor=args.actor,
    )
    gate = event.get("gate", "unchanged")
    sys.stdout.write(f"{args.name} {args.stage} -> v{event['version']} (gate: {gate})\n")
    if roller:
        sys.stdout.write(roller.roll(event["version"]) + "\n")
    return 0


def _roller(args: argparse.Namespace, registry: Registry) -> ServingRoll | None:
    """``--roll-deployment``'s Deployment, checked (it exists, may be patched, serves the alias) before the alias
    moves; None without the flag."""
    if not args.roll_deployment:
        return None
    from sdarflow.registry.roll import ServingRoll

    return ServingRoll(args.roll_deployment, registry, args.name, args.stage)


def cmd_gate(args: argparse.Namespace) -> int:
    registry, thresholds = _registry(args), _thresholds(args)
    if any(v is not None for v in thresholds.values()):
        registry.set_gate(args.name, args.stage, thresholds, args.reason or "", actor=args.actor)
    emit(dataclasses.asdict(registry.gate_policies(args.name)[0]))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    registry = _registry(args)
    roller = _roller(args, registry)
    event = registry.rollback(args.name, stage=args.stage, reason=args.reason or "", actor=args.actor)
    sys.stdout.write(f"{args.name} {args.stage} -> v{event['version']} (was v{event['from']})\n")
    if roller:
        sys.stdout.write(roller.roll(event["version"]) + "\n")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from sdarflow import storage
    from sdarflow.registry.layout import LINEAGE

    registry = _registry(args)
    version = registry.resolve(args.name, args.version)  # once: an alias moved meanwhile cannot split the two
    if args.out:  # a fetch replaces only an earlier fetch's folder (an init container's retry)
        with storage.replacing_folder(args.out, LINEAGE, "registry fetch") as staged:
            registry.fetch_adapter(args.name, version, dest=staged)
        path = Path(args.out)
    else:
        path = registry.fetch_adapter(args.name, version)
    sys.stdout.write(f"{path}\n")
    return 0


def cmd_serve_config(args: argparse.Namespace) -> int:
    from pipelines.kube import Toleration
    from sdarflow.registry.serve import DEFAULT_FETCH_IMAGE, serve_config

    config = serve_config(
        args.registry,
        args.base_model,
        args.name,
        image=args.image,
        fetch_image=args.fetch_image or pinned_image("image", DEFAULT_FETCH_IMAGE, "--fetch-image"),
        run_as_user=args.run_as_user,
        secret=args.secret,
        namespace=args.namespace,
        node_selector=pairs(args.node_selector, "--node-selector"),
        tolerations=[Toleration.parse(t).as_dict() for t in args.toleration],
        priority_class=args.priority_class,
        image_pull_secrets=args.image_pull_secret,
        model_storage=args.model_storage,
    )
    if not args.out:
        emit(config, as_json=args.json)
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".json" or args.json:
        out.write_text(json.dumps(config["kubernetes"], indent=2) + "\n")
    else:
        import yaml

        out.write_text(yaml.safe_dump_all(config["kubernetes"], sort_keys=False))
    # The manifests went to the file; the launch command (for running without Kubernetes) goes to stdout.
    sys.stdout.write(shlex.join(config["vllm"]["args"]) + "\n")
    return 0


def cmd_serve_fetch(args: argparse.Namespace) -> int:
    from sdarflow.registry.serve import serving_files

    served = serving_files(
        _registry(args),
        args.base_model,
        args.adapter,
        model_dir=args.model_dir,
        adapter_root=args.adapter_root,
    )
    emit(served)
    return 0


REGISTRY_FIX = (
    "check --registry (the training pipeline's is <storage>/registry), or register a version first with "
    "`sdarflow registry register`"
)


def _common(p: argparse.ArgumentParser, name: bool = True, new_registry: bool = False) -> None:
    """``--registry`` (a local one must exist, except where ``new_registry``: register makes it) and the name."""
    p.add_argument(
        "--registry",
        required=True,
        **({} if new_registry else {"action": ReadsPath, "fix": REGISTRY_FIX}),
        help="registry root: a folder or s3://bucket/prefix"
        + (" (made by the first register)" if new_registry else ""),
    )
    if name:
        policy_name_flag(p, "adapter name in the registry, e.g. sdar-qwen-0.5b", required=True)


def _add_register(p: argparse.ArgumentParser) -> None:
    _common(p, new_registry=True)
    p.add_argument(
        "--adapter",
        required=True,
        action=ReadsPath,
        help="published adapter (a train stage's output: URI or folder)",
    )
    p.add_argument(
        "--allow-unpublished",
        action="store_true",
        help="accept a PEFT folder without _manifest.json (made by hand; an interrupted train output has none)",
    )
    p.add_argument(
        "--eval",
        required=True,
        action=ReadsPath,
        help="the evaluate stage's output (folder or URI), or its report.json",
    )
    p.add_argument(
        "--model",
        action=ReadsPath,
        help="base model folder the adapter was trained on: its fingerprint and every tensor shape are checked "
        "(default: the adapter's base_model_name_or_path when that is a local folder)",
    )
    p.add_argument(
        "--base-eval-report",
        action=ReadsPath,
        help="the base model's evaluate output on the same tasks (folder, URI or report.json): what the gate "
        "compares the version with when nothing is in production, and besides production afterwards",
    )
    p.add_argument("--lineage", help="lineage as inline JSON or a path/URI to a JSON file")
    p.add_argument("--actor", help="who registers (default: $SDARFLOW_ACTOR or user@host)")
    p.set_defaults(func=cmd_register)


def _add_list(p: argparse.ArgumentParser) -> None:
    _common(p, name=False)
    policy_name_flag(p, "list this name's versions")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.set_defaults(func=cmd_list)


def _add_show(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--version", required=True, help="version number, 'latest', production or staging")
    p.set_defaults(func=cmd_show)


def _add_promote(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--version", required=True, help="version number or 'latest'")
    _alias_flags(
        p,
        "the alias to move (gated by the registry's policy: production always, staging when set)",
        "why (required with --force); written to the alias history and the audit log",
        "promotes",
    )
    p.add_argument("--force", action="store_true", help="override a gate refusal (needs --reason)")
    _gate_flags(p, "for this promotion only: may tighten the registry's policy (`sdarflow registry gate`)")
    _roll_flag(p)
    p.set_defaults(func=cmd_promote)


def _alias_flags(p: argparse.ArgumentParser, stage_help: str, why: str, who: str) -> None:
    """``--stage`` (the alias or gate), and the ``--reason`` and ``--actor`` the audit log records."""
    p.add_argument("--stage", default="production", choices=RELEASE_STAGES, help=stage_help)
    p.add_argument("--reason", help=why)
    p.add_argument("--actor", help=f"who {who} (default: $SDARFLOW_ACTOR or user@host)")


def _roll_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--roll-deployment",
        metavar="[NAMESPACE/]NAME",
        help="then roll this serving Deployment (k8s/serving, which serves the alias; give the namespace) so its "
        "new pods fetch the version the alias points at; checked before the alias moves ($KUBECONFIG, else "
        "~/.kube/config, else the pod's service account)",
    )


def _gate_flags(p: argparse.ArgumentParser, scope: str) -> None:
    from sdarflow.registry.gate import GATE, GATE_HELP

    for name, help_text in GATE_HELP.items():
        flag = f"--{name.replace('_', '-')}"
        p.add_argument(
            flag,
            type=type(getattr(GATE, name)),
            help=f"{help_text}; {scope} (default policy: {getattr(GATE, name)})",
        )


def _add_gate(p: argparse.ArgumentParser) -> None:
    _common(p)
    _alias_flags(
        p, "the stage whose gate to set", "why (required to set); written to the audit log", "sets it"
    )
    _gate_flags(p, "sets the registry's policy; the others keep theirs")
    p.set_defaults(func=cmd_gate)


def _add_rollback(p: argparse.ArgumentParser) -> None:
    _common(p)
    _alias_flags(
        p, "the alias to move back (default production)", "why; written to the audit log", "rolls back"
    )
    _roll_flag(p)
    p.set_defaults(func=cmd_rollback)


def _add_fetch(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--version", default="production", help="version number, 'latest', production or staging")
    output_flag(p, "target folder (default: a temp folder, or in place for a local registry)")
    p.set_defaults(func=cmd_fetch)


def _add_serve_config(p: argparse.ArgumentParser) -> None:
    from sdarflow.registry.serve import DEFAULT_IMAGE, MODEL_STORAGE, SERVING_SECRET

    _common(p, name=False)
    p.add_argument(
        "--base-model", required=True, help="s3:// URI of the base model the adapters were trained on"
    )
    policy_name_flag(p, "only this adapter (default: every name with a production version)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="vLLM serving image")
    p.add_argument(
        "--fetch-image",
        default=None,
        help="image with sdarflow for the initContainer that fetches the models",
    )
    p.add_argument(
        "--secret",
        default=SERVING_SECRET,
        help="Secret with AWS_* variables of a key that can read the registry",
    )
    p.add_argument("--namespace", help="Kubernetes namespace for the manifests")
    p.add_argument(
        "--node-selector", action="append", metavar="KEY=VALUE", help="GPU pool label [repeatable]"
    )
    p.add_argument(
        "--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]", help="[repeatable]"
    )
    p.add_argument(
        "--model-storage",
        default=MODEL_STORAGE,
        help=f"the pod's disk for the base model's copy (default {MODEL_STORAGE}; a base model's size and more)",
    )
    p.add_argument(
        "--priority-class", help="PriorityClass of the serving pods (k8s/overlays/gpu: sdarflow-serving)"
    )
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="for a private registry [repeatable]",
    )
    run_as_user_flag(p)
    output_flag(p, "write the manifests here (YAML; JSON if it ends in .json) and print the command")
    p.add_argument("--json", action="store_true", help="JSON instead of YAML")
    p.set_defaults(func=cmd_serve_config)


def _add_serve_fetch(p: argparse.ArgumentParser) -> None:
    from sdarflow.registry.serve import ADAPTER_ROOT, MODEL_DIR, parse_adapter

    _common(p, name=False)
    p.add_argument(
        "--base-model", required=True, help="the base model to serve (s3:// URI or a local folder)"
    )
    p.add_argument(
        "--adapter",
        action="append",
        required=True,
        type=parse_adapter,
        metavar="NAME[:VERSION]",
        help="a version (number, latest or an alias; default production) to serve [repeatable]",
    )
    p.add_argument("--model-dir", default=MODEL_DIR, help="where an s3:// base model is copied")
    p.add_argument("--adapter-root", default=ADAPTER_ROOT, help="the adapters go to ROOT/NAME/VERSION")
    p.set_defaults(func=cmd_serve_fetch)


SUBCOMMANDS = {
    "register": ("publish an adapter as a new immutable version; prints the version", _add_register),
    "list": ("names with their aliases, or the versions of one name", _add_list),
    "show": ("lineage, eval summary, files and aliases of one version", _add_show),
    "promote": ("point a stage at a version (production is gated)", _add_promote),
    "gate": ("show, or with thresholds set, a name's promotion gate policy (audited)", _add_gate),
    "rollback": ("point a stage back at its previous version", _add_rollback),
    "fetch": ("download a version (sha256-verified) to a local folder", _add_fetch),
    "serve-config": ("vLLM multi-LoRA command and Kubernetes manifests for production", _add_serve_config),
    "serve-fetch": (
        "a serving pod's base model and adapters on local disk, each adapter checked against the base",
        _add_serve_fetch,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the subcommands of ``sdarflow registry`` (the top-level CLI made ``parser``)."""
    sub = parser.add_subparsers(dest="registry_command", metavar="SUBCOMMAND", required=True)
    for name, (help_text, add) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_text))
