# syntax=docker/dockerfile:1
# hintstream: a multi-stage build (BuildKit, the default builder of Docker
# Engine 23 and later). The builder compiles librdkafka (cmake) and the binary
# with the CUDA feature (dynamic loading: the image runs on CPU hosts and uses
# the GPU where the NVIDIA runtime provides libcuda).
#
# Dependencies stay compiled across source changes: the cargo registry and the
# target directory are BuildKit cache mounts, so after a change under src/
# cargo rebuilds the hintstream crate alone, not librdkafka or arrow (its link,
# ThinLTO across every crate, takes longer: Cargo.toml's [profile.release]).
FROM rust:1.88-bookworm AS builder
RUN apt-get update && apt-get install -y --no-install-recommends cmake libcurl4-openssl-dev libssl-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY src src
COPY kernels kernels
COPY benches benches
COPY examples examples
COPY schemas schemas
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --features cuda --bin hintstream \
    && install -D target/release/hintstream /out/hintstream

FROM debian:bookworm-slim
# Exactly what the binary links beyond the base image (tests/it/deploy/image.rs checks
# this line against `ldd`): libssl3 for OpenSSL (librdkafka's TLS and
# SASL/SCRAM; libz, libgcc_s and libc are in the base), and ca-certificates
# for TLS to brokers and model APIs. The user is unprivileged, by number, so
# that runAsNonRoot can verify it.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 hintstream \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin hintstream
COPY --from=builder /out/hintstream /usr/local/bin/hintstream
COPY --chmod=0755 deploy/hintstream-probe /usr/local/bin/hintstream-probe
COPY examples/data /usr/share/hintstream/examples/data
COPY hintstream.example.toml /etc/hintstream/hintstream.toml
USER 10001:10001
WORKDIR /usr/share/hintstream
# Metrics, /healthz and /readyz of `hints` and `advantages` (the ports the
# compose stack gives them with --metrics-addr).
EXPOSE 9464 9465
# No HINTSTREAM_BOOTSTRAP_SERVERS here: `quickstart` then uses its embedded
# broker, and the stages get the broker from their environment (compose sets
# kafka:9092) or --bootstrap-servers.
ENTRYPOINT ["hintstream", "--config", "/etc/hintstream/hintstream.toml"]
CMD ["--help"]
