"""Names that several layers share and that must cost nothing to import (the CLI builds flags from them, the KFP
components and Kubernetes manifests use them): defined here once, with no dependency."""

# The Kubernetes Secret (k8s/base) whose AWS_* keys pods, jobs and servers get as environment variables.
S3_SECRET = "sdarflow-s3"
# The registry's stage aliases; only production is gated.
RELEASE_STAGES: tuple[str, ...] = ("production", "staging")
# The name a pipeline registers its adapters under unless told.
DEFAULT_POLICY_NAME = "sdar-policy"
