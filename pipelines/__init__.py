"""KFP pipelines: the SDAR training DAG (and, later, promotion), compiled to IR YAML or run locally."""
