# Herald's container image: all four executables on a slim Debian, running as a non-root user.
#   docker build -t herald:1.0.0 .
# Kubernetes picks the executable with `command:` (see k8s/).

FROM swift:6.3-bookworm AS build
WORKDIR /src
# Dependencies first, so source changes don't rebuild librdkafka.
COPY scripts/setup scripts/lib.sh scripts/
COPY scripts/patches/ scripts/patches/
RUN scripts/setup --build-only
COPY Package.swift ./
COPY Sources/ Sources/
RUN swift build -c release --static-swift-stdlib \
 && mkdir /out \
 && cp .build/release/herald-ingest .build/release/herald-dispatcher .build/release/heraldctl \
       .build/release/herald-apns-sim /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libhiredis0.14 libssl3 libnghttp2-14 \
      libsasl2-2 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin herald
# librdkafka as scripts/setup built it, where the dynamic linker looks.
COPY --from=build /usr/local/lib/librdkafka.so.1 /usr/local/lib/
RUN ldconfig
COPY --from=build /out/ /usr/local/bin/
USER 10001:10001
ENV HERALD_APPS_FILE=/etc/herald/apps.json
# herald-ingest's API and (HERALD_INGEST_ADMIN_ADDR, as in k8s/) its metrics; herald-dispatcher's probes and metrics.
EXPOSE 8080 9091 9090
CMD ["herald-ingest", "--help"]
