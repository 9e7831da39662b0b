"""Checks Herald's monitoring (k8s/monitoring) against the code and the README, and extracts the alert rules for promtool.

Usage: check_monitoring.py --rules-dir DIR RENDERED.yaml...   (exit 1 with one line per problem)

- Metrics: what the services export is read from Sources/: every MetricsRegistry counter(…), gauge(…) and
  histogram(…) call whose first argument is a "herald_…" literal, with its labels: [...] (the APNs simulator's
  left out). A histogram is exported as NAME_bucket (with le), NAME_sum and NAME_count (Metrics.swift).
- Every herald_* name in a Grafana dashboard query (the ConfigMaps labelled grafana_dashboard: "1", and
  k8s/monitoring/grafana-dashboard.json itself) and in a PrometheusRule expression must be exported, and the labels
  its selectors match on must be the metric's own or a scrape target's (namespace, pod, job, ...).
- Dashboards: valid JSON, a uid, unique panel ids, every query on the ${datasource} variable with a refId.
- PrometheusRule and PodMonitor: only the fields of monitoring.coreos.com/v1 Herald uses (kubernetes-validate
  has no schema for them); every alert with for, a severity, summary, description and a runbook_url to
  README.md#<its own runbook heading>; the alerts and the README runbook's "#### Name" entries are the same set;
  a PodMonitor selects a Herald Deployment's pods on the port its prometheus.io/port annotation names.
- Writes each PrometheusRule's spec to DIR/<rendered file>/<name>.rules.yaml (a plain Prometheus rule file) with a
  copy of k8s/monitoring/tests/*.test.yaml beside it, for promtool check rules and promtool test rules.
"""
import argparse
import json
import pathlib
import re
import shutil
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MONITORING = ROOT / "k8s" / "monitoring"
# Labels a scrape adds to every series (Prometheus, the Prometheus Operator, annotation-based scrape configs).
TARGET_LABELS = {"namespace", "pod", "job", "instance", "container", "service", "endpoint", "node",
                 "kubernetes_namespace", "kubernetes_pod_name", "app_kubernetes_io_name"}
SEVERITIES = {"critical", "warning", "info"}
SKIP_SOURCES = ("HeraldAPNsSimulator", "herald-apns-sim")


def call_arguments(text, start):
    """The text between the parenthesis at `start` and its match, skipping string literals."""
    depth, i, in_string = 0, start, False
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
        i += 1
    raise ValueError("unbalanced call")


def exported_metrics():
    """{exposition name: set of label names} for every metric Herald's services register."""
    declared = {}
    pattern = re.compile(r'\.(counter|gauge|histogram)\(\s*"(herald_[a-z0-9_]+)"')
    for source in sorted((ROOT / "Sources").rglob("*.swift")):
        if any(part in SKIP_SOURCES for part in source.parts):
            continue
        text = source.read_text()
        for match in pattern.finditer(text):
            kind, name = match.groups()
            arguments = call_arguments(text, text.index("(", match.start()))
            labels = re.search(r"labels:\s*\[([^\]]*)\]", arguments)
            names = set(re.findall(r'"([a-zA-Z_][a-zA-Z0-9_]*)"', labels.group(1))) if labels else set()
            previous = declared.get(name)
            if previous and previous[0] != kind:
                raise SystemExit(f"check_monitoring: {name} is registered as both {previous[0]} and {kind}")
            declared[name] = (kind, names | (previous[1] if previous else set()))
    exported = {}
    for name, (kind, labels) in declared.items():
        if kind == "histogram":
            exported[f"{name}_bucket"] = labels | {"le"}
            exported[f"{name}_sum"] = labels
            exported[f"{name}_count"] = labels
        else:
            exported[name] = labels
    return declared, exported


STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'


def expression_problems(expr, exported):
    """Unknown herald_* metrics, and selector labels a metric does not have, in one PromQL expression."""
    problems = []
    bare = re.sub(STRING, '""', expr)
    for name in sorted(set(re.findall(r"(?<![\w:$.])(herald_[A-Za-z0-9_:]*)", bare))):
        if name not in exported:
            close = [m for m in exported if m.startswith(name) or name.startswith(m)]
            hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
            problems.append(f"names {name}, which Herald does not export{hint}")
    for match in re.finditer(r"(?<![\w:$.])(herald_[A-Za-z0-9_:]*)\s*\{((?:[^{}\"]|" + STRING + r")*)\}", expr):
        name, matchers = match.groups()
        if name not in exported:
            continue
        for label in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", re.sub(STRING, '""', matchers)):
            if label not in exported[name] and label not in TARGET_LABELS:
                problems.append(f"matches {name} on label {label}, which it does not have "
                                f"(its labels: {', '.join(sorted(exported[name])) or 'none'})")
    return problems


def dashboard_panels(panels):
    for panel in panels:
        yield panel
        yield from dashboard_panels(panel.get("panels", []))


def check_dashboard(where, text, exported, problems):
    try:
        dashboard = json.loads(text)
    except json.JSONDecodeError as error:
        problems.append(f"{where}: not JSON: {error}")
        return 0
    for key in ("uid", "title", "panels"):
        if not dashboard.get(key):
            problems.append(f"{where}: no {key}")
    variables = {v.get("name") for v in dashboard.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        problems.append(f"{where}: no datasource variable (queries must not name a data source of one Grafana)")
    queries, ids = 0, set()
    for panel in dashboard_panels(dashboard.get("panels", [])):
        title = f"{where}: panel {panel.get('title')!r}"
        if panel.get("id") in ids:
            problems.append(f"{title}: id {panel.get('id')} used twice")
        ids.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        if not all(k in grid for k in "hwxy") or grid.get("x", 0) + grid.get("w", 0) > 24:
            problems.append(f"{title}: gridPos missing or wider than the dashboard")
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{title}: datasource must be ${{datasource}}")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{title}: no query")
        refs = [t.get("refId") for t in targets]
        if None in refs or len(set(refs)) != len(refs):
            problems.append(f"{title}: every query needs its own refId")
        for target in targets:
            expr = target.get("expr", "")
            if not expr:
                problems.append(f"{title}: query {target.get('refId')} has no expr")
            queries += 1
            problems.extend(f"{title}: query {target.get('refId')} {p}" for p in expression_problems(expr, exported))
    return queries


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_entries():
    """The "#### Name" entries of README.md's "### Runbook: what to alert on" section."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^### Runbook: what to alert on\n(.*?)(?=^#{1,3} )", text, re.M | re.S)
    if not section:
        return None
    return re.findall(r"^#### (.+?)\s*$", section.group(1), re.M)


RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
GROUP_FIELDS = {"name", "interval", "rules", "limit", "partial_response_strategy"}
POD_MONITOR_FIELDS = {"jobLabel", "podTargetLabels", "selector", "namespaceSelector", "podMetricsEndpoints",
                      "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit",
                      "attachMetadata"}
ENDPOINT_FIELDS = {"port", "path", "scheme", "params", "interval", "scrapeTimeout", "honorLabels",
                   "honorTimestamps", "relabelings", "metricRelabelings", "enableHttp2", "followRedirects"}
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def check_rule(where, rule, exported, runbook, problems):
    unknown = set(rule) - RULE_FIELDS
    if unknown:
        problems.append(f"{where}: unknown fields {sorted(unknown)}")
    if ("alert" in rule) == ("record" in rule) or not isinstance(rule.get("expr"), str):
        problems.append(f"{where}: needs expr and exactly one of alert, record")
        return
    problems.extend(f"{where}: expr {p}" for p in expression_problems(rule["expr"], exported))
    if "record" in rule:
        return
    if not DURATION.match(str(rule.get("for", ""))):
        problems.append(f"{where}: needs for: (a duration)")
    if rule.get("labels", {}).get("severity") not in SEVERITIES:
        problems.append(f"{where}: labels.severity must be one of {sorted(SEVERITIES)}")
    annotations = rule.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        if not annotations.get(key):
            problems.append(f"{where}: annotations.{key} missing")
    anchor = slug(rule["alert"])
    if runbook is not None and rule["alert"] not in runbook:
        problems.append(f"{where}: README's runbook has no '#### {rule['alert']}' entry")
    url = annotations.get("runbook_url", "")
    if not url.endswith(f"README.md#{anchor}"):
        problems.append(f"{where}: runbook_url must link to README.md#{anchor}, not {url!r}")


def check_rules_object(where, obj, exported, runbook, problems):
    spec = obj.get("spec") or {}
    if set(spec) != {"groups"} or not isinstance(spec["groups"], list):
        problems.append(f"{where}: spec must hold groups only")
        return []
    alerts = []
    for group in spec["groups"]:
        unknown = set(group) - GROUP_FIELDS
        if unknown or not group.get("name") or not group.get("rules"):
            problems.append(f"{where}: group {group.get('name')!r}: needs name and rules, has {sorted(unknown)}")
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            check_rule(f"{where}: rule {name}", rule, exported, runbook, problems)
            if "alert" in rule:
                alerts.append(rule["alert"])
    for name in sorted({a for a in alerts if alerts.count(a) > 1}):
        problems.append(f"{where}: alert {name} defined twice")
    return alerts


def check_pod_monitor(where, obj, objects, problems):
    spec = obj.get("spec") or {}
    unknown = set(spec) - POD_MONITOR_FIELDS
    if unknown:
        problems.append(f"{where}: unknown fields {sorted(unknown)}")
    endpoints = spec.get("podMetricsEndpoints") or []
    if not endpoints or not isinstance(spec.get("selector"), dict):
        problems.append(f"{where}: needs selector and podMetricsEndpoints")
        return
    for endpoint in endpoints:
        unknown = set(endpoint) - ENDPOINT_FIELDS
        if unknown:
            problems.append(f"{where}: unknown endpoint fields {sorted(unknown)}")
    selected = [o for o in objects if o["kind"] == "Deployment"
                and all(o["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                        for k, v in spec["selector"].get("matchLabels", {}).items())]
    if not selected:
        problems.append(f"{where}: selects no Deployment's pods")
    for deployment in selected:
        template = deployment["spec"]["template"]
        ports = {p.get("name"): p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        scraped = template["metadata"].get("annotations", {}).get("prometheus.io/port")
        for endpoint in endpoints:
            if str(ports.get(endpoint.get("port"))) != str(scraped) or endpoint.get("path", "/metrics") != "/metrics":
                problems.append(f"{where}: scrapes port {endpoint.get('port')!r} of {deployment['metadata']['name']}, "
                                f"not /metrics on its prometheus.io/port {scraped}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules-dir", required=True, type=pathlib.Path)
    parser.add_argument("rendered", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    declared, exported = exported_metrics()
    problems = []
    if len(declared) < 25:
        problems.append(f"only {len(declared)} herald_* metrics found in Sources/: has the way metrics are declared changed?")
    runbook = runbook_entries()
    if runbook is None:
        problems.append("README.md has no '### Runbook: what to alert on' section")
    dashboards, queries, alerts, checked_rules = {}, 0, set(), set()
    source = MONITORING / "grafana-dashboard.json"
    if source.exists():
        dashboards[source.read_text()] = str(source.relative_to(ROOT))
    for path in args.rendered:
        objects = [o for o in yaml.safe_load_all(path.read_text()) if o]
        for obj in objects:
            where = f"{path.name}: {obj['kind']} {obj['metadata']['name']}"
            if obj["kind"] == "ConfigMap" and obj["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
                for key, text in (obj.get("data") or {}).items():
                    dashboards.setdefault(text, f"{where} {key}")
            elif obj["kind"] == "PrometheusRule":
                # The same rules rendered into several overlays are checked once (promtool still gets each).
                key = json.dumps(obj["spec"], sort_keys=True)
                if key not in checked_rules:
                    checked_rules.add(key)
                    alerts.update(check_rules_object(where, obj, exported, runbook, problems))
                target = args.rules_dir / path.stem
                target.mkdir(parents=True, exist_ok=True)
                (target / f"{obj['metadata']['name']}.rules.yaml").write_text(yaml.safe_dump(obj["spec"], sort_keys=False))
                for test in sorted((MONITORING / "tests").glob("*.test.yaml")):
                    shutil.copy(test, target / test.name)
            elif obj["kind"] == "PodMonitor":
                check_pod_monitor(where, obj, objects, problems)
            elif obj.get("apiVersion", "").startswith("monitoring.coreos.com/"):
                problems.append(f"{where}: no check knows this kind; add one to scripts/ci/check_monitoring.py")
    for text, where in dashboards.items():
        queries += check_dashboard(where, text, exported, problems)
    if runbook is not None and alerts:
        for name in sorted(set(runbook) - alerts):
            problems.append(f"README runbook entry '#### {name}' has no alert of that name in a PrometheusRule")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"monitoring: {len(declared)} metrics in Sources/, {len(dashboards)} dashboards ({queries} queries), "
          f"{len(alerts)} alerts, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
