"""KFP lightweight components: thin wrappers that call ``sdarflow.pipeline_config.run_component`` for a stage.

Kubernetes wiring (GPUs, tolerations, secrets, retries, caching, display names) is applied in ``pipelines/``.
"""

from sdarflow import __version__

# One image for every component, tagged with the package version (built from images/Dockerfile.cpu).
IMAGE = f"ghcr.io/sdarflow/sdarflow:{__version__}"
