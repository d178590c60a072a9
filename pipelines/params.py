"""A pipeline's parameters: a pipeline function with a given signature (:func:`with_parameters`), a description
for each (KFP reads them from the pipeline function's docstring, Google
style) and the defaults a compile preset sets."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from sdarflow.errors import ConfigError


def with_parameters(
    body: Callable[[dict], object], params: list[inspect.Parameter], returns: type
) -> Callable:
    """A pipeline function with the signature ``params``, calling ``body`` with its arguments as a dict (KFP calls
    a pipeline function with one argument per parameter, in order)."""
    names = [p.name for p in params]

    def pipeline(*values):
        return body(dict(zip(names, values, strict=True)))

    pipeline.__signature__ = inspect.Signature(params, return_annotation=returns)
    return pipeline


def describe(func: Callable, summary: str, helps: Mapping[str, str]) -> Callable:
    """Give ``func`` the docstring KFP turns into the pipeline's and each parameter's description."""
    names = list(inspect.signature(func).parameters)
    missing = [n for n in names if n not in helps]
    if missing:
        raise ConfigError(f"pipeline parameters without a description: {missing}")  # a developer's error
    lines = [summary, "", "Args:", *(f"    {n}: {' '.join(helps[n].split())}" for n in names)]
    func.__doc__ = "\n".join(lines) + "\n"
    return func


def with_defaults(func: Callable, defaults: Mapping[str, object]) -> Callable:
    """Make ``defaults`` the parameters' defaults KFP compiles (and the UI pre-fills); unknown names are refused."""
    signature = inspect.signature(func)
    unknown = sorted(set(defaults) - set(signature.parameters))
    if unknown:
        raise ConfigError(
            f"preset sets unknown pipeline parameters {unknown}; valid: {list(signature.parameters)}"
        )
    params = [p.replace(default=defaults.get(p.name, p.default)) for p in signature.parameters.values()]
    func.__signature__ = signature.replace(parameters=params)
    return func
