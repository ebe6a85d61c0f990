# The operator image: a static binary on a distroless base, running as a non-root user.
#   docker build -t flotilla:0.1.0 .
# (No image is built by this project's scripts; deploy/base runs the image flotilla:0.1.0.)

FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --locked --release --target x86_64-unknown-linux-musl \
    && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs \
    && cargo build --locked --release --target x86_64-unknown-linux-musl --bin flotilla \
    && cp target/x86_64-unknown-linux-musl/release/flotilla /flotilla

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /flotilla /usr/local/bin/flotilla
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/flotilla"]
CMD ["run"]
