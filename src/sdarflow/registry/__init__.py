"""Adapter registry: immutable numbered versions of PEFT adapters with eval reports and lineage, stage aliases
(production, staging) moved by compare-and-swap, a promotion gate on pass@1, pass@k and OOD, an audit log, and
serving configs (vLLM multi-LoRA, Kubernetes) for the production adapters.

    reg = Registry("s3://models/registry")
    v = reg.register("sdar-qwen", "out/adapter", "out/eval_report.json", {"run_id": "r42"})
    reg.promote("sdar-qwen", v)            # raises GateRefused (exit code 3) if it is not better
    path = reg.fetch_adapter("sdar-qwen", "production")
"""

from sdarflow.registry.errors import GateRefused, RegistryConflict, RegistryError
from sdarflow.registry.gate import GatePolicy, check_gate
from sdarflow.registry.serve import serve_config
from sdarflow.registry.store import Registry
