"""deploy/: the Kubernetes manifests validate offline against the Kubernetes schemas
(kubernetes-validate, strict: an unknown field fails), the ConfigMap's config and catalog are
accepted by stsd itself, and the Secret's placeholder values make stsd refuse to start
rather than run with a known key. Nothing here runs a cluster: see docs/src/deployment.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml  # kubernetes-validate depends on PyYAML
from conftest import ROOT, stsd_bin

K8S = ROOT / "deploy" / "kubernetes"
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
MANIFESTS = ["configmap.yaml", "secret.yaml", "deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml"]
# The oldest Kubernetes the manifests target (appArmorProfile in securityContext is 1.30+).
VERSIONS = ["1.30.0", "1.37.0"]


def validate(*files: Path, version: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VALIDATE), "--strict", "-k", version, *map(str, files)],
                          capture_output=True, text=True)


def test_every_manifest_validates_strictly_against_the_kubernetes_schemas():
    kustomized = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert set(kustomized) | {"secret.yaml"} == set(MANIFESTS)
    for v in VERSIONS:
        r = validate(*(K8S / m for m in MANIFESTS), version=v)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count("passed") == len(MANIFESTS), r.stdout


def test_the_validator_is_not_a_no_op(tmp_path: Path):
    doc = yaml.safe_load((K8S / "deployment.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalaton"] = False
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert validate(bad, version=VERSIONS[0]).returncode != 0


def test_the_pod_keeps_the_sandbox_settings():
    d = yaml.safe_load((K8S / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert d["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert d["securityContext"]["appArmorProfile"]["type"] == "RuntimeDefault"
    assert d["securityContext"]["runAsNonRoot"] is True
    c = d["containers"][0]
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_configmap_config_and_catalog_are_accepted_by_stsd(tmp_path: Path):
    cm = yaml.safe_load((K8S / "configmap.yaml").read_text())["data"]
    (tmp_path / "stsd.toml").write_text(cm["stsd.toml"])
    (tmp_path / "catalog.json").write_text(cm["catalog.json"])
    r = subprocess.run([stsd_bin(), "check", "--config", str(tmp_path / "stsd.toml"), "--json",
                        str(tmp_path / "catalog.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"word-count"' in r.stdout


def test_the_secret_placeholders_stop_the_daemon(tmp_path: Path):
    sec = yaml.safe_load((K8S / "secret.yaml").read_text())["stringData"]
    key = tmp_path / "approval-state-key"
    key.write_text(sec["approval-state-key"])
    tokens = tmp_path / "tokens"
    tokens.write_text(sec["tokens"])
    conf = tmp_path / "c.toml"
    conf.write_text(f'[daemon]\naudit_log = "{tmp_path / "a.jsonl"}"\n'
                    f'[approval]\nstate_key_file = "{key}"\n[http]\ntokens_file = "{tokens}"\n')
    r = subprocess.run([stsd_bin(), "--config", str(conf), "--socket", str(tmp_path / "s.sock"),
                        "--pool", "1", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "at least 32" in r.stderr, r.stderr
    key.write_text("k" * 32)
    r = subprocess.run([stsd_bin(), "--config", str(conf), "--socket", str(tmp_path / "s.sock"),
                        "--pool", "1", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "authenticate" in r.stderr, r.stderr
