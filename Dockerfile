# The operator image: the binary every test and benchmark of this project runs (glibc, the
# release profile) on distroless `cc`, which holds glibc and libgcc_s and nothing else (no
# shell, no package manager), running as a non-root user.
#   docker build -t flotilla:0.1.0 .
# (No image is built by this project's scripts; deploy/base runs the image flotilla:0.1.0.
# hack/build-image.sh puts the host's build in an image of the same shape for the in-cluster
# tests.)
#
# Not a static musl build: the memory figures in docs/measurements.md and the bounds in
# docs/security.md are glibc's. Its allocator is told to map large blocks apart, so that a
# tenant's 1.5 MiB App goes back to the system once read, and its heap is trimmed
# (--heap-trim-interval); musl's allocator has neither, and was never measured here.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --locked --release \
    && rm -rf src
COPY src ./src
# The shard fence's admission policies, which the binary embeds (tests/image_build.rs).
COPY rbac ./rbac
RUN touch src/main.rs src/lib.rs \
    && cargo build --locked --release --bin flotilla \
    && strip -o /flotilla target/release/flotilla

# Debian 12's glibc (2.36), as in the build stage.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /flotilla /usr/local/bin/flotilla
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/flotilla"]
CMD ["run"]
