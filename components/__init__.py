"""KFP lightweight components: thin wrappers that call ``sdarflow.kfp_runtime`` for a stage.

Kubernetes wiring (GPUs, tolerations, secrets, retries, caching, display names, per-stage images) is applied in
``pipelines/``. Every image already has sdarflow and kfp installed, so components do not pip-install kfp at start
(``install_kfp_package=False``): pods start faster and work on clusters without internet access.
"""

from sdarflow import __version__

# Images tagged with the package version, built from images/ (`make images`). IMAGE is every component's
# default; pipelines/ swaps in the GPU images for the stages that get GPUs.
IMAGE = f"ghcr.io/sdarflow/sdarflow:{__version__}"
TRAIN_GPU_IMAGE = f"ghcr.io/sdarflow/sdarflow-train-gpu:{__version__}"
ROLLOUT_GPU_IMAGE = f"ghcr.io/sdarflow/sdarflow-rollout-gpu:{__version__}"
