"""Policies every rendered Herald overlay must meet, and HERALD_* variables that the code really reads.

Usage: k8s_policy.py RENDERED.yaml...   (exit 1 with one line per violation)
"""
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Variables the executables read: every "HERALD_…" string literal in Sources/.
READ = set()
for source in (ROOT / "Sources").rglob("*.swift"):
    READ.update(re.findall(r'"(HERALD_[A-Z0-9_]+)"', source.read_text()))


def herald_containers(obj):
    """(workload name, pod spec, container) for Herald's own containers (those running the Herald image)."""
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec") if obj["kind"] in ("Deployment", "Job") else None
    if not pod:
        return []
    return [(obj["metadata"]["name"], pod, c) for c in pod["containers"] if c["command"][0].startswith("herald")] \
        if all("command" in c for c in pod["containers"]) else []


def check(path, problems):
    objects = [o for o in yaml.safe_load_all(open(path)) if o]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for required in [("Deployment", "herald-ingest"), ("Deployment", "herald-dispatcher"),
                     ("Service", "herald-ingest"), ("HorizontalPodAutoscaler", "herald-ingest"),
                     ("PodDisruptionBudget", "herald-ingest"), ("PodDisruptionBudget", "herald-dispatcher"),
                     ("ConfigMap", "herald-config"), ("Job", "herald-topics")]:
        if required not in kinds:
            problems.append(f"{path}: missing {required[0]} {required[1]}")
    env_names = set()
    config = {}
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "herald-config":
            config = obj.get("data", {})
            env_names.update(k for k in config if k.startswith("HERALD_"))
        for name, pod, container in herald_containers(obj):
            where = f"{path}: {obj['kind']} {name}/{container['name']}"
            security = container.get("securityContext", {})
            pod_security = pod.get("securityContext", {})
            if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
                problems.append(f"{where}: must run as non-root")
            if security.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: root filesystem must be read-only")
            if security.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: privilege escalation must be off")
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in resources.get(part, {}):
                        problems.append(f"{where}: resources.{part}.{resource} missing")
            env_names.update(e["name"] for e in container.get("env", []) if e["name"].startswith("HERALD_"))
            # Every container talks to Redis or Kafka: their files must be mounted where the variables point.
            mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts", [])]
            for name, value in config.items():
                if re.fullmatch(r"HERALD_(REDIS|KAFKA)_[A-Z_]*FILE", name) and not any(value.startswith(m) for m in mounts):
                    problems.append(f"{where}: {name}={value} is on no volume the container mounts")
            for volume in pod.get("volumes", []):
                secrets = [volume["secret"]["secretName"]] if "secret" in volume else \
                    [s["secret"]["name"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
                mode = (volume.get("secret") or volume.get("projected") or {}).get("defaultMode")
                if secrets and mode != 0o400:
                    problems.append(f"{where}: secret volume {volume['name']} must have defaultMode 0400")
                if "herald-apns-keys" in secrets and container["command"][0] != "herald-dispatcher":
                    problems.append(f"{where}: only herald-dispatcher may mount the APNs keys (herald-apns-keys)")
            if obj["kind"] == "Deployment":
                for probe, path_ in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                    if container.get(probe, {}).get("httpGet", {}).get("path") != path_:
                        problems.append(f"{where}: {probe} must GET {path_}")
                if pod.get("terminationGracePeriodSeconds", 30) < 30:
                    problems.append(f"{where}: terminationGracePeriodSeconds must cover the 25 s drain")
                annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
                if annotations.get("prometheus.io/scrape") != "true":
                    problems.append(f"{where}: Prometheus scrape annotations missing")
    for obj in objects:
        if obj["kind"] == "Service" and obj["metadata"]["name"] == "herald-ingest":
            exposed = {str(p.get("targetPort")) for p in obj["spec"].get("ports", [])}
            if exposed != {"http"}:
                problems.append(f"{path}: the public herald-ingest Service must expose only the API port (http), not {sorted(exposed)}")
    # HERALD_KAFKA_PROPERTY_<NAME> is read by its prefix: any librdkafka property.
    for name in sorted(n for n in env_names - READ if not n.startswith("HERALD_KAFKA_PROPERTY_")):
        problems.append(f"{path}: {name} is set but no Herald executable reads it")


def main():
    problems = []
    for path in sys.argv[1:]:
        check(path, problems)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"k8s policy: {len(sys.argv) - 1} overlays checked, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
