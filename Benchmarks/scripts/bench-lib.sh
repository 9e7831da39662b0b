# Shared by the benchmark scripts (sourced, not run): the project's settings, builds of the benchmark tools, and
# the nginx + wrk A/B harness of the HTTP benchmarks.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$HERALD_ROOT"

# The benchmark tools (herald-bench-*, herald-soak) are in the Benchmarks package, built into a scratch path of
# their own; Herald's executables come from the root package's release build.
BENCH_SCRATCH=$HERALD_ROOT/.build/benchmarks
bench_build() { # product… (release, Benchmarks package)
  local product
  for product in "$@"; do
    swift build -c release --package-path "$HERALD_ROOT/Benchmarks" --scratch-path "$BENCH_SCRATCH" \
      --product "$product" >&2 || return
  done
}
bench_bin_path() { swift build -c release --package-path "$HERALD_ROOT/Benchmarks" --scratch-path "$BENCH_SCRATCH" --show-bin-path; }
herald_build() { # product… (release, root package)
  local product
  for product in "$@"; do swift build -c release --product "$product" >&2 || return; done
}
herald_bin_path() { swift build -c release --show-bin-path; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { # port [tries of 50 ms]
  for _ in $(seq "${2:-200}"); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): nothing listens on port $1" >&2
  return 1
}

require_tools() { # tool…
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null \
      || { echo "$(basename "$0"): $tool is not installed (scripts/setup)" >&2; exit 1; }
  done
}

# nginx answering every request with 201 and `body`, from folder `work`, without access logs; sets NGINX_PID.
# stop_nginx stops it (call it from the script's cleanup).
NGINX_PID=""
start_nginx() { # work port body
  local work=$1 port=$2 body=$3 nginx
  nginx=$(PATH=$PATH:/usr/sbin command -v nginx)
  mkdir -p "$work/nginx/logs"
  cat >"$work/nginx/nginx.conf" <<CONF
worker_processes 2;
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server {
    listen 127.0.0.1:$port;
    location / { default_type application/json; return 201 '$body'; }
  }
}
CONF
  "$nginx" -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" -g 'daemon off;' &
  NGINX_PID=$!
  NGINX_WORK=$work
}
stop_nginx() {
  [[ -n ${NGINX_WORK:-} && -f $NGINX_WORK/nginx.pid ]] && kill "$(cat "$NGINX_WORK/nginx.pid")" 2>/dev/null || true
  [[ -n $NGINX_PID ]] && wait "$NGINX_PID" 2>/dev/null || true
}

# One wrk run (-t2 -c64, $DURATION) with a Lua script; prints "req/s p99_ms non2xx" and appends wrk's output to
# $WORK/wrk.log.
wrk_measure() { # lua url
  local out rps p99 errors
  out=$(wrk -t2 -c64 -d"$DURATION" --latency -s "$1" "$2")
  echo "$out" >>"$WORK/wrk.log"
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  p99=$(awk '$1 == "99%" { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
          if (u == "us") v /= 1000; else if (u == "s") v *= 1000; printf "%.2f", v }' <<<"$out")
  errors=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")
  echo "$rps $p99 ${errors:-0}"
}

cpu_ticks() { # pid…: the user + system CPU time these processes have used so far, in clock ticks
    local sum=0 pid
    for pid in "$@"; do sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$pid/stat"))); done
    echo "$sum"
}

mean() { awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.2f", s / NF }' <<<"$1"; }

# Warms both servers up for a second, then measures them in ABBA order (nginx, herald, herald, nginx), so a
# drift in what else the cores do falls on both alike, and prints each run, the means of two and Herald's ratio.
# Sets HERALD_NON_2XX to the number of Herald's non-2xx answers.
abba_against_nginx() { # label lua nginx_url herald_url
  local label=$1 lua=$2 run name url rps p99 errors
  wrk -t2 -c64 -d1s -s "$lua" "$3" >/dev/null
  wrk -t2 -c64 -d1s -s "$lua" "$4" >/dev/null
  printf '%-30s %12s %10s %8s\n' run req/s p99_ms non-2xx
  local -A rates p99s non2xx
  for run in nginx:1 herald:1 herald:2 nginx:2; do
    name=${run%%:*}
    url=$3; [[ $name == herald ]] && url=$4
    read -r rps p99 errors < <(wrk_measure "$lua" "$url")
    printf '%-30s %12.0f %10s %8s\n' "$run" "$rps" "$p99" "$errors"
    rates[$name]="${rates[$name]:-} $rps"; p99s[$name]="${p99s[$name]:-} $p99"
    non2xx[$name]=$(( ${non2xx[$name]:-0} + errors ))
  done
  echo
  printf '%-30s %12s %10s\n' "mean of 2 runs" req/s p99_ms
  printf '%-30s %12.0f %10s\n' "nginx return 201" "$(mean "${rates[nginx]}")" "$(mean "${p99s[nginx]}")"
  printf '%-30s %12.0f %10s\n' "$label" "$(mean "${rates[herald]}")" "$(mean "${p99s[herald]}")"
  awk -v h="$(mean "${rates[herald]}")" -v n="$(mean "${rates[nginx]}")" \
    'BEGIN { printf "ratio herald/nginx (req/s): %.2f\n", h / n }'
  HERALD_NON_2XX=${non2xx[herald]}
}

# abba_against_nginx with herald-ingest as users get it (`$5 on`: info level, access log on) and with
# `$5 off` (HERALD_ACCESS_LOG=off). $5 starts herald-ingest in the background with HERALD_ACCESS_LOG=$1 and sets
# HERALD_PID; it is stopped after each round. HERALD_NON_2XX is the sum over both rounds.
abba_access_log_on_and_off() { # label lua nginx_url herald_url start_function
  local access_log total=0
  for access_log in on off; do
    echo "== HERALD_ACCESS_LOG=$access_log$([[ $access_log == on ]] && echo ' (the default)')"
    "$5" "$access_log"
    abba_against_nginx "$1" "$2" "$3" "$4"
    kill "$HERALD_PID"; wait "$HERALD_PID" || true; HERALD_PID=""
    total=$((total + HERALD_NON_2XX))
    echo
  done
  HERALD_NON_2XX=$total
}

# The Lua text of `static let <name> = RedisScript(source: """ … """)` in a Swift file read from stdin, with the
# rate-limit counting first when the script starts with `RateLimiter.countingLua(first:) +` (used by the Redis cost
# scripts, which load a tree's scripts into a Redis of their own).
lua_script_of() {
  python3 -c 'import re, sys, textwrap
root, name, src = sys.argv[1], sys.argv[2], sys.stdin.read()
def literal(text, at):
    start = text.index("\n", text.index("\"\"\"", at)) + 1
    return textwrap.dedent(text[start:text.index("\"\"\"", start)])
head = re.search(r"static let %s = RedisScript\(source: (RateLimiter\.countingLua\(first: (\d+)\) \+ )?\"\"\"" % name, src)
lua = literal(src, head.start())
if head.group(1):
    # The rate-limit counting the script starts with, its ARGV numbers filled in as Swift would.
    limiter = open(root + "/Sources/HeraldStore/RateLimiter.swift").read()
    first = int(head.group(2))
    counting = literal(limiter, limiter.index("static func countingLua"))
    counting = re.sub(r"\\\(first(?: \+ (\d+))?\)", lambda m: str(first + int(m.group(1) or 0)), counting)
    lua = counting + lua
print(lua, end="")' "$HERALD_ROOT" "$1"
}

# Sets REGISTER_ARGS to an EVALSHA of the registration script in file $1 (loaded as sha $2) for redis-benchmark:
# token $3 and post $4 (redis-benchmark's __rand_int__ or a fixed value), a rate-limit counter that never refuses,
# now = $5 (ms).
register_bench_args() {
  local lua=$1 sha=$2 token=$3 post=$4 now=$5
  local counter="herald:{rb:k:k}:rl:1"
  # Scripts.register's KEYS and ARGV on a standalone Redis (the layout of Keys.swift).
  REGISTER_ARGS=(EVALSHA "$sha" 4 "herald:{rb:p:$post}:act:$token" "herald:{rb:p:$post}:post" "herald:{rb:a:$token}:acttok"
                 "$counter" "$token" u "$post" "$token" production com.example.bench.LiveActivity
                 2026-11-30T12:00:00.000Z "$now" 3600000 $((now + 3600000)) 3660000 1 "$token$post"
                 "$counter" 1000000000 61 "" 0)
}
