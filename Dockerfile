# Build: docker build -t coder-gpu-reclaimer:0.1.0 .
# The final image is distroless (no shell), runs as a non-root user, and starts the binary
# directly so SIGTERM reaches it (it then stops no more workspaces and exits within 10 s).
# Base images are pinned by digest, so a rebuild uses the bytes that were reviewed. To move to a
# newer image: `docker buildx imagetools inspect rust:1.95-slim-bookworm` (and the same for
# gcr.io/distroless/cc-debian12:nonroot), then replace the digest.
FROM rust:1.95-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082 AS build
WORKDIR /src
# make: the allocator (jemalloc, src/lib.rs) is built from its C sources by tikv-jemalloc-sys.
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cargo build --release --locked --bin coder-gpu-reclaimer

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /src/target/release/coder-gpu-reclaimer /usr/local/bin/coder-gpu-reclaimer
USER nonroot:nonroot
# The service allocates through jemalloc with one arena (src/lib.rs, .cargo/config.toml); glibc's
# malloc serves only what the C runtime itself allocates (the resolver): one heap per thread
# there would keep what each freed, so it stays at two.
ENV MALLOC_ARENA_MAX=2
EXPOSE 9464 9465
ENTRYPOINT ["/usr/local/bin/coder-gpu-reclaimer"]
CMD ["run"]
