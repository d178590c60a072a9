"""sdarflow: SDAR post-training for LLM agents on Kubeflow Pipelines."""

import atexit
import gc

__version__ = "0.1.0"

# At exit the interpreter's final garbage collection walks every object torch and transformers made: 1-1.5 s of
# every CLI command and KFP task on 2 cores. Frozen objects are skipped (everything is still released by reference
# counting, in order). At exit only: freezing during a run would keep garbage alive.
atexit.register(gc.freeze)
