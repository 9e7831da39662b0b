# Shared settings for Herald's scripts (sourced, not run).
HERALD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Where the tools scripts/setup installs live (the Python venv with Tansu, librdkafka's own producer benchmark).
HERALD_DEPS=${HERALD_DEPS:-$HOME/.cache/herald}
# librdkafka itself goes where pkg-config and the dynamic linker find it with no settings, so plain `swift build`
# and the binaries it makes work without flags.
RDKAFKA_PREFIX=/usr/local
RDKAFKA_PERFORMANCE=$HERALD_DEPS/bin/rdkafka_performance
export HERALD_DEPS PATH="$HERALD_DEPS/venv/bin:$PATH"
# Every dispatcher the scripts start talks to Tansu, whose fetches can stall: turn the dispatcher's recovery on
# (README, HERALD_KAFKA_FETCH_STALL_SECONDS).
export HERALD_KAFKA_FETCH_STALL_SECONDS=${HERALD_KAFKA_FETCH_STALL_SECONDS:-30}

# Unpacks Debian forky's librdkafka source (2.14 when written; ≥ 2.10 needed: 2.4–2.9 crash in the metadata cache
# when a topic is recreated with a new id, librdkafka#4964, as a restarted Tansu does) into $1/build, applies
# scripts/patches/librdkafka-*.patch, configured to install into $2; further arguments go to its configure script
# (used by scripts/setup and scripts/test-sanitizers). A build records the patches it carries in
# $2/share/herald/librdkafka-patches (`librdkafka_patches_installed` checks it).
LIBRDKAFKA_PATCHES=$(cd "$HERALD_ROOT/scripts/patches" && cat librdkafka-*.patch | sha256sum | cut -c1-16)
librdkafka_patches_installed() { [[ "$(cat "$1/share/herald/librdkafka-patches" 2>/dev/null)" == "$LIBRDKAFKA_PATCHES" ]]; }
record_librdkafka_patches() { mkdir -p "$1/share/herald" && echo "$LIBRDKAFKA_PATCHES" > "$1/share/herald/librdkafka-patches"; }
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
  local patch_file
  for patch_file in "$HERALD_ROOT"/scripts/patches/librdkafka-*.patch; do
    patch -s -d "$work/build" -p1 < "$patch_file"
  done
  (cd "$work/build" \
    && ./configure --prefix="$2" --no-download --disable-zstd --disable-gssapi --disable-curl \
         --disable-lz4-ext "${@:3}" >/dev/null)
}
