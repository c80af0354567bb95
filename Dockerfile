# hintstream: a multi-stage build. The builder compiles librdkafka (cmake)
# and the binary with the CUDA feature (dynamic loading: the image runs on CPU
# hosts and uses the GPU where the NVIDIA runtime provides libcuda).
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
RUN cargo build --release --locked --features cuda --bin hintstream

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libcurl4 libssl3 \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 hintstream
COPY --from=builder /src/target/release/hintstream /usr/local/bin/hintstream
COPY examples/data /usr/share/hintstream/examples/data
COPY hintstream.example.toml /etc/hintstream/hintstream.toml
USER hintstream
WORKDIR /usr/share/hintstream
ENV HINTSTREAM_BOOTSTRAP_SERVERS=kafka:9092
ENTRYPOINT ["hintstream", "--config", "/etc/hintstream/hintstream.toml"]
CMD ["--help"]
