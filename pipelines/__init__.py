"""KFP pipelines: the SDAR training DAG and the promotion pipeline, their Kubernetes wiring (``kube``), the
operations against a KFP server (``client``) and the multi-node Kubeflow Trainer manifest (``trainjob``)."""
