"""sdarflow: SDAR post-training for LLM agents on Kubeflow Pipelines."""

__version__ = "0.1.0"
