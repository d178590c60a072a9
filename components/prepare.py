"""Component ``prepare``: validate the run's settings once and store the pipeline config (the first task). Its
outputs are the config's URI and ``skip``: why the run would train nothing new ("" when it would), which the
pipeline branches on.

Its parameters are :class:`~sdarflow.pipeline_config.PipelineConfig`'s fields, written from the dataclass here
and nowhere else. KFP reads a lightweight component's signature and ships its source to the pod, so the source
is generated too, and kept in ``linecache``, where ``inspect.getsource`` (which KFP calls) finds it.
"""

import linecache
from typing import NamedTuple

from kfp import dsl

from components import IMAGE
from sdarflow.pipeline_config import kfp_parameters

_FILENAME = "<components.prepare: generated from PipelineConfig>"


def _source() -> str:
    params = "".join(f"    {p.name}: {p.annotation.__name__},\n" for p in kfp_parameters())
    return (
        f"def prepare(\n{params}) -> NamedTuple('Outputs', [('config_uri', str), ('skip', str)]):\n"
        "    params = dict(locals())  # first statement: exactly the pipeline parameters\n"
        "    from collections import namedtuple\n\n"
        "    from sdarflow.pipeline_config import PipelineConfig, load, prepare, unchanged_since\n\n"
        "    uri = prepare(PipelineConfig.from_dict(params))\n"
        "    return namedtuple('Outputs', ['config_uri', 'skip'])(uri, unchanged_since(load(uri)))\n"
    )


def _define():
    source = _source()
    linecache.cache[_FILENAME] = (len(source), None, source.splitlines(True), _FILENAME)
    namespace = {"__name__": __name__, "NamedTuple": NamedTuple}
    exec(compile(source, _FILENAME, "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace["prepare"]


prepare = dsl.component(base_image=IMAGE, install_kfp_package=False)(_define())
