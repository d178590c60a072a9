"""sdarflow: SDAR post-training for LLM agents on Kubeflow Pipelines."""

import gc

__version__ = "0.1.0"


def fast_exit() -> None:
    """Call when the process is about to end (a CLI command or a KFP task has done its work): the interpreter's
    final garbage collection would walk every object torch and transformers made (1-1.5 s per task on 2 cores);
    frozen objects are skipped, and everything is still released by reference counting, in order."""
    gc.freeze()
