"""The shipped manifests: schema-valid for the oldest supported Kubernetes, consistent with the
server, and with matchConditions that compile and select the right fixtures.

No cluster exists here: schemas come from kubernetes-validate (offline, --strict), CEL from
cel-python (core language only, which is all our expressions use), and the kustomize overlay is
assembled from its parts (and cross-checked with ``kubectl kustomize`` when kubectl exists).
"""

import functools
import shutil
import subprocess
from pathlib import Path

import celpy
import kubernetes_validate
import pytest
import yaml
from admission_helpers import CORPUS, SAN, job_files, load, review

from dssup.admission.asgi import ROUTES
from dssup.admission.server import ServeOptions

ROOT = Path(__file__).parents[3]
OLDEST = "1.30.0"  # matchConditions are GA since 1.30
BASE = ROOT / "k8s" / "base"
CERT = ROOT / "k8s" / "components" / "cert-manager"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@functools.cache
def _overlay() -> list[dict]:
    """base + cert-manager component, assembled like kustomize would."""
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    docs = [d for name in kust["resources"] for d in _docs(BASE / name)]
    comp = yaml.safe_load((CERT / "kustomization.yaml").read_text())
    docs += [d for name in comp["resources"] for d in _docs(CERT / name)]
    for p in comp["patches"]:
        patch = yaml.safe_load(p["patch"])
        for d in docs:
            if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"]):
                d["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
    return docs


def _one(docs, kind, name=None):
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name)
    return found[0]


BUILTIN = [p for p in sorted(BASE.glob("*.yaml")) if p.name != "kustomization.yaml"] + sorted(
    [
        *(ROOT / "examples" / "k8s").glob("namespace.yaml"),
        *(ROOT / "examples" / "k8s").glob("dssup-configmap-reader.yaml"),
    ]
)


@pytest.mark.parametrize("path", BUILTIN, ids=lambda p: p.name)
def test_kubernetes_validate_strict_oldest_version(path):
    for doc in _docs(path):
        kubernetes_validate.validate(doc, OLDEST, strict=True)


def test_strict_validation_catches_a_broken_webhook():
    hook = _docs(BASE / "webhooks.yaml")[0]
    del hook["webhooks"][0]["sideEffects"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hook, OLDEST, strict=True)


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed"
)
@pytest.mark.parametrize("overlay", ["cert-manager", "cert-manager-prometheus"])
def test_kustomize_build_matches_the_assembled_overlay(overlay):
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    built = {(d["kind"], d["metadata"]["name"]) for d in docs}
    expected = {(d["kind"], d["metadata"]["name"]) for d in _overlay()}
    if overlay.endswith("prometheus"):
        expected.add(("ServiceMonitor", "dssup-webhook"))
        monitor, svc = _one(docs, "ServiceMonitor"), _one(docs, "Service")
        assert (
            monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        )
        assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert built == expected
    hooks = _one(docs, "ValidatingWebhookConfiguration")
    assert (
        hooks["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "dssup-system/dssup-webhook-cert"
    )


def _hooks(docs):
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = _one(docs, kind, "dssup")
        for h in cfg["webhooks"]:
            yield cfg, h


def test_webhook_settings():
    docs = _overlay()
    for cfg, h in _hooks(docs):
        assert 1 <= h["timeoutSeconds"] <= 30 and h["timeoutSeconds"] == 2
        assert h["sideEffects"] in {"None", "NoneOnDryRun"}
        assert "v1" in h["admissionReviewVersions"]
        assert len(h.get("matchConditions", [])) <= 64
        svc = h["clientConfig"]["service"]
        assert svc["path"] in ROUTES and svc.get("port", 443) == 443
        ns_names = h["namespaceSelector"]["matchExpressions"][0]
        assert {"kube-system", "dssup-system"} <= set(ns_names["values"])
        if cfg["kind"] == "MutatingWebhookConfiguration":
            assert h["failurePolicy"] == "Ignore" and h["reinvocationPolicy"] == "IfNeeded"
            assert h["rules"][0]["operations"] == ["CREATE"] and svc["path"] == "/mutate"
        else:
            assert "patch" not in svc["path"]
            assert h["failurePolicy"] == ("Fail" if svc["path"] == "/validate" else "Ignore")
        assert all(
            "/" not in r or r.endswith("/scale") is False
            for rule in h["rules"]
            for r in rule["resources"]
        )


def test_ca_injection_and_san_match_the_service():
    docs = _overlay()
    cert = _one(docs, "Certificate", "dssup-webhook-cert")
    svc = _one(docs, "Service", "dssup-webhook")
    for cfg, h in _hooks(docs):
        ref = h["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (
            svc["metadata"]["name"],
            svc["metadata"]["namespace"],
        )
        assert f"{ref['name']}.{ref['namespace']}.svc" in cert["spec"]["dnsNames"]
        bundle = h["clientConfig"].get("caBundle")
        inject = cfg["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
        assert inject == f"{cert['metadata']['namespace']}/{cert['metadata']['name']}" or (
            bundle and "BEGIN CERTIFICATE" in bundle
        )
    assert SAN in cert["spec"]["dnsNames"]  # the name our apiserver-like test client verifies
    deploy = _one(docs, "Deployment")
    secret = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert secret["secret"]["secretName"] == cert["spec"]["secretName"]


def _flag(args, name):
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


def test_ports_paths_and_probes_match_the_server():
    docs = _overlay()
    deploy = _one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (
        int(_flag(c["args"], "port")) == ports["https"] == ServeOptions.model_fields["port"].default
    )
    assert (
        int(_flag(c["args"], "health-port"))
        == ports["health"]
        == ServeOptions.model_fields["health_port"].default
    )
    svc = _one(docs, "Service")
    https = next(p for p in svc["spec"]["ports"] if p["name"] == "https")
    assert https["port"] == 443 and https["targetPort"] == "https"
    assert (
        svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert _flag(c["args"], "cert-file").rsplit("/", 1)[0] in mounts and "/tmp" in mounts
    assert c["args"][:3] == ["--log-format=json", "webhook", "serve"]


def test_deployment_hardening_and_availability():
    docs = _overlay()
    deploy = _one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert deploy["spec"]["replicas"] >= 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "cpu" not in c["resources"].get("limits", {})
    pdb = _one(docs, "PodDisruptionBudget")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )


def test_rbac_is_list_and_watch_only():
    role = _one(_overlay(), "ClusterRole")
    resources = set()
    for rule in role["rules"]:
        assert set(rule["verbs"]) == {"list", "watch"}
        resources |= set(rule["resources"])
    # No ConfigMaps cluster-wide: a namespaced Role per opted-in namespace grants them.
    assert resources == {"nodes", "clustertrainingruntimes", "trainingruntimes"}
    example = _docs(ROOT / "examples" / "k8s" / "dssup-configmap-reader.yaml")
    reader, binding = _one(example, "Role"), _one(example, "RoleBinding")
    assert reader["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}
    ]
    sa = _one(_overlay(), "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "dssup-system"}
    ]
    args = _one(_overlay(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    watched = next(a.split("=", 1)[1] for a in args if a.startswith("--configmap-namespaces="))
    assert reader["metadata"]["namespace"] in watched.split(",")


def _arg(args, flag):
    return next(a.split("=", 1)[1] for a in args if a.startswith(flag + "="))


def test_network_policy_priority_and_grace_period():
    docs = _overlay()
    deploy = _one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    policy = _one(docs, "NetworkPolicy")
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    ingress_ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ingress_ports == {int(_arg(args, "--port")), int(_arg(args, "--health-port"))}
    egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 6443}  # DNS and the API server only
    prio = _one(docs, "PriorityClass")
    assert pod["priorityClassName"] == prio["metadata"]["name"] and prio["value"] >= 1_000_000
    drain = float(_arg(args, "--drain"))
    # exit within drain + 1 s (tests/integration/admission/test_admission_server_limits.py)
    assert drain + 1 < pod["terminationGracePeriodSeconds"] <= drain + 10


# -- matchConditions ------------------------------------------------------------------------------

ENV = celpy.Environment()


@functools.cache
def _conditions(path: str, group: str, resource: str):
    for _, h in _hooks(_overlay()):
        rule = h["rules"][0]
        if (
            h["clientConfig"]["service"]["path"] == path
            and resource in rule["resources"]
            and group in rule["apiGroups"]
        ):
            return [ENV.program(ENV.compile(c["expression"])) for c in h["matchConditions"]]
    raise AssertionError((group, resource))


def _selected(path: str, obj: dict) -> bool:
    rev = review(obj)
    group, resource = rev["request"]["resource"]["group"], rev["request"]["resource"]["resource"]
    act = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(None),
        "request": celpy.json_to_cel(rev["request"]),
    }
    return all(bool(p.evaluate(act)) for p in _conditions(path, group, resource))


def test_every_match_condition_compiles():
    for _, h in _hooks(_overlay()):
        for c in h["matchConditions"]:
            ENV.compile(c["expression"])


@pytest.mark.parametrize("name", job_files())
@pytest.mark.parametrize("path", ["/mutate", "/validate", "/warn"])
def test_match_conditions_select_gpu_jobs_only(name, path):
    assert _selected(path, load(name)) == (name != "job-cpu.yaml")


def _corpus_gpu_jobs():
    out = []
    for f in sorted((CORPUS / "jobs").glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            text = yaml.safe_dump(d)
            if (
                d
                and "limits:" in text
                and any(r in text for r in ("nvidia.com/gpu: ", "amd.com/gpu", "nvidia.com/mig-"))
            ):
                out.append(pytest.param(d, id=f.name))
    return out


@pytest.mark.parametrize("doc", _corpus_gpu_jobs())
def test_match_conditions_select_the_real_gpu_jobs(doc):
    """Every kind's filter lets the corpus's GPU jobs through (Volcano, MPIJob, MIG, AMD)."""
    owned = any(r.get("controller") for r in doc.get("metadata", {}).get("ownerReferences", []))
    if doc["kind"] == "TrainJob" or owned:
        return
    for path in ("/mutate", "/validate", "/warn"):
        assert _selected(path, doc), path


def test_match_conditions_skip_controlled_pods_and_containers_without_resources():
    pod = load("pod-shell.yaml")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}
    ]
    assert not _selected("/validate", pod)
    bare = load("pod-shell.yaml")
    del bare["spec"]["containers"][0]["resources"]
    assert not _selected("/validate", bare)
    cpu_trainjob = load("trainjob-qwen2-hf.yaml")
    cpu_trainjob["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"cpu": "4"}}
    assert not _selected("/validate", cpu_trainjob)
