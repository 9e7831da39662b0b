# Shared settings for Herald's scripts (sourced, not run).
HERALD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Where built dependencies live; Package.swift uses the same default, so keep them in step.
HERALD_DEPS=${HERALD_DEPS:-$HOME/.cache/herald}
RDKAFKA_PREFIX=$HERALD_DEPS/librdkafka
export HERALD_DEPS PATH="$HERALD_DEPS/venv/bin:$PATH"
export PKG_CONFIG_PATH="$RDKAFKA_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
