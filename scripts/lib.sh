# Shared settings for Herald's scripts (sourced, not run).
HERALD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Where built dependencies live; Package.swift uses the same default, so keep them in step.
HERALD_DEPS=${HERALD_DEPS:-$HOME/.cache/herald}
RDKAFKA_PREFIX=$HERALD_DEPS/librdkafka-forky
export HERALD_DEPS PATH="$HERALD_DEPS/venv/bin:$PATH"
export PKG_CONFIG_PATH="$RDKAFKA_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# Every dispatcher the scripts start talks to Tansu, whose fetches can stall: turn the dispatcher's recovery on
# (README, HERALD_KAFKA_FETCH_STALL_SECONDS).
export HERALD_KAFKA_FETCH_STALL_SECONDS=${HERALD_KAFKA_FETCH_STALL_SECONDS:-30}

# Unpacks Debian forky's librdkafka source (2.14 when written; ≥ 2.10 needed: 2.4–2.9 crash in the metadata cache
# when a topic is recreated with a new id, librdkafka#4964, as a restarted Tansu does) into $1/build, configured to install into $2; further
# arguments go to its configure script (used by scripts/setup and scripts/test-sanitizers).
fetch_librdkafka_source() {
  local work=$1
  rm -rf "$work" && mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  local mirror
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [[ -n "$mirror" ]] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
  echo "deb-src [trusted=yes] $mirror forky main" > "$work/sources.list"
  local apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
                  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=root")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq librdkafka >/dev/null)
  local tarball
  tarball=$(ls "$work"/librdkafka_*.orig.tar.* | head -n1)
  mkdir -p "$work/build" && tar -xf "$tarball" -C "$work/build" --strip-components=1
  (cd "$work/build" \
    && ./configure --prefix="$2" --no-download --disable-zstd --disable-gssapi --disable-curl \
         --disable-lz4-ext "${@:3}" >/dev/null)
}

# The Lua text of `static let <name> = RedisScript(source: """ … """)` in a Swift file read from stdin (used by the
# Redis cost scripts, which load a tree's scripts into a Redis of their own).
lua_script_of() {
  python3 -c 'import sys, textwrap
src = sys.stdin.read(); i = src.index("static let %s = RedisScript(source: \"\"\"" % sys.argv[1])
start = src.index("\n", i) + 1
print(textwrap.dedent(src[start:src.index("\"\"\"", start)]), end="")' "$1"
}

# Sets REGISTER_ARGS to an EVALSHA of the registration script in file $1 (loaded as sha $2) for redis-benchmark:
# token $3 and post $4 (redis-benchmark's __rand_int__ or a fixed value), a rate-limit counter that never refuses,
# now = $5 (ms). Scripts before the second registration-cost pass (14 arguments) took the counter key again as
# ARGV[10].
register_bench_args() {
  local lua=$1 sha=$2 token=$3 post=$4 now=$5
  local counter="herald:{rb}:rl:k:1"
  REGISTER_ARGS=(EVALSHA "$sha" 4 "herald:{rb}:act:$token" "herald:{rb}:post:$post" "herald:{rb}:acttok:$token"
                 "$counter" "$token" u "$post" "$token" production com.example.bench.LiveActivity
                 2026-11-30T12:00:00.000Z "$now" 3600000)
  if grep -q 'ARGV\[14\]' "$lua"; then REGISTER_ARGS+=("$counter"); fi
  REGISTER_ARGS+=(1000000000 61 $((now + 3600000)) 3660000)
}
