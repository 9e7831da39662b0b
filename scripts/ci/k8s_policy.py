"""Policies every rendered Herald overlay must meet, and HERALD_* variables that the code really reads.

Usage: k8s_policy.py RENDERED.yaml...   (exit 1 with one line per violation)

Every workload (Herald's and the dev overlay's Redis and Kafka alike): non-root, read-only root filesystem, no
privilege escalation, all capabilities dropped, seccomp RuntimeDefault, no service-account token, requests and
limits, secret volumes mode 0400; a Deployment also has startup, liveness and readiness probes, an explicit
terminationGracePeriodSeconds of 30 s or more and a PodDisruptionBudget; and NetworkPolicies select every pod for
both ingress and egress. Herald's own containers (those running herald-* or heraldctl) also: probes on /healthz
and /readyz, scrape annotations, /metrics off the public port, HERALD_* variables the code reads, credential files
on mounted volumes. The NetworkPolicies are evaluated, not just looked for: herald-ingest takes connections from
anywhere on its API port only, the metrics ports only from a namespace selector, the dispatcher nothing else; each
Herald pod reaches DNS and the Redis and Kafka ports herald-config names (and the dev overlay's Redis and Kafka
pods admit it there), the dispatcher also 443.
"""
import ipaddress
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Variables the executables read: every "HERALD_…" string literal in Sources/.
READ = set()
for source in (ROOT / "Sources").rglob("*.swift"):
    READ.update(re.findall(r'"(HERALD_[A-Z0-9_]+)"', source.read_text()))

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
EVERYWHERE = "everywhere"  # a peer outside the rendered objects: any address, any namespace


def is_herald(container):
    return bool(container.get("command")) and container["command"][0].startswith("herald")


def selects(selector, labels):
    """A Kubernetes label selector (matchLabels, matchExpressions) against a label map; {} selects everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


class Pod:
    """A workload's pods, as NetworkPolicies see them."""

    def __init__(self, obj, namespace):
        template = obj["spec"]["template"]
        self.name = f"{obj['kind']} {obj['metadata']['name']}"
        self.labels = template.get("metadata", {}).get("labels", {})
        self.spec = template["spec"]
        self.namespace = namespace
        self.ports = {}  # name → (number, protocol); numbers map to themselves too
        for container in self.spec["containers"]:
            for port in container.get("ports", []):
                entry = (port["containerPort"], port.get("protocol", "TCP"))
                if "name" in port:
                    self.ports[port["name"]] = entry
                self.ports[port["containerPort"]] = entry

    def port(self, name_or_number, protocol="TCP"):
        number, proto = self.ports.get(name_or_number, (name_or_number, protocol))
        return number, proto


def port_allowed(rule_ports, number, protocol, destination=None):
    """Whether a rule's ports admit (number, protocol); named ports resolve against the destination pod."""
    if not rule_ports:
        return True
    for entry in rule_ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        value = entry.get("port")
        if value is None:
            return True
        if isinstance(value, str):
            if destination is None or destination.ports.get(value, (None,))[0] != number:
                continue
            return True
        if value == number or (entry.get("endPort") and value <= number <= entry["endPort"]):
            return True
    return False


def peer_admits(peers, other, own_namespace):
    """Whether a rule's from/to peers admit `other`: a Pod of the rendered objects, or EVERYWHERE (outside them).

    For EVERYWHERE the question is "may some outside address match": a namespaceSelector or an ipBlock may."""
    if not peers:
        return True
    for peer in peers:
        if "ipBlock" in peer:
            if other == EVERYWHERE or ipaddress.ip_network(peer["ipBlock"]["cidr"]).prefixlen == 0:
                return True
            continue
        namespaces, pods = peer.get("namespaceSelector"), peer.get("podSelector")
        if other == EVERYWHERE:
            if namespaces is not None:
                return True
            continue
        namespace_labels = {"kubernetes.io/metadata.name": other.namespace}
        if namespaces is not None:
            if selects(namespaces, namespace_labels) and (pods is None or selects(pods, other.labels)):
                return True
        elif other.namespace == own_namespace and selects(pods, other.labels):
            return True
    return False


def open_to_all(peers):
    """Whether a rule's from peers admit any source at all (no from, or a selector/block matching everything)."""
    if not peers:
        return True
    for peer in peers:
        if "ipBlock" in peer and ipaddress.ip_network(peer["ipBlock"]["cidr"]).prefixlen == 0 \
                and not peer["ipBlock"].get("except"):
            return True
        if peer.get("namespaceSelector") == {} and peer.get("podSelector") in (None, {}):
            return True
    return False


class Network:
    def __init__(self, objects, namespace):
        self.namespace = namespace
        self.policies = [o for o in objects if o["kind"] == "NetworkPolicy"]

    def selecting(self, pod, kind):
        return [p for p in self.policies if selects(p["spec"]["podSelector"], pod.labels)
                and kind in p["spec"].get("policyTypes", ["Ingress"])]

    def ingress_rules(self, pod):
        return [rule for p in self.selecting(pod, "Ingress") for rule in p["spec"].get("ingress") or []]

    def ingress_allowed(self, source, destination, number, protocol="TCP"):
        policies = self.selecting(destination, "Ingress")
        return not policies or any(
            port_allowed(rule.get("ports"), number, protocol, destination)
            and peer_admits(rule.get("from"), source, self.namespace)
            for p in policies for rule in p["spec"].get("ingress") or [])

    def egress_allowed(self, source, destination, number, protocol="TCP"):
        """`destination`: a Pod, or EVERYWHERE for an address outside the rendered objects."""
        policies = self.selecting(source, "Egress")
        target = destination if isinstance(destination, Pod) else None
        return not policies or any(
            port_allowed(rule.get("ports"), number, protocol, target)
            and peer_admits(rule.get("to"), destination, self.namespace)
            for p in policies for rule in p["spec"].get("egress") or [])


def addresses(config):
    """(what, host, port) of the Redis server and the Kafka bootstrap brokers herald-config names."""
    found = []
    url = config.get("HERALD_REDIS_URL")
    if url:
        match = re.match(r"rediss?://(?:[^@/]*@)?([^:/]+)(?::(\d+))?", url)
        if match:
            found.append(("Redis", match.group(1), int(match.group(2) or 6379)))
    for broker in filter(None, config.get("HERALD_KAFKA_BROKERS", "").split(",")):
        host, _, port = broker.strip().rpartition(":") if ":" in broker else (broker.strip(), "", "9092")
        found.append(("Kafka", host, int(port)))
    return found


def resolve(host, port, services, pods, namespace):
    """The rendered Pod and container port behind host:port when a rendered Service is that host, else None."""
    parts = host.split(".")
    if len(parts) > 1 and parts[1] not in (namespace, "svc"):
        return None
    service = services.get(parts[0])
    if not service:
        return None
    for entry in service["spec"].get("ports", []):
        if entry["port"] == port:
            for pod in pods:
                if selects({"matchLabels": service["spec"].get("selector", {})}, pod.labels):
                    number, _ = pod.port(entry.get("targetPort", port))
                    return pod, number
    return None


def listen_port(address):
    return int(address.rsplit(":", 1)[1]) if address and ":" in address else None


def check(path, problems):
    objects = [o for o in yaml.safe_load_all(open(path)) if o]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for required in [("Deployment", "herald-ingest"), ("Deployment", "herald-dispatcher"),
                     ("Service", "herald-ingest"), ("HorizontalPodAutoscaler", "herald-ingest"),
                     ("PodDisruptionBudget", "herald-ingest"), ("PodDisruptionBudget", "herald-dispatcher"),
                     ("ConfigMap", "herald-config"), ("Job", "herald-topics")]:
        if required not in kinds:
            problems.append(f"{path}: missing {required[0]} {required[1]}")
    namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] in WORKLOADS}
    namespace = namespaces.pop() if len(namespaces) == 1 else None
    network = Network(objects, namespace)
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    pods = [Pod(o, namespace) for o in objects if o["kind"] in WORKLOADS]
    env_names = set()
    config = {}
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "herald-config":
            config = obj.get("data", {})
            env_names.update(k for k in config if k.startswith("HERALD_"))
    for obj, pod in zip([o for o in objects if o["kind"] in WORKLOADS], pods):
        spec = pod.spec
        workload = f"{path}: {pod.name}"
        pod_security = spec.get("securityContext", {})
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{workload}: automountServiceAccountToken must be false")
        herald = [c for c in spec["containers"] if is_herald(c)]
        for container in spec["containers"]:
            where = f"{workload}/{container['name']}"
            security = container.get("securityContext", {})
            if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
                problems.append(f"{where}: must run as non-root")
            if security.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: root filesystem must be read-only")
            if security.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: privilege escalation must be off")
            if "ALL" not in security.get("capabilities", {}).get("drop", []):
                problems.append(f"{where}: capabilities must drop ALL")
            seccomp = security.get("seccompProfile") or pod_security.get("seccompProfile") or {}
            if seccomp.get("type") != "RuntimeDefault":
                problems.append(f"{where}: seccompProfile must be RuntimeDefault")
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in resources.get(part, {}):
                        problems.append(f"{where}: resources.{part}.{resource} missing")
            if obj["kind"] == "Deployment":
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    if probe not in container:
                        problems.append(f"{where}: {probe} missing")
        for volume in spec.get("volumes", []):
            secrets = [volume["secret"]["secretName"]] if "secret" in volume else \
                [s["secret"]["name"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
            mode = (volume.get("secret") or volume.get("projected") or {}).get("defaultMode")
            if secrets and mode != 0o400:
                problems.append(f"{workload}: secret volume {volume['name']} must have defaultMode 0400")
            if "herald-apns-keys" in secrets and not any(c["command"][0] == "herald-dispatcher" for c in herald):
                problems.append(f"{workload}: only herald-dispatcher may mount the APNs keys (herald-apns-keys)")
        if obj["kind"] == "Deployment":
            if spec.get("terminationGracePeriodSeconds", 0) < 30:
                problems.append(f"{workload}: terminationGracePeriodSeconds must be set, at least 30 s "
                                "(Herald drains for 25 s; Redis and Kafka flush)")
            if not any(selects(b["spec"].get("selector"), pod.labels) for b in budgets):
                problems.append(f"{workload}: no PodDisruptionBudget selects its pods")
        for kind in ("Ingress", "Egress"):
            if not network.selecting(pod, kind):
                problems.append(f"{workload}: no NetworkPolicy restricts its {kind.lower()}")
        for container in herald:
            check_herald_container(path, obj, pod, container, config, env_names, problems)
            check_herald_network(path, obj, pod, container, config, network, services, pods, problems)
        if not herald:
            # Only named peers may connect to a dependency the overlay runs itself.
            for number in sorted(n for n in pod.ports if isinstance(n, int)):
                if any(open_to_all(rule.get("from")) and port_allowed(rule.get("ports"), number, pod.ports[number][1], pod)
                       for rule in network.ingress_rules(pod)):
                    problems.append(f"{workload}: port {number} is open to every source")
    for obj in objects:
        if obj["kind"] == "Service" and obj["metadata"]["name"] == "herald-ingest":
            exposed = {str(p.get("targetPort")) for p in obj["spec"].get("ports", [])}
            if exposed != {"http"}:
                problems.append(f"{path}: the public herald-ingest Service must expose only the API port (http), not {sorted(exposed)}")
    # HERALD_KAFKA_PROPERTY_<NAME> is read by its prefix: any librdkafka property.
    for name in sorted(n for n in env_names - READ if not n.startswith("HERALD_KAFKA_PROPERTY_")):
        problems.append(f"{path}: {name} is set but no Herald executable reads it")


def check_herald_container(path, obj, pod, container, config, env_names, problems):
    where = f"{path}: {pod.name}/{container['name']}"
    env_names.update(e["name"] for e in container.get("env", []) if e["name"].startswith("HERALD_"))
    # Every container talks to Redis or Kafka: their files must be mounted where the variables point.
    mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts", [])]
    for name, value in config.items():
        if re.fullmatch(r"HERALD_(REDIS|KAFKA)_[A-Z_]*FILE", name) and not any(value.startswith(m) for m in mounts):
            problems.append(f"{where}: {name}={value} is on no volume the container mounts")
    if obj["kind"] != "Deployment":
        return
    for probe, path_ in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        if container.get(probe, {}).get("httpGet", {}).get("path") != path_:
            problems.append(f"{where}: {probe} must GET {path_}")
    annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true":
        problems.append(f"{where}: Prometheus scrape annotations missing")
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    metrics = int(annotations.get("prometheus.io/port", 0))
    if container["command"][0] == "herald-ingest":
        admin, api = listen_port(env.get("HERALD_INGEST_ADMIN_ADDR")), listen_port(env.get("HERALD_INGEST_ADDR"))
        if admin is None or admin == api:
            problems.append(f"{where}: HERALD_INGEST_ADMIN_ADDR must be set to a port of its own, so /metrics is off the API port")
        elif admin != metrics or pod.ports.get("admin", (None,))[0] != admin:
            problems.append(f"{where}: the admin port (HERALD_INGEST_ADMIN_ADDR {admin}) must be the container port "
                            f"named admin and the prometheus.io/port annotation ({metrics})")
    if container["command"][0] == "herald-dispatcher":
        listen = listen_port(env.get("HERALD_DISPATCHER_ADDR"))
        if listen != metrics:
            problems.append(f"{where}: prometheus.io/port ({metrics}) must be HERALD_DISPATCHER_ADDR's port ({listen})")


def check_herald_network(path, obj, pod, container, config, network, services, pods, problems):
    where = f"{path}: {pod.name}/{container['name']}"
    command = container["command"][0]
    for protocol in ("UDP", "TCP"):
        if not network.egress_allowed(pod, EVERYWHERE, 53, protocol):
            problems.append(f"{where}: NetworkPolicy blocks DNS (53/{protocol})")
    uses = {"Kafka"} if command == "heraldctl" else {"Redis", "Kafka"}
    for what, host, port in addresses(config):
        if what not in uses:
            continue
        inside = resolve(host, port, services, pods, network.namespace)
        if inside:
            target, number = inside
            if not network.egress_allowed(pod, target, number):
                problems.append(f"{where}: NetworkPolicy blocks egress to {what} at {host}:{port} ({target.name})")
            if not network.ingress_allowed(pod, target, number):
                problems.append(f"{where}: {target.name}'s NetworkPolicy does not admit it on {number} ({what})")
        elif not network.egress_allowed(pod, EVERYWHERE, port):
            problems.append(f"{where}: NetworkPolicy blocks egress to {what} at {host}:{port} (herald-config)")
    if command == "herald-dispatcher" and not network.egress_allowed(pod, EVERYWHERE, 443):
        problems.append(f"{where}: NetworkPolicy blocks egress to APNs (443)")
    if obj["kind"] != "Deployment":
        return
    metrics = int(obj["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/port", 0))
    api = pod.ports.get("http", (None,))[0] if command == "herald-ingest" else None
    rules = network.ingress_rules(pod)
    for number in sorted(n for n in pod.ports if isinstance(n, int)):
        open_ = any(open_to_all(r.get("from")) and port_allowed(r.get("ports"), number, "TCP", pod) for r in rules)
        if open_ and number != api:
            problems.append(f"{where}: port {number} is open to every source (only herald-ingest's API port may be)")
        if number == api and not open_:
            problems.append(f"{where}: NetworkPolicy does not admit clients on the API port {number}")
        if number != api and number != metrics and any(port_allowed(r.get("ports"), number, "TCP", pod) for r in rules):
            problems.append(f"{where}: port {number} admits connections; only the API and metrics ports may")
    scraped = any(port_allowed(r.get("ports"), metrics, "TCP", pod) and any(
        p.get("namespaceSelector") not in (None, {}) for p in r.get("from") or []) for r in rules)
    if not scraped:
        problems.append(f"{where}: no NetworkPolicy admits the metrics port {metrics} from a monitoring namespace selector")


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
