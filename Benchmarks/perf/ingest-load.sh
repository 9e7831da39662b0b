# Shared by scripts/cpu-cost-ingest and Benchmarks/perf/ab-cost-ingest (sourced after lib.sh, with $WORK, Redis and Tansu
# up): one app "bench" with a public and a secret key, and the wrk script posting one request shape per endpoint.

# Writes $WORK/apps.json (with $WORK/bench.p8) and $WORK/load.lua; sets PUBLIC and SECRET, the app's two API keys.
write_ingest_load_files() {
  PUBLIC=hrd_pub_$(openssl rand -hex 24)
  SECRET=hrd_sec_$(openssl rand -hex 24)
  sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$WORK/bench.p8" 2>/dev/null
  cat >"$WORK/apps.json" <<JSON
{"apps": [{"id": "bench", "keys": [{"kind": "public", "sha256": "$(sha "$PUBLIC")"},
                                   {"kind": "secret", "sha256": "$(sha "$SECRET")"}],
  "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "bench.p8", "bundleId": "com.example.bench"}}]}
JSON
  cat >"$WORK/load.lua" <<'LUA'
-- One request shape per endpoint (ENDPOINT): distinct tokens or channels every request.
local endpoint = os.getenv("ENDPOINT")
local public, secret = os.getenv("PUBLIC_KEY"), os.getenv("SECRET_KEY")
local counter, tid, threads = 0, 0, 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init() math.randomseed(os.time() * 100 + tid) end
local function token()
  return string.format("%08x%08x%08x%08x%08x%08x%08x%08x", tid, counter, math.random(0, 2147483647),
    math.random(0, 2147483647), math.random(0, 2147483647), math.random(0, 2147483647),
    math.random(0, 2147483647), math.random(0, 2147483647))
end
function request()
  counter = counter + 1
  if endpoint == "subscribe" then
    return wrk.format("POST", "/v1/apps/bench/subscriptions", { ["Content-Type"] = "application/json", ["X-API-Key"] = public },
      string.format('{"channel":"order:%d:status","deviceToken":"%s","tokenType":"alert","metadata":{"locale":"en_US"}}',
        counter % 1000, token()))
  elseif endpoint == "register" then
    return wrk.format("POST", "/api/v1/activities/register", { ["Content-Type"] = "application/json", ["X-API-Key"] = public },
      string.format('{"push_token":"%s","post_id_hash":"%016x","bundle_id":"com.example.bench.LiveActivity"}',
        token(), math.random(0, 1023)))
  else
    return wrk.format("POST", "/v1/apps/bench/events", { ["Content-Type"] = "application/json", ["X-API-Key"] = secret },
      '{"channel":"order:' .. tid .. '-' .. counter .. ':status","alert":{"aps":{"alert":{"title":"Shipped","body":"Order ' .. counter .. '"}}}}')
  end
end
LUA
}

# The Redis herald-ingest is given: the standalone one, or the cluster's first two nodes.
bench_redis_url() {
  local cluster=${HERALD_SERVICES_REDIS_CLUSTER_PORT:-}
  if [[ -n $cluster ]]; then echo "redis://127.0.0.1:$cluster,127.0.0.1:$((cluster + 1))"
  else echo "redis://127.0.0.1:$HERALD_SERVICES_REDIS_PORT/0"; fi
}

# Starts herald-ingest $1 on a free port against those files, logging to $2 (appended); waits until it is ready.
# Sets STARTED_PID and STARTED_PORT. Against the Redis Cluster of scripts/services when
# HERALD_SERVICES_REDIS_CLUSTER_PORT is set (its first two nodes as seeds).
start_bench_ingest() {
  [[ -f $WORK/jobs.secret ]] || head -c 32 /dev/urandom | base64 > "$WORK/jobs.secret"
  export HERALD_JOB_SIGNING_SECRET_FILE=$WORK/jobs.secret
  STARTED_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  HERALD_INGEST_ADDR=127.0.0.1:$STARTED_PORT HERALD_APPS_FILE=$WORK/apps.json \
    HERALD_REDIS_URL=$(bench_redis_url) \
    HERALD_KAFKA_BROKERS=127.0.0.1:$HERALD_SERVICES_KAFKA_PORT \
    HERALD_RATE_LIMIT_PER_MINUTE=1000000 "$1" 2>>"$2" &
  STARTED_PID=$!
  for _ in $(seq 200); do curl -fs "http://127.0.0.1:$STARTED_PORT/readyz" >/dev/null && return 0; sleep 0.05; done
  echo "herald-ingest $1 is not ready" >&2
  cat "$2" >&2
  kill "$STARTED_PID" 2>/dev/null || true
  return 1
}
