# capn: a small, non-root image with the built-in channels compiled into the binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY channels channels
# A member of the workspace (the test kit): cargo loads every member's manifest.
COPY testkit testkit
RUN cargo build --release --locked --bin capn

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/capn /usr/local/bin/capn
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/capn"]
CMD ["run"]
