"""deploy/ and the Dockerfile: every manifest validates against the Kubernetes schema, the
kustomization is complete, RBAC is least-privilege and covers the spec's targets, and the
image runs what the Deployment expects. (No cluster or kustomize binary here: the checks read
the files as kustomize and the API server would.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdscale.spec import load_spec
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return data


def _objects(folder: Path = DEPLOY) -> list[dict[str, Any]]:
    k = _kustomization(folder)
    out = []
    for rel in k.get("resources", []):
        out += _docs(folder / rel)
    return out


def test_kustomization_lists_existing_files_and_a_valid_spec() -> None:
    k = _kustomization(DEPLOY)
    for rel in k["resources"]:
        assert (DEPLOY / rel).is_file(), rel
    generated = k["configMapGenerator"][0]
    assert generated["name"] == "pdscale-spec"
    for rel in generated["files"]:
        load_spec(DEPLOY / rel)  # raises on an invalid spec
    for name in ("drain", "scale-down-drain"):
        component = _kustomization(DEPLOY / name)
        assert component["kind"] == "Component"
        for rel in component["resources"]:
            assert (DEPLOY / name / rel).is_file()
        assert f"#   - {name}" in (DEPLOY / "kustomization.yaml").read_text()


@pytest.mark.parametrize("folder", [DEPLOY, DEPLOY / "drain", DEPLOY / "scale-down-drain"],
                         ids=["base", "drain", "scale-down-drain"])
def test_manifests_validate_against_the_kubernetes_schema(folder: Path) -> None:
    import kubernetes_validate

    checked = 0
    for obj in _objects(folder):
        if obj["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a CRD: checked below
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
        checked += 1
    assert checked >= (8 if folder == DEPLOY else 2)


def test_servicemonitor_scrapes_the_service_port_keeping_labels() -> None:
    objs = _objects()
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    service = next(o for o in objs if o["kind"] == "Service")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    # The selector matches the labels kustomize puts on every object.
    common = _kustomization(DEPLOY)["labels"][0]["pairs"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= common.items()


def test_deployment_runs_two_replicas_with_probes_and_the_spec() -> None:
    objs = _objects()
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]["memory"]
    args = container["args"]
    spec_path = args[args.index("--spec") + 1]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "spec")
    assert spec_path.startswith(mount["mountPath"] + "/")
    volume = next(v for v in pod["volumes"] if v["name"] == "spec")
    assert volume["configMap"]["name"] == "pdscale-spec"
    envs = {e["name"] for e in container["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= envs  # leader identity and Lease namespace
    assert pod["serviceAccountName"] == next(o for o in objs
                                             if o["kind"] == "ServiceAccount")["metadata"]["name"]
    pdb = next(o for o in objs if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def _rules(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for o in objs if o["kind"] == kind for r in o["rules"]]


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               for r in rules)


def test_rbac_covers_the_spec_targets_and_nothing_more() -> None:
    objs = _objects()
    cluster = _rules(objs, "ClusterRole")
    spec = load_spec(DEPLOY / "spec.yaml")
    for svc in spec.services:
        for pool in svc.pools.values():
            api = pool.target.api_version
            group = api.split("/")[0] if "/" in api else ""
            kind = pool.target.kind.lower()
            plural = kind + ("es" if kind.endswith("s") else "s")
            for verb in ("get", "update", "patch"):
                assert _allows(cluster, group, f"{plural}/scale", verb), (group, plural, verb)
            assert _allows(cluster, group, plural, "get")
            assert _allows(cluster, group, plural, "list")  # one LIST per namespace and kind
    assert _allows(cluster, "", "events", "create")
    # Least privilege: no wildcards, no pod rights, nothing that deletes or lists secrets.
    for rule in cluster + _rules(objs, "Role"):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert not {"delete", "deletecollection", "escalate", "bind"} & set(rule["verbs"])
        assert "secrets" not in rule["resources"]
    assert not _allows(cluster, "", "pods", "patch")
    # Leases only in the controller's own namespace (a Role, not a ClusterRole).
    role = next(o for o in objs if o["kind"] == "Role")
    assert role["metadata"]["namespace"] == "pdscale-system"
    assert _allows(role["rules"], "coordination.k8s.io", "leases", "update")
    assert not _allows(cluster, "coordination.k8s.io", "leases", "update")
    drain = _rules(_objects(DEPLOY / "drain"), "ClusterRole")
    assert drain == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    # Scale-down drains: read the pools' pods and patch their labels and annotations; never
    # delete (the workload removes the pod when pdscale lowers its count).
    scale_down = _rules(_objects(DEPLOY / "scale-down-drain"), "ClusterRole")
    assert scale_down == [{"apiGroups": [""], "resources": ["pods"],
                           "verbs": ["get", "list", "patch"]}]
    binding = next(o for o in _objects(DEPLOY / "scale-down-drain")
                   if o["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == next(
        o for o in objs if o["kind"] == "ServiceAccount")["metadata"]["name"]


def test_dockerfile_copies_what_exists_and_runs_the_controller() -> None:
    text = (ROOT / "Dockerfile").read_text()
    sources = [part for line in text.splitlines() if line.startswith("COPY ")
               and "--from" not in line for part in line.split()[1:-1]]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert {name.split(".")[0] for name in found} <= set(sources), \
        "every package must be copied into the image"
    assert re.search(r'ENTRYPOINT \["pdscale"\]', text)
    cmd = re.search(r"CMD (\[.*\])", text)
    assert cmd is not None and '"run"' in cmd.group(1)
    dep = next(o for o in _objects() if o["kind"] == "Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    uid = re.search(r"USER (\d+)", text)
    assert uid is not None
    assert int(uid.group(1)) == dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert container["args"][0] == "run"


def test_deploy_ships_an_authenticated_webhook() -> None:
    """The controller reads a token from a required Secret, and the spec's generated
    Alertmanager receiver sends the same token: no anonymous drain or scale-up."""
    spec = load_spec(DEPLOY / "spec.yaml")
    token = spec.reactions.auth.bearer_token_file
    assert token is not None and not spec.reactions.auth.allow_unauthenticated
    deployment = next(o for o in _objects() if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret_mount = next(name for name, path in mounts.items()
                        if token.startswith(path.rstrip("/") + "/"))
    secret = volumes[secret_mount]["secret"]
    assert secret.get("optional") is False  # no Secret, no pod: never an open webhook
    assert spec.alerts.webhook.credentials_file is not None
    assert f"/secrets/{secret['secretName']}/" in spec.alerts.webhook.credentials_file
