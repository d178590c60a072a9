"""The Pod Security Standards' ``restricted`` profile, level ``latest``: a port of the admission checks.

Ported from Kubernetes' ``staging/src/k8s.io/pod-security-admission/policy/check_*.go`` (v1.32): the baseline
checks (``check_windowsHostProcess``, ``check_hostNamespaces``, ``check_privileged``, ``check_capabilities_baseline``,
``check_hostPathVolumes``, ``check_hostPorts``, ``check_appArmorProfile``, ``check_seLinuxOptions``,
``check_procMount``, ``check_seccompProfile_baseline``, ``check_sysctls``) and the restricted ones
(``check_restrictedVolumes``, ``check_allowPrivilegeEscalation``, ``check_runAsNonRoot``, ``check_runAsUser``,
``check_seccompProfile_restricted``, ``check_capabilities_restricted``). Each returns the reasons a pod spec is
forbidden, worded as the admission controller words them; Windows pods (``spec.os.name: windows``), which some
checks exempt, are not ported: every pod here is Linux.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Pod = dict[str, Any]

CAPABILITIES_BASELINE = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def containers(spec: Pod) -> Iterator[dict]:
    """Every container of a pod spec: init, regular and ephemeral, as the checks visit them."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(container: dict) -> dict:
    return container.get("securityContext") or {}


def restricted_violations(spec: Pod, annotations: dict[str, str] | None = None) -> list[str]:
    """The reasons Pod Security ``restricted`` (latest) forbids a pod with this ``spec`` (and metadata
    ``annotations``); empty when it is admitted."""
    pod_sc = spec.get("securityContext") or {}
    found: list[str] = []

    def forbid(check: str, offenders: list[str]) -> None:
        if offenders:
            found.append(f"{check}: {', '.join(offenders)}")

    # baseline
    forbid(
        "hostProcess",
        [c["name"] for c in containers(spec) if (_sc(c).get("windowsOptions") or {}).get("hostProcess")]
        + (["pod"] if (pod_sc.get("windowsOptions") or {}).get("hostProcess") else []),
    )
    forbid("host namespaces", [k for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)])
    forbid("privileged", [c["name"] for c in containers(spec) if _sc(c).get("privileged")])
    forbid(
        "non-default capabilities",
        [
            f"{c['name']} adds {cap}"
            for c in containers(spec)
            for cap in (_sc(c).get("capabilities") or {}).get("add") or []
            if cap not in CAPABILITIES_BASELINE
        ],
    )
    forbid("hostPath volumes", [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v])
    forbid(
        "hostPort",
        [
            f"{c['name']} {p['hostPort']}"
            for c in containers(spec)
            for p in c.get("ports") or []
            if p.get("hostPort")
        ],
    )
    apparmor = [
        f"{k.removeprefix(APPARMOR_ANNOTATION)}={v}"
        for k, v in (annotations or {}).items()
        if k.startswith(APPARMOR_ANNOTATION) and v != "runtime/default" and not v.startswith("localhost/")
    ]
    for owner, sc in [("pod", pod_sc), *((c["name"], _sc(c)) for c in containers(spec))]:
        profile = sc.get("appArmorProfile")
        if profile and profile.get("type") not in ("RuntimeDefault", "Localhost"):
            apparmor.append(f"{owner} {profile.get('type')}")
    forbid("forbidden AppArmor profiles", apparmor)
    selinux = []
    for owner, sc in [("pod", pod_sc), *((c["name"], _sc(c)) for c in containers(spec))]:
        opts = sc.get("seLinuxOptions") or {}
        if opts.get("type", "") not in SELINUX_TYPES or opts.get("user") or opts.get("role"):
            selinux.append(owner)
    forbid("seLinuxOptions", selinux)
    forbid(
        "procMount", [c["name"] for c in containers(spec) if _sc(c).get("procMount", "Default") != "Default"]
    )
    forbid(
        "seccompProfile",
        [
            owner
            for owner, sc in [("pod", pod_sc), *((c["name"], _sc(c)) for c in containers(spec))]
            if (sc.get("seccompProfile") or {}).get("type") == "Unconfined"
        ],
    )
    forbid(
        "forbidden sysctls", [s["name"] for s in pod_sc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    )

    # restricted
    forbid(
        "restricted volume types",
        [v["name"] for v in spec.get("volumes") or [] if not set(v) - {"name"} <= RESTRICTED_VOLUMES],
    )
    forbid(
        "allowPrivilegeEscalation != false",
        [c["name"] for c in containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False],
    )
    non_root = []
    if pod_sc.get("runAsNonRoot") is False:
        non_root.append("pod must not set runAsNonRoot=false")
    non_root += [
        f"container {c['name']} must not set runAsNonRoot=false"
        for c in containers(spec)
        if _sc(c).get("runAsNonRoot") is False
    ]
    if pod_sc.get("runAsNonRoot") is not True:
        non_root += [
            f"pod or container {c['name']} must set runAsNonRoot=true"
            for c in containers(spec)
            if _sc(c).get("runAsNonRoot") is None
        ]
    forbid("runAsNonRoot != true", non_root)
    forbid(
        "runAsUser=0",
        [
            owner
            for owner, sc in [("pod", pod_sc), *((c["name"], _sc(c)) for c in containers(spec))]
            if sc.get("runAsUser") == 0
        ],
    )
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = (pod_sc.get("seccompProfile") or {}).get("type")
    seccomp = [] if pod_type is None or pod_type in allowed else [f"pod {pod_type}"]
    for c in containers(spec):
        kind = (_sc(c).get("seccompProfile") or {}).get("type")
        if kind is not None and kind not in allowed:
            seccomp.append(f"container {c['name']} {kind}")
        elif kind is None and pod_type is None:
            seccomp.append(
                f"pod or container {c['name']} must set seccompProfile.type to RuntimeDefault or Localhost"
            )
    forbid("seccompProfile", seccomp)
    caps = []
    for c in containers(spec):
        cap = _sc(c).get("capabilities") or {}
        if "ALL" not in (cap.get("drop") or []):
            caps.append(f'container {c["name"]} must set securityContext.capabilities.drop=["ALL"]')
        caps += [
            f"container {c['name']} must not add {a}" for a in cap.get("add") or [] if a != "NET_BIND_SERVICE"
        ]
    forbid("unrestricted capabilities", caps)
    return found


def pod_templates(doc: dict) -> Iterator[tuple[str, dict, dict]]:
    """(name, pod spec, pod annotations) of every pod a Kubernetes object creates: a Pod, the template of a
    Deployment, StatefulSet, DaemonSet, ReplicaSet or Job, and a CronJob's job template's."""
    kind, name = doc.get("kind"), f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if kind == "Pod":
        yield name, doc["spec"], doc.get("metadata", {}).get("annotations") or {}
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        template = doc["spec"]["template"]
        yield name, template["spec"], template.get("metadata", {}).get("annotations") or {}
    elif kind == "CronJob":
        template = doc["spec"]["jobTemplate"]["spec"]["template"]
        yield name, template["spec"], template.get("metadata", {}).get("annotations") or {}


# What KFP's Argo workflow controller gives its own init and wait containers (the `executor` securityContext of
# manifests/kustomize/third-party/argo/base/workflow-controller-configmap-patch.yaml, KFP 2.16.0).
ARGO_EXECUTOR_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def kfp_task_pod(k8s_executor: dict) -> Pod:
    """The pod a KFP 2.16 backend creates for one task, from the task's kubernetes executor config (the compiled
    platform spec's ``deploymentSpec.executors[...]``): the compiler's ``applySecurityContextToExecutorTemplate``
    (backend/src/v2/compiler/argocompiler/security_context.go: pod seccomp only; the user container without
    runAsNonRoot; the launcher init container with the full context), then the driver's merge of the executor
    config's ``securityContext`` into the user container (backend/src/v2/driver/k8s.go), the emptyDir volumes, and
    Argo's init/wait containers."""
    hardened = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    main = {"name": "main", "securityContext": dict(hardened)}
    user = k8s_executor.get("securityContext") or {}  # proto JSON: int64 fields are strings
    for key in ("runAsUser", "runAsGroup", "runAsNonRoot"):
        if key in user:
            main["securityContext"][key] = user[key] if isinstance(user[key], bool) else int(user[key])
    launcher = {"name": "kfp-launcher", "securityContext": {**hardened, "runAsNonRoot": True}}
    volumes = [{"name": "kfp-launcher", "emptyDir": {}}, {"name": "gcs-scratch", "emptyDir": {}}]
    volumes += [{"name": v["volumeName"], "emptyDir": {}} for v in k8s_executor.get("emptyDirMounts", [])]
    argo = [{"name": n, "securityContext": ARGO_EXECUTOR_SECURITY} for n in ("init", "wait")]
    return {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [argo[0], launcher],
        "containers": [argo[1], main],
        "volumes": volumes,
    }
